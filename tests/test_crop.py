"""Augment's output_size: torchvision's RandomResizedCrop / Resize + CenterCrop semantics, and a stream that yields
batches of output_size whatever runs it (workers=0 or 2, a feeder, a resumed stream), on real files."""

from __future__ import annotations

import math

import numpy as np
import pytest

import h5stream
from h5stream.augment import crop as crops
from h5stream.augment.warp import _cv2
from h5stream.errors import ConfigError
from h5stream.store.writer import write_arrays

ROWS = 300
STORED = (40, 56, 3)


def torchvision_get_params(draws, height, width, scale, ratio):
    """torchvision.transforms.RandomResizedCrop.get_params, line for line, with its random calls replaced by
    ``draws`` (an iterator of uniforms on [0, 1)): ``uniform_(a, b)`` -> ``a + (b - a) * u``, ``randint(0, n)``
    -> ``floor(u * n)``."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        u_area, u_ratio = draws["area"].pop(0), draws["ratio"].pop(0)
        target_area = area * (scale[0] + (scale[1] - scale[0]) * u_area)
        aspect_ratio = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * u_ratio)
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = math.floor(draws["top"] * (height - h + 1))
            j = math.floor(draws["left"] * (width - w + 1))
            return i, j, h, w
    # Fallback to central crop
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:  # whole image
        w = width
        h = height
    i = (height - h) // 2
    j = (width - w) // 2
    return i, j, h, w


@pytest.mark.parametrize("height, width, scale, ratio", [
    (40, 56, (0.08, 1.0), (3 / 4, 4 / 3)),
    (224, 224, (0.08, 1.0), (3 / 4, 4 / 3)),
    (10, 200, (0.08, 1.0), (3 / 4, 4 / 3)),  # a strip: most tries miss, the fallback cuts to ratio 4/3
    (200, 10, (0.5, 1.0), (3 / 4, 4 / 3)),
    (32, 32, (0.9, 1.0), (2.0, 3.0)),  # no try fits: the fallback, wider than tall
    (33, 31, (1.0, 1.0), (1.0, 1.0)),
])
def test_boxes_are_torchvision_get_params_for_the_same_draws(height, width, scale, ratio):
    n = 4000
    u = np.random.default_rng(height * width).random((2 * crops.TRIES + 2, n))
    boxes = crops.crop_box_from_draws(u[:10].T, u[10:20].T, u[20], u[21], height, width, scale, ratio)
    fallbacks = 0
    for k in range(n):
        draws = {"area": list(u[:10, k]), "ratio": list(u[10:20, k]), "top": u[20, k], "left": u[21, k]}
        expected = torchvision_get_params(draws, height, width, scale, ratio)
        fallbacks += len(draws["area"]) == 0 and expected == crops.fallback_box(height, width, ratio)
        assert tuple(int(v) for v in boxes[k]) == expected, (k, draws)
    if (height, width) in ((10, 200), (32, 32)):
        assert fallbacks > 0


def test_drawn_boxes_keep_to_scale_and_ratio_and_depend_only_on_seed_epoch_row():
    h, w, scale, ratio = 72, 64, (0.08, 1.0), (3 / 4, 4 / 3)
    rows = np.arange(20000)
    boxes = crops.random_resized_boxes(5, 2, rows, h, w, scale, ratio)
    top, left, bh, bw = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + bh <= h).all() and (left + bw <= w).all()
    # Rounding each side to whole pixels moves the area and the ratio by at most half a pixel per side.
    area = bh * bw / (h * w)
    assert (area >= scale[0] * (1 - 1 / bh) * (1 - 1 / bw) - 1e-9).all() and (area <= 1).all()
    r = bw / bh
    assert (r >= ratio[0] * (bw - 0.5) / bw * bh / (bh + 0.5) - 1e-9).all()
    assert (r <= ratio[1] * (bw + 0.5) / bw * bh / (bh - 0.5) + 1e-9).all()
    assert area.min() < 0.1 and area.max() > 0.95  # the whole range of scale is drawn
    assert top.max() > h // 2 and left.max() > w // 2 and top.min() == 0 and left.min() == 0
    # The same (seed, epoch, row) gives the same box in any batch, in any order; another epoch another box.
    shuffled = np.random.default_rng(0).permutation(rows[:500])
    again = crops.random_resized_boxes(5, 2, shuffled, h, w, scale, ratio)
    assert np.array_equal(again, boxes[shuffled])
    assert not np.array_equal(crops.random_resized_boxes(5, 3, rows[:500], h, w, scale, ratio), boxes[:500])


def test_a_random_resized_crop_is_its_box_resized_then_flipped():
    images = np.random.default_rng(3).integers(0, 256, (64, *STORED), dtype=np.uint8)
    rows = np.arange(1000, 1064)
    aug = h5stream.Augment(output_size=(24, 32), horizontal_flip=True)
    out = aug(images, seed=9, epoch=1, row_ids=rows)
    assert out.shape == (64, 24, 32, 3) and out.dtype == np.uint8
    boxes = crops.random_resized_boxes(9, 1, rows, STORED[0], STORED[1], (0.08, 1.0), (3 / 4, 4 / 3))
    flips = aug.draw(9, 1, rows, 24, 32)["flip_horizontal"]
    assert 0 < flips.sum() < 64
    cv2 = _cv2()
    for i, (top, left, h, w) in enumerate(boxes):
        interp = cv2.INTER_AREA if h >= 24 and w >= 32 else cv2.INTER_LINEAR
        box = np.ascontiguousarray(images[i, top:top + h, left:left + w])
        expected = cv2.resize(box, (32, 24), interpolation=interp)
        np.testing.assert_array_equal(out[i], expected[:, ::-1] if flips[i] else expected)


def test_an_enlarging_crop_is_torch_bilinear_to_rounding():
    torch = pytest.importorskip("torch")
    image = np.random.default_rng(4).integers(0, 256, (1, 12, 9, 3), dtype=np.uint8)
    dst = np.empty((1, 30, 20, 3), np.uint8)
    crops._resize_into(_cv2(), image[0], dst[0])
    t = torch.from_numpy(image).permute(0, 3, 1, 2).double()
    ref = torch.nn.functional.interpolate(t, size=(30, 20), mode="bilinear", align_corners=False)
    ref = ref.permute(0, 2, 3, 1).numpy()
    assert np.abs(dst.astype(np.float64) - ref).max() <= 1.0


def test_a_centre_crop_is_the_hand_computed_crop():
    image = np.random.default_rng(5).integers(0, 256, (1, 40, 60, 3), dtype=np.uint8)
    # resize = the short side: Resize is the identity; CenterCrop(30, 50) starts at round(5), round(5).
    out = h5stream.Augment(output_size=(30, 50), crop="center", resize=40)(image, seed=0, epoch=0, row_ids=[0])
    np.testing.assert_array_equal(out[0], image[0, 5:35, 5:55])
    # A tall image and the default resize: 16 * 256 / 224 -> 18; 40x30 -> 24x18 (int(18 * 40 / 30)); the crop
    # starts at round((24 - 16) / 2) = 4 and round((18 - 16) / 2) = 1.
    tall = np.ascontiguousarray(image[:, :40, :30])
    aug = h5stream.Augment(output_size=16, crop="center")
    assert aug.resize == 18 and crops.center_geometry(40, 30, (16, 16), 18) == ((24, 18), (4, 1, 16, 16))
    out = aug(tall, seed=0, epoch=0, row_ids=[0])
    resized = _cv2().resize(tall[0], (18, 24), interpolation=_cv2().INTER_AREA)
    np.testing.assert_array_equal(out[0], resized[4:20, 1:17])
    # A resize that leaves the image smaller than the crop: one line, before anything runs.
    with pytest.raises(ConfigError, match=r"makes 40x60 images 30x45, smaller than output_size=\(30, 50\); raise "
                                          r"resize to 50"):
        h5stream.Augment(output_size=(30, 50), crop="center", resize=30).output_shape((40, 60, 3))
    # The ImageNet recipe: 224 -> resize 256.
    assert h5stream.Augment(output_size=(224, 224), crop="center").resize == 256


@pytest.mark.parametrize("kwargs, words", [
    (dict(output_size=(0, 224)), "output_size=(0, 224) must be (height, width)"),
    (dict(output_size=(224, -1)), "two positive ints"),
    (dict(output_size=(224, 224.0)), "two positive ints"),
    (dict(output_size=(224, 224), scale=(0.0, 1.0)), "scale=(0.0, 1.0) must satisfy 0 < min <= max <= 1"),
    (dict(output_size=(224, 224), scale=(0.5, 1.5)), "scale=(0.5, 1.5)"),
    (dict(output_size=(224, 224), scale=(0.9, 0.1)), "scale=(0.9, 0.1)"),
    (dict(output_size=(224, 224), ratio=(4 / 3, 3 / 4)), "must satisfy 0 < min <= max (width / height)"),
    (dict(output_size=(224, 224), ratio=(0, 1)), "ratio=(0.0, 1.0)"),
    (dict(crop="random_resized"), "crop='random_resized' needs output_size=(height, width)"),
    (dict(crop="center"), "needs output_size"),
    (dict(output_size=(224, 224), crop="centre"), "crop='centre' is not a crop; choose one of 'random_resized', "
                                                  "'center'"),
    (dict(output_size=(224, 224), crop="center", resize=100), "resize=100 must be an int >= min(output_size)"),
    (dict(output_size=(224, 224), resize=256), "resize=256 is for crop='center'"),
    (dict(output_size=(224, 224), crop="center", scale=(0.5, 1)), "scale=(0.5, 1) is for crop='random_resized' "
                                                                   "(with output_size); drop it for crop='center'"),
    (dict(ratio=(0.5, 1)), "ratio=(0.5, 1) is for crop='random_resized'"),
])
def test_bad_crop_options_are_one_line_errors(kwargs, words):
    with pytest.raises(ConfigError) as caught:
        h5stream.Augment(**kwargs)
    message = str(caught.value)
    assert words in message and "\n" not in message


def test_upscaling_is_allowed_as_torchvision_allows_it():
    images = np.zeros((2, 8, 8, 1), np.uint8)
    assert h5stream.Augment(output_size=(20, 30))(images, seed=0, epoch=0, row_ids=[0, 1]).shape == (2, 20, 30, 1)
    assert h5stream.Augment(output_size=(20, 30), crop="center")(
        images, seed=0, epoch=0, row_ids=[0, 1]).shape == (2, 20, 30, 1)


def test_without_output_size_the_output_is_the_stored_size():
    aug = h5stream.Augment(horizontal_flip=True)
    assert aug.output_size is None and aug.output_shape(STORED) == STORED
    images = np.random.default_rng(6).integers(0, 256, (4, *STORED), dtype=np.uint8)
    assert aug(images, seed=0, epoch=0, row_ids=np.arange(4)).shape == images.shape


# --------------------------------------------------------------------------- the stream


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    images = np.random.default_rng(1).integers(0, 256, (ROWS, *STORED), dtype=np.uint8)
    path = tmp_path_factory.mktemp("crop") / "c.h5"
    write_arrays(path, images, np.arange(ROWS) % 5, block_rows=16)
    return path


TRAIN = h5stream.Augment(output_size=(24, 32), horizontal_flip=True, rescale=1 / 255)
KW = dict(batch_size=32, memory_budget="200MiB", seed=11, rows_per_fill=96)


def _epochs(store, n_epochs=2, **kw):
    with h5stream.open(store, **{**KW, **kw}) as s:
        return [(x.copy(), y.copy()) for _ in range(n_epochs) for x, y in s]


@pytest.mark.usefixtures("no_leaks")
def test_batches_have_output_size_and_are_the_same_with_0_and_2_workers_and_a_feeder(store):
    runs = {name: _epochs(store, augment=TRAIN, **kw) for name, kw in
            (("inline", dict(workers=0)), ("workers", dict(workers=2)), ("feeder", dict(workers=2, feeder=True)))}
    first = runs["inline"]
    assert len(first) == 2 * math.ceil(ROWS / 32)
    assert all(x.shape[1:] == (24, 32, 3) and x.dtype == np.float32 for x, _ in first)
    for name in ("workers", "feeder"):
        assert len(runs[name]) == len(first)
        for (x0, y0), (x1, y1) in zip(first, runs[name]):
            assert np.array_equal(x0, x1) and np.array_equal(y0, y1), name
    assert not np.array_equal(first[0][0], first[len(first) // 2][0])  # another epoch, other crops


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("workers", [0, 2])
def test_resumed_cropped_stream_equals_not_stopping(store, workers):
    kw = dict(KW, augment=h5stream.Augment(output_size=(20, 20), crop="random_resized"), workers=workers)
    with h5stream.open(store, **kw) as s:
        it = iter(s)
        next(it), next(it), next(it)
        state = s.state()
        rest = [x.copy() for x, _ in it]
    with h5stream.open(store, resume=state, **kw) as r:
        again = [x.copy() for x, _ in r]
    assert len(rest) == len(again) == math.ceil(ROWS / 32) - 3
    assert all(a.shape[1:] == (20, 20, 3) and np.array_equal(a, b) for a, b in zip(rest, again))


@pytest.mark.usefixtures("no_leaks")
def test_a_centre_cropped_validation_stream_is_the_centre_of_every_row(store):
    aug = h5stream.Augment(output_size=(30, 50), crop="center", resize=40)
    with h5stream.open(store, batch_size=50, shuffle=False, augment=aug, workers=2) as s:
        assert s.image_shape == (30, 50, 3)
        got = np.concatenate([x for x, _ in s])
    with h5stream.open(store, batch_size=50, shuffle=False) as s:
        stored = np.concatenate([x for x, _ in s])
    np.testing.assert_array_equal(got, stored[:, 5:35, 3:53])


@pytest.mark.parametrize("workers", [0, 2])
def test_the_plan_counts_output_size_not_the_stored_size(store, workers):
    from h5stream.store.meta import read_meta
    from h5stream.streaming.planning import plan_stream

    meta = read_meta(store)
    small = h5stream.Augment(output_size=(8, 8), rescale=1 / 255)
    large = h5stream.Augment(output_size=(80, 112), rescale=1 / 255)
    same = h5stream.Augment(rescale=1 / 255)
    plans = {name: plan_stream(meta, None, 32, augment=a, workers=workers, available_bytes=None)
             for name, a in (("small", small), ("large", large), ("same", same))}
    out_row = {"small": 8 * 8 * 3 * 4, "large": 80 * 112 * 3 * 4, "same": meta.row_bytes * 4}
    for name, plan in plans.items():
        assert plan.output_bytes == plan.consumer_sets * 32 * out_row[name]
    if workers:  # the pool's output slots are of the output size too
        assert plans["large"].pool_bytes - plans["small"].pool_bytes == \
            plans["large"].out_slots * 32 * (out_row["large"] - out_row["small"])
    assert "output" in plans["large"].describe()


def test_crop_options_given_to_open_point_to_augment_and_a_too_small_resize_fails_at_open(store):
    with pytest.raises(ConfigError, match=r"has no option 'output_size': it is an augmentation: pass "
                                          r"augment=h5stream.Augment\(output_size=...\)"):
        h5stream.open(store, output_size=(24, 24))
    with pytest.raises(ConfigError, match=r"makes 40x56 images 30x42, smaller than output_size=\(30, 50\)"):
        h5stream.open(store, augment=h5stream.Augment(output_size=(30, 50), crop="center", resize=30))


@pytest.mark.usefixtures("no_leaks")
def test_a_rows_crop_is_the_same_whichever_shard_reads_it_and_changes_with_the_epoch(tmp_path):
    rows = 60
    path = tmp_path / "ids.h5"  # each row's label is its id
    write_arrays(path, np.random.default_rng(2).integers(0, 256, (rows, 20, 30, 3), dtype=np.uint8), np.arange(rows),
                 block_rows=8)
    aug = h5stream.Augment(output_size=(12, 12), horizontal_flip=True)

    def crops_by_row(**kw):
        got = {}
        with h5stream.open(path, batch_size=8, seed=5, augment=aug, **kw) as s:
            for epoch in range(2):
                for x, y in s:
                    got.update({(epoch, int(r)): image.copy() for image, r in zip(x, y)})
        return got

    whole = crops_by_row()
    assert len(whole) == 2 * rows
    assert sum(np.array_equal(whole[0, r], whole[1, r]) for r in range(rows)) < rows // 4  # new crops each epoch
    for kw in (dict(shard=(0, 2)), dict(shard=(1, 2)), dict(shard=(2, 3), workers=2)):
        part = crops_by_row(**kw)
        assert part and all(np.array_equal(whole[key], image) for key, image in part.items()), kw


@pytest.mark.usefixtures("no_leaks")
def test_torch_batches_have_output_size(store):
    torch = pytest.importorskip("torch")
    aug = h5stream.Augment(output_size=(16, 24), crop="center")
    with h5stream.open(store, batch_size=32, shuffle=False, augment=aug) as s:
        x, y = next(iter(s.torch()))
        assert isinstance(x, torch.Tensor) and tuple(x.shape) == (32, 16, 24, 3)
        x, _ = next(iter(s.torch(device="cpu", layout="NCHW", dtype=torch.float32)))
        assert tuple(x.shape) == (32, 3, 16, 24)


@pytest.mark.parametrize("kwargs", [dict(rotation_range=20, channel_shift_range=10, rescale=1 / 255),
                                    dict(horizontal_flip=True, fill_mode="nearest", zoom_range=0.2),
                                    dict(crop="center", samplewise_center=True, dtype="float16")])
def test_cropping_a_few_rows_at_a_time_gives_the_rows_of_one_at_a_time(monkeypatch, kwargs):
    images = np.random.default_rng(7).integers(0, 256, (23, 70, 70, 3), dtype=np.uint8)
    rows = np.arange(50, 73)
    aug = h5stream.Augment(output_size=(64, 64), **kwargs)
    monkeypatch.setattr(crops, "SCRATCH_BYTES", 5 * 64 * 64 * 3)  # groups of 5 rows, the last of 3
    grouped = aug(images, seed=2, epoch=4, row_ids=rows)
    single = np.concatenate([aug(images[i:i + 1], seed=2, epoch=4, row_ids=rows[i:i + 1]) for i in range(23)])
    np.testing.assert_array_equal(grouped, single)
    assert grouped.shape == (23, 64, 64, 3)


@pytest.mark.parametrize("channels", [1, 2, 3, 4, 5])
def test_the_fast_flip_gives_numpys_reversed_pixels(channels):
    from h5stream.augment.pixels import flip_into

    image = np.random.default_rng(channels).integers(0, 256, (7, 9, channels), dtype=np.uint8)
    for horizontal in (False, True):
        for vertical in (False, True):
            dst = np.empty_like(image)
            flip_into(_cv2(), image, dst, horizontal, vertical)
            expected = image[:, ::-1] if horizontal else image
            np.testing.assert_array_equal(dst, expected[::-1] if vertical else expected)


def test_a_shrinking_crop_is_close_to_torch_antialiased_bilinear():
    torch = pytest.importorskip("torch")
    cv2 = _cv2()
    noise = np.random.default_rng(8).integers(0, 256, (300, 300, 3), dtype=np.uint8)
    image = cv2.GaussianBlur(noise, (0, 0), 1.5)  # some structure at every scale, like a photo
    dst = np.empty((224, 224, 3), np.uint8)
    crops._resize_into(cv2, image, dst)
    t = torch.from_numpy(image).permute(2, 0, 1)[None].double()
    ref = torch.nn.functional.interpolate(t, size=(224, 224), mode="bilinear", align_corners=False, antialias=True)
    diff = np.abs(dst - ref[0].permute(1, 2, 0).numpy())
    assert diff.mean() < 0.6 and diff.max() <= 3.0  # OpenCV's INTER_LINEAR, no anti-aliasing: 0.6 and 4.6


def _against_torch_antialiased(image: np.ndarray, size) -> np.ndarray:
    """|h5stream's resize of ``image`` to ``size`` - torch's antialiased bilinear|, per pixel."""
    import torch

    dst = np.empty((*size, image.shape[2]), np.uint8)
    crops._resize_into(_cv2(), image, dst)
    t = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None].double()
    ref = torch.nn.functional.interpolate(t, size=size, mode="bilinear", align_corners=False, antialias=True)
    return np.abs(dst - ref[0].permute(1, 2, 0).numpy())


def test_the_resize_departs_from_torch_by_the_documented_levels_where_a_side_shrinks():
    """The figures docs/design.md gives for the crops where the resize is not torchvision's filter: a crop that
    shrinks on one side and grows on the other (bilinear on both: about 1 in 5 random resized crops at the default
    scale and ratio), and a shrink of 2x (OpenCV's area average is a box, torch's antialiased bilinear a triangle)."""
    pytest.importorskip("torch")
    cv2 = _cv2()
    image = cv2.GaussianBlur(np.random.default_rng(8).integers(0, 256, (448, 448, 3), dtype=np.uint8), (0, 0), 1.5)
    mixed = _against_torch_antialiased(image[:200, :300], (224, 224))  # 200 rows grow to 224, 300 columns shrink
    assert 0.3 < mixed.mean() < 0.5 and mixed.max() <= 4.0  # 0.45 and 3.3
    assert _against_torch_antialiased(image[:300, :200], (224, 224)).max() <= 4.0
    halved = _against_torch_antialiased(image, (224, 224))
    assert 1.0 < halved.mean() < 1.6 and halved.max() <= 9.0  # 1.4 and 7.2
    boxes = crops.random_resized_boxes(0, 0, np.arange(20_000), 256, 341, crops.DEFAULT_SCALE, crops.DEFAULT_RATIO)
    grows_and_shrinks = ((boxes[:, 2] > 224) & (boxes[:, 3] < 224)) | ((boxes[:, 2] < 224) & (boxes[:, 3] > 224))
    assert 0.15 < grows_and_shrinks.mean() < 0.25  # 0.20: stored at 256 (short side), trained at 224


def test_the_reduced_decode_scale_keeps_the_box_at_least_output_size():
    assert crops.reduced_scale(1800, 1800, (224, 224)) == 8  # 225 >= 224
    assert crops.reduced_scale(1791, 1800, (224, 224)) == 4  # 1791 // 8 = 223
    assert crops.reduced_scale(448, 900, (224, 224)) == 2
    assert crops.reduced_scale(447, 900, (224, 224)) == 1
    assert crops.reduced_scale(100, 100, (224, 224)) == 1  # an enlarging crop decodes whole
    assert crops.reduced_scale(1800, 1800, (224, 224), scales=(2,)) == 2


def test_the_crop_benchmark_prints_a_table_and_json(capsys):
    pytest.importorskip("PIL")
    import json

    from benchmarks import crop as bench

    assert bench.main(["--stored", "40", "--size", "24", "--batch", "4", "--repeats", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["images_per_s"]) == {"h5stream", "pillow (tv)", "h5stream center"}
    assert result["vs_pillow"]["pillow (tv)"] == 1.0 and all(v > 0 for v in result["images_per_s"].values())
    assert bench.main(["--stored", "40", "--size", "24", "--batch", "4", "--repeats", "1"]) == 0
    assert "x pillow" in capsys.readouterr().out


def test_boxes_for_rows_of_different_sizes_are_each_rows_own():
    rng = np.random.default_rng(9)
    heights, widths = rng.integers(4, 300, 500), rng.integers(4, 300, 500)
    heights[:50], widths[:50] = 10, 200  # strips: the fallback among ordinary rows
    rows = np.arange(7000, 7500)
    boxes = crops.random_resized_boxes(1, 0, rows, heights, widths, (0.08, 1.0), (3 / 4, 4 / 3))
    for i in range(500):
        alone = crops.random_resized_boxes(1, 0, rows[i:i + 1], int(heights[i]), int(widths[i]), (0.08, 1.0),
                                           (3 / 4, 4 / 3))
        assert np.array_equal(boxes[i], alone[0]), i
    assert any(tuple(b) == crops.fallback_box(10, 200, (3 / 4, 4 / 3)) for b in boxes[:50])
