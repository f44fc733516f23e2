"""What a :class:`~h5stream.augment.pool.WorkerPool` owns, kept apart from the pool object.

:class:`PoolState` holds the workers (a :class:`~h5stream.concurrency.procpool.Workers`),
the slots and the task bookkeeping.  No thread of the pool's own reads the
workers' pipes: the thread that waits for a result (the consumer, or the
constructor waiting for start-up) reads them itself
(:meth:`PoolState.collect_until`), files each message and notices dead
workers by their process sentinels.  A finished batch thus costs its consumer
at most one sleep (on the pipe of the worker that has it: another worker
finishing does not wake it), a look at every pipe and one read of each ready
one, two holds of the lock, and no wake-up of a second thread (a collector
thread cost a wake-up, a lock hand-off and a notify per batch; on a virtual
machine a sleep and wake-up costs the sleeper about as much CPU as the rest
of the batch's work).
:func:`shutdown` is what the pool's ``weakref.finalize`` runs.  None of them
refers to the pool, so dropping an unclosed pool still reaches the finalizer.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import threading
import time
import traceback
from collections import deque
from typing import Callable

from h5stream.concurrency import wait as _wait
from h5stream.concurrency.interrupt import raised_by_signal_handler
from h5stream.concurrency.procpool import DONE, ERROR, EXITED, FATAL, READY, InOrder, Workers, pick_worker
from h5stream.concurrency.procpool import stopped as stopped  # the feed asks it of a late worker's pid
from h5stream.errors import StreamClosedError, WorkerError
from h5stream.memory.shm import SharedArray

POLL_S = _wait.POLL_S
"""Longest a wait goes without looking for a held-back Ctrl-C (:mod:`h5stream.concurrency.wait`'s, the one of every
wait)."""


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
    """Everything the pool owns; shared by the facade (its producer and consumer threads) and the finalizer.

    Nothing here references the WorkerPool object, so dropping the pool lets
    ``weakref.finalize`` run :func:`shutdown`.  All fields below ``cond`` are
    guarded by its lock (``lock``).  Two conditions share that lock, so a routine event
    wakes only the side that waits for it: ``for_producer`` (an output slot,
    worker capacity) and ``cond`` for the rest (a second thread waiting to
    read the pipes, shutdown waiting for the reading to end).  Close and
    failures wake both (:meth:`wake_all`): waking a thread for nothing costs a
    futex round trip and a GIL hand-off per batch.
    The consumer learns of finished tasks by reading the pipes itself
    (:meth:`collect_until`), so nobody notifies it of one.
    """

    def __init__(self, n_workers, n_slots, per_worker_cap, close_timeout_s):
        self.owner_pid = os.getpid()
        lock = self.lock = threading.RLock()  # taken as itself (``with state.lock``): cheaper than the condition
        self.cond = threading.Condition(lock)
        self.for_producer = threading.Condition(lock)
        self.closed = False
        self.failure: tuple[str, str | None] | None = None
        self.per_worker_cap = per_worker_cap
        self.close_timeout_s = close_timeout_s
        self.workers = Workers("augment worker")  # its wait() runs in one thread at a time: see collect_until()
        self.ready: set[int] = set()  # workers that answered "ready" and have not ended: they take tasks
        self.inflight = [0] * n_workers
        self.free_slots = deque(range(n_slots))
        self.held_slots: set[int] = set()
        self.tasks: dict[int, Task] = {}  # seq -> task submitted and not finished
        self.order = InOrder()  # finished tasks' (slot, rows, error), handed over in seq order
        self.slots: SharedArray | None = None
        self.lender = None  # the output slots as lent to the consumer (a Lender: see SharedArray.lender)
        self.reading: int | None = None  # the thread in collect_until()'s wait on the pipes, if one is
        self.wake_r, self.wake_w = os.pipe()  # written once, by shutdown: ends a wait on the pipes

    # -- helpers called with cond held

    def check(self) -> None:
        if self.closed:
            raise StreamClosedError("the augment worker pool is closed; open a new stream")
        if self.failure is not None:
            raise worker_error(*self.failure)

    def wake_all(self) -> None:
        self.cond.notify_all()
        self.for_producer.notify_all()

    def wait(self, predicate: Callable[[], bool], timeout_s: float, what: str,
             on: threading.Condition | None = None) -> None:
        """Wait on ``on`` (default cond) until predicate() holds; raises on close, failure or timeout (one
        TimeoutError, at the deadline), and :class:`~h5stream.concurrency.wait.Stopped` once a stop scope of the calling
        thread is set (:func:`h5stream.concurrency.wait.stop_when`).  A :func:`~h5stream.concurrency.wait.wait_until`
        wait: a Ctrl-C
        held back by :mod:`h5stream.concurrency.interrupt` is raised within :data:`POLL_S`.  Any thread, cond held."""
        if not _wait.wait_until(on or self.cond, predicate, deadline=time.monotonic() + timeout_s, check=self.check):
            raise TimeoutError(f"augment worker pool: {what} within {timeout_s:g} s")

    def next_worker(self) -> int | None:
        """The worker that has the next task in order, if one has it.  Lock held."""
        task = self.tasks.get(self.order.next_deliver)
        return None if task is None else task.worker

    def collect_until(self, ready: Callable[[], bool], timeout_s: float, what: str | Callable[[], str],
                      sleep_on: Callable[[], int | None] | None = None, take: Callable[[], object] | None = None):
        """Read the workers' messages and file them until ``ready()`` holds; then return ``take()`` (None
        without it).  ``ready``, ``take`` and ``sleep_on`` run with the lock held, ``take`` in the same hold
        as the ``ready()`` that held.  Raises on close, failure or timeout (TimeoutError, at the deadline),
        :class:`~h5stream.concurrency.wait.Stopped` once a stop scope of the calling thread is set, and a held-back
        Ctrl-C within :data:`POLL_S`.  Whatever is in the pipes is read first even when ``ready()`` already
        holds, so a dead worker is reported at the next call and the tasks in flight are counted fresh.
        ``sleep_on()``: the worker whose answer is awaited, whose pipe alone ends a sleep (see
        :meth:`~h5stream.concurrency.procpool.Workers.wait`), or None.  ``what`` (or what it returns, made only for the
        error) says what did not happen.

        The thread that waits for a result; the lock not held.  One thread at a time reads the pipes: a
        second one waits on ``cond`` meanwhile.  A failure of the reading itself becomes the pool's failure.
        """
        deadline = time.monotonic() + timeout_s
        me = threading.get_ident()
        left = None
        while True:
            with self.lock:
                self.check()
                if left is None:  # one read of the pipes either way: it returns on a message
                    left = 0.0 if ready() else min(timeout_s, POLL_S)
                reading = self.reading is None or self.reading == me
                if reading:
                    self.reading = me
                    worker = None if sleep_on is None or not left else sleep_on()
                else:  # another thread reads the pipes: it notifies when it has filed what it read
                    self.cond.wait(left)
                    self.check()
                    if ready():
                        return None if take is None else take()
            if reading:
                events, error = [], None
                try:
                    events = self.workers.wait(left, wake_fd=self.wake_r, sleep_on=worker)
                except BaseException as exc:  # the pipes are the pool's lifeline: fail loudly, never wait for good
                    error = exc
                with self.lock:
                    self.reading = None
                    for w, msg in events:
                        self.handle(w, msg)
                    # A signal handler's exception (a SIGTERM handler's, an alarm's) is the caller's: raised as
                    # it is.  It may have cut a read short, so the pool is failed all the same, saying why.
                    foreign = error is not None and raised_by_signal_handler(error)
                    if isinstance(error, Exception) and self.failure is None and not self.closed:
                        name = f"{type(error).__name__}: {error}".rstrip(": ")
                        self.failure = ((f"a signal handler's {name} interrupted the reading of the augment "
                                         "workers' pipes, whose answers may be lost: open the stream again, "
                                         "or go on from its state()") if foreign else
                                        f"reading the augment workers' pipes failed: {name}",
                                        "".join(traceback.format_exception(error)))
                        self.wake_all()
                    else:
                        self.cond.notify_all()  # a second reader, or shutdown, waits for the reading to end
                    if error is not None and (foreign or not isinstance(error, Exception)):
                        raise error  # a Ctrl-C, once the reading is over
                    self.check()
                    if ready():
                        return None if take is None else take()
            _wait.check_stops()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"augment worker pool: {what if isinstance(what, str) else what()} "
                                   f"within {timeout_s:g} s")
            left = min(left, POLL_S)

    def dead_worker(self, w: int) -> BaseException:
        """The error for a worker whose pipe took no task: it died.  Waits (up to 5 s) for its process to end,
        records its death report as the pool's failure unless there is one.  Producer thread, lock not held."""
        multiprocessing.connection.wait([self.workers.procs[w].sentinel], 5.0)
        with self.lock:
            if self.failure is None and not self.closed:
                self.failure = (self.workers.death(w, OOM_FIX, STARTUP_HINT), None)
                self.wake_all()
            try:
                self.check()
            except BaseException as exc:
                return exc
            return worker_error(f"augment worker {w} stopped taking tasks", None)  # pragma: no cover

    def pick_worker(self) -> int | None:
        return pick_worker(self.inflight, self.ready, self.per_worker_cap)

    def task_finished(self, seq: int, error) -> None:
        task = self.tasks.pop(seq, None)
        if task is None:
            return
        self.inflight[task.worker] -= 1
        self.order.finish(seq, (task.slot, task.rows, error))
        if self.inflight[task.worker] == self.per_worker_cap - 1:
            self.for_producer.notify_all()  # worker capacity came free (free slots are the usual limit)

    def handle(self, w: int, msg) -> None:
        """File message ``msg`` of worker ``w`` (see :mod:`h5stream.concurrency.procpool`); the thread in
        :meth:`collect_until`,
        lock held."""
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


def shutdown(state: PoolState) -> None:
    """Stop the workers, unlink the slots.  Idempotent; never references the pool.  Any thread: a thread
    reading the pipes is woken and waited for (up to 5 s) before they close."""
    if state.owner_pid != os.getpid():
        return  # a forked copy of the owner: the processes and segments are not ours
    with state.lock:
        state.closed = True
        state.wake_all()
    try:
        os.write(state.wake_w, b"x")
    except OSError:
        pass
    me, end = threading.get_ident(), time.monotonic() + 5.0
    with state.lock:
        while state.reading not in (None, me) and end > time.monotonic():
            state.cond.wait(end - time.monotonic())  # no stoppable wait here: a finalizer raises nothing
    state.workers.stop(state.close_timeout_s)
    for fd in (state.wake_r, state.wake_w):
        try:
            os.close(fd)
        except OSError:
            pass
    state.wake_r = state.wake_w = -1
    state.lender = None
    if state.slots is not None:
        state.slots.close()
