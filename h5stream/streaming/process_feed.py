"""The feeder: a child process runs the whole pooled feed; the training process takes one message per batch.

``h5stream.open(..., workers=N, feeder=True)`` makes the stream's feed a
:class:`ProcessFeed`.  It starts one spawned *feeder* process that runs an
ordinary :class:`~h5stream.streaming.feeds.PooledFeed` (the reader thread, and the
worker pool, whose workers are the feeder's children).  The training process
keeps none of its threads: per batch it sends one small request and receives
one small answer ``(epoch, index, out-slot, rows, labels)``.  The pixels stay
where the workers wrote them, in the pool's shared output slots, which the
training process maps once and lends as views (zero-copy), as ``PooledFeed``
lends them in its own process.

Protocol (pure data over one duplex pipe, in order both ways):

* trainer -> feeder ``(kind, generation, freed_slots, *args)``: ``START``
  (``epoch, batch``), ``NEXT``, ``STATS``, ``STOP``.  Every message carries the
  output slots the trainer no longer lends, so the feeder's ``PooledFeed``
  reclaims them at its next batch.
* feeder -> trainer ``(kind, generation, *payload)``: ``READY`` (its pid and
  the slot segment's spec), ``STARTED``, ``BATCH``, ``ERROR``, ``STATS``.

The trainer keeps :data:`~h5stream.streaming.budget.FEEDER_IN_FLIGHT` ``NEXT`` requests
outstanding, so the feeder is always making the next batch while the caller
trains on this one.  ``start`` bumps the generation: the feeder skips requests
of an older one still in its pipe, and the trainer drops (and frees) answers of
an older one.  Slot accounting: the trainer lends at most ``plan.lent_slots``
views (copying beyond them, as ``PooledFeed`` does); the feeder keeps a view of
every slot answered and not freed yet, so its own ``PooledFeed`` (told
``lent_slots + FEEDER_IN_FLIGHT``) never reuses one; the plan counts those
slots (:func:`h5stream.streaming.budget.plan_memory` with ``feeder=True``).

Errors raised by the feeder's ``PooledFeed`` reach the trainer as the same
exception type and message.  The feeder's death is a
:class:`~h5stream.ReaderError` naming its pid and the signal, at once (its
process sentinel); a feeder that answers nothing within ``timeout_s`` (stopped)
is one too.  The feeder exits when the training process dies (its parent's
sentinel, or the pipe's end), closing its pool; a feeder killed with its whole
process group leaves segments the next stream's sweep removes
(:func:`h5stream.memory.shm.sweep_stale_segments`, by the creator's pid).
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import multiprocessing.util as mp_util
import os
import pickle
import selectors
import signal
import socket
import struct
import time
from collections import deque

import numpy as np

from h5stream.concurrency.fork import release_in_forks
from h5stream.concurrency.procpool import death_report, frames, stopped
from h5stream.concurrency.spawn import reap_workers, spawn_workers, worker_signals
from h5stream.concurrency.wait import POLL_S, check_stops
from h5stream.memory.lend import ArrayArena, SlotLender
from h5stream.streaming.budget import FEEDER_IN_FLIGHT, KEPT_SLOTS
from h5stream.streaming.config import StreamConfig
from h5stream.errors import ReaderError
from h5stream.streaming.feeder_protocol import (BATCH, ERROR, FATAL, NEXT, READY, START, STARTED, STATS, STOP,
                                                ProgressBeacon, error_payload, progress_word, rebuild_error, send,
                                                unpack)


#: Seconds the trainer waits for an answer beyond ``timeout_s``: the feeder's own wait for that batch began
#: before the trainer's (it makes batches ahead), so its error, if any, comes first.
ANSWER_GRACE_S = 2.0

#: How long ``close()`` lets the feeder close its pool (whose own close lets workers finish for 5 s).
CLOSE_TIMEOUT_S = 10.0

_OOM_FIX = "lower memory_budget or workers"


# -- the feeder process --------------------------------------------------------------------------------------------


def _slot_of(x: np.ndarray, base: int, slot_bytes: int, n_slots: int) -> int | None:
    """The output slot ``x`` is a view of (its data's address in the slot segment), or None for another array."""
    offset = x.__array_interface__["data"][0] - base
    if 0 <= offset < slot_bytes * n_slots and offset % slot_bytes == 0:
        return offset // slot_bytes
    return None


def _on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # close() ran out of patience: close the pool on the way out


def feeder_main(conn, parts: bytes, progress=None) -> None:
    """What the feeder process runs (the target of :func:`~h5stream.concurrency.spawn.spawn_workers`): build the
    ``PooledFeed`` from ``parts`` (pickled), answer ``READY``, then serve the trainer's messages in order until
    ``STOP``, the pipe's end or the parent's death; the feed is closed on every way out.  ``progress``: the
    :func:`~h5stream.streaming.feeder_protocol.progress_word` a :class:`ProgressBeacon` thread raises while the
    feed's reader moves.  Main thread of the feeder; its ``PooledFeed`` runs its reader thread as usual."""
    worker_signals()
    signal.signal(signal.SIGTERM, _on_sigterm)
    parent = mp.parent_process()
    try:
        from h5stream.streaming.feeds import PooledFeed

        feed = PooledFeed(pickle.loads(parts))
    except BaseException as exc:
        send(conn, (FATAL, None, error_payload(exc)))
        return
    beacon = None if progress is None else ProgressBeacon(feed, progress, POLL_S)
    try:
        # The pool's output segment: the trainer maps it and reads its batches there.
        slots = feed.pool.output_slots
        if not send(conn, (READY, None, os.getpid(), slots.spec, feed.pool.pids)):
            return
        _serve(conn, parent, feed, slots)
    finally:
        if beacon is not None:
            beacon.close()
        feed.close()


def _serve(conn, parent, feed, slots) -> None:
    """The feeder's loop (see :func:`feeder_main`)."""
    labels_as = (np.dtype(feed.meta.label_dtype), tuple(feed.meta.label_shape))
    spec = slots.spec
    n_slots = spec.shape[0]
    slot_bytes = int(np.prod(spec.shape[1:], dtype=np.int64)) * np.dtype(spec.dtype).itemsize
    base = slots.array.__array_interface__["data"][0]
    held: dict[int, np.ndarray] = {}  # slot -> a view of it, kept while the trainer has it: the pool won't reuse it
    pending: deque = deque()
    watch = selectors.DefaultSelector()
    watch.register(conn, selectors.EVENT_READ)
    if parent is not None:
        watch.register(parent.sentinel, selectors.EVENT_READ)
    generation = None
    while True:
        try:
            # Everything the trainer sent (a START makes older requests moot); a wait only when nothing is.
            while conn in [key.fileobj for key, _ in watch.select(None if not pending else 0)]:
                pending.append(unpack(conn.recv_bytes(), *labels_as))
            if not pending:
                return  # the training process died without stopping us
        except (EOFError, OSError):
            return
        kind, gen, freed, *args = pending.popleft()
        for slot in freed:
            held.pop(slot, None)
        if kind == STOP:
            return
        if kind == START:
            generation = gen
            try:
                feed.start(*args)
                reply = (STARTED, gen)
            except Exception as exc:
                reply = (ERROR, gen, error_payload(exc))
        elif kind == STATS:
            reply = (STATS, gen, feed.stats())
        elif gen != generation or any(m[0] == START for m in pending):
            continue  # a request of a generation the trainer has left
        else:
            try:
                epoch, index, x, labels = feed.next()
            except Exception as exc:
                reply = (ERROR, gen, error_payload(exc))
            else:
                slot = _slot_of(x, base, slot_bytes, n_slots)
                if slot is None:  # not a slot (cannot happen with the plan's lent slots): the pixels travel
                    reply = (BATCH, gen, epoch, index, -1, np.ascontiguousarray(x), labels)
                else:
                    held[slot] = x
                    reply = (BATCH, gen, epoch, index, slot, len(x), labels)
                del x
        if not send(conn, reply, labels_as):
            return


# -- the training process's side -------------------------------------------------------------------------------------


class _Inbox:
    """The trainer's end of the feeder's pipe (a socket pair), read as ``Connection`` frames
    (:func:`~h5stream.concurrency.procpool.frames`, the one parser of that framing) with one blocking ``recv`` for
    whatever
    has come, which returns after ``wait_s`` at the latest (``SO_RCVTIMEO``): one system call per answer, where
    ``Connection.recv_bytes`` makes two and a wait on a selector one more.  Owned by the
    :class:`_FeederState`; consumer thread."""

    def __init__(self, fd: int, wait_s: float):
        self._sock = socket.socket(fileno=os.dup(fd))
        release_in_forks((self._sock,))  # a child forked from here must not hold the feeder's pipe open
        self._sock.settimeout(None)  # blocking: the kernel's own receive timeout ends the wait
        whole = int(wait_s)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                              struct.pack("ll", whole, int((wait_s - whole) * 1e6)))
        self._partial = b""  # the start of a message not received whole yet
        self._messages: deque[bytes] = deque()

    def pop(self) -> bytes | None:
        """The next whole message received, or None."""
        return self._messages.popleft() if self._messages else None

    def fill(self) -> bool | None:
        """Take what has come, waiting up to ``wait_s`` for something: True if something came, False if
        nothing did, None at the pipe's end (the feeder is gone)."""
        try:
            data = self._sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError, TimeoutError):
            return False
        except OSError:
            return None
        if not data:
            return None
        data = self._partial + data
        messages, used = frames(data)
        self._messages.extend(bytes(m) for m in messages)
        self._partial = data[used:]
        return True

    def close(self) -> None:
        self._sock.close()


