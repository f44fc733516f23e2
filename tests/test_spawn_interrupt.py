"""A signal handler's exception can come at any line of the parent while it starts workers (a trainer's SIGTERM
handler raising SystemExit, an alarm): every worker already started is killed and reaped before it propagates,
none is left unrecorded.  Real spawned processes; the exception is raised at the exact line by a trace hook, as a
signal handler's would be."""

from __future__ import annotations

import multiprocessing.connection
import sys

import psutil
import pytest
from conftest import new_children

from h5stream.concurrency import spawn

pytestmark = pytest.mark.usefixtures("no_leaks")


class Stop(BaseException):
    """What a SIGTERM handler raises (as SystemExit does: not an Exception)."""


def _raise_after_start(nth: int):
    """A trace function that raises :class:`Stop` in :func:`spawn.spawn_workers` when it reaches, for the
    ``nth`` time, the line right after ``proc.start()`` (that call has returned: the worker runs)."""
    import inspect

    code = spawn.spawn_workers.__code__
    lines, first = inspect.getsourcelines(spawn.spawn_workers)
    target = next(first + i for i, text in enumerate(lines) if text.strip() == "proc.start()") + 1
    seen = [0]

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == target:
            seen[0] += 1
            if seen[0] == nth:
                raise Stop()
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code is code else None
    return tracer


@pytest.mark.parametrize("nth", [1, 2])
def test_an_exception_right_after_a_worker_started_leaves_no_worker_behind(nth):
    before = {p.pid for p in psutil.Process().children()}
    sys.settrace(_raise_after_start(nth))
    try:
        with pytest.raises(Stop):
            spawn.spawn_workers(multiprocessing.connection.Connection.recv, [(), ()], name="test-start")
    finally:
        sys.settrace(None)
    assert [p for p in new_children(before) if p.status() != psutil.STATUS_ZOMBIE] == []
