"""One process-pool core: spawned workers serving tasks over pipes, results in order, one death report.

Ingest's decode pool (:mod:`h5stream.ingest.pool`) and the augment pool
(:mod:`h5stream.augment.pool`) both stand on it.  It holds the mechanics only;
what a task carries and what its result means belong to the front ends.

The protocol, plain tuples pickled over one duplex pipe per worker:

* parent -> worker: ``(seq, body)``, one task; ``None``, stop.  Or, sent with
  :meth:`Workers.send_raw`, one task as plain bytes: :data:`RAW`, ``seq``
  (8 bytes, little-endian) and a body the front end packed itself, handed to
  its handler as a ``memoryview`` -- no pickling on the hot path.
* worker -> parent: ``("ready", pid)`` once set up, or ``("fatal", failure)``
  when set-up raised (the worker then exits); per task ``("done", seq,
  result)`` or ``("error", seq, failure)``, ``failure`` a :class:`Failure`.
* :meth:`Workers.wait` adds ``("exited", exitcode)`` when a worker's process
  has ended, after every message it sent before.

Worker side: :func:`serve`, the loop every worker runs.  Parent side:
:class:`Workers` owns the processes and pipes (start, send, wait, stop) and
writes the one report of a worker's death (:func:`death_report`);
:class:`InOrder` hands results over in submission order; :func:`pick_worker`
chooses whom a task goes to.  Pipes, not ``multiprocessing`` queues: a
queue's named semaphores outlive a process group killed by SIGKILL, a pipe
leaves nothing behind.  A worker imports this module: it imports neither
psutil nor anything heavy at top level.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import selectors
import signal
import struct
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from h5stream.concurrency.spawn import exit_with_parent, reap_workers, spawn_workers, worker_signals

READY, FATAL, DONE, ERROR, EXITED = "ready", "fatal", "done", "error", "exited"
"""The first item of every message a front end receives from :meth:`Workers.wait`."""

RAW = b"R"
"""First byte of a task sent as bytes (:meth:`Workers.send_raw`); a pickle starts with another."""

_LENGTH = struct.Struct("!i")
"""The head of every message on a pipe, as ``multiprocessing.connection`` frames it: the length of what follows
(-1: a 64-bit length follows, :data:`_LONG_LENGTH`)."""
_LONG_LENGTH = struct.Struct("!Q")
_READ_BYTES = 1 << 16
"""Most bytes one read of a worker's pipe takes: every whole message in it, usually one or two."""


def frames(data: bytes) -> tuple[list[memoryview], int]:
    """The whole messages at the start of ``data`` (framed as :mod:`multiprocessing.connection` frames them)
    and how many bytes they take (pure): what follows is the start of a message not yet read whole."""
    out, at, end = [], 0, len(data)
    view = memoryview(data)
    while end - at >= 4:
        (n,), head = _LENGTH.unpack_from(data, at), 4
        if n == -1:
            if end - at < 12:
                break
            (n,), head = _LONG_LENGTH.unpack_from(data, at + 4), 12
        if end - at - head < n:
            break
        out.append(view[at + head:at + head + n])
        at += head + n
    return out, at


class Failure(NamedTuple):
    """What went wrong in a worker, in a form that crosses the pipe: ``summary`` is ``"Type: message"``,
    ``errno`` the OSError's (None otherwise), ``stage`` where it happened (set by the front end)."""

    summary: str
    traceback: str
    errno: int | None
    stage: str


class TaskFailed(Exception):
    """Raised by a task handler to report ``cause`` as a failure of ``stage`` rather than :func:`serve`'s default."""

    def __init__(self, stage: str, cause: BaseException):
        super().__init__(stage, cause)
        self.stage, self.cause = stage, cause


def failure(exc: BaseException, stage: str) -> Failure:
    """The :class:`Failure` of ``exc`` (pure, but for formatting its traceback)."""
    if isinstance(exc, TaskFailed):
        stage, exc = exc.stage, exc.cause
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    errno = exc.errno if isinstance(exc, OSError) else None
    return Failure(f"{type(exc).__name__}: {exc}", tb, errno, stage)


# -- worker side ---------------------------------------------------------------------------------------------------