class _FeederState:
    """What a :class:`ProcessFeed` owns, kept apart from it so its finalizer holds no reference to it."""

    def __init__(self):
        self.proc = None
        self.conn = None
        self.inbox = None  # what the trainer reads the pipe with
        self.slots = None
        self.closed = False


def _shutdown(state: _FeederState) -> None:
    """Stop the feeder (``STOP``; then SIGTERM, SIGKILL) and unmap the slots; sweep what a feeder that died
    left in ``/dev/shm``.  Idempotent; run by ``close()``, by garbage collection, and before multiprocessing
    joins its children at interpreter exit."""
    if state.closed:
        return
    state.closed = True
    try:
        if state.conn is not None:
            send(state.conn, (STOP, None, ()))
        if state.proc is not None:
            if stopped(state.proc.pid):
                state.proc.kill()  # a stopped feeder reads nothing and obeys no signal but SIGKILL
            reap_workers([state.proc], CLOSE_TIMEOUT_S)
    finally:
        if state.inbox is not None:
            state.inbox.close()
        if state.conn is not None:
            state.conn.close()
        if state.slots is not None:
            state.slots.close()  # our mapping; lent views keep it alive as long as they live
        if state.proc is not None and state.proc.exitcode not in (0, None):
            from h5stream.memory.shm import sweep_stale_segments

            sweep_stale_segments()  # the feeder did not close its pool: its segments, by its pid


