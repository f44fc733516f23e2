"""A pool of augmenting worker processes that exchange only indices.

The augment front end of the process-pool core (:mod:`h5stream.concurrency.procpool`).
Generic: it knows nothing about HDF5.  The owner (the feed) submits tasks
``(source_index, positions, row_ids, epoch, seed)`` on its *sources*:

* a :class:`~h5stream.memory.shm.SharedSpec`, shared arrays the owner fills (its
  input slots): ``positions`` are one contiguous run of rows, which the
  worker transforms where they lie;
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
* No thread of the pool's own: the thread that waits for a result (``get``,
  ``discard_pending``, the constructor) reads the workers' messages and
  watches their process sentinels itself, so a worker killed by SIGKILL / the
  OOM killer is reported at once (by the next ``get``), not after a queue
  timeout.  Its work per batch is one message: no per-row work, no thread
  hop.  The producer packs each task as bytes and sends it outside the
  pool's lock.
* The public methods are safe to call from two threads: a producer
  (``submit``; the feed's reader thread) and a consumer (``get``,
  ``slot_view``, ``output_lender``, ``release``, ``discard_pending``; the
  thread that iterates the stream).  Each method's docstring names its side.
  Every blocking call takes a timeout and wakes on ``close()`` (the stop flag)
  or on a worker failure; none blocks forever.

Ownership: the pool owns its worker processes and its slot segment; the
sources belong to the caller, who must keep them alive until ``close()``.
The worker side is :mod:`h5stream.augment.worker`; what the pool owns, and
how a waiting thread reads the workers' answers, :mod:`h5stream.augment.pool_state`.
"""

from __future__ import annotations

import pickle
import weakref
from typing import Callable, NamedTuple, Sequence

import numpy as np

from h5stream.augment.pool_state import PoolState, Task, shutdown, worker_error
from h5stream.augment.worker import FileSource, pack_task, run_task, setup
from h5stream.errors import ConfigError, StreamClosedError
from h5stream.memory.shm import SharedArray, SharedSpec, new_prefix

__all__ = [
    "FileSource",
    "Result",
    "WorkerPool",
]

# A task message is at most 25 bytes per row (row id, offset, digest, checked) plus its head.  Capping the tasks
# queued per worker keeps a worker's pipe below this many bytes, so send()
# never blocks even when the worker is stuck in a slow transform.
_PIPE_BUDGET_BYTES = 64 << 10
_TASK_OVERHEAD_BYTES = 64


class Result(NamedTuple):
    """A finished batch, delivered in submission order: read ``slot_view(slot)[:rows]``, then ``release(slot)``."""

    seq: int
    slot: int
    rows: int


