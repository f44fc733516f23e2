"""Client calls that a Ctrl-C in the main thread interrupts at once.

The client (obstore) blocks in its own runtime until a request succeeds or ``timeout_s`` runs out, and Python
runs a signal handler only between bytecodes: a Ctrl-C during an ``open`` of a URL whose server stopped answering
was raised only once the client gave up, many seconds later.  :func:`interruptible` runs such a call on a daemon
thread while the main thread waits in :func:`h5stream.concurrency.wait.wait_until`, which raises a Ctrl-C (held back by
:mod:`h5stream.concurrency.interrupt` or not) within :data:`~h5stream.concurrency.wait.POLL_S`.  The call given up on
ends by itself
within ``timeout_s``; a daemon, its thread never keeps the process alive.  It must write only into memory of its
own (see :meth:`h5stream.remote.source.RemoteSource.readinto`): the caller's buffers may be gone by then.
Other threads make the call themselves (signals reach only the main thread).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from h5stream.concurrency.gcpause import collection_paused
from h5stream.concurrency.wait import wait_until

T = TypeVar("T")


def on_main_thread() -> bool:
    """Whether the calling thread is the main thread (the one Python runs signal handlers in)."""
    return threading.current_thread() is threading.main_thread()


def interruptible(fn: Callable[..., T], /, *args, **kwargs) -> T:
    """``fn(*args, **kwargs)``, run on a daemon thread when called from the main thread, which then waits for it
    in stoppable polls: what it returns or raises, or ``KeyboardInterrupt`` as soon as a SIGINT arrives."""
    if not on_main_thread():
        return fn(*args, **kwargs)
    cond = threading.Condition()
    outcome: list = []

    def run() -> None:
        try:
            result = (True, fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread, raised there
            result = (False, exc)
        with cond:
            outcome.append(result)
            cond.notify_all()

    # The caller may be inside HDF5 (a read of h5py's file object), holding h5py's lock: see gcpause.
    with collection_paused():
        threading.Thread(target=run, name="h5stream-remote-call", daemon=True).start()
        with cond:
            wait_until(cond, lambda: bool(outcome))
    ok, value = outcome[0]
    if ok:
        return value
    raise value
