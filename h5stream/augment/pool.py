"""A pool of augmenting worker processes that exchange only indices.

Generic: it knows nothing about HDF5.  The owner (the stream) submits tasks
``(source_index, positions, row_ids, epoch, seed)`` on its *sources*:

* a :class:`~h5stream.shm.SharedSpec`, shared arrays the owner fills (its
  input slots): a worker gathers ``source[positions]`` into its private buffer,
  or, for a contiguous run submitted ``in_place``, reads it where it lies;
* a :class:`FileSource`, fixed-size rows stored uncompressed in a file:
  ``positions`` are byte offsets, and the worker reads the rows itself
  (``preadv`` from the page cache into its private buffer), so the owner never
  copies a pixel.

The worker then calls the transform writing straight into an output *slot* (a
ring of shared arrays the pool owns), and reports back.  Pixels never go
through a pipe.

Threads and processes:

* ``workers`` processes, started once with the ``spawn`` start method and
  reused until ``close()``.  They ignore SIGINT (the parent's ``close()``
  governs shutdown) and exit on their own if the parent dies.
* One collector thread in the parent reads the workers' messages and watches
  their process sentinels, so a worker killed by SIGKILL / the OOM killer is
  reported within milliseconds, not after a queue timeout.
* The public methods are safe to call from two threads: a producer
  (``submit``, ``wait_source_free``) and a consumer (``get``, ``slot_view``,
  ``release``).  Every blocking call takes a timeout and wakes on ``close()``
  (the stop flag) or on a worker failure; none blocks forever.

Ownership: the pool owns its worker processes and its slot segment; the
sources belong to the caller, who must keep them alive until ``close()``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import selectors
import signal
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import numpy as np

from h5stream import _interrupt as interrupt
from h5stream._spawn import spawn_workers, worker_signals
from h5stream.read.pagecache import preadv_all
from h5stream.shm import SharedArray, SharedSpec, new_prefix
from h5stream.errors import ConfigError, StreamClosedError, WorkerError

__all__ = [
    "Batch",
    "FileSource",
    "WorkerPool",
    "measure_worker_pss",
    "slot_bytes",
    "worker_buffer_bytes",
]

# A task message is ~16 bytes per row plus pickle framing.  Capping the tasks
# queued per worker keeps a worker's pipe below this many bytes, so send()
# never blocks even when the worker is stuck in a slow transform.
_PIPE_BUDGET_BYTES = 64 << 10
_POLL_S = 0.1  # longest a wait goes without looking for a held-back Ctrl-C
_TASK_OVERHEAD_BYTES = 512


class Batch(NamedTuple):
    """A finished batch, delivered in submission order: read ``slot_view(slot)[:rows]``, then ``release(slot)``."""

    seq: int
    slot: int
    rows: int


@dataclass(frozen=True)
class FileSource:
    """Rows of ``row_shape``/``dtype`` stored uncompressed in a file, addressed by byte offset; picklable.

    A task on a file source names each row by its offset; the worker reads the
    rows itself (``preadv`` from the page cache into its gather buffer), so no
    pixel passes through the parent at all.
    """

    path: str
    shape: tuple[int, ...]  # (rows, *row_shape) like SharedSpec; tasks address rows by byte offset, not index
    dtype: str

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * np.dtype(self.dtype).itemsize


def slot_bytes(n_slots: int, batch_rows: int, row_shape: Sequence[int], dtype) -> int:
    """Bytes of shared memory a pool allocates for its output slots (pure)."""
    return int(n_slots) * int(batch_rows) * int(np.prod(row_shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def worker_buffer_bytes(batch_rows: int, row_shape: Sequence[int], dtype=np.uint8) -> int:
    """Bytes of private memory each worker allocates to gather one input batch (pure).

    Excludes the transform's own scratch memory.
    """
    return int(batch_rows) * int(np.prod(row_shape, dtype=np.int64)) * np.dtype(dtype).itemsize


class _RemoteTraceback(Exception):
    """Carries a worker's formatted traceback as the ``__cause__`` of a WorkerError."""

    def __init__(self, tb_text: str):
        super().__init__(tb_text)
        self.tb_text = tb_text

    def __str__(self) -> str:
        return "\n" + self.tb_text


