"""The cores this process may use, and the worker count that suits them: one answer for every message that
suggests a number of workers (the budget's error and the stream's warning)."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, which containers and ``taskset`` narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on macOS / Windows
        return os.cpu_count() or 1


def suggested_workers(cores: int) -> int:
    """The most augmenting workers worth starting on ``cores`` cores: one each, less one core left to the training
    loop (at least one worker).  Each worker is a core's work; more only add memory and context switches."""
    return max(1, int(cores) - 1)