def serve(conn, setup: Callable, handle: Callable, stage: str, *setup_args) -> None:
    """What every worker process runs (the ``target`` of :func:`~h5stream.concurrency.spawn.spawn_workers`).

    Ignores SIGINT (the parent governs shutdown), runs ``state = setup(*setup_args)`` and answers ``("ready",
    pid)``, or ``("fatal", failure)`` and returns when it raised.  Then serves each task ``(seq, body)`` with
    ``handle(state, body)``: ``("done", seq, result)``, or ``("error", seq, failure)`` if it raised (anything,
    SystemExit from user code too: the worker reports and keeps serving; stage ``stage`` unless the handler
    raised :class:`TaskFailed`).  Returns on ``None``, or as soon as it is between tasks and the parent is
    gone (its process sentinel, so even a parent killed by SIGKILL leaves no orphan serving); a parent gone
    while a task runs ends the process at once (:func:`~h5stream.concurrency.spawn.exit_with_parent`).  ``setup`` and
    ``handle`` are module-level functions (spawn pickles them by name).
    """
    worker_signals()
    parent = mp.parent_process()
    if parent is not None:
        exit_with_parent(parent.sentinel)  # a parent killed mid-task: between tasks the loop below sees it too
    try:
        state = setup(*setup_args)
    except BaseException as exc:
        _send(conn, (FATAL, failure(exc, "start")))
        return
    if not _send(conn, (READY, os.getpid())):
        return
    watch = selectors.DefaultSelector()  # registered once: one wait per task, not a new selector each time
    watch.register(conn, selectors.EVENT_READ)
    if parent is not None:
        watch.register(parent.sentinel, selectors.EVENT_READ)
    with watch:
        while True:
            if conn not in [key.fileobj for key, _ in watch.select()]:
                return  # the parent died without stopping us: nothing left to serve
            try:
                data = conn.recv_bytes()
            except (EOFError, OSError):
                return
            if data[:1] == RAW:
                seq, body = int.from_bytes(data[1:9], "little"), memoryview(data)[9:]
            else:
                msg = pickle.loads(data)
                if msg is None:
                    return
                seq, body = msg
            try:
                reply = (DONE, seq, handle(state, body))
            except BaseException as exc:
                reply = (ERROR, seq, failure(exc, stage))
            if not _send(conn, reply):
                return


def _send(conn, msg) -> bool:
    try:
        conn.send(msg)
        return True
    except (EOFError, OSError):
        return False  # the parent went away


# -- parent side ---------------------------------------------------------------------------------------------------


def death_report(role: str, worker: int | None, pid: int | None, exitcode: int | None, started: bool,
                 oom_fix: str, startup_hint: str = "") -> str:
    """The one account of a worker that ended on its own (pure): who, how, and what to do.

    ``role`` names the pool's workers ("decode worker"), ``worker`` the one that died (None for a process
    that is no pool's worker, such as the feeder: then only its pid is given); a negative ``exitcode`` is the
    signal that killed it (SIGKILL, the out-of-memory killer's, gets ``oom_fix``); ``started``: whether it had
    answered "ready" (if not, it died during start-up, and ``startup_hint`` says what usually causes that).
    """
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        how = f"was killed by {name}"
        hint = f"; SIGKILL often means the out-of-memory killer: {oom_fix}" if -exitcode == signal.SIGKILL else ""
    elif exitcode is not None:
        how, hint = f"exited with code {exitcode}", "; see its output above"
    else:
        how, hint = "ended", ""
    when = ""
    if not started:
        when, hint = " during start-up", f"{hint}; its traceback, if any, is on stderr above{startup_hint}"
    who = f"worker {worker} (pid {pid})" if worker is not None else f"pid {pid}"
    return f"{role} died{when}: {who} {how}{hint}"


def pick_worker(in_flight: Sequence[int], eligible: Iterable[int], cap: int) -> int | None:
    """The eligible worker with the fewest tasks in flight, below ``cap``; the lowest index on a tie (pure)."""
    best = None
    for w in sorted(eligible):
        if in_flight[w] < cap and (best is None or in_flight[w] < in_flight[best]):
            best = w
    return best


class InOrder:
    """Results that finish in any order, handed over in submission order.  Not locked: its owner's lock or
    thread guards it."""

    def __init__(self):
        self.next_submit = 0
        self.next_deliver = 0
        self._finished: dict = {}

    def submitted(self) -> int:
        """Number the next submission (from 0 up)."""
        seq = self.next_submit
        self.next_submit += 1
        return seq

    def finish(self, seq: int, value) -> None:
        self._finished[seq] = value

    def ready(self) -> bool:
        """Whether the next result in order is in."""
        return self.next_deliver in self._finished

    def pop(self) -> tuple[int, object]:
        """``(seq, value)`` of the next result in order (call when :meth:`ready`)."""
        seq = self.next_deliver
        self.next_deliver += 1
        return seq, self._finished.pop(seq)

    def drop(self) -> list:
        """Forget every finished result not handed over (returned) and skip to the next submission."""
        values = list(self._finished.values())
        self._finished.clear()
        self.next_deliver = self.next_submit
        return values


