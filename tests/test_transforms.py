"""Augment: determinism from (seed, epoch, row), each parameter's effect, dtype rules, validation, feature stats."""

from __future__ import annotations

import pickle

import h5py
import numpy as np
import pytest

import h5stream
from h5stream.augment import PRESETS, Augment, apply_affine_transform, compute_feature_stats, rng
from h5stream.errors import ConfigError
from h5stream.store.writer import StoreWriter, write_arrays


def invert(image):
    """A picklable preprocessing_function (module level), as workers need."""
    return 255.0 - image


def boom(image):
    raise ZeroDivisionError("boom in preprocessing_function")


def batch(n=12, h=24, w=20, c=3, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, c), dtype=np.uint8)


# ------------------------------------------------------------------ determinism


@pytest.mark.parametrize("aug", [Augment.preset("standard"), Augment.preset("standard", fill_mode="wrap",
                                 brightness_range=(0.5, 1.5), vertical_flip=True, shear_range=15, rescale=1 / 255)])
def test_same_row_same_output_whatever_the_batch(aug):
    images = batch(16)
    rows = np.arange(100, 116, dtype=np.int64)
    full = aug(images, seed=7, epoch=3, row_ids=rows)
    perm = np.random.default_rng(1).permutation(16)
    shuffled = aug(images[perm], seed=7, epoch=3, row_ids=rows[perm])
    np.testing.assert_array_equal(shuffled, full[perm])
    for lo, hi in ((0, 1), (3, 9), (9, 16)):  # sub-batches of any size give the same rows
        np.testing.assert_array_equal(aug(images[lo:hi], seed=7, epoch=3, row_ids=rows[lo:hi]), full[lo:hi])
    # and a fresh, unpickled copy (a worker process) agrees
    clone = pickle.loads(pickle.dumps(aug))
    np.testing.assert_array_equal(clone(images, seed=7, epoch=3, row_ids=rows), full)


def test_same_row_same_output_whatever_the_batch_at_full_size():
    """The fast path (RGBA groups, per-image edge padding) keeps a row's output independent of its batch."""
    aug = Augment.preset("standard")
    images = batch(11, 96, 96)
    rows = np.arange(500, 511, dtype=np.int64)
    full = aug(images, seed=3, epoch=1, row_ids=rows)
    for lo, hi in ((0, 1), (2, 7), (7, 11)):
        np.testing.assert_array_equal(aug(images[lo:hi], seed=3, epoch=1, row_ids=rows[lo:hi]), full[lo:hi])
    perm = np.random.default_rng(2).permutation(11)
    np.testing.assert_array_equal(aug(images[perm], seed=3, epoch=1, row_ids=rows[perm]), full[perm])


def test_seed_epoch_and_row_all_matter():
    aug = Augment.preset("standard")
    images = np.repeat(batch(1), 8, axis=0)  # identical pixels: only the keys differ
    rows = np.arange(8)
    base = aug(images, seed=0, epoch=0, row_ids=rows)
    assert len({base[i].tobytes() for i in range(8)}) == 8  # different rows -> different draws
    assert not np.array_equal(base, aug(images, seed=1, epoch=0, row_ids=rows))
    assert not np.array_equal(base, aug(images, seed=0, epoch=1, row_ids=rows))
    np.testing.assert_array_equal(base, aug(images, seed=0, epoch=0, row_ids=rows))


def test_rng_draws_are_uniform_and_keyed():
    keys = rng.sample_keys(5, 2, np.arange(20000))
    u = rng.uniform(keys, rng.STREAM_THETA, -3.0, 3.0)
    assert u.min() >= -3.0 and u.max() < 3.0 and abs(u.mean()) < 0.1
    assert abs(np.corrcoef(u, rng.uniform(keys, rng.STREAM_SHEAR))[0, 1]) < 0.05
    np.testing.assert_array_equal(rng.sample_keys(5, 2, [7, 3]), keys[[7, 3]])
    counts = np.bincount(rng.integers(keys, 1, 4), minlength=4)
    assert counts.min() > 4500


