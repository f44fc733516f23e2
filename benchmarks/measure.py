"""Memory of a process tree, for benchmarks: the sum of PSS over a process and its descendants.

A page shared by k processes (shared memory, the same library) counts 1/k in
each, so once in the sum.  :class:`h5stream.measure.ResourceSampler` samples the
same figure over time from a process of its own; this is the one-off reading.
"""

from __future__ import annotations

import psutil


def process_pss_bytes(proc: psutil.Process) -> int:
    """PSS of one process (falls back to RSS where the kernel gives no PSS)."""
    info = proc.memory_full_info()
    return int(getattr(info, "pss", info.rss))


def tree_pss_bytes(pid: int | None = None, exclude_pids: tuple[int, ...] = ()) -> int:
    """Sum of PSS over process ``pid`` (default: this one) and all its descendants.

    Shared pages count once in the sum.  Children that exit while being
    measured, and ``exclude_pids``, are skipped.
    """
    proc = psutil.Process(pid)
    total = process_pss_bytes(proc)
    for child in proc.children(recursive=True):
        if child.pid in exclude_pids:
            continue
        try:
            total += process_pss_bytes(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


