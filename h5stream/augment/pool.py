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
The worker side is :mod:`h5stream.augment.worker`; what the pool owns, and
its collector thread, :mod:`h5stream.augment.pool_state`.
"""

from __future__ import annotations

import pickle
import sys
import threading
import weakref
from typing import Callable, NamedTuple, Sequence

import numpy as np

from h5stream._spawn import spawn_workers
from h5stream.augment.pool_state import PoolState, Task, collect, shutdown, worker_error
from h5stream.augment.worker import FileSource, worker_main
from h5stream.errors import ConfigError, StreamClosedError
from h5stream.shm import SharedArray, SharedSpec, new_prefix

__all__ = [
    "FileSource",
    "Result",
    "WorkerPool",
    "slot_bytes",
    "worker_buffer_bytes",
]

# A task message is ~16 bytes per row plus pickle framing.  Capping the tasks
# queued per worker keeps a worker's pipe below this many bytes, so send()
# never blocks even when the worker is stuck in a slow transform.
_PIPE_BUDGET_BYTES = 64 << 10
_TASK_OVERHEAD_BYTES = 512


class Result(NamedTuple):
    """A finished batch, delivered in submission order: read ``slot_view(slot)[:rows]``, then ``release(slot)``."""

    seq: int
    slot: int
    rows: int


def slot_bytes(n_slots: int, batch_rows: int, row_shape: Sequence[int], dtype) -> int:
    """Bytes of shared memory a pool allocates for its output slots (pure)."""
    return int(n_slots) * int(batch_rows) * int(np.prod(row_shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def worker_buffer_bytes(batch_rows: int, row_shape: Sequence[int], dtype=np.uint8) -> int:
    """Bytes of private memory each worker allocates to gather one input batch (pure).

    Excludes the transform's own scratch memory.
    """
    return int(batch_rows) * int(np.prod(row_shape, dtype=np.int64)) * np.dtype(dtype).itemsize


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
            raise ConfigError("WorkerPool: sources must be a non-empty list of SharedSpec or FileSource "
                              "shaped (rows, ...)")
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
        state = PoolState(self.workers, len(sources), self.n_slots, cap, float(close_timeout_s))
        self._state = state
        self._finalizer = weakref.finalize(self, shutdown, state)
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
        state.procs, state.conns = spawn_workers(worker_main, args, name="h5stream-augment",
                                                 hide_main=b"__main__" not in transform_bytes)
        state.collector = threading.Thread(target=collect, args=(state,), name="h5stream-pool-collector", daemon=True)
        state.collector.start()
        with state.cond:
            state.wait(lambda: len(state.ready) == self.workers, start_timeout_s, "workers did not start")

    # ------------------------------------------------------------------ producer side

    def submit(self, source_index: int, positions, row_ids, *, epoch: int, seed: int, timeout_s: float,
               in_place: bool = False, checks: tuple[np.ndarray, np.ndarray] | None = None) -> int:
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

        ``checks=(digests, checked)`` (a :class:`FileSource` only): the worker
        checks the xxh3-64 of each row it reads where ``checked``, and fails
        the task (stage ``"read"``, a ``ChecksumError`` summary) on a mismatch.
        """
        positions = np.asarray(positions)
        row_ids = np.asarray(row_ids)
        if positions.ndim != 1 or not 1 <= positions.shape[0] <= self.batch_rows:
            raise ConfigError(f"submit: positions must be 1-D with 1..{self.batch_rows} entries, "
                              f"got shape {positions.shape}")
        if not (np.issubdtype(positions.dtype, np.integer) and np.issubdtype(row_ids.dtype, np.integer)):
            raise ConfigError(f"submit: positions and row_ids must be integers, "
                              f"got {positions.dtype} and {row_ids.dtype}")
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
        task_checks = None
        if checks is not None and from_file and np.asarray(checks[1]).any():
            task_checks = (np.asarray(checks[0], np.uint64).tobytes(), np.asarray(checks[1], bool).tobytes())
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
                # Plain ints and bytes: much cheaper to pickle than the two arrays.
                task = (seq, slot, source_index, where, task_row_ids, int(epoch), int(seed), bool(in_place),
                        task_checks)
                state.conns[worker].send(task)
            except OSError:
                state.free_slots.appendleft(slot)
                # The collector reports how the worker ended; give it a moment to.
                state.wait(lambda: False, 5.0, f"worker {worker} stopped taking tasks")
            state.next_submit += 1
            task = state.tasks[seq] = Task(slot, source_index, positions.shape[0], worker)
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
            state.wait(lambda: state.source_readers[source_index] == 0, timeout_s,
                       f"source {source_index} still being read",
                       on=state.for_producer)

    def source_readers(self, source_index: int) -> int:
        """Tasks submitted for ``source_index`` whose rows have not been copied out yet (non-blocking)."""
        with self._state.cond:
            return self._state.source_readers[source_index]

    # ------------------------------------------------------------------ consumer side

    def get(self, timeout_s: float) -> Result:
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
                    raise worker_error(f"augment worker could not read the rows of batch {seq}: {summary}", tb_text,
                                        stage, summary)
                raise worker_error(f"augment worker raised while transforming batch {seq}: {summary}", tb_text,
                                    stage, summary)
            state.held_slots.add(slot)
            return Result(seq, slot, rows)

    def slot_view(self, slot: int) -> np.ndarray:
        """The whole output slot (batch_rows, *out_row_shape), a view into shared memory; valid until release()."""
        if self._state.slots is None or self._state.slots.array is None or not self._state.slot_items:
            raise StreamClosedError("the augment worker pool is closed; open a new stream")
        return self._state.slot_items[slot]

    def lend(self, batch: Result) -> np.ndarray:
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

    def waiting_on(self) -> tuple[int, int, int | None] | None:
        """``(seq, worker, pid)`` of the next batch in order while a worker still has it; None when it is done,
        or not submitted yet.  Any thread; for saying which worker a late batch waits for."""
        state = self._state
        with state.cond:
            task = state.tasks.get(state.next_deliver)
            if task is None:
                return None
            return state.next_deliver, task.worker, state.pids[task.worker]

    def discard_pending(self, timeout_s: float) -> int:
        """Wait for every submitted task to finish and drop the undelivered results.

        For ending an epoch early: afterwards ``get`` waits for the next
        submission.  Transform errors of dropped batches are ignored; slots
        the consumer still holds stay held.  Returns the number dropped.
        """
        state = self._state
        with state.cond:
            state.wait(lambda: not state.tasks, timeout_s, f"{len(state.tasks)} tasks did not finish",
                       on=state.for_consumer)
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
        slots = f"{self.n_slots} slots x {self.batch_rows} rows {self.out_row_shape} {self.out_dtype}"
        return f"WorkerPool({state}, {slots})"
