"""What an augment worker process costs: the imports it needs and no more, within the plan's figures for it.

Measured from a fresh interpreter, so that what the test process already loaded (OpenCV, when another test
augmented inline) does not hide what the workers load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from h5stream.streaming.budget import TRANSFORM_LIBRARY_BYTES, WORKER_OVERHEAD_BYTES

pytestmark = pytest.mark.usefixtures("no_leaks")

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = r"""
import json, sys
import numpy as np, psutil
from h5stream.augment import PRESETS, Augment
from h5stream.augment.pool import WorkerPool
from h5stream.memory.shm import SharedArray, new_prefix
from worker_probe import ReportModules

rows, shape, report = 16, (96, 96, 3), sys.argv[1]
parent_files = {m.path for m in psutil.Process().memory_maps(grouped=True)}
with SharedArray.create((rows, *shape), np.uint8, new_prefix()) as src:
    src.array[...] = np.arange(src.array.size, dtype=np.int64).reshape(src.array.shape) % 251
    with WorkerPool(ReportModules(Augment(**PRESETS["standard"]), report), [src.spec], workers=1, batch_rows=rows,
                    n_slots=1) as pool:
        for epoch in (0, 1, -1):  # the transform runs (OpenCV loaded, scratch allocated), then reports
            pool.submit(0, np.arange(rows), np.arange(rows), epoch=epoch, seed=0, timeout_s=60, in_place=True)
            pool.release(pool.get(60).slot)
        # Counted per page whoever else maps it: independent of what else runs on the machine.
        private = shared_code = 0
        for m in psutil.Process(pool.pids[0]).memory_maps(grouped=True):
            if "/dev/shm/" in m.path:
                continue  # the pool's slots: planned on their own
            if m.path.startswith("/") and m.path not in parent_files:
                shared_code += m.rss  # library code only the workers load
            else:
                private += m.private_clean + m.private_dirty
print(json.dumps({"private": private, "shared_code": shared_code}))  # rows transformed in place: no gather buffer
"""


def test_an_augment_worker_imports_no_hdf5_and_fits_the_plans_figures(tmp_path):
    report = tmp_path / "modules.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(report)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    modules = json.loads(report.read_text())
    assert "cv2" in modules and "numpy" in modules  # what the transform needs
    assert not [m for m in modules if m.split(".")[0] in ("h5py", "tables", "psutil", "tqdm", "PIL")], modules
    assert 0 < figures["private"] <= WORKER_OVERHEAD_BYTES, figures
    assert 0 < figures["shared_code"] <= TRANSFORM_LIBRARY_BYTES, figures
