"""The part ingest on a real Dask cluster (``dask.distributed.LocalCluster``, 2 worker processes):
examples/ingest_parts_dask.py writes the parts and their manifest, and the manifest streams as one dataset."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import h5stream
from h5stream.store.meta import read_meta

pytest.importorskip("distributed")
pytestmark = pytest.mark.usefixtures("no_leaks")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _example():
    spec = importlib.util.spec_from_file_location("ingest_parts_dask",
                                                  os.path.join(ROOT, "examples", "ingest_parts_dask.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_parts_ingested_on_a_local_dask_cluster_stream_as_one(class_src, tmp_path, monkeypatch):
    from dask.distributed import Client, LocalCluster

    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))  # workers run this tree
    root, written = class_src
    example = _example()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        assert len(client.scheduler_info()["workers"]) == 2
        manifest = example.ingest_parts(client, root, str(tmp_path / "parts"), 3, ["--size", "8"])
        again = example.ingest_parts(client, root, str(tmp_path / "parts"), 3, ["--size", "8"])  # a rerun: no-op
    assert again == manifest
    with h5stream.open(manifest, batch_size=4, seed=0) as s:
        assert s.rows == len(written)
        assert sorted(s.file_paths) == sorted(rel for rel, _ in written)
        labels = np.concatenate([y for _, y in s])
    assert sorted(labels.tolist()) == sorted(label for _, label in written)
    assert [read_meta(str(tmp_path / "parts" / f"part-{i}.h5")).part.label for i in range(3)] == ["0/3", "1/3", "2/3"]


def test_the_dask_example_runs_as_its_docstring_shows(tmp_path):
    """``python examples/ingest_parts_dask.py --quick --work DIR``: its own cluster, parts, manifest, one epoch."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "ingest_parts_dask.py"), "--quick",
                           "--work", str(tmp_path), "--parts", "3"],
                          env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    manifest = tmp_path / "parts" / "parts.json"
    assert f"{manifest}: 3 parts, one epoch of 24 rows streamed as one dataset" in proc.stdout
    assert sorted(os.listdir(tmp_path / "parts")) == ["part-0.h5", "part-1.h5", "part-2.h5", "parts.json"]