def test_rng_draws_follow_the_documented_chain():
    # The reproducibility contract: unit = splitmix64(key ^ splitmix64(stream)) >> 11, scaled by 2**-53,
    # whether one stream is hashed at a time or all of them together (as Augment.draw does).
    keys = rng.sample_keys(-1, 3, np.array([0, 1, 2**40, 12345]))
    for stream in rng.ALL_STREAMS:
        salt = rng.splitmix64(np.array([stream], dtype=np.uint64))
        expected = (rng.splitmix64(keys ^ salt) >> np.uint64(11)).astype(np.float64) * 2.0**-53
        np.testing.assert_array_equal(rng.uniform(keys, stream), expected)
        np.testing.assert_array_equal(rng.units(keys, rng.ALL_STREAMS)[rng.ALL_STREAMS.index(stream)], expected)
    draws = rng.Draws(keys, rng.ALL_STREAMS)
    np.testing.assert_array_equal(draws.coin(rng.STREAM_FLIP_H), rng.coin(keys, rng.STREAM_FLIP_H))
    np.testing.assert_array_equal(draws.integers(rng.STREAM_SHIFT_X, 7), rng.integers(keys, rng.STREAM_SHIFT_X, 7))


# ------------------------------------------------------------------ parameters


def test_horizontal_and_vertical_flip_flip():
    images = batch(32)
    rows = np.arange(32)
    h = Augment(horizontal_flip=True)(images, seed=0, epoch=0, row_ids=rows)
    flipped = [np.array_equal(h[i], images[i, :, ::-1]) for i in range(32)]
    kept = [np.array_equal(h[i], images[i]) for i in range(32)]
    assert all(f or k for f, k in zip(flipped, kept)) and 5 < sum(flipped) < 27
    v = Augment(vertical_flip=True)(images, seed=0, epoch=0, row_ids=rows)
    vflipped = [np.array_equal(v[i], images[i, ::-1]) for i in range(32)]
    assert all(f or np.array_equal(v[i], images[i]) for i, f in enumerate(vflipped)) and 5 < sum(vflipped) < 27


def test_flip_folded_into_the_warp_equals_warp_then_flip():
    aug = Augment(rotation_range=30, horizontal_flip=True, vertical_flip=True)
    images, rows = batch(16, 32, 32), np.arange(16)
    out = aug(images, seed=3, epoch=0, row_ids=rows)
    p = aug.draw(3, 0, rows, 32, 32)
    assert p["flip_horizontal"].any() and p["flip_vertical"].any()
    for i in range(16):
        ref = apply_affine_transform(images[i], theta=p["theta"][i])
        if p["flip_horizontal"][i]:
            ref = ref[:, ::-1]
        if p["flip_vertical"][i]:
            ref = ref[::-1]
        assert np.abs(out[i].astype(int) - ref).max() <= 1


def test_integer_shift_moves_content_by_whole_pixels():
    aug = Augment(width_shift_range=4, height_shift_range=3)  # ints: pixels, Keras' choice semantics
    images, rows = batch(20, 30, 40), np.arange(20)
    out = aug(images, seed=0, epoch=0, row_ids=rows)
    p = aug.draw(0, 0, rows, 30, 40)
    assert set(np.abs(p["tx"]).astype(int)) <= {0, 1, 2, 3} and set(np.abs(p["ty"]).astype(int)) <= {0, 1, 2}
    assert np.abs(p["tx"]).max() > 0
    for i in range(20):
        tx, ty = int(p["tx"][i]), int(p["ty"][i])
        # inverse map: output (r, c) samples source (r + ty, c + tx): content moves by (-ty, -tx)
        np.testing.assert_array_equal(out[i, 3:-3, 4:-4], images[i, 3 + ty : 27 + ty, 4 + tx : 36 + tx])


def test_shift_units_follow_keras():
    rows = np.arange(4000)
    frac = Augment(width_shift_range=0.25, height_shift_range=0.5).draw(0, 0, rows, 20, 40)
    assert 9 < np.abs(frac["tx"]).max() <= 10 and 9 < np.abs(frac["ty"]).max() <= 10  # 0.25*40, 0.5*20
    pixels = Augment(width_shift_range=6.0).draw(0, 0, rows, 20, 40)
    assert 5.9 < np.abs(pixels["tx"]).max() <= 6.0 and not np.all(pixels["tx"] == np.round(pixels["tx"]))
    choice = Augment(width_shift_range=[0.1, 0.2]).draw(0, 0, rows, 20, 40)
    assert set(np.abs(choice["tx"]).round(6)) == {4.0, 8.0}