def _worker_error(message: str, tb_text: str | None, stage: str | None = None, summary: str | None = None) -> WorkerError:
    """``stage``: "read" (getting a task's rows failed), "transform", or None (a worker died or failed to start);
    ``summary``: the worker's one-line account of a read or transform failure."""
    err = WorkerError(message)
    err.worker_traceback = tb_text
    err.stage = stage
    err.summary = summary
    if tb_text:
        err.__cause__ = _RemoteTraceback(tb_text)
    return err


# --------------------------------------------------------------------------- worker side


def _worker_main(conn, worker_id, transform_bytes, source_specs, slot_spec, batch_rows):
    """Entry point of a worker process (spawned; imports numpy and the h5stream modules the transform needs, never h5py)."""
    worker_signals()
    parent = mp.parent_process()
    try:
        transform = pickle.loads(transform_bytes)
        sources = [_FileRows(spec) if isinstance(spec, FileSource) else SharedArray.attach(spec).array
                   for spec in source_specs]
        slots = SharedArray.attach(slot_spec)
    except BaseException:
        conn.send(("fatal", worker_id, traceback.format_exc()))
        return
    conn.send(("ready", worker_id, os.getpid()))
    try:
        _serve(conn, parent.sentinel, transform, sources, source_specs[0], slots.array, batch_rows)
    except (EOFError, OSError):
        pass  # the parent went away mid-message; nothing left to serve


class _FileRows:
    """A worker's handle on a :class:`FileSource`: reads rows at byte offsets into a buffer."""

    def __init__(self, spec: FileSource):
        self.path = spec.path
        self.row_bytes = spec.row_bytes
        self.fd = os.open(spec.path, os.O_RDONLY)

    def read(self, offsets: np.ndarray, out: np.ndarray) -> None:
        """Read row ``i`` of ``out`` from byte ``offsets[i]``; rows adjacent in both go in one call."""
        n, rb = len(offsets), self.row_bytes
        dest = memoryview(out.reshape(-1)).cast("B")
        # Runs: places where the next row's offset is not right after this one's.
        breaks = np.flatnonzero(offsets[1:] != offsets[:-1] + rb) + 1
        starts = [0, *breaks.tolist()]
        stops = [*breaks.tolist(), n]
        firsts = offsets[starts].tolist()
        for a, b, off in zip(starts, stops, firsts):
            preadv_all(self.fd, [dest[a * rb:b * rb]], off, self.path)


