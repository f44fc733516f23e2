"""The cores this process may use, and the worker count that suits them: one answer for every message that
suggests a number of workers (the budget's error and the stream's warning)."""

from __future__ import annotations

import os
import warnings

from h5stream import _optnames as opt


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


def warn_if_more_workers_than_cores(workers: int, stacklevel: int = 4) -> None:
    """Warn (``h5stream.open`` goes on) when worker processes outnumber the cores: each is one core's work, and the
    extra ones only add memory and contention."""
    cores = usable_cores()
    if workers > cores:
        given = opt.setting("workers", workers)
        warnings.warn(f"{given if given.startswith('-') else f'h5stream.open({given})'} on {cores} usable CPU "
                      f"core{'s' if cores > 1 else ''}: the extra workers only cost memory and context switches; "
                      f"{opt.setting('workers', suggested_workers(cores))} "
                      "leaves a core to the training loop", UserWarning, stacklevel=stacklevel)
