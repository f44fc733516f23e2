"""h5stream.write from arrays of many small rows: whole blocks at a time, paths made without a step per row, commits
every few MiB of rows with the default ``commit_rows`` (each commit costs two fsyncs), and ``benchmarks.scale``
writes its stores so."""

from __future__ import annotations

import json

import h5py
import numpy as np

import h5stream
from h5stream.ingest.pywrite import ARRAY_COMMIT_BYTES
from h5stream.store import pathrows, schema
from h5stream.store.progress import WRITER_SOURCE


def test_paths_from_indices_are_the_decimal_strings_of_the_indices():
    rng = np.random.default_rng(3)
    edges = [0, 1, 9, 10, 99, 100, 999_999_999, 1_000_000_000, 4_294_967_295, 4_294_967_296, 10**18 - 1, 10**18,
             2**63 - 1]
    for values in (np.array(edges), rng.integers(0, 2**63 - 1, 500), rng.integers(0, 1000, 500),
                   np.array([], np.int64), np.array([7])):
        rows = pathrows.PathRows.from_indices(values)
        want = pathrows.PathRows.from_bytes(str(int(v)).encode() for v in values)
        assert rows.to_bytes() == want.to_bytes()
        np.testing.assert_array_equal(rows.lengths, want.lengths)
        assert pathrows.digest(rows) == pathrows.digest(want)


def write_history(path) -> list:
    """The writer's record of its last two commits: ``[rows, consumed, skipped]`` each."""
    with h5py.File(path, "r") as f:
        record = json.loads(f.attrs[schema.ATTR_INGEST_SOURCE])
    assert record["src"] == WRITER_SOURCE
    return record["write"]


def test_small_rows_from_arrays_commit_by_bytes_by_default_and_every_commit_rows_when_asked(tmp_path):
    rows = 4 * 1024 + 512
    x = np.random.default_rng(0).integers(0, 256, (rows, 4, 4, 3), dtype=np.uint8)
    y = np.arange(rows) % 10
    assert rows * x[0].nbytes < ARRAY_COMMIT_BYTES
    h5stream.write(tmp_path / "default.h5", (x, y), block_rows=1024)
    h5stream.write(tmp_path / "asked.h5", (x, y), block_rows=1024, commit_rows=1024)
    # the default: 4608 rows of 48 bytes are less than one commit's bytes, so the close's commit is the only one;
    # asked: a commit after each block of 1024 rows, then the close's (the last two are recorded)
    assert write_history(tmp_path / "default.h5") == [[rows, rows, 0]]
    assert write_history(tmp_path / "asked.h5") == [[4096, 4096, 0], [rows, rows, 0]]
    with h5py.File(tmp_path / "default.h5", "r") as a, h5py.File(tmp_path / "asked.h5", "r") as b:
        for name in (schema.IMAGES, schema.LABELS, schema.PATH_ENDS, schema.PATH_BYTES_NODE, schema.CHECKSUMS):
            np.testing.assert_array_equal(a[name][:], b[name][:], err_msg=name)
        index = np.array([int(p) for p in pathrows.stored_bytes(a, 0, rows)])
    np.testing.assert_array_equal(index, np.random.default_rng(0).permutation(rows))  # paths: source indices
