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
batches, so the queue keeps moving; once they are out, fill ``f + 2`` is
planned and its reads queued behind ``f + 1``'s (its batches then exist).

Every run of rows and every label read is checked against the store's block
checksums where it has them (:mod:`h5stream.read.verify`), right after it
lands and before any batch holding it goes out; receivers that read rows
themselves get their rows' digests with the batch.

Every blocking wait is a stoppable wait (:mod:`h5stream.concurrency.wait`) that looks at
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

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from h5stream.concurrency.wait import POLL_S, Channel, Stopped, get_while_moving, wait_futures
from h5stream.errors import ReaderError, StreamClosedError
from h5stream.order.epoch import EpochLayout
from h5stream.read.arrive import arrive, head_first
from h5stream.read.locate import direct_reads, images_dataset, locate
from h5stream.read.batches import Batches
from h5stream.read.fill import Batch, Failure, FillJob, IOThreads, consumer_error
from h5stream.read.rows import RowReader
from h5stream.read.runs import placement, plan_runs, row_offsets
from h5stream.read.source import ByteSource, close_while_reading, open_source
from h5stream.read.verify import BlockCheck, check_buffers, checks_every_read, row_digest_reader
from h5stream.store import schema
from h5stream.store.access import busy_error, open_h5_readonly, writer_pids
from h5stream.store.meta import StoreMeta

__all__ = ["POLL_S", "Batch", "Reader", "Stopped", "direct_reads"]

