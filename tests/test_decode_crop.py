"""Encoded rows with Augment(output_size=...): each row decoded at the reduced scale its crop needs, then cropped and
resized; the same batches whatever runs them (workers=0 or 2, a feeder, a resumed stream), close to decoding in
full, on real files."""

from __future__ import annotations

import numpy as np
import pytest

import h5stream
from h5stream import ImageDecodeError
from h5stream.augment.crop import center_geometry, random_resized_boxes, reduced_scale
from h5stream.augment.decode_crop import box_at_scale
from h5stream.store.encoded import EncodedRows
from h5stream.store.jpeg import decode

SIDE = 96
ROWS = 24
OUT = (16, 16)


def smooth_image(k: int) -> np.ndarray:
    """A smooth RGB image (gradients and a slow wave): what a JPEG keeps well."""
    y, x = np.mgrid[0:SIDE, 0:SIDE].astype(np.float64) / SIDE
    phase = k * 0.7
    channels = [128 + 100 * np.sin(2 * np.pi * (x + phase) * 1.3) * np.cos(2 * np.pi * y * 0.8),
                255 * x * (1 - y) if k % 2 else 255 * y,
                128 + 90 * np.cos(2 * np.pi * (x * y + phase))]
    return np.clip(np.stack(channels, axis=-1), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """24 smooth 96x96x3 rows stored as JPEG q95, in blocks of 8."""
    import cv2

    from h5stream.store.writer import StoreWriter

    rows = [cv2.imencode(".jpg", smooth_image(k), [cv2.IMWRITE_JPEG_QUALITY, 95])[1].tobytes() for k in range(ROWS)]
    path = str(tmp_path_factory.mktemp("decodecrop") / "s.h5")
    with StoreWriter.create(path, image_shape=(SIDE, SIDE, 3), class_names=["a", "b"], block_rows=8,
                            encoding="jpeg") as w:
        w.append(EncodedRows.from_bytes(rows), np.arange(ROWS) % 2, [f"r{i}" for i in range(ROWS)])
    return path, rows


def streamed(path, **kw) -> tuple[np.ndarray, np.ndarray]:
    with h5stream.open(path, batch_size=5, seed=9, **kw) as s:
        order = s.epoch_order(0)
        xs = [np.array(x) for x, _ in s]
    return np.concatenate(xs), order


def test_a_box_at_the_reduced_scale_stays_at_least_output_size_and_inside_the_image():
    rng = np.random.default_rng(0)
    for _ in range(3000):
        height, width = (int(v) for v in rng.integers(8, 600, 2))
        oh, ow = (int(v) for v in rng.integers(1, 64, 2))
        h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        top, left = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
        d = reduced_scale(h, w, (oh, ow))
        t, lft, bh, bw = box_at_scale(top, left, h, w, d, height, width)
        assert 0 <= t and t + bh <= -(-height // d) and 0 <= lft and lft + bw <= -(-width // d)
        assert bh >= 1 and bw >= 1
        if d > 1:
            assert bh >= oh and bw >= ow  # the resize still only shrinks
        else:
            assert (t, lft, bh, bw) == (top, left, h, w)


def test_each_row_is_its_box_decoded_at_the_reduced_scale_then_resized(store, no_leaks):
    import cv2

    path, rows = store
    x, order = streamed(path, augment=h5stream.Augment(output_size=OUT))
    boxes = random_resized_boxes(9, 0, order[:len(x)], SIDE, SIDE, (0.08, 1.0), (3 / 4, 4 / 3))
    scales = []
    for i, (row, (top, left, h, w)) in enumerate(zip(order[:len(x)], boxes.tolist())):
        d = reduced_scale(h, w, OUT)
        scales.append(d)
        small = decode(rows[row], (SIDE, SIDE, 3), scale=d)
        t0, t1 = round_half_up(top, d), round_half_up(top + h, d)
        l0, l1 = round_half_up(left, d), round_half_up(left + w, d)
        expected = cv2.resize(small[t0:t1, l0:l1], OUT[::-1], interpolation=cv2.INTER_AREA)
        np.testing.assert_array_equal(x[i], expected)
    assert {2, 4} <= set(scales)  # rows decoded at a half and a quarter of their size


def round_half_up(v: int, d: int) -> int:
    return int(np.floor(v / d + 0.5))


@pytest.mark.parametrize("crop", ["random_resized", "center"])
def test_the_reduced_decode_is_within_a_few_levels_of_decoding_in_full(store, crop, no_leaks):
    path, rows = store
    aug = h5stream.Augment(output_size=OUT, crop=crop)
    x, order = streamed(path, augment=aug)
    full = np.stack([decode(r, (SIDE, SIDE, 3)) for r in rows])
    expected = np.concatenate([aug(full[order[i:i + 5]], seed=9, epoch=0, row_ids=order[i:i + 5])
                               for i in range(0, len(x), 5)])
    diff = np.abs(x.astype(int) - expected.astype(int))
    # Measured: 2.2-2.5 levels on average (16-20 at most over seeds) for the random crops, whose edges move by up to
    # d / 2 stored pixels on the reduced grid; 0.8 (4 at most) for the centre crop, the whole image at 1/4.
    assert diff.mean() < 3.5 and diff.max() < 40
    if crop == "center":  # decoded at 1/4 (96 / 4 = 24 >= the resize's 18): not the full decode's pixels
        assert center_geometry(SIDE, SIDE, OUT, aug.resize)[0] == (18, 18) and diff.mean() > 0


def sharp_image(k: int) -> np.ndarray:
    """Flat rectangles of random colours: sharp edges everywhere."""
    rng = np.random.default_rng(k)
    image = np.zeros((SIDE, SIDE, 3), np.uint8)
    for _ in range(12):
        (y, x), (h, w) = rng.integers(0, SIDE, 2), rng.integers(4, 40, 2)
        image[y:y + h, x:x + w] = rng.integers(0, 256, 3)
    return image


def test_on_sharp_edges_the_reduced_decode_is_close_on_average_but_not_pixel_for_pixel(tmp_path, no_leaks):
    """What docs/design.md says of sharp edges: a few levels on average, most of an edge's contrast on a pixel."""
    import cv2

    from h5stream.store.writer import StoreWriter

    rows = [cv2.imencode(".jpg", sharp_image(k), [cv2.IMWRITE_JPEG_QUALITY, 95])[1].tobytes() for k in range(ROWS)]
    path = str(tmp_path / "sharp.h5")
    with StoreWriter.create(path, image_shape=(SIDE, SIDE, 3), class_names=["a", "b"], block_rows=8,
                            encoding="jpeg") as w:
        w.append(EncodedRows.from_bytes(rows), np.arange(ROWS) % 2, [f"r{i}" for i in range(ROWS)])
    aug = h5stream.Augment(output_size=OUT)
    x, order = streamed(path, augment=aug)
    full = np.stack([decode(r, (SIDE, SIDE, 3)) for r in rows])
    expected = np.concatenate([aug(full[order[i:i + 5]], seed=9, epoch=0, row_ids=order[i:i + 5])
                               for i in range(0, len(x), 5)])
    diff = np.abs(x.astype(int) - expected.astype(int))
    # Measured: 5.3-6.3 levels on average, 118-132 at most over seeds (an edge a fraction of an output pixel away).
    assert diff.mean() < 9 and diff.max() > 40


@pytest.mark.parametrize("crop", ["random_resized", "center"])
def test_the_same_batches_with_0_and_2_workers_a_feeder_and_after_resume(store, crop, no_leaks):
    path, _ = store
    kw = dict(output_size=OUT, crop=crop, rescale=1 / 255)
    if crop == "random_resized":
        kw.update(horizontal_flip=True)
    aug = h5stream.Augment(**kw)
    inline, _ = streamed(path, augment=aug)
    pooled, _ = streamed(path, augment=aug, workers=2)
    fed, _ = streamed(path, augment=aug, workers=1, feeder=True)
    np.testing.assert_array_equal(pooled, inline)
    np.testing.assert_array_equal(fed, inline)
    with h5stream.open(path, batch_size=5, seed=9, augment=aug) as s:
        it = iter(s)
        first = [np.array(next(it)[0]) for _ in range(2)]
        state = s.state()
    with h5stream.open(path, batch_size=5, seed=9, augment=aug, resume=state, workers=2) as s:
        rest = [np.array(x) for x, _ in s]
    np.testing.assert_array_equal(np.concatenate(first + rest), inline)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_row_that_does_not_decode_is_an_error_naming_the_row(tmp_path, workers, no_leaks):
    from h5stream.store.writer import StoreWriter

    import cv2

    good = [cv2.imencode(".jpg", smooth_image(k))[1].tobytes() for k in range(8)]
    rows = good[:5] + [good[5][:40] + b"\x00" * 300] + good[6:]
    path = str(tmp_path / "d.h5")
    with StoreWriter.create(path, image_shape=(SIDE, SIDE, 3), class_names=["a"], block_rows=4,
                            encoding="jpeg") as w:
        w.append(EncodedRows.from_bytes(rows), np.zeros(8, int), [f"r{i}" for i in range(8)])
    aug = h5stream.Augment(output_size=OUT)
    with h5stream.open(path, batch_size=2, seed=0, workers=workers, shuffle=False, augment=aug) as s:
        with pytest.raises(ImageDecodeError, match=rf"{path}: row 5: its stored JPEG does not decode"):
            [None for _ in s]


def test_rows_the_reader_decoded_already_are_cropped_at_full_size(tmp_path, no_leaks):
    """8x8 noise: each JPEG is larger than its 192-byte row, so the reader decodes it into its place (length -1)."""
    import cv2

    from h5stream.store.writer import StoreWriter

    rng = np.random.default_rng(2)
    pixels = rng.integers(0, 256, (10, 8, 8, 3), dtype=np.uint8)
    rows = [cv2.imencode(".jpg", p)[1].tobytes() for p in pixels]
    assert min(len(r) for r in rows) > 8 * 8 * 3
    path = str(tmp_path / "tiny.h5")
    with StoreWriter.create(path, image_shape=(8, 8, 3), class_names=["a"], block_rows=4, encoding="jpeg") as w:
        w.append(EncodedRows.from_bytes(rows), np.zeros(10, int), [f"r{i}" for i in range(10)])
    aug = h5stream.Augment(output_size=(4, 4), horizontal_flip=True)
    full = np.stack([decode(r, (8, 8, 3)) for r in rows])
    for workers in (0, 2):
        x, order = streamed(path, augment=aug, workers=workers)
        expected = np.concatenate([aug(full[order[i:i + 5]], seed=9, epoch=0, row_ids=order[i:i + 5])
                                   for i in range(0, len(x), 5)])
        np.testing.assert_array_equal(x, expected)
