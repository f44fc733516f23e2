"""A signal handler's exception can come at any line of the parent while it starts workers (a trainer's SIGTERM
handler raising SystemExit, an alarm): every worker already started is killed and reaped before it propagates,
none is left unrecorded.  Real spawned processes; the exception is raised at the exact line by a trace hook, as a
signal handler's would be."""

from __future__ import annotations

import multiprocessing.connection
import subprocess
import sys
import textwrap

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


RAISER = textwrap.dedent('''
    import signal, sys, threading
    import psutil
    from h5stream.concurrency import spawn
    from multiprocessing.connection import Connection

    signum = getattr(signal, sys.argv[1])
    if signum == signal.SIGTERM:
        def on_term(signum, frame):  # a trainer's graceful shutdown
            raise SystemExit(3)
        signal.signal(signal.SIGTERM, on_term)

    def trace(frame, event, arg):  # the signal to this thread right after the first worker started
        if frame.f_code is spawn.spawn_workers.__code__ and event == "line":
            procs = frame.f_locals.get("procs") or []
            if procs and procs[0].pid is not None:
                sys.settrace(None)
                signal.pthread_kill(threading.main_thread().ident, signum)  # SIGINT: pending till unblocked
                return None
        return trace

    sys.settrace(trace)
    try:
        spawn.spawn_workers(Connection.recv, [(), ()], name="echo")
        print("no signal", flush=True)
    except (KeyboardInterrupt, SystemExit) as exc:
        print(type(exc).__name__, flush=True)
    from multiprocessing import resource_tracker
    tracker = resource_tracker._resource_tracker._pid  # started by multiprocessing itself, not a worker
    print(sum(c.pid != tracker for c in psutil.Process().children()), flush=True)  # zombies count: unreaped
''')


@pytest.mark.parametrize("signame, raised", [("SIGINT", "KeyboardInterrupt"), ("SIGTERM", "SystemExit")])
def test_a_real_signal_as_workers_start_leaves_no_worker_running(signame, raised):
    """The real signals, to the main thread right after the first worker started: a Ctrl-C, held back while
    workers start and raised as the mask is restored (outside the clean-up, it left both workers running and
    unreaped; and the first spawn's start of multiprocessing's resource tracker unblocked SIGINT mid-start), and
    a SIGTERM handler raising at once."""
    out = subprocess.run([sys.executable, "-c", RAISER, signame], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [raised, "0"], (out.stdout, out.stderr)
