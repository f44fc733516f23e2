"""What a :class:`~h5stream.augment.pool.WorkerPool` owns, kept apart from the pool object.

:class:`PoolState` holds the workers (a :class:`~h5stream._procpool.Workers`),
the slots and the task bookkeeping; :func:`collect` is the collector thread
that routes the workers' messages into it and notices dead workers;
:func:`shutdown` is what the pool's ``weakref.finalize`` runs.  None of them
refers to the pool, so dropping an unclosed pool still reaches the finalizer.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections import deque
from typing import Callable

import numpy as np

from h5stream import _wait
from h5stream._procpool import DONE, ERROR, EXITED, FATAL, READY, InOrder, Workers, pick_worker
from h5stream._procpool import stopped as stopped  # the feed asks it of a late worker's pid
from h5stream.errors import StreamClosedError, WorkerError
from h5stream.shm import SharedArray

POLL_S = _wait.POLL_S
"""Longest a wait goes without looking for a held-back Ctrl-C (:mod:`h5stream._wait`'s, the one of every wait)."""


class RemoteTraceback(Exception):
    """Carries a worker's formatted traceback as the ``__cause__`` of a WorkerError."""

    def __init__(self, tb_text: str):
        super().__init__(tb_text)
        self.tb_text = tb_text

    def __str__(self) -> str:
        return "\n" + self.tb_text


def worker_error(message: str, tb_text: str | None, stage: str | None = None,
                 summary: str | None = None) -> WorkerError:
    """``stage``: "read" (getting a task's rows failed), "transform", or None (a worker died or failed to start);
    ``summary``: the worker's one-line account of a read or transform failure."""
    err = WorkerError(message)
    err.worker_traceback = tb_text
    err.stage = stage
    err.summary = summary
    if tb_text:
        err.__cause__ = RemoteTraceback(tb_text)
    return err


#: What a SIGKILLed worker's report advises, and what one that died starting up usually means.
OOM_FIX = "lower memory_budget or workers"
STARTUP_HINT = " (an import error, or a script without `if __name__ == '__main__':`?)"


class Task:
    __slots__ = ("slot", "rows", "worker")

    def __init__(self, slot, rows, worker):
        self.slot, self.rows, self.worker = slot, rows, worker


class PoolState:
    """Everything the pool owns; shared by the facade, the collector thread and the finalizer.

    Nothing here references the WorkerPool object, so dropping the pool lets
    ``weakref.finalize`` run :func:`shutdown`.  All fields below ``cond`` are
    guarded by its lock.  Three conditions share that lock, so a routine event
    wakes only the side that waits for it: ``for_consumer`` (a result in order,
    or no task left), ``for_producer`` (an output slot, worker capacity) and
    ``cond`` for the rest (start-up).  Close and failures wake all three
    (:meth:`wake_all`): waking a thread for nothing costs a futex round trip
    and a GIL hand-off per batch.
    """

    def __init__(self, n_workers, n_slots, per_worker_cap, close_timeout_s):
        self.owner_pid = os.getpid()
        lock = threading.RLock()
        self.cond = threading.Condition(lock)
        self.for_consumer = threading.Condition(lock)
        self.for_producer = threading.Condition(lock)
        self.closed = False
        self.failure: tuple[str, str | None] | None = None
        self.per_worker_cap = per_worker_cap
        self.close_timeout_s = close_timeout_s
        self.workers = Workers("augment worker")  # its wait() is the collector's alone
        self.ready: set[int] = set()  # workers that answered "ready" and have not ended: they take tasks
        self.inflight = [0] * n_workers
        self.free_slots = deque(range(n_slots))
        self.held_slots: set[int] = set()
        self.tasks: dict[int, Task] = {}  # seq -> task submitted and not finished
        self.order = InOrder()  # finished tasks' (slot, rows, error), handed over in seq order
        self.slots: SharedArray | None = None
        self.slot_items: list[np.ndarray] = []  # one array per slot, made on the mapping (see SharedArray.item_arrays)
        self.lent: list[int] = []  # slots handed to the consumer without a copy (see WorkerPool.lend)
        self.collector: threading.Thread | None = None
        self.wake_r, self.wake_w = os.pipe()

    # -- helpers called with cond held

    def check(self) -> None:
        if self.closed:
            raise StreamClosedError("the augment worker pool is closed; open a new stream")
        if self.failure is not None:
            raise worker_error(*self.failure)

    def wake_all(self) -> None:
        self.cond.notify_all()
        self.for_consumer.notify_all()
        self.for_producer.notify_all()

    def wait(self, predicate: Callable[[], bool], timeout_s: float, what: str,
             on: threading.Condition | None = None) -> None:
        """Wait on ``on`` (default cond) until predicate() holds; raises on close, failure or timeout (one
        TimeoutError, at the deadline), and :class:`~h5stream._wait.Stopped` once a stop scope of the calling
        thread is set (:func:`h5stream._wait.stop_when`).  A :func:`~h5stream._wait.wait_until` wait: a Ctrl-C
        held back by :mod:`h5stream._interrupt` is raised within :data:`POLL_S`.  Any thread, cond held."""
        if not _wait.wait_until(on or self.cond, predicate, deadline=time.monotonic() + timeout_s, check=self.check):
            raise TimeoutError(f"augment worker pool: {what} within {timeout_s:g} s")

    def pick_worker(self) -> int | None:
        return pick_worker(self.inflight, self.ready, self.per_worker_cap)

    def task_finished(self, seq: int, error) -> None:
        task = self.tasks.pop(seq, None)
        if task is None:
            return
        self.inflight[task.worker] -= 1
        self.order.finish(seq, (task.slot, task.rows, error))
        self.for_producer.notify_all()  # worker capacity came free
        if seq == self.order.next_deliver or not self.tasks:
            self.for_consumer.notify_all()  # the batch it waits for, or the last one discard_pending waits for

    def handle(self, w: int, msg) -> None:
        """File message ``msg`` of worker ``w`` (see :mod:`h5stream._procpool`); collector thread, cond held."""
        kind = msg[0]
        if kind == DONE:
            self.task_finished(msg[1], None)
        elif kind == ERROR:
            fail = msg[2]
            self.task_finished(msg[1], (fail.summary, fail.traceback, fail.stage))
        elif kind == READY:
            self.ready.add(w)
            self.wake_all()
        elif kind == FATAL:
            if self.failure is None and not self.closed:
                self.failure = (f"augment worker {w} failed to start: {msg[1].summary}", msg[1].traceback)
            self.wake_all()
        elif kind == EXITED:
            self.ready.discard(w)
            if not self.closed and self.failure is None:
                self.failure = (self.workers.death(w, OOM_FIX, STARTUP_HINT), None)
                self.wake_all()


def collect(state: PoolState) -> None:
    """Collector thread: route worker messages into state, notice dead workers.

    If it fails itself, every blocked or later call raises WorkerError instead
    of waiting for results that would never be routed.
    """
    try:
        while not state.closed:  # read without the lock: a stale False costs one more wait
            for w, msg in state.workers.wait(None, wake_fd=state.wake_r):
                with state.cond:
                    state.handle(w, msg)
    except BaseException as exc:
        with state.cond:
            if state.failure is None and not state.closed:
                state.failure = (f"the pool's collector thread failed: {type(exc).__name__}: {exc}",
                                 traceback.format_exc())
            state.wake_all()


def shutdown(state: PoolState) -> None:
    """Stop workers and the collector, unlink the slots.  Idempotent; never references the pool."""
    if state.owner_pid != os.getpid():
        return  # a forked copy of the owner: the processes and segments are not ours
    with state.cond:
        state.closed = True
        state.wake_all()
    try:
        os.write(state.wake_w, b"x")
    except OSError:
        pass
    collector = state.collector
    if collector is not None and collector is not threading.current_thread():
        collector.join(5.0)
    state.workers.stop(state.close_timeout_s)
    for fd in (state.wake_r, state.wake_w):
        try:
            os.close(fd)
        except OSError:
            pass
    state.wake_r = state.wake_w = -1
    state.slot_items, state.lent = [], []
    if state.slots is not None:
        state.slots.close()
