"""The measurement collectors, on real processes, threads and files."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from benchmarks.measure import tree_pss_bytes
from conftest import SESSION_PIDS
from h5stream import measure
from h5stream.measure.sampler import _child_label
from h5stream.errors import StoreNotFoundError

CHILD_MIB = 96
# A child that allocates and touches CHILD_MIB MiB, says so, and holds it until its stdin closes.
CHILD = f"""
import sys, time
buf = bytearray({CHILD_MIB} << 20)
for i in range(0, len(buf), 4096):
    buf[i] = 1
t = time.thread_time()
while time.thread_time() - t < 0.2:  # some CPU for the sampler to see
    pass
print("ready", flush=True)
sys.stdin.read()
"""


def start_child():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"  # blocks until the memory is touched
    return child


def end_child(child):
    child.stdin.close()
    child.wait(timeout=30)
    child.stdout.close()


def test_tree_pss_counts_a_child_process():
    before = tree_pss_bytes()
    child = start_child()
    try:
        during = tree_pss_bytes()
        without = tree_pss_bytes(exclude_pids=(child.pid,))
    finally:
        end_child(child)
    assert during - before > (CHILD_MIB - 16) << 20
    assert abs(without - before) < 32 << 20


def test_sampler_sees_child_memory_and_cpu():
    sampler = measure.ResourceSampler(interval_s=0.05).start()
    child = start_child()
    try:
        timeline = sampler.stop()  # the last sample is taken now, while the child still holds its memory
    finally:
        end_child(child)
    assert timeline.t_s.size >= 2 and np.all(np.diff(timeline.t_s) > 0)
    assert timeline.peak_mem_bytes - timeline.mem_bytes[0] > (CHILD_MIB - 16) << 20
    # multiprocessing's own helpers (a resource tracker left by earlier tests) are labelled "mp-..."; servers that
    # session fixtures started are children too.
    ours = {k: v for k, v in timeline.child_pids.items() if not k.startswith("mp-") and v not in SESSION_PIDS}
    assert list(ours.values()) == [child.pid]
    assert timeline.cpu_seconds(next(iter(ours))) > 0.1
    assert sampler.stop() is timeline  # idempotent


def test_sampler_attributes_cpu_to_threads_by_name():
    done_burning, release = threading.Event(), threading.Event()

    def burn():
        start = time.thread_time()
        while time.thread_time() - start < 0.3:
            pass
        done_burning.set()
        release.wait(timeout=60)  # stays alive until the sampler's last sample

    with measure.ResourceSampler(interval_s=0.05) as sampler:
        worker = threading.Thread(target=burn, name=measure.READER_THREAD)
        worker.start()
        assert done_burning.wait(timeout=60)
        sampler.mark(samples=10)
    release.set()
    worker.join()
    timeline = sampler.timeline
    assert timeline.cpu_seconds(measure.READER_THREAD) > 0.2
    assert measure.CONSUMER in timeline.cpu_pct
    assert list(timeline.cpu_pct)[:2] == [measure.CONSUMER, measure.READER_THREAD]  # stable order for plots


def test_marks_and_rate():
    t = measure.Timeline(
        t_s=np.array([0.0, 1.0]), mem_bytes=np.array([1, 2]),
        mark_t_s=np.linspace(0, 10, 101), marks={"samples": np.linspace(0, 1000, 101)},
    )
    times, per_s = t.rate("samples", window_s=1.0)
    assert times.size == 10
    assert np.allclose(per_s, 100.0)


def test_mark_values_are_recorded_on_the_sampler_clock():
    with measure.ResourceSampler(interval_s=0.05) as sampler:
        sampler.mark(samples=0, queue_depth=1)
        sampler.mark(samples=32)
    tl = sampler.timeline
    assert tl.marks["samples"].tolist() == [0.0, 32.0]
    assert tl.marks["queue_depth"][0] == 1 and np.isnan(tl.marks["queue_depth"][1])
    assert 0 <= tl.mark_t_s[0] <= tl.mark_t_s[1] <= tl.t_s[-1]


def test_peak_rss_high_water_mark_sees_a_short_spike():
    if not measure.reset_peak_rss():
        pytest.skip("no /proc/self/clear_refs on this system")
    before = measure.peak_rss_bytes()
    spike = np.ones(64 << 20, dtype=np.uint8)  # touched: ones, not empty
    del spike
    assert measure.peak_rss_bytes() - before > 60 << 20


def _filesystem(path):
    path, best, fstype = os.path.realpath(path), "", None
    with open("/proc/mounts") as f:
        for line in f:
            mount, kind = line.split()[1:3]
            if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                best, fstype = mount, kind
    return fstype


def test_evict_from_page_cache(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(8 << 20))
    with open(path, "rb") as f:
        f.read()
    before = measure.cached_fraction(path)
    if before is None:
        pytest.skip("mincore is not available here")
    if _filesystem(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip("the page cache of tmpfs cannot be dropped")
    assert before > 0.9
    assert measure.evict_from_page_cache(path) is True
    assert measure.cached_fraction(path) < 0.1
    with open(path, "rb") as f:
        f.read()
    assert measure.cached_fraction(path) > 0.9
    with measure.PeriodicEvictor(path, interval_s=3600) as evictor:  # evicts once on start; the thread never ticks
        assert measure.cached_fraction(path) < 0.1
        with open(path, "rb") as f:
            f.read()
        evictor.tick()  # pages read since the last tick stay for now (a reader's read-ahead survives) ...
        assert measure.cached_fraction(path) > 0.9
        evictor.tick()  # ... and go one tick later, as under LRU
        assert measure.cached_fraction(path) < 0.1
    evictor.close()  # idempotent


def test_evict_pages_drops_only_the_given_pages(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(4 << 20))
    with open(path, "rb") as f:
        f.read()
    pages = measure.cached_pages(path)
    if pages is None or _filesystem(tmp_path) in ("tmpfs", "ramfs") or not pages.all():
        pytest.skip("page-cache residency cannot be controlled here")
    drop = np.zeros(pages.size, dtype=bool)
    drop[: pages.size // 2] = True
    assert measure.evict_pages(path, drop) == 1  # one contiguous range
    after = measure.cached_pages(path)
    assert not after[: pages.size // 2].any() and after[pages.size // 2:].all()


def test_evict_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(StoreNotFoundError, match="no such file"):
        measure.evict_from_page_cache(tmp_path / "missing.h5")


def test_child_labels_number_workers_and_name_multiprocessing_helpers():
    taken = {}
    taken["1"] = _child_label("python -c from multiprocessing.resource_tracker import main;main(5)", taken)
    taken["2"] = _child_label("python -c from multiprocessing.spawn import spawn_main; spawn_main()", taken)
    taken["3"] = _child_label("python -c from multiprocessing.spawn import spawn_main; spawn_main()", taken)
    assert taken == {"1": "mp-resource-tracker", "2": "worker-1", "3": "worker-2"}
