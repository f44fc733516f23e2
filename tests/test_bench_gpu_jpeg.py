"""benchmarks.gpu_jpeg: the JPEG store's own bytes as torchvision's folder, every loader measured, table and JSON."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
from PIL import Image

from benchmarks import gpu_jpeg
from h5stream.store import schema

pytestmark = pytest.mark.usefixtures("no_leaks")
torch = pytest.importorskip("torch")


def test_the_exported_folder_holds_each_rows_jpeg_byte_for_byte_under_its_class(tmp_path):
    stores = gpu_jpeg.prepare(str(tmp_path), 16, 40)
    folder = stores["folder"]
    with h5py.File(stores["h5stream jpeg"], "r") as f:
        ends = f[schema.IMAGE_ENDS][:]
        data = f[schema.IMAGE_BYTES][:]
        labels = f[schema.LABELS][:]
        names = json.loads(f.attrs[schema.ATTR_CLASS_NAMES])
    files = sorted((os.path.join(d, n) for d, _, ns in os.walk(folder) for n in ns if n.endswith(".jpg")),
                   key=os.path.basename)
    assert len(files) == len(ends) == 16
    starts = np.concatenate([[0], ends[:-1]])
    for i, path in enumerate(files):
        assert os.path.basename(os.path.dirname(path)) == names[int(labels[i])]
        body = open(path, "rb").read()
        assert body == data[starts[i]:ends[i]].tobytes()
        assert Image.open(io.BytesIO(body)).size == (40, 40)
    # made once: a second call finds the folder whole and writes nothing
    os.remove(files[0])
    assert gpu_jpeg.prepare(str(tmp_path), 16, 40)["folder"] == folder and not os.path.exists(files[0])


@pytest.mark.parametrize("model", [pytest.param("small", marks=pytest.mark.slow), "none"])  # none: the loaders alone
def test_a_small_cpu_run_measures_every_loader_against_torchvision(tmp_path, model):
    # In a process of its own, as a user runs it: torch's optimizer and torchvision import triton, whose LLVM
    # crashes a process that has loaded TensorFlow's (a test worker may have).
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_jpeg", "--device", "cpu", "--model", model,
                           "--photos", "96", "--size", "40", "--crop", "32", "--batch-size", "16", "--steps", "4",
                           "--warmup", "1", "--workers", "1", "--torch-threads", "1", "--rounds", "2", "--data",
                           str(tmp_path), "--json"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    loaders = out["loaders"]
    assert set(loaders) == {"limit", "h5stream jpeg", "h5stream raw", "torchvision"}
    for name in ("h5stream jpeg", "h5stream raw"):
        assert len(loaders[name]["rounds"]) == 2 and loaders[name]["peak_mem_bytes"] is not None
    if importlib.util.find_spec("torchvision") is None:  # not imported here: see above
        assert loaders["torchvision"] == {"skipped": "torchvision is not installed (pip install torchvision)"}
    else:
        assert loaders["torchvision"]["images_per_s"] > 0
        assert out["vs_torchvision"]["h5stream jpeg"]["median"] > 0
    text = gpu_jpeg.format_text(out)
    assert "random resized crops of 32 px" in text and "h5stream jpeg" in text
    # no model, no limit: the rows are the loaders alone
    assert ("\nlimit " in text) == (model != "none")


def test_a_crop_larger_than_the_stored_rows_is_refused_before_anything_is_made(tmp_path):
    with pytest.raises(SystemExit, match="--crop 64: give a crop between 1 and --size"):
        gpu_jpeg.main(["--device", "cpu", "--size", "48", "--crop", "64", "--data", str(tmp_path)])
    assert os.listdir(tmp_path) == []
