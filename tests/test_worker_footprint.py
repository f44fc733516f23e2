"""What an augment worker process costs: the imports it needs and no more, within the plan's per-worker figure."""

from __future__ import annotations

import json

import numpy as np
import psutil
import pytest

from h5stream.augment import PRESETS, Augment
from h5stream.augment.pool import WORKER_OVERHEAD_BYTES, WorkerPool
from h5stream.shm import SharedArray, new_prefix
from worker_probe import ReportModules

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_an_augment_worker_imports_no_hdf5_and_fits_its_share_of_the_budget(tmp_path):
    report = tmp_path / "modules.json"
    transform = ReportModules(Augment(**PRESETS["standard"]), str(report))
    rows = 4
    with SharedArray.create((rows, 32, 32, 3), np.uint8, new_prefix()) as src:
        src.array[...] = np.arange(src.array.size, dtype=np.int64).reshape(src.array.shape) % 251
        with WorkerPool(transform, [src.spec], workers=1, batch_rows=rows, n_slots=1) as pool:
            for epoch in (0, -1):  # the second task runs the transform again (OpenCV loaded) and reports
                pool.submit(0, np.arange(rows), np.arange(rows), epoch=epoch, seed=0, timeout_s=60)
                pool.take(60)
            private = psutil.Process(pool.pids[0]).memory_full_info().uss
    modules = json.loads(report.read_text())
    assert "cv2" in modules and "numpy" in modules  # what the transform needs
    assert not [m for m in modules if m.split(".")[0] in ("h5py", "tables", "psutil", "tqdm", "PIL")], modules
    # Buffers are a few KiB here: what the worker holds privately is its fixed cost.
    assert 0 < private <= WORKER_OVERHEAD_BYTES, f"{private / 2**20:.1f} MiB"