class ProcessFeed:
    """:class:`~h5stream.streaming.feeds.PooledFeed`'s interface, the feed running in a feeder process (module doc).

    Threads: every method runs in the consumer's thread (the one inside the
    stream); the training process has no thread of h5stream's.  Its waits look
    every :data:`~h5stream.concurrency.wait.POLL_S` for a held-back Ctrl-C.
    """

    def __init__(self, config: StreamConfig):
        from h5stream.memory.shm import SharedArray

        meta, plan = config.meta, config.plan
        self.meta, self.plan, self._timeout_s = meta, plan, config.timeout_s
        self._labels_as = (np.dtype(meta.label_dtype), tuple(meta.label_shape))
        self._in_flight = FEEDER_IN_FLIGHT
        # The feeder's PooledFeed lends every slot: the trainer decides what to copy, and its slots on their way
        # here are counted as lent there.
        child_plan = dataclasses.replace(plan, lent_slots=plan.lent_slots + self._in_flight)
        parts = pickle.dumps(dataclasses.replace(config, plan=child_plan))
        self._state = state = _FeederState()
        # Before multiprocessing's exit handler, which would wait for the (non-daemon) feeder forever.
        self._finalizer = mp_util.Finalize(None, _shutdown, args=(state,), exitpriority=10)
        self._generation = 0
        self._outstanding = 0  # NEXT requests of this generation not answered yet
        self._answers: deque = deque()  # answers of this generation received while waiting for another message
        self._freed: list[int] = []  # slots to tell the feeder about with the next message (one list, kept)
        self._lender: SlotLender | None = None  # lends the slots' views, or copies (set once the slots are mapped)
        self._error: BaseException | None = None  # the feeder is gone: raised again by every call
        self._start_error: BaseException | None = None  # the last start failed: next() raises it until a start
        self._waited_s = 0.0
        self._ready = False  # the feeder answered READY
        self._moved = progress_word()  # raised by the feeder while its reader moves (feeder_protocol.ProgressBeacon)
        self.pid, self.worker_pids, self._last_stats = None, [], {}
        try:
            procs, conns = spawn_workers(feeder_main, [(parts, self._moved)], name="h5stream-feeder",
                                         hide_main=b"__main__" not in parts, daemon=False)
            state.proc, state.conn = procs[0], conns[0]
            state.inbox = _Inbox(state.conn.fileno(), POLL_S)
            ready = self._receive(max(60.0, config.timeout_s) * 2, "started", ready=True, moving=False)
            self.pid, spec, self.worker_pids = ready[2], ready[3], ready[4]
            self._ready = True
            self._last_stats = {"worker_pids": self.worker_pids}
            state.slots = SharedArray.attach(spec)
            self._lender = SlotLender(state.slots.lender(), self._freed.append,
                                      ArrayArena(plan.batch_size, config.output_shape, config.output_dtype,
                                                 plan.consumer_sets),
                                      lent_slots=plan.lent_slots, kept_slots=KEPT_SLOTS)
        except BaseException:
            self.close()
            raise

    # -- messages ------------------------------------------------------------------------------------------------

    def _send(self, kind: str, *args) -> None:
        freed = list(self._freed)
        self._freed.clear()
        if self._error is not None:
            raise self._error
        if not send(self._state.conn, (kind, self._generation, freed, *args), self._labels_as):
            raise self._died()

    def _receive(self, timeout_s: float, what: str, ready: bool = False, stopped_s: float | None = None,
                 moving: bool = True) -> tuple:
        """The next message from the feeder: answers of an older generation dropped (their slots freed), within
        ``timeout_s``, and past it for as long as the feeder's reader did something in the last ``timeout_s``
        (``moving``: the rule of ``timeout_s`` in the feeder's own wait, :func:`~h5stream.concurrency.wait.
        get_while_moving`, so a slow first fill that trips neither trips this), else :class:`ReaderError`; the
        feeder's death a :class:`ReaderError` at once.  ``ready``: the start-up answer (a failed start-up raises
        its error).  ``stopped_s``: a feeder found stopped once this long has passed is named then (a stopped
        feeder sends nothing, so no grace is owed to it)."""
        if self._error is not None:
            raise self._error
        state = self._state
        inbox = state.inbox
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        moved, moved_at = self._moved.value, t0
        while True:
            data = inbox.pop()
            if data is None:
                got = inbox.fill()  # waits POLL_S at most
                if got is None:
                    raise self._died()  # the pipe's end: only the feeder holds its other end
                if not got:
                    check_stops()  # a Ctrl-C held back since the stream was entered
                    if not state.proc.is_alive():
                        raise self._died()
                    now = time.monotonic()
                    if stopped_s is not None and now >= t0 + stopped_s and stopped(state.proc.pid):
                        raise self._late(stopped_s, what)
                    if moving and self._moved.value != moved:
                        moved, moved_at = self._moved.value, now
                        deadline = max(deadline, moved_at + timeout_s)
                    if now >= deadline:
                        raise self._late(now - t0, what, timeout_s if moving else None)
                continue
            msg = unpack(data, *self._labels_as)
            kind, gen = msg[0], msg[1]
            if ready:
                if kind == FATAL:
                    raise rebuild_error(msg[2], self.meta.path)
                return msg
            if gen != self._generation:
                if kind == BATCH and msg[4] >= 0:
                    self._freed.append(msg[4])
                continue
            return msg

    def _died(self) -> ReaderError:
        """The error for a feeder that ended; kept for every later call."""
        proc = self._state.proc
        proc.join(1.0)
        report = death_report("h5stream feeder process", None, proc.pid, proc.exitcode, self._ready, _OOM_FIX)
        self._error = ReaderError(f"{self.meta.path}: {report}; go on from the stream's state() "
                                  "(open(..., resume=state))")
        return self._error

    def _late(self, waited_s: float, what: str, quiet_s: float | None = None) -> ReaderError:
        pid = self._state.proc.pid
        if not self._state.proc.is_alive():
            return self._died()
        if stopped(pid):
            self._error = ReaderError(
                f"{self.meta.path}: the feeder process (pid {pid}) is stopped (SIGSTOP or Ctrl-Z) and has not "
                f"{what} in {waited_s:.3g} s; resume it (kill -CONT {pid}), then go on from the stream's state()")
        else:
            quiet = "" if quiet_s is None else f", and its reader has read nothing in the last {quiet_s:.3g} s"
            self._error = ReaderError(
                f"{self.meta.path}: the feeder process (pid {pid}) has not {what} in {waited_s:.3g} s{quiet}; "
                "raise timeout_s if the transform or the storage is that slow")
        return self._error

    # -- the feed's interface ----------------------------------------------------------------------------------

    def start(self, epoch: int, batch: int) -> None:
        """(Re)start at ``(epoch, batch)``: batches asked for before are dropped.  Raises what the feeder's
        ``PooledFeed.start`` raised.  Consumer thread."""
        self._generation += 1
        self._outstanding = 0
        for msg in self._answers:
            if msg[0] == BATCH and msg[4] >= 0:
                self._freed.append(msg[4])
        self._answers.clear()
        self._waited_s = 0.0
        self._start_error = None
        self._send(START, int(epoch), int(batch))
        msg = self._receive(self._timeout_s * 2 + ANSWER_GRACE_S, "restarted", stopped_s=self._timeout_s)
        if msg[0] == ERROR:
            # No batch was asked for: next() raises this error (the pooled feed's, which keeps it) rather than
            # wait for an answer that never comes.
            self._start_error = rebuild_error(msg[2], self.meta.path)
            raise self._start_error
        self._top_up()

    def _top_up(self) -> None:
        while self._outstanding < self._in_flight:
            self._send(NEXT)
            self._outstanding += 1

    def _answer(self) -> tuple:
        if self._answers:
            return self._answers.popleft()
        t0 = time.monotonic()
        msg = self._receive(self._timeout_s + ANSWER_GRACE_S, "sent a batch", stopped_s=self._timeout_s)
        self._waited_s += time.monotonic() - t0
        return msg

    def next(self) -> tuple[int, int, np.ndarray, np.ndarray]:
        """The next batch: a view of its output slot (lent by :class:`~h5stream.memory.lend.SlotLender`'s rule, as the
        pooled feed lends), else a copy; what the feeder's ``PooledFeed.next`` raised, as the same exception.
        Consumer thread."""
        if self._start_error is not None:
            raise self._start_error
        msg = self._answer()
        self._outstanding -= 1
        try:
            if msg[0] == ERROR:
                raise rebuild_error(msg[2], self.meta.path)
            _, _, epoch, index, slot, rows, labels = msg
            if slot < 0:
                return epoch, index, rows, labels  # the pixels came through the pipe
            return epoch, index, self._lender.hand_over(slot, rows), labels
        finally:
            if self._error is None:
                self._top_up()  # the feeder makes the next batch while the caller trains on this one

    @property
    def _copied_batches(self) -> int:
        return self._lender.copied if self._lender is not None else 0

    def stats(self) -> dict:
        """The feeder's ``PooledFeed`` stats and its pid; ``wait_s`` is the seconds this process waited for
        batches since the last start (the feeder's own: ``feeder_wait_s``).  Once the feeder is gone (closed,
        died), the last stats it sent.  Consumer thread."""
        if self._state.closed or self._error is not None:  # the feeder is gone: what this side knows
            return {**self._last_stats, "feeder_pid": self.pid, "wait_s": self._waited_s,
                    "copied_batches": self._copied_batches}
        self._send(STATS)
        while True:
            msg = self._receive(self._timeout_s * 2 + ANSWER_GRACE_S, "answered")
            if msg[0] == STATS:
                break
            self._answers.append(msg)  # a batch asked for earlier: next() takes it
        # wait_s: this process's waits (the consumer's); the feeder's own waits for its pool: feeder_wait_s.
        self._last_stats = {**msg[2], "feeder_wait_s": msg[2].get("wait_s", 0.0)}
        return {**self._last_stats, "wait_s": self._waited_s, "feeder_pid": self.pid,
                "copied_batches": self._copied_batches}

    def close(self) -> None:
        """Stop the feeder (it closes its pool) and unmap the slots; idempotent.  Lent views stay readable."""
        self._finalizer()
