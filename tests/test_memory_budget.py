"""A stream's measured memory stays within its budget: peak PSS of the whole process tree over an epoch.

Each case runs in a fresh interpreter, so what the test process already loaded (OpenCV from another test,
multiprocessing's resource tracker) cannot hide what the stream costs.  The baseline is the tree's memory
before ``open`` (the package imported, the ``Augment`` made); the peak includes the worker processes, the
shared-memory slots, OpenCV loaded by an inline transform and the resource tracker.  With workers the store
is evicted from the page cache first, so the reader reads every fill into the shared input slots (a cached
fill would go to the workers as byte offsets and use less).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")

ROWS, SIDE, BATCH = 4000, 64, 32
SCRIPT = r"""
import gc, json, sys
import h5stream, h5stream.streaming.stream
from h5stream.augment import PRESETS
from h5stream.streaming.planning import plan_stream
from h5stream.measure import ResourceSampler, evict_from_page_cache
from h5stream.store.meta import read_meta

path, workers, augmented, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
direct_io = sys.argv[5] == "1" if len(sys.argv) > 5 else "auto"
augment = h5stream.Augment(**PRESETS["standard"]) if augmented else None
budget = plan_stream(read_meta(path), None, {batch}, augment=augment, workers=workers).min_budget_bytes + extra
fill = None
if "://" in path:  # a URL gets its local file's fill, or the error naming the one that fits beside its client
    try:
        plan_stream(read_meta(path), budget, {batch}, augment=augment, workers=workers, verify_reads="once")
    except h5stream.BudgetError as exc:
        fill = exc.rows_per_fill
if workers:
    evict_from_page_cache(path)
gc.collect()
with ResourceSampler(0.02) as sampler:
    with h5stream.open(path, batch_size={batch}, memory_budget=budget, augment=augment, workers=workers,
                       direct_io=direct_io, rows_per_fill=fill) as s:
        plan, rows = s.plan, 0
        for x, _ in s:
            rows += len(x)
        del x
timeline = sampler.stop()
print(json.dumps({{"budget": budget, "peak": int(timeline.mem_bytes.max() - timeline.mem_bytes[0]), "rows": rows,
                  "rows_per_fill": plan.rows_per_fill, "planned": plan.total_bytes}}))
""".format(batch=BATCH)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """About 48 MiB of rows: several fills at either budget below."""
    path = tmp_path_factory.mktemp("memory") / "m.h5"
    rng = np.random.default_rng(3)
    write_arrays(path, rng.integers(0, 256, (ROWS, SIDE, SIDE, 3), dtype=np.uint8), np.arange(ROWS) % 10,
                 block_rows=64, storage_order="shuffled")
    return str(path)


@pytest.mark.parametrize("extra_mib", [8, 24])
@pytest.mark.parametrize("workers,augmented", [(0, False), (0, True), (2, True), (2, False)])
def test_peak_memory_of_the_process_tree_stays_within_the_budget(store, workers, augmented, extra_mib):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, store, str(workers), str(int(augmented)),
                           str(extra_mib << 20)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["rows"] == ROWS and r["rows_per_fill"] < ROWS  # a whole epoch, over several fills
    assert r["planned"] <= r["budget"]
    assert 0 < r["peak"] <= r["budget"], (f"peak {r['peak'] / 2**20:.1f} MiB over a budget of "
                                          f"{r['budget'] / 2**20:.1f} MiB: {r}")


@pytest.mark.parametrize("workers,augmented", [(0, False), (2, True)])
def test_peak_memory_with_direct_io_stays_within_the_budget(store, workers, augmented):
    """Reading past the page cache adds the direct reads' bounce buffers, which the plan counts."""
    from h5stream.read.source import _direct_refused

    if (reason := _direct_refused(store)) is not None:
        pytest.skip(f"this file system refuses O_DIRECT: {reason}")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, store, str(workers), str(int(augmented)), str(8 << 20), "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["rows"] == ROWS and r["rows_per_fill"] < ROWS and r["planned"] <= r["budget"]
    assert 0 < r["peak"] <= r["budget"], (f"peak {r['peak'] / 2**20:.1f} MiB over a budget of "
                                          f"{r['budget'] / 2**20:.1f} MiB: {r}")


@pytest.mark.parametrize("extra_mib", [8, 24])
def test_peak_memory_of_a_stream_from_a_url_stays_within_the_budget(store, tmp_path, extra_mib):
    """The remote client (its library, connections, responses in flight) is counted too; the server is this
    process, so only the client's memory is in the child's tree."""
    pytest.importorskip("obstore")
    import os

    from remote_servers import RangeServer

    (tmp_path / "www").mkdir()
    os.link(store, tmp_path / "www" / "m.h5")
    server = RangeServer(tmp_path / "www")
    try:
        proc = subprocess.run([sys.executable, "-c", SCRIPT, server.url + "m.h5", "0", "0", str(extra_mib << 20)],
                              capture_output=True, text=True, timeout=120)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["rows"] == ROWS and r["rows_per_fill"] < ROWS and r["planned"] <= r["budget"]
    assert 0 < r["peak"] <= r["budget"], (f"peak {r['peak'] / 2**20:.1f} MiB over a budget of "
                                          f"{r['budget'] / 2**20:.1f} MiB: {r}")


PROCESS_EVENTS = r"""
import sys
import h5py  # imported first: its own import asks `uname -p` (platform.processor), not h5stream's doing
import h5stream

started = []
sys.addaudithook(lambda event, args: started.append((event, str(args)[:200]))
                 if event in ("subprocess.Popen", "os.fork", "os.posix_spawn", "os.exec", "os.spawn") else None)
with h5stream.open(sys.argv[1], batch_size=32, workers=0, verify_reads=True) as s:
    rows = sum(len(x) for x, _ in s)
print(rows, started)
"""


def test_a_stream_without_workers_starts_no_process(store):
    """Finding the C library for ``preadv`` and ``cachestat`` asked ``ldconfig`` in a child process
    (``ctypes.util.find_library``): a vfork'd copy of the training process mid-epoch, which the measured peak
    counted as a second copy of its memory (twice the budget, now and then), and a process more where a job
    may start none.  The C library the interpreter runs on is found without one."""
    proc = subprocess.run([sys.executable, "-c", PROCESS_EVENTS, store], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{ROWS} []", proc.stdout