def _serve(conn, parent_sentinel, transform, sources, spec0, out_all, batch_rows) -> None:
    """The worker's task loop; returns on the stop message or when the parent is gone."""
    gather = np.empty((batch_rows,) + tuple(spec0.shape[1:]), dtype=np.dtype(spec0.dtype))
    watch = selectors.DefaultSelector()  # registered once: one wait per task, not a new selector each time
    watch.register(conn, selectors.EVENT_READ)
    watch.register(parent_sentinel, selectors.EVENT_READ)
    while True:
        if conn not in [key.fileobj for key, _ in watch.select()]:
            return  # parent died without close(): nothing left to serve
        msg = conn.recv()
        if msg is None:
            return
        seq, slot, src, where, row_ids, epoch, seed, in_place = msg
        row_ids = np.frombuffer(row_ids, np.int64)
        n = len(row_ids)
        source = sources[src]
        if isinstance(source, _FileRows):
            # The rows' byte offsets in the file: read them here (no "read" message: nothing to free).
            images = gather[:n]
            try:
                source.read(np.frombuffer(where, np.int64), images)
            except Exception as exc:
                conn.send(("error", seq, f"{type(exc).__name__}: {exc}", traceback.format_exc(), "read"))
                continue
        elif in_place:
            # The rows are one contiguous run the submitter keeps untouched until the result is taken:
            # transform straight from shared memory (no copy, no "read" message; "done" implies it).
            images = source[where:where + n]
        else:
            positions = np.frombuffer(where, np.intp)
            images = gather[:n]
            try:
                # mode="clip" avoids numpy's extra buffered copy; the parent validated the range.
                np.take(source, positions, axis=0, out=images, mode="clip")
            except Exception as exc:
                conn.send(("error", seq, f"{type(exc).__name__}: {exc}", traceback.format_exc(), "read"))
                continue
            conn.send(("read", seq))
        try:
            out = out_all[slot, :n]
            result = transform(images, seed=seed, epoch=epoch, row_ids=row_ids, out=out)
            if result is not None and result is not out:
                result = np.asarray(result)
                if result.shape != out.shape:
                    raise ValueError(f"transform returned shape {result.shape}, the pool expects {out.shape}")
                out[...] = result
        except BaseException as exc:  # SystemExit from user code too: report, keep serving
            conn.send(("error", seq, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
            continue
        conn.send(("done", seq))


# --------------------------------------------------------------------------- parent side


class _Task:
    __slots__ = ("slot", "source", "rows", "worker", "read_done")

    def __init__(self, slot, source, rows, worker):
        self.slot, self.source, self.rows, self.worker = slot, source, rows, worker
        self.read_done = False


class _PoolState:
    """Everything the pool owns; shared by the facade, the collector thread and the finalizer.

    Nothing here references the WorkerPool object, so dropping the pool lets
    ``weakref.finalize`` run :func:`_shutdown`.  All fields below ``cond`` are
    guarded by its lock.  Three conditions share that lock, so a routine event
    wakes only the side that waits for it: ``for_consumer`` (a result in order,
    or no task left), ``for_producer`` (an output slot, worker capacity, a
    source read) and ``cond`` for the rest (start-up).  Close and failures wake
    all three (:meth:`wake_all`).  Waking a thread for nothing costs a futex
    round trip and a GIL hand-off per batch, which on two cores showed as the
    largest single cost of the parent's Python.
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
        self.tasks: dict[int, _Task] = {}
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
            raise _worker_error(*self.failure)

    def wake_all(self) -> None:
        self.cond.notify_all()
        self.for_consumer.notify_all()
        self.for_producer.notify_all()

    def wait(self, predicate: Callable[[], bool], timeout_s: float, what: str, on: threading.Condition | None = None) -> None:
        """Wait on ``on`` (default cond) until predicate() holds; raises on close, failure or timeout.

        Wakes every :data:`_POLL_S` to run a Ctrl-C held back by :mod:`h5stream._interrupt`."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check()
            if predicate():
                return
            interrupt.raise_pending()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"augment worker pool: {what} within {timeout_s:g} s")
            (on or self.cond).wait(min(remaining, _POLL_S))

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
            hint = "; its traceback is on stderr above (an import error, or a script without `if __name__ == '__main__':`?)"
        self.failure = (f"augment worker {w} (pid {proc.pid}) {how}{hint}", None)
        self.wake_all()


def _collect(state: _PoolState) -> None:
    """Collector thread: route worker messages into state, notice dead workers.

    If it fails itself, every blocked or later call raises WorkerError instead
    of waiting for results that would never be routed.
    """
    try:
        _collect_loop(state)
    except BaseException as exc:
        with state.cond:
            if state.failure is None and not state.closed:
                state.failure = (f"the pool's collector thread failed: {type(exc).__name__}: {exc}", traceback.format_exc())
            state.wake_all()


def _collect_loop(state: _PoolState) -> None:
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


def _shutdown(state: _PoolState) -> None:
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
        if w not in state.ready and w < len(state.procs):
            state.procs[w].terminate()  # still starting: nothing to finish, and its imports may take seconds
    deadline = time.monotonic() + state.close_timeout_s
    for proc in state.procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in state.procs:
        if proc.exitcode is None:
            proc.terminate()
            proc.join(1.0)
        if proc.exitcode is None:
            proc.kill()
            proc.join(1.0)
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


class WorkerPool:
    """N spawned processes applying ``transform`` to rows of shared source arrays.

    Parameters
    ----------
    transform:
        Picklable callable ``transform(images, *, seed, epoch, row_ids, out) -> array | None``.
        ``images`` is the gathered batch (n, *row_shape) of the sources' dtype,
        owned by the worker and reused for the next task; ``out`` is the output
        slot view (n, *out_row_shape) of ``out_dtype``.  Write into ``out``, or
        return an array of that shape (copied into ``out``).  Workers re-run the
        parent's main script only if the transform's pickle refers to
        ``__main__``; define user functions in an importable module to keep
        a script's heavy imports (tensorflow) out of the workers.
    sources:
        Specs of the caller's shared arrays and/or :class:`FileSource` files,
        all shaped (rows, *row_shape) with one dtype.  The caller owns them and
        must not overwrite rows that a submitted task has not yet read (see
        :meth:`wait_source_free`; file sources count as read at once).
    workers, batch_rows, n_slots:
        Process count (>= 1), most rows per task, output slots in the ring.
        At most ``n_slots`` batches are in flight or held by the consumer.
    out_row_shape, out_dtype:
        Shape of one output row (default: the sources' row shape) and dtype.
    prefix:
        Segment-name prefix (default :func:`new_prefix`).
    start_timeout_s:
        The constructor waits this long for every worker to import the
        transform and attach; a worker that fails raises WorkerError here.
    close_timeout_s:
        How long ``close()`` lets workers finish their current task before
        terminating them.
    """

    def __init__(
        self,
        transform: Callable,
        sources: Sequence[SharedSpec | FileSource],
        *,
        workers: int,
        batch_rows: int,
        n_slots: int,
        out_row_shape: Sequence[int] | None = None,
        out_dtype=np.uint8,
        prefix: str | None = None,
        start_timeout_s: float = 60.0,
        close_timeout_s: float = 5.0,
    ):
        sources = list(sources)
        for name, value in (("workers", workers), ("batch_rows", batch_rows), ("n_slots", n_slots)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ConfigError(f"WorkerPool: {name} must be an integer >= 1, got {value!r}")
        if not sources or not all(isinstance(s, (SharedSpec, FileSource)) and len(s.shape) >= 2 for s in sources):
            raise ConfigError("WorkerPool: sources must be a non-empty list of SharedSpec or FileSource shaped (rows, ...)")
        row_shape, src_dtype = sources[0].shape[1:], np.dtype(sources[0].dtype)
        for s in sources:
            if s.shape[1:] != row_shape or np.dtype(s.dtype) != src_dtype:
                raise ConfigError(
                    f"WorkerPool: every source must have row shape {row_shape} and dtype {src_dtype}, "
                    f"got {s.shape[1:]} {s.dtype} for {getattr(s, 'name', None) or s.path}"
                )
        if not callable(transform):
            raise ConfigError(f"WorkerPool: transform must be callable, got {type(transform).__name__}")
        try:
            transform_bytes = pickle.dumps(transform)
        except Exception as exc:
            raise ConfigError(
                f"WorkerPool: the transform must be picklable to reach worker processes ({exc}); "
                "define functions at module top level, not as lambdas or closures"
            ) from None
        self.batch_rows = int(batch_rows)
        self.n_slots = int(n_slots)
        self.workers = int(workers)
        self.row_shape = tuple(row_shape)
        self.out_row_shape = tuple(int(d) for d in (out_row_shape if out_row_shape is not None else row_shape))
        self.out_dtype = np.dtype(out_dtype)
        self._source_rows = [s.shape[0] for s in sources]
        self._file_sources = {i for i, s in enumerate(sources) if isinstance(s, FileSource)}
        task_bytes = 16 * self.batch_rows + _TASK_OVERHEAD_BYTES
        cap = max(1, min(self.n_slots, _PIPE_BUDGET_BYTES // task_bytes))
        state = _PoolState(self.workers, len(sources), self.n_slots, cap, float(close_timeout_s))
        self._state = state
        self._finalizer = weakref.finalize(self, _shutdown, state)
        try:
            self._start(transform_bytes, sources, prefix or new_prefix(), float(start_timeout_s))
        except BaseException:
            self.close()
            raise

    def _start(self, transform_bytes, sources, prefix, start_timeout_s) -> None:
        state = self._state
        state.slots = SharedArray.create((self.n_slots, self.batch_rows) + self.out_row_shape, self.out_dtype, prefix)
        state.slot_items = state.slots.item_arrays()
        args = [(w, transform_bytes, list(sources), state.slots.spec, self.batch_rows) for w in range(self.workers)]
        state.procs, state.conns = spawn_workers(_worker_main, args, name="h5stream-augment",
                                                 hide_main=b"__main__" not in transform_bytes)
        state.collector = threading.Thread(target=_collect, args=(state,), name="h5stream-pool-collector", daemon=True)
        state.collector.start()
        with state.cond:
            state.wait(lambda: len(state.ready) == self.workers, start_timeout_s, "workers did not start")

    # ------------------------------------------------------------------ producer side

    def submit(self, source_index: int, positions, row_ids, *, epoch: int, seed: int, timeout_s: float,
               in_place: bool = False) -> int:
        """Queue one batch ``transform(sources[source_index][positions])``; return its seq number.

        ``positions`` index rows of the source (1-D, 1..batch_rows entries), or
        for a :class:`FileSource` are the rows' byte offsets in the file;
        ``row_ids`` (int64, same length) are passed to the transform as the
        rows' identity for per-sample randomness.  Blocks until an output slot
        is free; raises TimeoutError after ``timeout_s``, StreamClosedError if
        the pool was closed meanwhile, WorkerError if a worker died.
        Seq numbers count up from 0 in submission order.

        ``in_place=True`` (``positions`` must then be one ascending run) lets
        the worker transform the rows where they lie instead of copying them
        out first; the caller promises not to overwrite them until the result
        is taken, and the source counts as read only when the task is done.
        """
        positions = np.asarray(positions)
        row_ids = np.asarray(row_ids)
        if positions.ndim != 1 or not 1 <= positions.shape[0] <= self.batch_rows:
            raise ConfigError(f"submit: positions must be 1-D with 1..{self.batch_rows} entries, got shape {positions.shape}")
        if not (np.issubdtype(positions.dtype, np.integer) and np.issubdtype(row_ids.dtype, np.integer)):
            raise ConfigError(f"submit: positions and row_ids must be integers, got {positions.dtype} and {row_ids.dtype}")
        if row_ids.shape != positions.shape:
            raise ConfigError(f"submit: row_ids shape {row_ids.shape} differs from positions shape {positions.shape}")
        if not 0 <= source_index < len(self._source_rows):
            raise ConfigError(f"submit: source_index {source_index} out of range 0..{len(self._source_rows) - 1}")
        rows = self._source_rows[source_index]
        n = positions.shape[0]
        first = int(positions[0])
        from_file = source_index in self._file_sources
        if from_file:
            if in_place:
                raise ConfigError("submit: in_place=True applies to shared-memory sources, not to a FileSource")
            if int(positions.min()) < 0:
                raise ConfigError(f"submit: byte offsets must be >= 0 for file source {source_index}")
            low, high = 0, 0  # whether an offset lies inside the file, the worker's read tells
        elif in_place:
            if not np.array_equal(positions, np.arange(first, first + n)):
                raise ConfigError("submit: in_place=True needs positions to be one ascending contiguous run")
            low, high = first, first + n - 1
        else:
            low, high = int(positions.min()), int(positions.max())
        if low < 0 or high >= rows:
            raise ConfigError(f"submit: positions must lie in 0..{rows - 1} for source {source_index}")
        # In place, the run's first row says it all; otherwise the positions go as raw bytes.
        if from_file:
            where = positions.astype(np.int64, copy=False).tobytes()
        else:
            where = first if in_place else positions.astype(np.intp, copy=False).tobytes()
        task_row_ids = row_ids.astype(np.int64, copy=False).tobytes()
        state = self._state
        with state.cond:
            state.wait(
                lambda: bool(state.free_slots) and state.pick_worker() is not None,
                timeout_s,
                "no output slot was released (is the consumer calling release()?)",
                on=state.for_producer,
            )
            worker = state.pick_worker()
            slot = state.free_slots.popleft()
            seq = state.next_submit
            try:
                # Plain ints and bytes: pickling them costs a fifth of pickling the two arrays.
                state.conns[worker].send((seq, slot, source_index, where, task_row_ids, int(epoch), int(seed), bool(in_place)))
            except OSError:
                state.free_slots.appendleft(slot)
                # The collector reports how the worker ended; give it a moment to.
                state.wait(lambda: False, 5.0, f"worker {worker} stopped taking tasks")
            state.next_submit += 1
            task = state.tasks[seq] = _Task(slot, source_index, positions.shape[0], worker)
            state.inflight[worker] += 1
            if from_file:
                task.read_done = True  # nothing of the caller's to free: the file is not overwritten
            else:
                state.source_readers[source_index] += 1
        return seq

    def wait_source_free(self, source_index: int, timeout_s: float) -> None:
        """Block until no submitted task still has to read ``sources[source_index]``.

        Workers copy their rows out before transforming, so a source frees up
        well before its batches are finished.  Raises TimeoutError,
        StreamClosedError or WorkerError like :meth:`submit`.
        """
        state = self._state
        with state.cond:
            state.wait(lambda: state.source_readers[source_index] == 0, timeout_s, f"source {source_index} still being read",
                       on=state.for_producer)

    def source_readers(self, source_index: int) -> int:
        """Tasks submitted for ``source_index`` whose rows have not been copied out yet (non-blocking)."""
        with self._state.cond:
            return self._state.source_readers[source_index]

    # ------------------------------------------------------------------ consumer side

    def get(self, timeout_s: float) -> Batch:
        """Return the next batch in seq order (completions may arrive out of order).

        The slot stays reserved until :meth:`release`.  If the transform raised
        for this batch, its slot is freed and WorkerError is raised, carrying
        the worker's traceback in ``.worker_traceback`` and ``__cause__``; the
        pool stays usable.  A dead worker makes every call raise WorkerError.
        Raises TimeoutError if the batch is not ready within ``timeout_s``.
        """
        state = self._state
        with state.cond:
            state.wait(
                lambda: state.next_deliver in state.results,
                timeout_s,
                f"batch {state.next_deliver} not ready ({len(state.tasks)} in flight, {state.next_submit} submitted)",
                on=state.for_consumer,
            )
            seq = state.next_deliver
            slot, rows, error = state.results.pop(seq)
            state.next_deliver += 1
            if error is not None:
                state.free_slots.append(slot)
                state.for_producer.notify_all()
                summary, tb_text, stage = error
                if stage == "read":
                    raise _worker_error(f"augment worker could not read the rows of batch {seq}: {summary}", tb_text,
                                        stage, summary)
                raise _worker_error(f"augment worker raised while transforming batch {seq}: {summary}", tb_text,
                                    stage, summary)
            state.held_slots.add(slot)
            return Batch(seq, slot, rows)

    def slot_view(self, slot: int) -> np.ndarray:
        """The whole output slot (batch_rows, *out_row_shape), a view into shared memory; valid until release()."""
        if self._state.slots is None or self._state.slots.array is None or not self._state.slot_items:
            raise StreamClosedError("the augment worker pool is closed; open a new stream")
        return self._state.slot_items[slot]

    def lend(self, batch: Batch) -> np.ndarray:
        """Hand ``batch``'s rows to the caller without a copy: a view into its output slot.

        The slot stays out of the ring while anything refers to the view (or
        to a view of it); :meth:`reclaim` gives it back once nothing does.  So
        a caller may keep the array as long as it likes, but every array kept
        holds a slot: lend only while :meth:`lent` is small, and copy
        otherwise.  Consumer thread only.
        """
        view = self.slot_view(batch.slot)[: batch.rows]
        self._state.lent.append(batch.slot)
        return view

    def reclaim(self) -> int:
        """Release every lent slot nothing refers to any more; return how many stay lent.  Consumer thread only."""
        state = self._state
        items, still = state.slot_items, []
        for slot in state.lent:
            # Only the items list and getrefcount's own argument: no view of this slot is alive.
            if items and sys.getrefcount(items[slot]) > 2:
                still.append(slot)
            elif items:
                self.release(slot)
        state.lent = still
        return len(still)

    @property
    def lent(self) -> int:
        """Slots lent to the consumer (see :meth:`lend`) and not reclaimed yet."""
        return len(self._state.lent)

    def release(self, slot: int) -> None:
        """Give a slot obtained from :meth:`get` back to the ring."""
        state = self._state
        with state.cond:
            if slot not in state.held_slots:
                raise ConfigError(f"release: slot {slot} is not held by the consumer (released twice?)")
            state.held_slots.remove(slot)
            state.free_slots.append(slot)
            state.for_producer.notify_all()

    def take(self, timeout_s: float) -> tuple[int, np.ndarray]:
        """``get`` + copy + ``release``: return ``(seq, array)`` with an array the caller owns."""
        batch = self.get(timeout_s)
        try:
            return batch.seq, self.slot_view(batch.slot)[: batch.rows].copy()
        finally:
            self.release(batch.slot)

    def discard_pending(self, timeout_s: float) -> int:
        """Wait for every submitted task to finish and drop the undelivered results.

        For ending an epoch early: afterwards ``get`` waits for the next
        submission.  Transform errors of dropped batches are ignored; slots
        the consumer still holds stay held.  Returns the number dropped.
        """
        state = self._state
        with state.cond:
            state.wait(lambda: not state.tasks, timeout_s, f"{len(state.tasks)} tasks did not finish", on=state.for_consumer)
            dropped = len(state.results)
            for slot, _rows, _error in state.results.values():
                state.free_slots.append(slot)
            state.results.clear()
            state.next_deliver = state.next_submit
            state.wake_all()
            return dropped

    # ------------------------------------------------------------------ introspection and lifecycle

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers (for monitoring and tests)."""
        return [p.pid for p in self._state.procs]

    @property
    def in_flight(self) -> int:
        """Submitted tasks not finished yet."""
        with self._state.cond:
            return len(self._state.tasks)

    @property
    def slot_nbytes(self) -> int:
        """Shared memory this pool allocated for its output slots."""
        return slot_bytes(self.n_slots, self.batch_rows, self.out_row_shape, self.out_dtype)

    @property
    def worker_buffer_nbytes(self) -> int:
        """Private gather buffer of each worker (bytes), excluding the transform's scratch."""
        return worker_buffer_bytes(self.batch_rows, self.row_shape)

    def worker_pss_bytes(self) -> list[int]:
        """Measured PSS of each live worker (psutil; bytes).  Includes its share of touched shared pages."""
        import psutil

        out = []
        for pid in self.pids:
            try:
                out.append(psutil.Process(pid).memory_full_info().pss)
            except psutil.Error:
                out.append(0)
        return out

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Stop the workers (stop message, join, then terminate/kill) and unlink the slots.

        Idempotent; also run by the context manager, at garbage collection and
        at interpreter exit.  Views from :meth:`slot_view` stay readable.
        """
        self._finalizer()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.workers} workers"
        return f"WorkerPool({state}, {self.n_slots} slots x {self.batch_rows} rows {self.out_row_shape} {self.out_dtype})"


# --------------------------------------------------------------------------- measurement


def _copy_transform(images, *, seed, epoch, row_ids, out=None):
    out[...] = images
    return out


def measure_worker_pss(transform: Callable | None = None, *, row_shape=(32, 32, 3), batch_rows: int = 4) -> int:
    """PSS (bytes) of one spawned worker after importing ``transform`` and running one tiny task.

    Buffers are tiny, so this is the fixed per-worker cost (interpreter,
    numpy, the transform's imports).  Takes about one process start-up.
    """
    transform = transform or _copy_transform
    with SharedArray.create((batch_rows,) + tuple(row_shape), np.uint8, new_prefix()) as src:
        with WorkerPool(transform, [src.spec], workers=1, batch_rows=batch_rows, n_slots=1) as pool:
            pool.submit(0, np.arange(batch_rows), np.arange(batch_rows), epoch=0, seed=0, timeout_s=60)
            pool.take(60)
            return pool.worker_pss_bytes()[0]
