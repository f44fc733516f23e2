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


def test_the_url_regime_serves_the_store_over_http_with_the_local_files_batches_and_stops_its_server(tmp_path):
    """``--url http``: the store served by the tests' RangeServer in a process of its own, streamed from its URL with
    the regime's options (default budget, the local window pinned, the disk cache on): the local file's batches;
    the server's process is gone after (the leak check)."""
    pytest.importorskip("obstore")
    from h5stream.store.writer import write_arrays

    x, y, _, _ = quality.digits_dataset(copies=1)
    path = str(tmp_path / "digits_sorted.h5")
    write_arrays(path, x, y, block_rows=32, storage_order="sorted")
    opts = {"batch_size": 32, "memory_budget": "8MiB", "read_unit": None}
    with h5stream.open(path, **opts) as probe:
        fill = probe.plan.rows_per_fill
    url_opts = quality.url_options(opts, fill, str(tmp_path / "cache"))
    with quality.http_served(str(tmp_path)) as url:
        url += "digits_sorted.h5"
        assert quality.same_order(path, url, opts, url_opts, seed=3, epochs=3)
        with h5stream.open(path, **opts, seed=3) as here, h5stream.open(url, **url_opts, seed=3) as there:
            assert there.plan.rows_per_fill == fill < len(x) // 10  # a small window, as the local file's
            for _ in range(2):
                for (a, b), (c, d) in zip(here, there, strict=True):
                    assert np.array_equal(a, c) and np.array_equal(b, d)
    assert any((tmp_path / "cache").iterdir())  # the disk cache was on