def stopped(pid: int | None) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, Ctrl-Z, a debugger): it runs nothing until SIGCONT."""
    if pid is None:
        return False
    try:  # Linux: the state letter of /proc/PID/stat ("T" stopped, "t" stopped by a tracer), read in microseconds
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2:][:1] in (b"T", b"t")
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return False  # gone
    except (OSError, ValueError):
        pass
    import psutil  # here, not at the top: workers import this module and need no psutil (importing it: ~40 ms)

    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


class Workers:
    """A pool's worker processes and the parent's ends of their pipes; their one owner is the pool's state.

    Threads: :meth:`send` from one thread (the producer), :meth:`wait` from one
    thread (the one that reads the workers' messages: the caller's for ingest,
    the one waiting for a result for augment), :meth:`stop` once nobody waits any more.
    """

    def __init__(self, role: str):
        self.role = role  # "decode worker", "augment worker": how reports name them
        self.procs: list = []
        self.conns: list = []
        self.started: set[int] = set()  # workers that answered "ready" (read by wait's thread)
        self.exitcodes: dict[int, int | None] = {}  # workers whose end wait() reported
        self._watch: selectors.BaseSelector | None = None
        self._narrow: dict[int, selectors.BaseSelector] = {}  # worker -> selector of its pipe, no other pipe
        self._open: dict[int, object] = {}  # worker -> pipe still read
        self._partial: dict[int, bytes] = {}  # worker -> the start of a message not read whole yet
        self._alive: dict[int, int] = {}  # sentinel -> worker, not yet reported exited

    def start(self, setup: Callable, handle: Callable, stage: str, args: Sequence[tuple], *, name: str,
              hide_main: bool = True) -> None:
        """Spawn one worker per entry of ``args``, each running :func:`serve` with ``setup(*args[i])`` (see
        :func:`~h5stream.concurrency.spawn.spawn_workers`).  Returns at once: their "ready" comes through
        :meth:`wait`."""
        self.procs, self.conns = spawn_workers(serve, [(setup, handle, stage, *a) for a in args], name=name,
                                               hide_main=hide_main)
        self._open = dict(enumerate(self.conns))
        self._alive = {p.sentinel: w for w, p in enumerate(self.procs)}

    def replace(self, worker: int, setup: Callable, handle: Callable, stage: str, args: tuple, *, name: str) -> None:
        """Start a new process in the place of ``worker``, whose end :meth:`wait` reported, as :meth:`start`
        started it; its "ready" comes through :meth:`wait`.  The thread that calls :meth:`wait`."""
        procs, conns = spawn_workers(serve, [(setup, handle, stage, *args)], name=f"{name}-{worker}")
        self.conns[worker].close()
        self.procs[worker], self.conns[worker] = procs[0], conns[0]
        self.started.discard(worker)
        self.exitcodes.pop(worker, None)
        self._partial.pop(worker, None)
        self._open[worker] = conns[0]
        self._alive[procs[0].sentinel] = worker
        self._close_selectors()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def send(self, worker: int, seq: int, body) -> bool:
        """Send task ``(seq, body)`` to ``worker``; False when its pipe is gone (it died: :meth:`wait` says how)."""
        try:
            self.conns[worker].send((seq, body))
            return True
        except (OSError, ValueError):
            return False

    def send_raw(self, worker: int, seq: int, body: bytes) -> bool:
        """Send task ``seq`` to ``worker`` as bytes, ``body`` packed by the front end (its handler gets it as a
        ``memoryview``): one write of the frame ``Connection.recv_bytes`` reads, no pickling.  False when its
        pipe is gone, as :meth:`send`."""
        try:
            fd = self.conns[worker].fileno()
            data = b"".join((_LENGTH.pack(len(body) + 9), RAW, seq.to_bytes(8, "little"), body))
            while data:  # a pipe takes a message of a few KiB whole; a write cut short goes on with the rest
                data = data[os.write(fd, data):]
            return True
        except (OSError, ValueError):
            return False

    def wait(self, timeout_s: float | None = None, wake_fd: int | None = None,
             sleep_on: int | None = None) -> list[tuple[int, tuple]]:
        """Block until a worker sends or ends (or ``wake_fd`` is readable, or ``timeout_s`` passes: ``[]``).

        Returns ``(worker, message)`` pairs, messages first (a worker that
        answered, then died, is described by its answer), then ``("exited",
        exitcode)`` for each worker whose process ended, after what was
        left in its pipe.  Every whole message in a ready pipe is read.
        ``sleep_on``: the worker whose answer the caller waits for; only
        that worker's pipe, a process ending, ``wake_fd`` or ``timeout_s``
        ends the sleep, and then every pipe is read: a caller that needs one
        answer wakes once for it, not once for each other worker finishing
        meanwhile (their answers are read at the end of the sleep, never
        waited for).  ``wake_fd`` must be the same at every call.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if self._watch is None:  # one selector, rebuilt only when a pipe or process goes away
                self._watch = self._selector(wake_fd, self._open)
                self._narrow = {}
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if sleep_on is not None and left != 0 and sleep_on in self._open:
                # Sleep until the awaited answer (or an end), then read whatever every pipe holds.
                narrow = self._narrow.get(sleep_on)
                if narrow is None:
                    narrow = self._narrow[sleep_on] = self._selector(wake_fd, {sleep_on: self._open[sleep_on]})
                narrow.select(left)
                ready = [key.data for key, _ in self._watch.select(0)]
            else:
                ready = [key.data for key, _ in self._watch.select(left)]
            events = self._read(ready)
            if events or ("wake", None) in ready or (deadline is not None and time.monotonic() >= deadline):
                break
            # only a pipe's end of file (its process's sentinel follows), or a message not read whole yet
        for w, msg in events:
            if msg[0] == READY:
                self.started.add(w)
        return events

    def _selector(self, wake_fd: int | None, pipes: dict) -> selectors.BaseSelector:
        """A selector of ``wake_fd``, the pipes ``pipes`` (worker -> connection) and every live process's
        sentinel."""
        watch = selectors.DefaultSelector()
        if wake_fd is not None:
            watch.register(wake_fd, selectors.EVENT_READ, ("wake", None))
        for w, conn in pipes.items():
            watch.register(conn, selectors.EVENT_READ, ("conn", w))
        for fd, w in self._alive.items():
            watch.register(fd, selectors.EVENT_READ, ("exit", w))
        return watch

    def _recv(self, w: int) -> list[tuple]:
        """Every whole message in worker ``w``'s pipe, after one read (which must not block: the pipe is ready);
        EOFError once it is closed.  Read past ``Connection.recv``: one read for all that is there, where
        ``recv`` takes two per message."""
        data = os.read(self._open[w].fileno(), _READ_BYTES)
        if not data:
            raise EOFError
        partial = self._partial.pop(w, None)
        if partial:
            data = partial + data
        messages, used = frames(data)
        if used < len(data):
            self._partial[w] = data[used:]
        return [pickle.loads(m) for m in messages]

    def _read(self, ready: list[tuple]) -> list[tuple[int, tuple]]:
        """The events behind what the selector found ready (see :meth:`wait`)."""
        events = []
        for kind, w in ready:
            if kind == "conn" and w in self._open:
                try:
                    events.extend((w, msg) for msg in self._recv(w))
                except (EOFError, OSError):
                    self._forget_pipe(w)  # its sentinel tells how it ended
        for kind, w in ready:
            if kind != "exit":
                continue
            proc = self.procs[w]
            self._alive.pop(proc.sentinel, None)
            conn = self._open.get(w)
            try:
                while conn is not None and conn.poll():
                    events.extend((w, msg) for msg in self._recv(w))
            except (EOFError, OSError):
                pass
            self._forget_pipe(w)
            proc.join(1.0)  # the sentinel fired, so this returns at once; it sets exitcode
            self.exitcodes[w] = proc.exitcode
            events.append((w, (EXITED, proc.exitcode)))
        return events

    def _forget_pipe(self, worker: int) -> None:
        self._open.pop(worker, None)
        self._partial.pop(worker, None)
        self._close_selectors()

    def _close_selectors(self) -> None:
        for watch in (self._watch, *self._narrow.values()):
            if watch is not None:
                watch.close()
        self._watch, self._narrow = None, {}

    def death(self, worker: int, oom_fix: str, startup_hint: str = "") -> str:
        """:func:`death_report` of ``worker``, whose end :meth:`wait` returned."""
        proc = self.procs[worker]
        return death_report(self.role, worker, proc.pid, self.exitcodes.get(worker, proc.exitcode),
                            worker in self.started, oom_fix, startup_hint)

    def tell_stop(self) -> None:
        """Ask every worker to exit after its current task, without waiting (any thread)."""
        for conn in self.conns:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass  # dead, or its pipe already closed

    def stop(self, timeout_s: float) -> None:
        """Stop every worker and close the pipes; idempotent.  Asks them to exit; kills a stopped one (SIGSTOP:
        it reads nothing and obeys no signal but SIGKILL), terminates one still starting (nothing to finish,
        and its imports may take seconds); after ``timeout_s`` in all, terminates then kills what is left."""
        self.tell_stop()
        for w, proc in enumerate(self.procs):
            if proc.exitcode is not None:
                continue
            if stopped(proc.pid):
                proc.kill()
            elif w not in self.started:
                proc.terminate()
        reap_workers(self.procs, timeout_s)
        for conn in self.conns:
            conn.close()
        self._close_selectors()
        self._open, self._alive, self._partial = {}, {}, {}
