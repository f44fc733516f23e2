"""What a :class:`~h5stream.augment.pool.WorkerPool` owns, kept apart from the pool object.

:class:`PoolState` holds the processes, pipes, slots and task bookkeeping;
:func:`collect` is the collector thread that routes the workers' messages
into it and notices dead workers; :func:`shutdown` is what the pool's
``weakref.finalize`` runs.  None of them refers to the pool, so dropping an
unclosed pool still reaches the finalizer.
"""

from __future__ import annotations

import os
import selectors
import signal
import threading
import time
import traceback
from collections import deque
from typing import Callable

import numpy as np
import psutil

from h5stream._spawn import reap_workers
from h5stream import _wait
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


class Task:
    __slots__ = ("slot", "source", "rows", "worker", "read_done")

    def __init__(self, slot, source, rows, worker):
        self.slot, self.source, self.rows, self.worker = slot, source, rows, worker
        self.read_done = False


class PoolState:
    """Everything the pool owns; shared by the facade, the collector thread and the finalizer.

    Nothing here references the WorkerPool object, so dropping the pool lets
    ``weakref.finalize`` run :func:`shutdown`.  All fields below ``cond`` are
    guarded by its lock.  Three conditions share that lock, so a routine event
    wakes only the side that waits for it: ``for_consumer`` (a result in order,
    or no task left), ``for_producer`` (an output slot, worker capacity, a
    source read) and ``cond`` for the rest (start-up).  Close and failures wake
    all three (:meth:`wake_all`): waking a thread for nothing costs a futex
    round trip and a GIL hand-off per batch.
    """

    def __init__(self, n_workers, n_sources, n_slots, per_worker_cap, close_timeout_s):
        self.owner_pid = os.getpid()
        lock = threading.RLock()
        self.cond = threading.Condition(lock)
        self.for_consumer = threading.Condition(lock)
        self.for_producer = threading.Condition(lock)
        self.closed = False
        self.failure: tuple[str, str | None] | None = None
        self.per_worker_cap = per_worker_cap
        self.close_timeout_s = close_timeout_s
        self.procs: list = []
        self.conns: list = []
        self.pids: list[int | None] = [None] * n_workers
        self.ready: set[int] = set()
        self.inflight = [0] * n_workers
        self.free_slots = deque(range(n_slots))
        self.held_slots: set[int] = set()
        self.tasks: dict[int, Task] = {}
        self.results: dict[int, tuple[int, int, tuple[str, str] | None]] = {}
        self.source_readers = [0] * n_sources
        self.next_submit = 0
        self.next_deliver = 0
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
        best = None
        for w in sorted(self.ready):
            if self.inflight[w] < self.per_worker_cap and (best is None or self.inflight[w] < self.inflight[best]):
                best = w
        return best

    def task_finished(self, seq: int, error) -> None:
        task = self.tasks.pop(seq, None)
        if task is None:
            return
        if not task.read_done:
            self.source_readers[task.source] -= 1
        self.inflight[task.worker] -= 1
        self.results[seq] = (task.slot, task.rows, error)
        self.for_producer.notify_all()  # worker capacity (and maybe a source) came free
        if seq == self.next_deliver or not self.tasks:
            self.for_consumer.notify_all()  # the batch it waits for, or the last one discard_pending waits for

    def handle(self, msg) -> None:
        kind = msg[0]
        if kind == "read":
            task = self.tasks.get(msg[1])
            if task is not None and not task.read_done:
                task.read_done = True
                self.source_readers[task.source] -= 1
                self.for_producer.notify_all()
        elif kind == "done":
            self.task_finished(msg[1], None)
        elif kind == "error":
            self.task_finished(msg[1], (msg[2], msg[3], msg[4] if len(msg) > 4 else "transform"))
        elif kind == "ready":
            self.ready.add(msg[1])
            self.pids[msg[1]] = msg[2]
        elif kind == "fatal" and self.failure is None and not self.closed:
            last_line = msg[2].strip().splitlines()[-1]
            self.failure = (f"augment worker {msg[1]} failed to start: {last_line}", msg[2])
        if kind in ("ready", "fatal"):
            self.wake_all()

    def worker_exited(self, w: int) -> None:
        proc = self.procs[w]
        proc.join(1.0)  # the sentinel fired, so this returns at once; it sets exitcode
        started = w in self.ready
        self.ready.discard(w)
        if self.closed or self.failure is not None:
            return
        code = proc.exitcode
        if code is not None and code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
            hint = "; SIGKILL often means the out-of-memory killer: lower memory_budget or workers"
        else:
            how, hint = f"exited with code {code}", "; see its output above"
        if not started:
            how = "died during start-up: " + how
            hint = ("; its traceback is on stderr above (an import error, or a script without "
                    "`if __name__ == '__main__':`?)")
        self.failure = (f"augment worker {w} (pid {proc.pid}) {how}{hint}", None)
        self.wake_all()