class WorkerPool:
    """N spawned processes applying ``transform`` to rows of shared source arrays or of a file.

    Parameters
    ----------
    transform:
        Picklable callable ``transform(images, *, seed, epoch, row_ids, out) -> array | None``.
        ``images`` is the batch (n, *row_shape) of the sources' dtype: a view
        of the caller's shared rows, or the worker's buffer of rows read from a
        file (reused for the next task); either way read-only for the
        transform.  ``out`` is the output slot view (n, *row_shape) of
        ``out_dtype``.  Write into ``out``, or return an array of that shape
        (copied into ``out``).  Workers re-run the parent's main script only if
        the transform's pickle refers to ``__main__``; define user functions in
        an importable module to keep a script's heavy imports (tensorflow) out
        of the workers.
    sources:
        Specs of the caller's shared arrays and/or :class:`FileSource` files,
        all shaped (rows, *row_shape) with one dtype.  The caller owns them and
        must not overwrite the rows of a task until its result is taken (file
        sources are never overwritten).
    workers, batch_rows, n_slots:
        Process count (>= 1), most rows per task, output slots in the ring.
        At most ``n_slots`` batches are in flight or held by the consumer.
    out_dtype:
        Dtype of the output rows.
    out_row_shape:
        Shape of one output row (default: the sources' row shape); a transform that resizes names its own.
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
        out_dtype=np.uint8,
        out_row_shape: tuple[int, ...] | None = None,
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
        # The output rows' shape: the sources' unless the transform resizes (Augment's output_size).
        self.out_row_shape = self.row_shape if out_row_shape is None else tuple(int(d) for d in out_row_shape)
        self.out_dtype = np.dtype(out_dtype)
        self._source_rows = [s.shape[0] for s in sources]
        self._file_sources = {i for i, s in enumerate(sources) if isinstance(s, FileSource)}
        task_bytes = 25 * self.batch_rows + _TASK_OVERHEAD_BYTES
        cap = max(1, min(self.n_slots, _PIPE_BUDGET_BYTES // task_bytes))
        state = PoolState(self.workers, self.n_slots, cap, float(close_timeout_s))
        self._state = state
        self._finalizer = weakref.finalize(self, shutdown, state)
        try:
            self._start(transform_bytes, sources, prefix or new_prefix(), float(start_timeout_s))
        except BaseException:
            self.close()
            raise

    def _start(self, transform_bytes, sources, prefix, start_timeout_s) -> None:
        state = self._state
        state.slots = SharedArray.create((self.n_slots, self.batch_rows) + self.out_row_shape, self.out_dtype,
                                         prefix)
        state.lender = state.slots.lender()
        args = [(transform_bytes, list(sources), state.slots.spec, self.batch_rows)] * self.workers
        state.workers.start(setup, run_task, "transform", args, name="h5stream-augment",
                            hide_main=b"__main__" not in transform_bytes)
        state.collect_until(lambda: len(state.ready) == self.workers, start_timeout_s, "workers did not start")

    # ------------------------------------------------------------------ producer side

    def submit(self, source_index: int, positions, row_ids, *, epoch: int, seed: int, timeout_s: float,
               in_place: bool = False, checks: tuple[np.ndarray, np.ndarray] | None = None) -> int:
        """Queue one batch ``transform(sources[source_index][positions])``; return its seq number.  Producer thread.

        ``positions``: for a shared-memory source, one ascending contiguous run
        of rows (1..batch_rows of them), passed with ``in_place=True``: the
        caller's promise not to overwrite them until the result is taken (the
        worker transforms them where they lie); for a :class:`FileSource`, the
        rows' byte offsets in the file (``in_place`` False).  ``row_ids``
        (int64, same length) are passed to the transform as the rows' identity
        for per-sample randomness.  Blocks until an output slot is free;
        raises TimeoutError after ``timeout_s``, StreamClosedError if the pool
        was closed meanwhile, WorkerError if a worker died.  Seq numbers count
        up from 0 in submission order.

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
        n = positions.shape[0]
        first = int(positions[0])
        if source_index in self._file_sources:
            if in_place:
                raise ConfigError("submit: in_place=True applies to shared-memory sources, not to a FileSource")
            if int(positions.min()) < 0:
                raise ConfigError(f"submit: byte offsets must be >= 0 for file source {source_index}")
            where = positions.astype(np.int64)  # whether they lie in the file, the read tells
        else:
            if not in_place:
                raise ConfigError("submit: rows of a shared-memory source are transformed where they lie: pass one "
                                  "contiguous run with in_place=True, and keep the rows until the result is taken")
            if not np.array_equal(positions, np.arange(first, first + n)):
                raise ConfigError("submit: in_place=True needs positions to be one ascending contiguous run")
            if first < 0 or first + n > self._source_rows[source_index]:
                raise ConfigError(f"submit: positions must lie in 0..{self._source_rows[source_index] - 1} "
                                  f"for source {source_index}")
            where = first  # the run's first row says it all
        offsets = None if isinstance(where, int) else where
        if checks is not None and offsets is not None:
            checks = (np.asarray(checks[0], np.uint64), np.asarray(checks[1], bool))
        return self.submit_trusted(source_index, where if offsets is None else -1, row_ids.astype(np.int64),
                                   offsets, checks if offsets is not None else None,
                                   epoch=epoch, seed=seed, timeout_s=timeout_s)

    def submit_trusted(self, source_index: int, first: int, row_ids: np.ndarray, offsets: np.ndarray | None = None,
                       checks: tuple[np.ndarray, np.ndarray] | None = None, *, epoch: int, seed: int,
                       timeout_s: float) -> int:
        """:meth:`submit` for a caller that guarantees what it checks (the feed, whose reader made the batch):
        ``first``, the first row of a run of ``len(row_ids)`` rows in shared-memory source ``source_index``
        (in place), or -1 and ``offsets`` (int64 byte offsets) for a :class:`FileSource`; ``row_ids`` int64;
        ``checks`` as in :meth:`submit`.  Nothing is validated: the task is packed as bytes (no pickling) and
        sent outside the pool's lock.  Producer thread."""
        task_checks = None
        if checks is not None and offsets is not None and checks[1].any():
            task_checks = (checks[0].tobytes(), checks[1].tobytes())
        body_rest = (row_ids.tobytes(), int(epoch), int(seed), None if offsets is None else offsets.tobytes(),
                     task_checks)
        state = self._state
        with state.lock:
            worker = state.pick_worker() if state.free_slots and not state.closed and state.failure is None else None
            if worker is None:  # no room now: the stoppable wait
                state.wait(
                    lambda: bool(state.free_slots) and state.pick_worker() is not None,
                    timeout_s,
                    "no output slot was released (is the consumer calling release()?)",
                    on=state.for_producer,
                )
                worker = state.pick_worker()
            slot = state.free_slots.popleft()
            seq = state.order.submitted()
            state.tasks[seq] = Task(slot, len(row_ids), worker)
            state.inflight[worker] += 1
        # Sent outside the lock (one producer: the order of seqs holds): the consumer files results meanwhile.
        if not state.workers.send_raw(worker, seq, pack_task(slot, source_index, first, *body_rest)):
            raise state.dead_worker(worker)
        return seq

    def has_room(self) -> bool:
        """Whether a submit would go at once: an output slot is free and a worker can take it.  Any thread; it
        holds until the next submit when the submitter is also the thread that takes results (the feed).  A
        snapshot, taken without the lock: only a submit, a release and reading the workers' answers change
        it, and one taken with the lock would be as stale once the lock is let go."""
        state = self._state
        return bool(state.free_slots) and state.pick_worker() is not None

    # ------------------------------------------------------------------ consumer side

    def get(self, timeout_s: float) -> Result:
        """Return the next batch in seq order (completions may arrive out of order).  Consumer thread.

        The slot stays reserved until :meth:`release`.  If the transform raised
        for this batch, its slot is freed and WorkerError is raised, carrying
        the worker's traceback in ``.worker_traceback`` and ``__cause__``; the
        pool stays usable.  A dead worker makes every call raise WorkerError.
        Raises TimeoutError if the batch is not ready within ``timeout_s``.
        """
        state = self._state
        return state.collect_until(state.order.ready, timeout_s,
                                   lambda: f"batch {state.order.next_deliver} not ready",
                                   sleep_on=state.next_worker, take=self._take)

    def _take(self) -> Result:
        """The next batch in order, which is in (:meth:`get`): its slot held, or its error raised.  Consumer
        thread, lock held."""
        state = self._state
        seq, (slot, rows, error) = state.order.pop()
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

    def _lender(self):
        """The output slots' :class:`~h5stream.memory.lend.Lender`; StreamClosedError once the pool is closed."""
        if self._state.slots is None or self._state.slots.array is None or self._state.lender is None:
            raise StreamClosedError("the augment worker pool is closed; open a new stream")
        return self._state.lender

    def slot_view(self, slot: int) -> np.ndarray:
        """The whole output slot (batch_rows, *out_row_shape), a view into shared memory; valid until release().
        Consumer thread."""
        return self._lender().part(slot)

    @property
    def output_lender(self):
        """The output slots' :class:`~h5stream.memory.lend.Lender`, for the consumer's
        :class:`~h5stream.memory.lend.SlotLender`, which lends finished slots as views and :meth:`release` s them once
        nothing refers to them.  StreamClosedError once the pool is closed.  Consumer thread."""
        return self._lender()

    def release(self, slot: int) -> None:
        """Give a slot obtained from :meth:`get` back to the ring.  Consumer thread."""
        state = self._state
        with state.lock:
            if slot not in state.held_slots:
                raise ConfigError(f"release: slot {slot} is not held by the consumer (released twice?)")
            state.held_slots.remove(slot)
            state.free_slots.append(slot)
            state.for_producer.notify_all()

    def waiting_on(self) -> tuple[int, int, int | None] | None:
        """``(seq, worker, pid)`` of the next batch in order while a worker still has it; None when it is done,
        or not submitted yet.  Any thread; for saying which worker a late batch waits for."""
        state = self._state
        with state.lock:
            seq = state.order.next_deliver
            task = state.tasks.get(seq)
            if task is None:
                return None
            return seq, task.worker, state.workers.procs[task.worker].pid

    def discard_pending(self, timeout_s: float) -> int:
        """Wait for every submitted task to finish and drop the undelivered results.

        For ending an epoch early: afterwards ``get`` waits for the next
        submission.  Transform errors of dropped batches are ignored; slots
        the consumer still holds stay held.  Returns the number dropped.
        Consumer thread (while the producer submits nothing).
        """
        state = self._state
        state.collect_until(lambda: not state.tasks, timeout_s, "the tasks in flight did not finish")
        with state.lock:
            state.check()
            dropped = state.order.drop()
            for slot, _rows, _error in dropped:
                state.free_slots.append(slot)
            state.wake_all()
            return len(dropped)

    # ------------------------------------------------------------------ introspection and lifecycle

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers (for monitoring and tests).  Any thread."""
        return self._state.workers.pids

    @property
    def output_slots(self):
        """The shared output slots (a :class:`~h5stream.memory.shm.SharedArray` the pool owns: read its ``spec`` for
        another process to map them, and its addresses; never close it).  Any thread."""
        return self._state.slots

    @property
    def in_flight(self) -> int:
        """Submitted tasks not finished yet.  Any thread."""
        with self._state.lock:
            return len(self._state.tasks)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran.  Any thread."""
        return not self._finalizer.alive

    def close(self) -> None:
        """Stop the workers (stop message, join, then terminate/kill) and unlink the slots.

        Idempotent; also run by the context manager, at garbage collection and
        at interpreter exit.  Views from :meth:`slot_view` stay readable.  Any
        thread: a producer or consumer blocked in the pool raises StreamClosedError.
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
