"""The reader thread: where the stream opens the store and decides what is read when.

:class:`Reader` owns a thread and a bounded queue.  The thread opens the file
itself and walks fills (see :mod:`h5stream.order.epoch`) epoch after epoch.  For
each fill it knows, before reading, where every row must land: batch ``j``, row
``k`` (:mod:`h5stream.read.runs`).  It then reads each contiguous run of rows
**straight into those places** with one scatter read from a byte source
(:mod:`h5stream.read.source`, one buffer per row): a row is copied once, the
GIL is released meanwhile, and no separate shuffle buffer or gather pass
exists.  The batches being filled *are* the shuffle buffer; the plan bounds
them to two fills' worth of rows.  Where the source takes read-ahead advice,
a whole fill is advised ahead (the runs not already cached).  Compressed
stores (no raw chunk access) read each run through h5py into the batches.

The thread starts by reading where every committed row lies
(:func:`~h5stream.read.locate.locate`).  From then on an uncompressed store is
read by byte offset only, pixels and labels alike: their bytes never move, so
it streams while another process appends to the file.  A compressed store is
read through HDF5, which relies on metadata a writer rewrites; it is refused
with :class:`StoreBusyError` while another process writes it.

With ``defer_pixels``, a fill already in the page cache is not copied at all:
its batches carry their rows' byte offsets for worker processes to read (see
:class:`Reader`).

Reading overlaps handing out batches: while the batches of fill ``f`` go to
the consumer, fill ``f + 1`` is read -- by I/O threads keeping the source's
``max_in_flight`` reads in flight, all the fill's runs submitted at once, or
(compressed stores, read through HDF5 in this thread) a few runs between
batches, so the queue keeps moving.

Every run of rows and every label read is checked against the store's block
checksums where it has them (:mod:`h5stream.read.verify`), right after it
lands and before any batch holding it goes out; receivers that read rows
themselves get their rows' digests with the batch.

Every blocking wait is a stoppable wait (:mod:`h5stream._wait`) that looks at
the stop flag at least every :data:`POLL_S`, so :meth:`Reader.close` always
returns promptly.  An exception in the thread is
queued and re-raised by the consumer as :class:`ReaderError` with the cause.

No thread of a reader keeps the process alive: the reader thread and its I/O
threads are daemon threads that nothing joins at exit (a read stuck on a hung
disk or network file system cannot be interrupted, so waiting for it would
wait for good), and a read through HDF5 gives up when the stop flag is
set (:class:`~h5stream.store.access.StoppableFile`), so no thread is left
inside HDF5 when the interpreter exits.  Once :meth:`Reader.get` has raised,
the reader is stopped and every later ``get`` raises the same error.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from h5stream._io import aligned_empty
from h5stream._wait import POLL_S, Channel, Stopped, wait_futures
from h5stream.errors import ChecksumError, ReaderError, StoreBusyError, StreamClosedError, descriptor_limit
from h5stream.order.epoch import EpochLayout
from h5stream.read.locate import direct_reads, images_dataset, locate
from h5stream.read.runs import Run, chunk_pieces, placement, plan_runs, row_offsets, spans
from h5stream.read.source import ByteSource, open_source
from h5stream.read.verify import BlockCheck, check_buffers, checks_every_read
from h5stream.store import schema
from h5stream.store.access import busy_error, open_h5_readonly, writer_pids
from h5stream.store.meta import StoreMeta

__all__ = ["POLL_S", "Batch", "Reader", "Stopped", "direct_reads"]

CACHE_SPAN_GAP_BYTES = 8 << 20
"""Runs of a fill at most this far apart in the file are asked about together whether they are in the page
cache: asking about the pages between them costs less than asking once more (the figures: docs/performance.md,
"Design figures")."""

CLOSE_WAIT_S = 0.5
"""Longest :meth:`Reader.close` waits for the thread to end (it ends within :data:`POLL_S` unless a read hangs)."""


@dataclass
class Batch:
    """A batch as the reader hands it on.  ``images``/``labels``/``row_ids`` belong to the receiver.

    ``slot`` is whatever the allocator attached (e.g. a shared-memory slot index), else None.
    A batch without images carries ``file_offsets`` (every row's byte offset) and, where the reads are
    checked, ``checks``: ``(digests, checked)``, every row's xxh3-64 and whether it is to be checked (see
    :meth:`h5stream.read.verify.BlockCheck.expected`), for the receiver that reads the rows.
    """

    epoch: int
    index: int
    images: np.ndarray
    labels: np.ndarray
    row_ids: np.ndarray
    slot: object = None
    file_offsets: np.ndarray | None = None
    checks: tuple[np.ndarray, np.ndarray] | None = None


@dataclass(frozen=True)
class _Failure:
    exc: BaseException


class _Pending:
    """A batch being assembled: arrays, a byte view of its images, and how many rows are still missing."""

    __slots__ = ("batch", "missing", "rows")

    def __init__(self, batch: Batch, missing: int):
        self.batch = batch
        self.missing = missing
        images = batch.images
        self.rows = memoryview(images.reshape(-1)).cast("B") if images is not None and images.size else None


class _FillJob:
    """One fill being read: its runs and, for every buffer position, the batch and row it lands at.

    Pixels go straight into the batches; labels and row ids are gathered into small per-fill arrays and
    scattered when the fill is complete, which is also when its batches count the rows as arrived.
    """

    def __init__(self, epoch: int, batch: np.ndarray, offset: np.ndarray, row_ids: np.ndarray,
                 labels: np.ndarray | None, runs: list[Run], yielded: np.ndarray):
        self.epoch = epoch
        self.batch = batch  # buffer position -> batch index, -1: read but not used
        self.offset = offset  # buffer position -> row in its batch
        # The buffer positions that go to a batch, in the order they are yielded: by batch, and within a batch
        # row after row (see placement), so each batch's rows are one slice of it.
        used = batch[yielded] >= 0
        self.yielded = yielded if used.all() else yielded[used]
        self.first_batch = int(batch[self.yielded[0]]) if len(self.yielded) else 0
        self.n_batches = int(batch[self.yielded[-1]]) + 1 - self.first_batch if len(self.yielded) else 0
        self.row_ids = row_ids
        self.labels = labels  # None: read with the runs when the fill completes
        self.runs = runs
        self.to_read = runs  # the runs read into batches (deferred batches' rows are read by their receivers)
        self.done = 0  # runs of to_read read or handed to the I/O threads
        self.targets: dict[int, _Pending] = {}
        self.futures: list = []


class _IOThreads:
    """A fixed set of daemon threads running submitted calls: ``concurrent.futures.ThreadPoolExecutor`` without
    its join at interpreter exit, which would wait for good on a read that hangs.  Created, used and shut down
    by the reader thread."""

    def __init__(self, n: int, name: str):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True) for i in range(n)]
        for t in self._threads:
            t.start()

    def submit(self, fn, *args) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((future, fn, args))
        return future

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn, args = call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # Stopped included: the waiter re-raises it
                future.set_exception(exc)
            else:
                future.set_result(result)

    def shutdown(self) -> None:
        """Cancel the calls not started, let the running ones finish, end the threads."""
        while True:
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                break
            if call is not None:
                call[0].cancel()
        for _ in self._threads:
            self._calls.put(None)
        for t in self._threads:
            t.join()


class Reader:
    """Owns the reader thread, its byte source and HDF5 handle, and the batch queue.

    ``layout(epoch) -> EpochLayout`` describes each epoch; reading starts at
    ``(start_epoch, start_batch)`` and goes on epoch after epoch until
    :meth:`close`.  ``allocate(n, images)`` returns ``(images, labels, slot)``
    for an ``n``-row batch (``images`` None when asked for none) and may block;
    it must raise :class:`Stopped` once ``stop`` is set.  ``cache_labels`` reads every label once up front instead
    of run by run.  ``source()`` opens the store's
    :class:`~h5stream.read.source.ByteSource`, in the reader thread (default:
    the local file, read past the page cache with ``O_DIRECT`` when
    ``direct_io``); I/O threads keep its ``max_in_flight`` raw reads in
    flight (GIL released), so reading overlaps handing out batches.
    ``defer_pixels=True`` (uncompressed stores only, see :func:`direct_reads`)
    lets the batches of a fill that is wholly in the page cache go out without
    images: such a batch carries ``file_offsets``, the byte offset of every row,
    for its receivers (the worker processes) to read from the page cache.  A
    fill with runs missing from the page cache (or a source that cannot tell)
    is read into batches as usual (the disk then being read in file order,
    several reads in flight, and nothing left for the page cache to drop
    before a receiver reads it).
    ``verify`` checks every row and label read against the store's block
    checksums where it has them (see :mod:`h5stream.read.verify`); a
    mismatch ends the thread with :class:`~h5stream.errors.ChecksumError`
    before any batch holding those rows goes out, and deferred batches carry
    their rows' digests for the receivers to check.  ``verify="once"``
    checks the rows of each block on its first read only (labels always),
    except over a URL, where every read is checked.
    Threads: each method's docstring says which thread runs it -- the
    *consumer* (one thread at a time: :meth:`get`, :meth:`poll`, :meth:`add_wait`), the
    *reader thread* (``_run`` and what it calls), its *I/O threads*
    (``_read_runs``) or *any* (``close``, idempotent; ``stats``,
    ``queue_fill``, ``alive``).  ``stats`` has one writer per counter: the
    reader thread counts what was read (its I/O threads hand their counts
    back with their results), the consumer what it waited.  The threads are daemons, and stop within :data:`POLL_S` once
    ``stop`` is set unless a read hangs (see the module doc).
    """

    def __init__(
        self,
        meta: StoreMeta,
        layout: Callable[[int], EpochLayout],
        *,
        queue_depth: int,
        queue_resume_at: int | None = None,
        start_epoch: int = 0,
        start_batch: int = 0,
        timeout_s: float = 60.0,
        cache_labels: bool = False,
        defer_pixels: bool = False,
        direct_io: bool = False,
        verify: bool | str = True,
        source: Callable[[], ByteSource] | None = None,
        allocate: Callable[[int], tuple[np.ndarray, np.ndarray, object]],
        stop: threading.Event | None = None,
        name: str = "h5stream-reader",
    ):
        self.meta = meta
        self.defer_pixels = bool(defer_pixels)
        # Counters, each dict written by one thread: the reader thread's, and the consumer's (see stats).
        self._counts = {"read_bytes": 0, "read_s": 0.0, "fills": 0, "advised_bytes": 0, "deferred_bytes": 0,
                        "direct_io": 0, "in_place_bytes": 0, "verify_learn_bytes": 0}
        self._consumer_counts = {"wait_s": 0.0, "batches": 0}
        self.all_labels: np.ndarray | None = None
        self._layout = layout
        self._timeout_s = float(timeout_s)
        self._queue = Channel(queue_depth, queue_resume_at)
        self._stop = stop or threading.Event()
        self._start = (int(start_epoch), int(start_batch))
        self._allocate = allocate
        self._cache_labels = bool(cache_labels)
        self._verify = verify if verify == "once" else bool(verify)
        self._check: BlockCheck | None = None  # set by the reader thread when the store has digests to check
        self._learned: set[int] = set()  # blocks whose digests are learned (by _learn_runs)
        self._open_source = source or (lambda: open_source(meta.path, direct_io=direct_io, remote=meta.remote))
        self._scratch = aligned_empty(meta.row_bytes)  # destination of rows that are read but not used
        # Set by the reader thread when it opens the store:
        self._source: ByteSource | None = None
        self._offsets: np.ndarray | None = None  # byte offset of each image chunk; None: read through HDF5
        self._label_offsets = None  # (byte offset of each label chunk, rows per chunk) where stored uncompressed
        self._images = self._labels = None  # HDF5 datasets, for what only HDF5 can read
        self._io: _IOThreads | None = None
        self._io_threads = 0
        # Batches being assembled and handed out, owned by the reader thread:
        self._pending: dict[tuple[int, int], _Pending] = {}
        self._bounds: dict[int, np.ndarray] = {}  # epoch -> its batch boundaries
        self._next_emit: tuple[int, int] | None = None  # the next batch to hand out
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False
        self._error: BaseException | None = None  # what get raised; the reader is stopped from then on
        self._thread.start()

    # -- consumer side -----------------------------------------------------------
    def get(self, deadline: float | None = None) -> Batch:
        """Next batch in order.  Consumer thread.

        Waits until ``deadline`` (a ``time.monotonic()`` value; default: ``timeout_s`` from now), running a
        Ctrl-C held back meanwhile (see :mod:`h5stream._interrupt`) within :data:`POLL_S`.  Raises
        :class:`ReaderError` if the thread failed, ended or went quiet; the reader is then stopped and every
        later call raises the same error.
        """
        if self._closed:
            raise StreamClosedError("the stream is closed; open it again with h5stream.open(...)")
        if self._error is not None:
            raise self._error
        t0 = time.monotonic()
        if deadline is None:
            deadline = t0 + self._timeout_s
        try:
            item = self._queue.get(deadline=deadline, check=self._check_alive)
        except TimeoutError:
            self._fail(ReaderError(
                f"{self.meta.path}: no batch from the reader in {deadline - t0:.3g} s "
                "(storage too slow or stuck?); raise timeout_s if this is expected"
            ))
        self._consumer_counts["wait_s"] += time.monotonic() - t0
        return self._take(item)

    def poll(self) -> Batch | None:
        """The next batch in order if one is queued, else None at once; raises as :meth:`get`.  Consumer
        thread."""
        if self._closed:
            raise StreamClosedError("the stream is closed; open it again with h5stream.open(...)")
        if self._error is not None:
            raise self._error
        item = self._queue.poll()
        return None if item is None else self._take(item)

    def _take(self, item) -> Batch:
        """``item`` taken from the queue: the batch, or the thread's failure raised.  Consumer thread."""
        if isinstance(item, _Failure):
            if isinstance(item.exc, StoreBusyError):  # already one line that says what to do
                self._fail(StoreBusyError(str(item.exc)), item.exc)
            if isinstance(item.exc, ChecksumError):  # likewise
                self._fail(ChecksumError(str(item.exc)), item.exc)
            limit = descriptor_limit(getattr(item.exc, "errno", None))
            if limit is not None:
                self._fail(ReaderError(f"{self.meta.path}: reading failed: {limit[0]}; {limit[1]}"), item.exc)
            self._fail(ReaderError(f"{self.meta.path}: reading failed: {item.exc!r}"), item.exc)
        self._consumer_counts["batches"] += 1
        return item

    def _check_alive(self) -> None:
        """Consumer thread, while :meth:`get` waits: fail once the thread has ended with nothing queued."""
        if not self._thread.is_alive() and self._queue.empty():
            self._fail(ReaderError(f"{self.meta.path}: the reader thread stopped without a result"))

    def add_wait(self, seconds: float) -> None:
        """Count ``seconds`` more of the consumer waiting (a feed waiting past :meth:`get`).  Consumer thread."""
        self._consumer_counts["wait_s"] += seconds

    @property
    def stats(self) -> dict:
        """Counters: what the reader thread read (``read_bytes``, ``read_s``, ``fills``, ...) and how long the
        consumer waited for how many ``batches`` (``wait_s``).  A snapshot; any thread."""
        return {**self._counts, **self._consumer_counts}

    def _fail(self, error: BaseException, cause: BaseException | None = None):
        """Stop the thread and raise ``error`` (from ``cause``), now and at every later :meth:`get`.  Consumer
        thread."""
        error.__cause__ = cause
        error.__suppress_context__ = True
        self._error = error
        self._stop.set()
        raise error

    @property
    def queue_fill(self) -> tuple[int, int]:
        """``(batches queued, capacity)``.  Any thread."""
        return self._queue.qsize(), self._queue.maxsize

    @property
    def alive(self) -> bool:
        """Whether the reader thread is still running (it ends soon after :meth:`close` or a failed :meth:`get`).
        Any thread."""
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop the thread and drop queued batches.  Idempotent; any thread.

        Returns once the thread has ended, or after :data:`CLOSE_WAIT_S` where a read hangs: the thread then
        ends (closing the file) when that read returns, and, a daemon, never keeps the process alive.
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join(timeout=min(self._timeout_s, CLOSE_WAIT_S))
        self._queue.drain()

    # -- reader thread -------------------------------------------------------------
    def _put(self, item) -> None:
        """Queue ``item`` for the consumer; raises :class:`Stopped` once the stop flag is set.  Reader thread."""
        self._queue.put(item, check=self._check_stop)

    def _check_stop(self) -> None:
        """Raise :class:`Stopped` once the stop flag is set.  Reader thread (its waits)."""
        if self._stop.is_set():
            raise Stopped

    def _run(self) -> None:
        """The reader thread: open the store, then read and hand out batches until stopped or failed."""
        path = self.meta.path
        try:
            where = locate(self.meta, self._cache_labels, digests=self._verify)
            self._offsets, self._label_offsets, self.all_labels = where.image_chunks, where.label_chunks, where.labels
            if self.defer_pixels and self._offsets is None:
                raise ValueError("defer_pixels needs an uncompressed store whose rows can be read directly")
            with contextlib.ExitStack() as stack:
                if self._offsets is None or (self.all_labels is None and self._label_offsets is None):
                    # Only HDF5 can read these rows (compressed), and it trusts metadata a writer rewrites.
                    writers = writer_pids(path)
                    if writers:
                        raise busy_error(path, writers, "a compressed store can only be read through HDF5 "
                                                        "metadata that the writer keeps changing")
                    f = stack.enter_context(open_h5_readonly(path, rdcc_nbytes=0, stop=self._stop))
                    self._images = images_dataset(f)
                    self._labels = f[schema.LABELS]
                self._source = self._open_source()
                stack.callback(self._source.close)
                self._counts["direct_io"] = int(bool(getattr(self._source, "direct", False)))
                self._check = BlockCheck.from_digests(
                    path, self.meta.rows, self.meta.block_rows, self.meta.row_bytes, where.digests,
                    max_buffers=check_buffers(getattr(self._source, "max_in_flight", 2)),
                    every_read=checks_every_read(self._verify, self.meta.remote is not None),
                )
                if self._check is not None and self.all_labels is not None:
                    self._check.labels(0, self.all_labels)  # every label, read once at the start
                if self._offsets is not None:
                    self._io_threads = max(1, int(self._source.max_in_flight))
                    self._io = _IOThreads(self._io_threads, self._thread.name + "-io")
                    stack.callback(self._io.shutdown)
                self._pump()
        except Stopped:
            pass
        except BaseException as exc:  # delivered to the consumer, never lost
            try:
                self._put(_Failure(exc))
            except Stopped:
                pass

    def _jobs(self) -> Iterator[_FillJob]:
        """Fill jobs in reading order, epoch after epoch, from the start position.  Reader thread."""
        epoch, first_batch = self._start
        self._next_emit = (epoch, first_batch)
        while True:
            layout = self._layout(epoch)
            bounds = np.concatenate([[0], np.cumsum(layout.batch_sizes)])
            fill_bounds = np.concatenate([[0], np.cumsum(layout.fill_rows)])
            self._bounds[epoch] = bounds
            first_fill = int(np.searchsorted(fill_bounds, bounds[first_batch], side="right")) - 1
            for fill in range(first_fill, len(layout.fills)):
                if fill_bounds[fill] >= bounds[-1]:
                    break  # only dropped rows left in this epoch
                permutation = layout.fill_permutation(fill)
                batch, offset = placement(permutation, int(fill_bounds[fill]), bounds, first_batch)
                row_ids = layout.fill_row_ids(fill)
                labels = None if self.all_labels is None else self.all_labels[row_ids]
                runs = plan_runs(layout.fill_segments(fill), self._offsets, self.meta.block_rows, self.meta.row_bytes)
                yield _FillJob(epoch, batch, offset, row_ids, labels, runs, permutation)
            self._bounds.pop(epoch - 2, None)
            epoch, first_batch = epoch + 1, 0

    def _pump(self) -> None:
        """Read fill after fill, handing out each fill's batches while the next one is read.  Reader thread."""
        jobs = self._jobs()
        job = next(jobs)
        self._start_fill(job)
        self._complete(job)
        for nxt in jobs:
            ready = self._ready()
            self._start_fill(nxt)
            # Hand out this fill's batches while the next one is read (by the I/O threads, or here in _step).
            per_batch = math.ceil(len(nxt.runs) / max(1, len(ready)))
            for key in ready:
                self._emit(key)
                self._step(nxt, per_batch)
            self._complete(nxt)

    def _ready(self) -> list[tuple[int, int]]:
        """Complete batches that can go out now, in order (stops at the first incomplete one).  Reader thread."""
        out = []
        epoch, j = self._next_emit
        while True:
            bounds = self._bounds.get(epoch)
            if bounds is not None and j >= len(bounds) - 1:
                epoch, j = epoch + 1, 0
                continue
            p = self._pending.get((epoch, j))
            if p is None or p.missing:
                break
            out.append((epoch, j))
            j += 1
        self._next_emit = (epoch, j)
        return out

    def _emit(self, key) -> None:
        """Hand batch ``key`` on to the queue.  Reader thread."""
        p = self._pending.pop(key)
        self._put(p.batch)

    def _batch(self, epoch: int, j: int, images: bool = True) -> _Pending:
        """The batch ``(epoch, j)`` being assembled, allocated on first use (with or without images).  Reader
        thread."""
        key = (epoch, j)
        p = self._pending.get(key)
        if p is None:
            bounds = self._bounds[epoch]
            n = int(bounds[j + 1] - bounds[j])
            x, y, slot = self._allocate(n, images)
            offsets = None if images else np.empty(n, np.int64)
            checks = None
            if not images and self._check is not None and self._check.every_read:
                checks = (np.zeros(n, np.uint64), np.zeros(n, bool))
            p = self._pending[key] = _Pending(Batch(epoch, j, x, y, np.empty(n, np.int64), slot, offsets, checks), n)
        return p

    # -- one fill ------------------------------------------------------------------
    def _start_fill(self, job: _FillJob) -> None:
        """Advise the source ahead, allocate the fill's batches (may block on a bounded allocator), and hand
        the pixel reads to the I/O threads when there are any.

        With deferred pixels a fill whose runs are all in the page cache gets batches without images (their
        receivers read the rows); a fill with runs missing is read into batches as usual, since the page
        cache may drop what it fetches before a receiver gets to it.  A batch shared with the previous fill
        keeps the kind it was made with: its rows are read here if it has images, else read past.  Reader thread.
        """
        missing = self._advise(job.runs)
        deferred = self.defer_pixels and not missing
        for j in range(job.first_batch, job.first_batch + job.n_batches):  # the fill's batches, in order
            job.targets[j] = self._batch(job.epoch, j, images=not deferred)
        self._counts["fills"] += 1
        if self.defer_pixels:
            with_images = [j for j, t in job.targets.items() if t.rows is not None]
            if not with_images:  # the usual deferred fill: every row is read by the batches' receivers
                job.to_read = []
            else:
                into_batches = np.isin(job.batch, with_images)
                job.to_read = [r for r in job.runs if into_batches[r.dest:r.dest + r.rows].any()]
        if self._io is not None and job.to_read:
            # One future per I/O thread, each taking the next run not yet taken: together they walk the fill
            # in file order and finish within one read of each other, so the device's queue stays full to the
            # end of the fill; a fill costs k futures instead of one per run.
            runs, lock = iter(job.to_read), threading.Lock()
            job.futures = [self._io.submit(self._read_runs, job, runs, lock) for _ in range(self._io_threads)]
            job.done = len(job.to_read)

    def _step(self, job: _FillJob, n_runs: int) -> None:
        """Read up to ``n_runs`` more runs of ``job`` in this thread (no-op when the I/O threads have them).
        Reader thread."""
        stop = min(len(job.to_read), job.done + n_runs)
        while job.done < stop:
            self._count_read(*self._read_pixels(job, job.to_read[job.done]))
            job.done += 1

    def _count_read(self, seconds: float, nbytes: int) -> None:
        """Count a read in the stats.  Reader thread (the stats' one writer)."""
        self._counts["read_s"] += seconds
        self._counts["read_bytes"] += nbytes

    def _complete(self, job: _FillJob) -> None:
        """Finish every read of the fill, then count its rows as arrived in their batches.  Reader thread."""
        self._step(job, len(job.to_read))
        wait_futures(job.futures, check=self._check_stop)
        for f in job.futures:  # what the I/O threads read, counted here: the stats have one writer
            self._count_read(*f.result())
        job.futures = []
        if job.labels is None:
            job.labels = self._read_labels(job.runs, len(job.row_ids))
        file_offsets = None
        if any(t.batch.file_offsets is not None for t in job.targets.values()):
            file_offsets = row_offsets(job.runs, len(job.row_ids), self.meta.row_bytes)
            if self._check is not None:  # the receivers check rows against their digests: learn them first
                self._learn_runs(job.runs)
        # Gathered once for the whole fill, in yield order; each batch then takes one slice of each.
        yielded = job.yielded
        labels, row_ids = job.labels[yielded], job.row_ids[yielded]
        first_row = job.offset[yielded]
        if file_offsets is not None:
            file_offsets = file_offsets[yielded]
            checks = None if self._check is None or not self._check.every_read else self._check.expected(row_ids)
        ends = np.searchsorted(job.batch[yielded], np.arange(job.first_batch + 1, job.first_batch + job.n_batches + 1))
        a = 0
        for j, b in zip(range(job.first_batch, job.first_batch + job.n_batches), ends.tolist()):
            t, m = job.targets[j], b - a
            k = slice(int(first_row[a]), int(first_row[a]) + m)
            t.batch.labels[k] = labels[a:b]
            t.batch.row_ids[k] = row_ids[a:b]
            if t.batch.file_offsets is not None:
                t.batch.file_offsets[k] = file_offsets[a:b]
                if t.batch.checks is not None:
                    t.batch.checks[0][k] = checks[0][a:b]
                    t.batch.checks[1][k] = checks[1][a:b]
                self._counts["deferred_bytes"] += m * self.meta.row_bytes
            t.missing -= m
            a = b
        job.targets = {}
        self._counts["in_place_bytes"] = getattr(self._source, "in_place_bytes", 0)
        if self._check is not None:
            self._counts["verify_learn_bytes"] = self._check.learned_bytes

    def _learn_runs(self, runs: list[Run]) -> None:
        """Learn the digests of every block ``runs`` touch (see :meth:`BlockCheck.learn_rows`), asking only about
        blocks not known learned yet: a learned block stays learned.  Reader thread."""
        block_rows, known = self.meta.block_rows, self._learned
        if len(known) >= -(-self.meta.rows // block_rows):
            return  # every block is learned: the usual case from the second epoch on
        for run in runs:
            blocks = range(run.src // block_rows, (run.src + run.rows - 1) // block_rows + 1)
            if not known.issuperset(blocks):
                self._check.learn_rows(run.src, run.rows, self._read_block)
                known.update(blocks)

    # -- I/O -------------------------------------------------------------------------
    def _advise(self, runs: list[Run]) -> list[Run]:
        """Advise the source to fetch a fill's runs ahead, skipping runs already cached; return the runs not
        known to be cached (every run where the source cannot tell).  Reader thread."""
        if self._offsets is None:
            return []
        cached = getattr(self._source, "cached", None)
        advise = getattr(self._source, "advise_willneed", None)
        row_bytes = self.meta.row_bytes
        missing = []
        if cached is not None:
            # One question per span of nearby runs (usually one per fill) instead of one per run; a span not
            # wholly cached is asked about run by run.
            for offset, length, members in spans(runs, row_bytes, CACHE_SPAN_GAP_BYTES):
                if len(members) > 1 and cached(offset, length):
                    continue
                missing.extend(run for run in members if not cached(run.offset, run.rows * row_bytes))
        else:
            missing = runs
        for run in missing:
            length = run.rows * row_bytes
            if advise is not None:
                advise(run.offset, length)
                self._counts["advised_bytes"] += length
        return missing

    def _read_runs(self, job: _FillJob, runs: Iterator[Run], lock: threading.Lock) -> tuple[float, int]:
        """Read runs taken one by one from ``runs`` (shared with the other I/O threads) until none is left;
        return the seconds and bytes read.  An I/O thread."""
        seconds = nbytes = 0
        while True:
            with lock:
                run = next(runs, None)
            if run is None:
                return seconds, nbytes
            t, n = self._read_pixels(job, run)
            seconds += t
            nbytes += n

    def _read_pixels(self, job: _FillJob, run: Run) -> tuple[float, int]:
        """Read one run of rows straight into their batches; return the seconds and bytes it took.  An I/O
        thread when there are any, else the reader thread."""
        if self._stop.is_set():
            raise Stopped
        dest, src, n, off = run
        t0 = time.perf_counter()
        row_bytes = self.meta.row_bytes
        targets = job.targets
        batches = job.batch[dest:dest + n].tolist()
        offsets = job.offset[dest:dest + n].tolist()
        if off is not None:
            scratch = memoryview(self._scratch)
            views = [
                targets[b].rows[k * row_bytes:(k + 1) * row_bytes] if b >= 0 and targets[b].rows is not None
                else scratch  # not used here: dropped, or (deferred batch) read by the batch's receiver
                for b, k in zip(batches, offsets)
            ]
            self._source.readinto(off, views)
            if self._check is not None:
                self._check.images(src, [None if v is scratch else v for v in views], self._read_block)
        else:  # compressed: HDF5 decodes; only ever called from the reader thread
            rows = self._images[src:src + n]
            if self._check is not None:
                self._check.images(src, [rows[i] if b >= 0 else None for i, b in enumerate(batches)],
                                   self._read_block)
            for i, (b, k) in enumerate(zip(batches, offsets)):
                if b >= 0:
                    targets[b].batch.images[k] = rows[i]
        return time.perf_counter() - t0, n * row_bytes

    def _read_block(self, start: int, stop: int, out: memoryview) -> None:
        """Read the image bytes of rows ``[start, stop)``, which lie in one block, into ``out``: by byte
        offset (from an I/O thread or the reader thread), or (compressed) through HDF5, then only from the
        reader thread.  What :class:`BlockCheck` learns a block with."""
        if self._offsets is not None:
            block = start // self.meta.block_rows
            offset = int(self._offsets[block]) + (start - block * self.meta.block_rows) * self.meta.row_bytes
            self._source.readinto(offset, [out])
        else:
            rows = np.frombuffer(out, np.uint8).reshape(stop - start, *self.meta.image_shape)
            self._images.read_direct(rows, np.s_[start:stop], np.s_[0:stop - start])

    def _read_labels(self, runs: list[Run], n: int) -> np.ndarray:
        """Labels of a fill in buffer order, run by run (when they are not all cached).  Checked reads take
        the whole blocks around each run, checked against their digests.  Reader thread."""
        labels = np.empty((n, *self.meta.label_shape), self.meta.label_dtype)
        for dest, src, k, _off in runs:
            span = None if self._check is None else self._check.widen(src, k)
            if span is None:
                self._read_label_rows(src, src + k, labels[dest:dest + k])
                continue
            a, b = span
            rows = np.empty((b - a, *self.meta.label_shape), self.meta.label_dtype)
            self._read_label_rows(a, b, rows)
            self._check.labels(a, rows)
            labels[dest:dest + k] = rows[src - a:src - a + k]
        return labels

    def _read_label_rows(self, start: int, stop: int, out: np.ndarray) -> None:
        """Labels of rows ``[start, stop)`` into ``out``: by byte offset where the labels are stored
        uncompressed, else through HDF5.  Reader thread."""
        if stop <= start:
            return
        if self._label_offsets is None:
            self._labels.read_direct(out, np.s_[start:stop], np.s_[0:stop - start])
            return
        chunk_offsets, chunk_rows = self._label_offsets
        row_bytes = self.meta.label_row_bytes
        view = memoryview(out.reshape(-1).view(np.uint8))
        for first, chunk, within, m in chunk_pieces(start, stop - start, chunk_rows):  # may span label chunks
            a = first * row_bytes
            self._source.readinto(int(chunk_offsets[chunk]) + within * row_bytes, [view[a:a + m * row_bytes]])