def stopped(pid: int | None) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, Ctrl-Z, a debugger): it runs nothing until SIGCONT."""
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def collect(state: PoolState) -> None:
    """Collector thread: route worker messages into state, notice dead workers.

    If it fails itself, every blocked or later call raises WorkerError instead
    of waiting for results that would never be routed.
    """
    try:
        _collect_loop(state)
    except BaseException as exc:
        with state.cond:
            if state.failure is None and not state.closed:
                state.failure = (f"the pool's collector thread failed: {type(exc).__name__}: {exc}",
                                 traceback.format_exc())
            state.wake_all()


def _collect_loop(state: PoolState) -> None:
    conns = {w: c for w, c in enumerate(state.conns)}
    sentinels = {p.sentinel: w for w, p in enumerate(state.procs)}
    watch = None  # one selector, rebuilt only when a worker's pipe or process goes away
    try:
        while not state.closed:  # read without the lock: a stale False costs one more select()
            if watch is None:
                watch = selectors.DefaultSelector()
                watch.register(state.wake_r, selectors.EVENT_READ, ("wake", None))
                for w, c in conns.items():
                    watch.register(c, selectors.EVENT_READ, ("conn", w))
                for fd, w in sentinels.items():
                    watch.register(fd, selectors.EVENT_READ, ("exit", w))
            ready = [key.data for key, _ in watch.select()]
            if ("wake", None) in ready:
                return
            # Messages first: a worker that reported an error and then died is described by its message.
            # One message per wake-up: the selector is level-triggered, so more waiting data wakes it again.
            for kind, w in ready:
                if kind != "conn" or w not in conns:
                    continue
                try:
                    msg = conns[w].recv()
                except (EOFError, OSError):
                    del conns[w]  # the sentinel reports the exit
                    watch.close()
                    watch = None
                    continue
                with state.cond:
                    state.handle(msg)
            for kind, w in ready:
                if kind != "exit":
                    continue
                fd = state.procs[w].sentinel
                sentinels.pop(fd, None)
                conn = conns.pop(w, None)
                if watch is not None:
                    watch.close()
                    watch = None
                try:
                    while conn is not None and conn.poll():
                        msg = conn.recv()
                        with state.cond:
                            state.handle(msg)
                except (EOFError, OSError):
                    pass
                with state.cond:
                    state.worker_exited(w)
    finally:
        if watch is not None:
            watch.close()


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
    for w, conn in enumerate(state.conns):
        try:
            conn.send(None)
        except OSError:
            pass
        if w >= len(state.procs):
            continue
        if stopped(state.procs[w].pid):
            state.procs[w].kill()  # stopped (SIGSTOP): it reads no message, and acts on no signal but SIGKILL
        elif w not in state.ready:
            state.procs[w].terminate()  # still starting: nothing to finish, and its imports may take seconds
    reap_workers(state.procs, state.close_timeout_s)
    for conn in state.conns:
        conn.close()
    for fd in (state.wake_r, state.wake_w):
        try:
            os.close(fd)
        except OSError:
            pass
    state.wake_r = state.wake_w = -1
    state.slot_items, state.lent = [], []
    if state.slots is not None:
        state.slots.close()
