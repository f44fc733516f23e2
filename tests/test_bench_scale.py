"""Smoke test of the scale benchmark on a tiny store: written by h5stream.write, measured under both verify_reads
settings, and reused by a second run with --keep."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np

from benchmarks import scale
from h5stream.store import schema
from h5stream.store.progress import WRITER_SOURCE


def test_bench_scale_writes_with_h5stream_write_and_reuses_kept_stores(tmp_path, capsys):
    argv = ["--rows", "20K", "--steady", "3", "--dir", str(tmp_path), "--keep", "--json"]
    assert scale.main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert [(r["rows"], r["verify_reads"]) for r in first["results"]] == [(20_000, "once"), (20_000, "off")]
    assert all("error" not in r and r["write_s"] > 0 and r["first_s"] > 0 for r in first["results"])
    path = os.path.join(tmp_path, "h5stream-scale", "scale-20000.h5")
    with h5py.File(path, "r") as f:
        assert json.loads(f.attrs[schema.ATTR_INGEST_SOURCE])["src"] == WRITER_SOURCE  # the public writer's record
        rows = int(f.attrs[schema.ATTR_COMMITTED])
        np.testing.assert_array_equal(f[schema.IMAGES][:rows], scale.TiledImages(rows)[:rows])
        np.testing.assert_array_equal(f[schema.LABELS][:rows], np.arange(rows) * 10 // rows)  # class-sorted
    assert scale.main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert all(r["write_s"] is None for r in again["results"])  # the kept store, not written again