CLOSE_WAIT_S = 0.5
"""Longest :meth:`Reader.close` waits for the thread to end (it ends within :data:`POLL_S` unless a read hangs)."""


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
    ``direct_io``; a set of parts: one bool per part); I/O threads keep its ``max_in_flight`` raw reads in
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
    (:meth:`RowReader.read_runs <h5stream.read.rows.RowReader.read_runs>`) or *any* (``close``, idempotent; ``stats``,
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
        direct_io: bool | tuple = False,
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
                        "direct_io": 0, "in_place_bytes": 0, "verify_learn_bytes": 0, "verify_digest_bytes": 0}
        self._consumer_counts = {"wait_s": 0.0, "batches": 0}
        self.parts_opened = 0  # raised by the reader thread per part of a set opened (read/partread.run_parts)
        self.all_labels: np.ndarray | None = None
        self._layout = layout
        self._timeout_s = float(timeout_s)
        self._queue = Channel(queue_depth, queue_resume_at)
        self._stop = stop or threading.Event()
        self._start = (int(start_epoch), int(start_batch))
        self._cache_labels = bool(cache_labels)
        self._verify = verify if verify == "once" else bool(verify)
        self._check: BlockCheck | None = None  # set by the reader thread when the store has digests to check
        # A set of parts is told part by part (h5stream.read.partread.run_parts): a tuple of bools.
        self._direct_io = tuple(direct_io) if isinstance(direct_io, (tuple, list)) else bool(direct_io)
        self._plan = None  # a part set's: fill segments -> runs (h5stream.read.partread)
        self._open_source = source or (lambda: open_source(meta.path, direct_io=direct_io, remote=meta.remote))
        # Set by the reader thread when it opens the store:
        self._source: ByteSource | None = None
        self._offsets: np.ndarray | None = None  # byte offset of each image chunk; None: read through HDF5
        self._rows: RowReader | None = None  # what it reads rows and labels with
        self._io: IOThreads | None = None
        self._io_threads = 0
        self._batches = Batches(allocate, meta.encoded)  # being assembled and handed out: the reader thread's
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False
        self._error: BaseException | None = None  # what get raised; the reader is stopped from then on
        self._thread.start()

    # -- consumer side -----------------------------------------------------------
    def get(self, deadline: float | None = None) -> Batch:
        """Next batch in order.  Consumer thread.

        Waits until ``deadline`` (a ``time.monotonic()`` value; default: ``timeout_s`` from now), and on while
        the reader thread reads (until ``timeout_s`` after its last read: slow is not stuck), running a
        Ctrl-C held back meanwhile (see :mod:`h5stream.concurrency.interrupt`) within :data:`POLL_S`.  Raises
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
            item = get_while_moving(self._queue, deadline, self._timeout_s, lambda: self.progress, self._check_alive)
        except TimeoutError:
            self._fail(ReaderError(
                f"{self.meta.path}: no batch from the reader in {time.monotonic() - t0:.3g} s, and no read done in "
                f"the last {self._timeout_s:.3g} s (storage too slow or stuck?); raise timeout_s if this is expected"
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
        if isinstance(item, Failure):
            self._fail(consumer_error(item.exc, self.meta.path, getattr(self.meta, "open_files_hint", "")), item.exc)
        self._consumer_counts["batches"] += 1
        return item

    def _check_alive(self) -> None:
        """Consumer thread, while :meth:`get` waits: fail once the thread has ended with nothing queued."""
        if not self._thread.is_alive() and self._queue.empty():
            self._fail(ReaderError(f"{self.meta.path}: the reader thread stopped without a result"))

    @property
    def progress(self) -> tuple[int, int]:
        """What the reader thread has done so far: ``(reads, fills, bytes landed, parts opened)``; it changes with
        every run, label or block read, every fill planned, from a URL every part of a response received (a long
        request on a slow link is moving), and every part of a set opened (hundreds of small parts at URLs take
        several requests each before the first read).  :meth:`get` times out only after ``timeout_s`` without a
        change.  Any thread (a snapshot)."""
        rows = self._rows
        return ((0 if rows is None else rows.progress), self._counts["fills"], getattr(self._source, "landed", 0),
                self.parts_opened)

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
        close_while_reading(self._source)  # a URL's disk cache, at once however long a read hangs (its doc)
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
            if getattr(self.meta, "parts", ()):  # a set of parts read as one store (h5stream.read.partread)
                from h5stream.read.partread import run_parts

                with contextlib.ExitStack() as stack:
                    if run_parts(self, stack, self._direct_io):  # else a compressed part: read in this thread
                        self._io_threads = max(1, int(self._source.max_in_flight))
                        self._io = IOThreads(self._io_threads, self._thread.name + "-io", self._source)
                        stack.callback(self._io.shutdown)
                    self._pump()
                return
            where = locate(self.meta, self._cache_labels, digests=self._verify)
            self._offsets, self.all_labels = where.image_chunks, where.labels
            by_offset = self._offsets is not None or where.encoded is not None  # encoded: read/encbytes.py
            images = labels = None  # HDF5 datasets, for what only HDF5 can read
            if self.defer_pixels and self._offsets is None:
                raise ValueError("defer_pixels needs an uncompressed store whose rows can be read directly")
            with contextlib.ExitStack() as stack:
                if not by_offset or (self.all_labels is None and where.label_chunks is None):
                    # Only HDF5 can read these rows (compressed), and it trusts metadata a writer rewrites.
                    writers = writer_pids(path) if self.meta.remote is None else ()
                    if writers:
                        raise busy_error(path, writers, "a compressed store can only be read through HDF5 metadata "
                                                        "that the writer keeps changing")
                    f = stack.enter_context(open_h5_readonly(path, rdcc_nbytes=0, stop=self._stop,
                                                             remote=self.meta.remote))
                    images, labels = images_dataset(f), f[schema.LABELS]
                    if self.meta.encoded:
                        from h5stream.store.encoded import EncodedArray

                        images = EncodedArray.of(f)
                self._source = self._open_source()
                piece_rows = getattr(self._layout, "piece_rows", 0)
                if piece_rows and self.meta.remote is not None and self._offsets is not None:
                    self._source = _piece_window(self._source, self._offsets, self.meta, piece_rows)
                stack.callback(self._source.close)
                self._counts["direct_io"] = int(bool(getattr(self._source, "direct", False)))
                self._check = BlockCheck.from_digests(
                    path, self.meta.rows, self.meta.block_rows, self.meta.row_bytes, where.digests,
                    max_buffers=check_buffers(getattr(self._source, "max_in_flight", 2)),
                    every_read=checks_every_read(self._verify, self.meta.remote is not None
                                                 and not getattr(self._source, "local_copy", False)),
                    row_digests=row_digest_reader(self._source, where.row_digests),
                )
                if self._check is not None and self.all_labels is not None:
                    self._check.labels(0, self.all_labels)  # every label, read once at the start
                self._rows = RowReader(self.meta, self._source, offsets=self._offsets,
                                       label_offsets=where.label_chunks, images=images, labels=labels,
                                       check=self._check, stop=self._stop, encoded=where.encoded)
                if by_offset:
                    self._io_threads = max(1, int(self._source.max_in_flight))
                    self._io = IOThreads(self._io_threads, self._thread.name + "-io", self._source)
                    stack.callback(self._io.shutdown)
                self._pump()
        except Stopped:
            pass
        except BaseException as exc:  # delivered to the consumer, never lost
            try:
                self._put(Failure(exc))
            except Stopped:
                pass

    def _jobs(self) -> Iterator[FillJob]:
        """Fill jobs in reading order, epoch after epoch, from the start position.  Reader thread."""
        epoch, first_batch = self._start
        self._batches.start_at(epoch, first_batch)
        while True:
            layout = self._layout(epoch)
            bounds = np.concatenate([[0], np.cumsum(layout.batch_sizes)])
            fill_bounds = np.concatenate([[0], np.cumsum(layout.fill_used)])  # epoch positions of the fills
            self._batches.add_epoch(epoch, bounds)
            first_fill = int(np.searchsorted(fill_bounds, bounds[first_batch], side="right")) - 1
            for fill in range(first_fill, len(layout.fills)):
                if fill_bounds[fill] >= bounds[-1]:
                    break  # only dropped rows left in this epoch
                permutation = layout.fill_permutation(fill)
                batch, offset = placement(permutation, int(fill_bounds[fill]), bounds, first_batch,
                                          int(layout.fill_rows[fill]))
                row_ids = layout.fill_row_ids(fill)
                labels = None if self.all_labels is None else self.all_labels[row_ids]
                segments = layout.fill_segments(fill)
                runs = self._plan(segments) if self._plan is not None else \
                    plan_runs(segments, self._offsets, self.meta.block_rows, self.meta.row_bytes)
                yield FillJob(epoch, batch, offset, row_ids, labels, runs, permutation)
            self._batches.planned(epoch)
            epoch, first_batch = epoch + 1, 0

    def _pump(self) -> None:
        """Read fill after fill, handing out each fill's batches while the next one is read, then queueing the
        reads of the one after: the I/O threads go from fill to fill without waiting for this thread.  Reader
        thread."""
        jobs = self._jobs()
        job = next(jobs)
        self._start_fill(job, first=True)
        if job.head:  # a cached URL's first batch goes out once its rows have landed (h5stream.read.arrive)
            wait_futures(job.head, check=self._check_stop)
            arrive(job, job.first_batch + 1)
            for key in self._ready():
                self._emit(key)
        self._complete(job)
        ready = self._ready()
        if ready:  # the first batch goes out before the next fill is planned and its batches allocated
            self._emit(ready.pop(0))
        nxt = next(jobs)
        self._start_fill(nxt)
        while True:
            ready += self._ready()
            # Hand out this fill's batches while the next one is read (by the I/O threads, or here in _step).
            per_batch = math.ceil(len(nxt.runs) / max(1, len(ready)))
            for key in ready:
                self._emit(key)
                self._step(nxt, per_batch)
            ready, after = [], next(jobs)  # planned while the I/O threads read nxt
            self._complete(nxt, then=after)
            nxt = after

    def _ready(self) -> list[tuple[int, int]]:
        """Complete batches that can go out now, in order.  Reader thread."""
        return self._batches.ready()

    def _emit(self, key) -> None:
        """Hand batch ``key`` on to the queue.  Reader thread."""
        self._put(self._batches.take(key))

    # -- one fill ------------------------------------------------------------------
    def _start_fill(self, job: FillJob, first: bool = False) -> None:
        """Advise the source ahead, allocate the fill's batches (may block on a bounded allocator), and hand
        the pixel reads to the I/O threads when there are any.  The ``first`` fill of a URL stream through the disk
        cache advises and reads its first batch's rows first (``job.head``: their futures; h5stream.read.arrive).

        With deferred pixels a fill whose runs are all in the page cache gets batches without images (their
        receivers read the rows); a fill with runs missing is read into batches as usual, since the page
        cache may drop what it fetches before a receiver gets to it.  A batch shared with the previous fill
        keeps the kind it was made with: its rows are read here if it has images, else read past.  Reader thread.
        """
        rounds = [job.runs]  # the runs read in rounds, each round's futures queued after the last round's
        if (first and getattr(self._source, "local_copy", False) and job.labels is not None and not self.defer_pixels
                and not getattr(self._layout, "piece_rows", 0) and not getattr(self.meta, "parts", ())):
            rounds = [part for part in head_first(job.batch, job.first_batch, job.runs, self.meta.row_bytes) if part]
        missing = self._rows.advise(rounds[0] + rounds[1] if len(rounds) > 1 else job.runs)
        self._counts["advised_bytes"] = self._rows.advised_bytes
        deferred = self.defer_pixels and not missing
        for j in range(job.first_batch, job.first_batch + job.n_batches):  # the fill's batches, in order
            job.targets[j] = self._batches.get(job.epoch, j, not deferred, self._check)
        self._counts["fills"] += 1
        if self.defer_pixels:
            with_images = [j for j, t in job.targets.items() if t.rows is not None]
            if not with_images:  # the usual deferred fill: every row is read by the batches' receivers
                job.to_read = []
            else:
                into_batches = np.isin(job.batch, with_images)
                job.to_read = [r for r in job.runs if into_batches[r.dest:r.dest + r.rows].any()]
        getattr(self._rows, "prepare", lambda job: None)(job)  # where small rows land (a part set's rows: none)
        if self._io is not None and job.to_read:
            # One future per I/O thread, each taking the next run not yet taken: together they walk the fill
            # in file order and finish within one read of each other, so the device's queue stays full to the
            # end of the fill; a fill costs k futures instead of one per run.
            reads = self._io.grow(self._source.max_in_flight)  # a URL's source asks for more once it stops caching
            for part in rounds if job.to_read is job.runs else [job.to_read]:
                runs, lock = iter(part), threading.Lock()
                job.futures += [self._io.submit(self._rows.read_runs, job, runs, lock) for _ in range(reads)]
            job.head = job.futures[:reads] if len(rounds) > 1 and job.to_read is job.runs else []
            job.done = len(job.to_read)

    def _step(self, job: FillJob, n_runs: int) -> None:
        """Read up to ``n_runs`` more runs of ``job`` in this thread (no-op when the I/O threads have them).
        Reader thread."""
        stop = min(len(job.to_read), job.done + n_runs)
        while job.done < stop:
            self._count_read(*self._rows.read_pixels(job, job.to_read[job.done]))
            job.done += 1

    def _count_read(self, seconds: float, nbytes: int) -> None:
        """Count a read in the stats.  Reader thread (the stats' one writer)."""
        self._counts["read_s"] += seconds
        self._counts["read_bytes"] += nbytes

    def _complete(self, job: FillJob, then: FillJob | None = None) -> None:
        """Start fill ``then`` (if any: its reads queue behind this fill's), finish every read of the fill, then
        count its rows as arrived in their batches.  Reader thread."""
        if then is not None:
            self._start_fill(then)
        self._step(job, len(job.to_read))
        wait_futures(job.futures, check=self._check_stop)
        for f in job.futures:  # what the I/O threads read, counted here: the stats have one writer
            self._count_read(*f.result())
        job.futures = []
        if job.labels is None:
            job.labels = self._rows.read_labels(job.runs, len(job.row_ids))
        file_offsets = None
        if any(t.batch.file_offsets is not None for t in job.targets.values()):
            file_offsets = row_offsets(job.runs, len(job.row_ids), self.meta.row_bytes)
            if self._check is not None:  # the receivers check rows against their digests: learn them first
                self._rows.learn_runs(job.runs)
        # The batches not counted yet (all but a URL's first batch, out already), each one slice of the fill.
        deferred_rows = arrive(job, job.first_batch + job.n_batches, file_offsets, self._check)
        self._counts["deferred_bytes"] += deferred_rows * self.meta.row_bytes
        job.targets = {}
        self._counts["in_place_bytes"] = getattr(self._source, "in_place_bytes", 0)
        if (c := self._check) is not None:
            self._counts.update(verify_learn_bytes=c.learned_bytes, verify_digest_bytes=c.digest_bytes)


def _piece_window(source: ByteSource, offsets: np.ndarray, meta: StoreMeta, piece_rows: int) -> ByteSource:
    """A URL's source behind the window of pieces the two-level order reads from (:mod:`h5stream.read.window`)."""
    from h5stream.order.twolevel import window_capacity
    from h5stream.read.window import piece_window

    return piece_window(source, offsets, meta, piece_rows, window_capacity(source.max_in_flight))