def test_zoom_range_float_and_pair():
    rows = np.arange(4000)
    p = Augment(zoom_range=0.2).draw(0, 0, rows, 8, 8)
    assert 0.8 <= p["zx"].min() < 0.82 and 1.18 < p["zy"].max() <= 1.2
    q = Augment(zoom_range=[0.5, 0.6]).draw(0, 0, rows, 8, 8)
    assert 0.5 <= q["zx"].min() and q["zx"].max() < 0.6
    assert Augment(zoom_range=[0.8, 1]).zoom_range == (0.8, 1.0)


def test_channel_shift_adds_and_clips_to_the_image_range():
    images, rows = batch(16, 10, 10), np.arange(16)
    images[:, 0, 0] = 30  # pin min and max so the clip bounds are known
    images[:, 0, 1] = 200
    images = np.clip(images, 30, 200)
    aug = Augment(channel_shift_range=80)
    out = aug(images, seed=0, epoch=0, row_ids=rows)
    s = np.rint(aug.draw(0, 0, rows, 10, 10)["channel_shift_intensity"]).astype(int)
    assert s.min() < -20 and s.max() > 20
    for i in range(16):
        np.testing.assert_array_equal(out[i], np.clip(images[i].astype(int) + s[i], 30, 200))


@pytest.mark.parametrize("seed", range(4))
def test_channel_shift_arithmetic_equals_clip_for_every_shift(seed):
    """shift_into's min/max rewrite of clip(x + s, min, max), for every shift including the all-clipped ends."""
    import cv2

    from h5stream.augment.pixels import shift_into

    rs = np.random.default_rng(seed)
    lo, hi = sorted(rs.integers(0, 256, 2))
    image = rs.integers(lo, hi + 1, (7, 15), dtype=np.uint8)
    for shift in [s for s in range(-256, 257) if s]:
        got = image.copy()
        shift_into(cv2, got, shift)
        want = np.clip(image.astype(int) + shift, image.min(), image.max())
        np.testing.assert_array_equal(got, want, err_msg=f"shift {shift}")


def test_fast_path_equals_the_general_path_at_full_size():
    """128x128 RGB, fill nearest, uint8 out: the batched fast path (two conversion groups, the second partial)
    gives the pixels of the per-image path that float32 output takes."""
    from h5stream.augment.pixels import group_size

    n = group_size(128, 128) + 4
    rs = np.random.default_rng(3)
    images = rs.integers(0, 256, (n, 128, 128, 3), dtype=np.uint8)
    images[::3] //= 4  # dark images: the shift clips to a small max
    rows = np.arange(1000, 1000 + n)
    fast = Augment.preset("standard", channel_shift_range=60)(images, seed=5, epoch=1, row_ids=rows)
    general = Augment.preset("standard", channel_shift_range=60, dtype="float32")(images, seed=5, epoch=1, row_ids=rows)
    np.testing.assert_array_equal(fast, general.astype(np.uint8))
    assert not np.array_equal(fast[0], images[0])


def test_brightness_scales_like_pil():
    images, rows = batch(8, 10, 10), np.arange(8)
    aug = Augment(brightness_range=(0.3, 1.8))
    out = aug(images, seed=0, epoch=0, row_ids=rows)
    b = aug.draw(0, 0, rows, 10, 10)["brightness"]
    for i in range(8):
        ref = np.clip(np.floor(images[i].astype(np.float32) * np.float32(b[i])), 0, 255)
        np.testing.assert_array_equal(out[i], ref)


def test_constant_fill_paints_cval_outside():
    images = np.full((2, 32, 32, 3), 9, np.uint8)
    out = Augment(rotation_range=45, zoom_range=(1.3, 1.3), fill_mode="constant", cval=200)(
        images, seed=0, epoch=0, row_ids=[0, 1]
    )
    assert set(np.unique(out)) == {9, 200}
    assert (out[:, 16, 16] == 9).all()


def test_rescale_and_output_dtype():
    images, rows = batch(4), np.arange(4)
    out = Augment(rescale=1 / 255)(images, seed=0, epoch=0, row_ids=rows)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, images / 255.0, rtol=1e-6)
    assert Augment(rescale=2.0, dtype="float64")(images, seed=0, epoch=0, row_ids=rows).dtype == np.float64
    half = Augment(dtype=np.float16)(images, seed=0, epoch=0, row_ids=rows)
    assert half.dtype == np.float16 and np.array_equal(half, images)


