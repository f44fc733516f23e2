"""benchmarks.quality's JPEG store: the same training rows, in the same order, decoded close to the raw pixels."""

from __future__ import annotations

import numpy as np
import pytest

import h5stream
from benchmarks import quality

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_the_jpeg_store_holds_the_training_rows_in_order_as_jpeg(tmp_path):
    x, y, _, _ = quality.digits_dataset(copies=1)
    path = str(tmp_path / "digits_jpeg.h5")
    meta = quality.write_jpeg_store(path, x, y, quality=90, block_rows=32, rows_per_write=500)
    assert meta.rows == len(x) and meta.encoded and meta.storage_order == "sorted"
    assert meta.encoded_bytes < x.nbytes / 2
    with h5stream.open(path, batch_size=64, shuffle=False, memory_budget="8MiB") as s:
        xs, ys = zip(*s)
    got, labels = np.concatenate(xs), np.concatenate(ys)
    assert np.array_equal(labels, y)  # every row, class-sorted, its own label
    err = np.abs(got.astype(np.int16) - x.astype(np.int16))
    assert got.shape == x.shape and 0 < err.mean() < 8  # decoded JPEG q90: close to, not equal to, the pixels


def test_the_jpeg_gap_is_per_seed_points_below_the_raw_store_and_their_mean():
    gap = quality.jpeg_gap([0.90, 0.80, 0.70], [0.89, 0.81, 0.70])
    assert gap["per_seed"] == pytest.approx([1.0, -1.0, 0.0])
    assert gap["mean"] == pytest.approx(0.0)