def test_output_dtype_rules():
    assert Augment().output_dtype() == np.uint8
    assert Augment.preset("standard").output_dtype() == np.uint8
    assert Augment(brightness_range=(0.5, 1.5)).output_dtype() == np.uint8
    for kwargs in (dict(rescale=1 / 255), dict(samplewise_center=True), dict(featurewise_center=True),
                   dict(preprocessing_function=invert)):
        assert Augment(**kwargs).output_dtype() == np.float32
    assert Augment(rescale=0.5, dtype="float16").output_dtype() == np.float16
    assert Augment(dtype="float32").output_dtype() == np.float32


def test_samplewise_normalisation():
    images, rows = batch(6), np.arange(6)
    out = Augment(samplewise_std_normalization=True, rescale=1 / 255)(images, seed=0, epoch=0, row_ids=rows)
    np.testing.assert_allclose(out.mean(axis=(1, 2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(out.std(axis=(1, 2, 3)), 1, atol=1e-4)
    centred = Augment(samplewise_center=True)(images, seed=0, epoch=0, row_ids=rows)
    ref = images - images.mean(axis=(1, 2, 3), keepdims=True)
    np.testing.assert_allclose(centred, ref, atol=1e-3)


def test_featurewise_normalisation_arithmetic():
    images, rows = batch(6), np.arange(6)
    aug = Augment(featurewise_std_normalization=True, rescale=1 / 255)
    assert aug.featurewise_center and aug.needs_feature_stats
    with pytest.raises(ConfigError, match="with_feature_stats"):
        aug(images, seed=0, epoch=0, row_ids=rows)
    mean, std = np.array([10.0, 100.0, 200.0]), np.array([5.0, 50.0, 25.0])
    ready = aug.with_feature_stats(mean, std)
    assert not ready.needs_feature_stats and aug.needs_feature_stats  # the original is unchanged
    out = ready(images, seed=0, epoch=0, row_ids=rows)
    ref = (images / 255.0 - mean / 255.0) / (std / 255.0 + 1e-6)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ConfigError, match="channels"):
        Augment(featurewise_center=True).with_feature_stats([1.0], [1.0])(images, seed=0, epoch=0, row_ids=rows)


def test_preprocessing_function_applied_and_picklable():
    images, rows = batch(5), np.arange(5)
    aug = Augment(preprocessing_function=invert, rescale=0.5)
    out = aug(images, seed=0, epoch=0, row_ids=rows)
    np.testing.assert_allclose(out, (255.0 - images) * 0.5)  # Keras: preprocessing_function before rescale
    aug.ensure_picklable()
    clone = pickle.loads(pickle.dumps(aug))
    np.testing.assert_array_equal(clone(images, seed=0, epoch=0, row_ids=rows), out)
    with pytest.raises(ConfigError, match="module-level"):
        Augment(preprocessing_function=lambda x: x).ensure_picklable()
    with pytest.raises(ZeroDivisionError, match="boom"):
        Augment(preprocessing_function=boom)(images, seed=0, epoch=0, row_ids=rows)
    with pytest.raises(ConfigError, match="keep the shape"):
        Augment(preprocessing_function=np.ravel)(images, seed=0, epoch=0, row_ids=rows)


@pytest.mark.parametrize("channels", [1, 4, 5])
def test_any_channel_count(channels):
    images, rows = batch(4, 20, 20, channels), np.arange(4)
    aug = Augment(rotation_range=20, channel_shift_range=10)
    out = aug(images, seed=0, epoch=0, row_ids=rows)
    assert out.shape == images.shape
    p = aug.draw(0, 0, rows, 20, 20)
    ref = apply_affine_transform(images[0], theta=p["theta"][0])
    assert np.abs(out[0].astype(int) - ref).max() <= abs(np.rint(p["channel_shift_intensity"][0])) + 1


def test_out_buffer_is_filled_and_validated():
    images, rows = batch(4), np.arange(4)
    aug = Augment.preset("standard")
    out = np.empty_like(images)
    assert aug(images, seed=1, epoch=0, row_ids=rows, out=out) is out
    np.testing.assert_array_equal(out, aug(images, seed=1, epoch=0, row_ids=rows))
    with pytest.raises(ConfigError, match="out must be"):
        aug(images, seed=1, epoch=0, row_ids=rows, out=np.empty(images.shape, np.float32))
    with pytest.raises(ConfigError, match="row_ids"):
        aug(images, seed=1, epoch=0, row_ids=rows[:3])
    with pytest.raises(ConfigError, match="uint8"):
        aug(images.astype(np.float32), seed=1, epoch=0, row_ids=rows)
    assert aug(images[:0], seed=1, epoch=0, row_ids=rows[:0]).shape == (0,) + images.shape[1:]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rotation_range=-1), "rotation_range"),
        (dict(width_shift_range="0.1"), "width_shift_range"),
        (dict(height_shift_range=[]), "height_shift_range"),
        (dict(width_shift_range=True), "width_shift_range"),
        (dict(zoom_range=1.5), "zoom factors"),
        (dict(zoom_range=[1.2, 0.8]), "zoom factors"),
        (dict(zoom_range=[1, 2, 3]), "zoom_range"),
        (dict(brightness_range=0.5), "brightness_range"),
        (dict(brightness_range=(1.5, 0.5)), "lower <= upper"),
        (dict(channel_shift_range=float("nan")), "finite"),
        (dict(fill_mode="mirror"), "constant, nearest, reflect, wrap"),
        (dict(cval=300), "cval"),
        (dict(horizontal_flip="yes"), "True or False"),
        (dict(preprocessing_function=3), "not callable"),
        (dict(dtype="int32"), "dtype"),
        (dict(dtype="uint8", rescale=1 / 255), "produce floats"),
    ],
)
def test_bad_parameters_raise_config_error(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Augment(**kwargs)


def test_presets_and_public_names():
    std = Augment.preset("standard")
    parameters = (std.rotation_range, std.width_shift_range, std.zoom_range, std.channel_shift_range)
    assert parameters == (45.0, 0.1, (0.8, 1.0), 20.0)
    assert std.horizontal_flip and std.fill_mode == "nearest" and "standard" in PRESETS
    assert Augment.preset("standard", rescale=1 / 255).rescale == pytest.approx(1 / 255)
    with pytest.raises(ConfigError, match="standard"):
        Augment.preset("nope")
    assert h5stream.Augment is Augment
    with pytest.raises(AttributeError):
        std.rotation_range = 3  # immutable


def test_apply_affine_transform_validation():
    x = batch(1)[0]
    np.testing.assert_array_equal(apply_affine_transform(x), x)
    with pytest.raises(ConfigError, match="order"):
        apply_affine_transform(x, theta=3, order=3)
    with pytest.raises(ConfigError, match="H x W x C"):
        apply_affine_transform(x[..., 0], theta=3)


# ------------------------------------------------------------------ featurewise statistics


def test_compute_feature_stats_streams_never_writes_and_follows_the_file(tmp_path):
    path = tmp_path / "s.h5"
    images = batch(37, 8, 6, 3, seed=4)
    write_arrays(path, images, np.zeros(37, np.int64), block_rows=8)
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    mean, std = compute_feature_stats(path, block_rows=5)
    np.testing.assert_allclose(mean, images.reshape(-1, 3).mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(std, images.reshape(-1, 3).std(axis=0), rtol=1e-12)
    part = compute_feature_stats(path, rows=(3, 20))
    np.testing.assert_allclose(part[0], images[3:20].reshape(-1, 3).mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(part[1], images[3:20].reshape(-1, 3).std(axis=0), rtol=1e-12)
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before  # reading never writes the store
    with h5py.File(path, "r") as f:
        assert not any(name.startswith("feature") for name in f.attrs)
    with pytest.raises(ConfigError, match="rows"):
        compute_feature_stats(path, rows=(20, 20))
    # new committed rows change the file, so the statistics are computed afresh
    extra = np.full((3, 8, 6, 3), 255, np.uint8)
    with StoreWriter.open_append(path) as w:
        w.append(extra, np.zeros(3, np.int64), ["a", "b", "c"])
        w.commit()
    both = np.concatenate([images, extra])
    mean2, std2 = compute_feature_stats(path)
    np.testing.assert_allclose(mean2, both.reshape(-1, 3).mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(std2, both.reshape(-1, 3).std(axis=0), rtol=1e-12)
