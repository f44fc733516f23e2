"""Feeds: the reader thread, plus augmentation inline or in a worker pool.

A feed delivers ``(epoch, index, images, labels)`` in order and owns every
resource behind it; it allocates exactly what its
:class:`~h5stream.streaming.budget.StreamPlan` counts.  :class:`InlineFeed` runs the
transform (if any) in the consumer's thread.  :class:`PooledFeed` submits one
task per batch (indices only) to a :class:`~h5stream.augment.pool.WorkerPool`
and lends each finished output slot to the consumer as a view (copying only
when the consumer already holds ``plan.lent_slots`` of them, not counting one
batch it keeps for good).  When a fill of
an uncompressed store is already in the page cache, its tasks name their rows
by byte offset and the workers read them from the file themselves; otherwise
the reader reads (or, compressed, decodes) each batch into a shared-memory
*input slot*.  Both recycle their output arrays
(:class:`~h5stream.memory.lend.ArrayArena`).  Used by :mod:`h5stream.streaming.stream`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from h5stream.memory.lend import ArrayArena, SlotLender
from h5stream.concurrency.wait import Channel, stop_when
from h5stream.streaming.budget import KEPT_SLOTS
from h5stream.errors import ChecksumError, H5StreamError, ImageDecodeError, ReaderError, WorkerError
from h5stream.read.reader import Batch, Reader, direct_reads

if TYPE_CHECKING:
    from h5stream.streaming.config import StreamConfig


class Feed(Protocol):
    """What a :class:`~h5stream.streaming.stream.Stream` asks of its feed: batches in order, restartable at any
    position.

    Made from a :class:`~h5stream.streaming.config.StreamConfig` alone; owns every thread, process and shared segment
    behind it and allocates exactly what ``config.plan`` counts.  Every method runs in the consumer's thread
    (the one inside the stream).
    """

    def start(self, epoch: int, batch: int) -> None:
        """(Re)start at batch ``batch`` of epoch ``epoch``; whatever was made ahead is dropped."""

    def next(self) -> tuple[int, int, np.ndarray, np.ndarray]:
        """The next batch in order: ``(epoch, index, images, stored labels)``; a :class:`ReaderError` (or a
        subclass) within the config's ``timeout_s`` if none comes."""

    def stats(self) -> dict:
        """Counters for monitoring (see :meth:`h5stream.streaming.stream.Stream.stats`)."""

    def close(self) -> None:
        """Stop and free everything; idempotent."""

class InlineFeed:
    """Reader thread + (optional) augmentation in the consumer's thread.

    Threads: ``start``, ``next``, ``stats`` and ``close`` run in the consumer's thread (the one inside the
    stream, see :class:`h5stream.streaming.stream.Stream`); ``_allocate`` in the reader thread.
    """

    def __init__(self, config: StreamConfig):
        meta, plan, augment = config.meta, config.plan, config.augment
        self.meta, self._layout, self.plan = meta, config.layout, plan
        self._augment, self._seed, self._timeout_s, self._direct_io = augment, config.seed, config.timeout_s, \
            config.reader_direct_io
        self._verify = config.verify_reads
        self._images = ArrayArena(plan.batch_size, meta.image_shape, np.uint8, plan.reader_batches)
        self._out = None
        if augment is not None:
            self._out = ArrayArena(plan.batch_size, config.output_shape, augment.output_dtype(),
                                   plan.consumer_sets)
        self.reader: Reader | None = None
        self._error: BaseException | None = None  # a batch taken but not made (its decode or transform raised)

    def _allocate(self, n, images=True):
        """Arrays for an ``n``-row batch.  Reader thread."""
        return self._images(n), np.empty((n, *self.meta.label_shape), self.meta.label_dtype), None

    def start(self, epoch: int, batch: int) -> None:
        """(Re)start reading at ``(epoch, batch)``, dropping anything read ahead."""
        if self.reader is not None:
            self.reader.close()
        # A new arena per reader: the old thread has ended, but its batches may still be referenced.
        self._images = ArrayArena(self.plan.batch_size, self.meta.image_shape, np.uint8, self._images.max_sets)
        self.reader = Reader(
            self.meta, self._layout, queue_depth=self.plan.queue_depth, start_epoch=epoch, start_batch=batch,
            allocate=self._allocate, cache_labels=self.plan.label_cache_bytes > 0, timeout_s=self._timeout_s,
            direct_io=self._direct_io, verify=self._verify,
        )
        self._error = None

    def next(self) -> tuple[int, int, np.ndarray, np.ndarray]:
        """The next batch, augmented here if there is a transform.  A batch whose decode or transform raises is
        taken from the reader all the same: that error is raised again by every later call (the batches after it
        would be out of order), until :meth:`start`.  Consumer thread."""
        if self._error is not None:
            raise self._error
        b: Batch = self.reader.get()
        try:
            return self._made(b)
        except Exception as exc:
            self._error = exc
            raise

    def _made(self, b: Batch) -> tuple[int, int, np.ndarray, np.ndarray]:
        """Batch ``b`` decoded (an encoded store's) and transformed.  Consumer thread."""
        x = b.images
        if b.encoded_lengths is not None:  # an encoded store's rows: decoded here, in place (read/encoded.py)
            from h5stream.augment.decode_crop import crops_while_decoding, decode_augment
            from h5stream.store.jpeg import decode_slot_rows

            if crops_while_decoding(self._augment):  # each row decoded at the scale its crop needs
                x = decode_augment(self._augment, x, b.encoded_lengths, b.row_ids, self._seed, b.epoch,
                                   self._out(len(x)), self.meta.path)
                return b.epoch, b.index, x, b.labels
            decode_slot_rows(x, b.encoded_lengths, b.row_ids, path=self.meta.path)
        if self._augment is not None:
            x = self._augment(x, seed=self._seed, epoch=b.epoch, row_ids=b.row_ids, out=self._out(len(x)))
        return b.epoch, b.index, x, b.labels

    def stats(self) -> dict:
        return _reader_stats(self.reader)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()


_SLOTS, _FILE = 0, 1
"""The pool's sources: the shared input slots, and (uncompressed stores) the file itself."""


class _Submitted(NamedTuple):
    epoch: int
    index: int
    labels: np.ndarray
    in_slot: int | None
    seq: int


class PooledFeed:
    """Reader thread + a pool of worker processes that read or receive the pixels and augment them (or, with no
    augmentation, copy them into the output slots as they are: :attr:`StreamConfig.transform
    <h5stream.streaming.config.StreamConfig.transform>`).

    ``direct`` (uncompressed store): a fill that is already in the page cache
    goes to the pool as byte offsets, and the workers ``preadv`` the rows into
    their own buffers.  That moves the one copy of every pixel out of this
    process, where it was the largest cost (the copy into cache-cold shared
    slots), into the workers, where it lands in a small warm buffer.

    Otherwise (a fill with rows not cached, or a compressed store, which only
    HDF5 can decode) the reader reads into shared-memory input slots:
    ``plan.input_slots``, the reader's batches and one per output slot, so
    the reader never waits on a slot that only it could free.  A slot returns
    to the free list when its batch's result is taken by the consumer (the
    worker has read it by then).

    Threads: ``start``, ``next``, ``_submit``, ``_top_up``, ``stats`` and
    ``close`` run in the consumer's thread (the one inside the stream), which
    also submits the reader's batches to the pool as output slots come free
    and reads the workers' answers (the pool has no thread of its own):
    nothing in this process wakes per batch but the consumer, and the reader
    thread once per fill.  ``_allocate`` (the reader's hook) runs in the reader
    thread, whose waits end with :class:`~h5stream.concurrency.wait.Stopped` once the
    feed's stop flag is set.
    """

    def __init__(self, config: StreamConfig):
        from h5stream.augment.pool import FileSource, WorkerPool
        from h5stream.memory.shm import SharedArray, new_prefix

        meta, plan, timeout_s, direct_io = config.meta, config.plan, config.timeout_s, config.reader_direct_io
        out_dtype = config.output_dtype
        self.meta, self._layout, self.plan = meta, config.layout, plan
        self._seed, self._timeout_s, self._direct_io, self._verify = (config.seed, timeout_s, direct_io,
                                                                      config.verify_reads)
        bs = plan.batch_size
        self._n_in = plan.input_slots
        prefix = new_prefix()
        # Workers read rows the page cache holds straight from the file: only a local file read through the
        # page cache has one.
        self.direct = meta.remote is None and not direct_io and not getattr(meta, "parts", ()) \
            and direct_reads(meta.path, meta)  # a set of parts: the reader reads every row
        self._inputs = SharedArray.create((self._n_in * bs, *meta.image_shape), np.uint8, prefix + "in_")
        sources = [self._inputs.spec]
        if self.direct:
            sources.append(FileSource(meta.path, (meta.rows, *meta.image_shape), "uint8"))
        try:
            self._pool = WorkerPool(
                config.transform, sources, workers=plan.workers, batch_rows=bs, n_slots=plan.out_slots,
                out_dtype=out_dtype, prefix=prefix + "out_", start_timeout_s=max(60.0, timeout_s),
                out_row_shape=config.output_shape,
            )
        except BaseException:
            self._inputs.close()
            raise
        self._lender = SlotLender(self._pool.output_lender, self._pool.release,
                                  ArrayArena(bs, config.output_shape, out_dtype, plan.consumer_sets),
                                  lent_slots=plan.lent_slots, kept_slots=KEPT_SLOTS)
        self._free = Channel(self._n_in)  # free input slots: the reader thread takes, the consumer gives back
        self._stop: threading.Event | None = None
        self._error: H5StreamError | None = None  # a batch not made (late, or its task raised): raised again
        self._submitted: deque[_Submitted] = deque()  # batches in the pool, in order
        self.reader: Reader | None = None

    def _allocate(self, n, images=True):
        """A free input slot's rows (waiting for one) and labels for an ``n``-row batch; no slot when the workers
        read the pixels.  Reader thread."""
        labels = np.empty((n, *self.meta.label_shape), self.meta.label_dtype)
        if not images:
            return None, labels, None  # the workers read the pixels from the file
        with stop_when(self._stop):
            k = self._free.get()
        bs = self.plan.batch_size
        return self._inputs.array[k * bs:k * bs + n], labels, k

    def _submit(self, b: Batch, timeout_s: float) -> None:
        """Hand batch ``b`` to the pool (waiting up to ``timeout_s`` for an output slot).  Consumer thread: it
        is the one that frees output slots, so it submits without waiting whenever :meth:`_top_up` finds room."""
        # The reader made the batch: its arrays are int64 and in range, so the pool's checks are skipped.
        if b.images is None:
            source, first, offsets, checks = _FILE, -1, b.file_offsets, b.checks
        else:  # in place: the input slot is freed only once the result is taken
            # An encoded store's rows go with their lengths: the worker decodes them (read/encoded.py).
            source, first, offsets, checks = _SLOTS, b.slot * self.plan.batch_size, b.encoded_lengths, None
        seq = self._pool.submit_trusted(source, first, b.row_ids, offsets, checks, epoch=b.epoch, seed=self._seed,
                                        timeout_s=timeout_s)
        self._submitted.append(_Submitted(b.epoch, b.index, b.labels, b.slot, seq))

    def _top_up(self) -> None:
        """Submit the batches the reader has queued while the pool has room; never waits.  A failure stays
        where it happened (the reader's or the pool's, both raise it again at their next call) for the next
        :meth:`next` to raise: this one may already hold a batch to return.  Consumer thread."""
        try:
            while self._pool.has_room():
                b = self.reader.poll()
                if b is None:
                    return
                self._submit(b, 0.0)
        except (H5StreamError, TimeoutError):
            pass

    def start(self, epoch: int, batch: int) -> None:
        """(Re)start reading at ``(epoch, batch)``; tasks of a previous reader are finished and dropped.  A task
        that does not finish within ``timeout_s`` (a stopped worker) raises the error :meth:`next` keeps, or the
        one naming that worker, and the feed stays as it was; a dead worker raises its WorkerError, which
        :meth:`next` raises from then on.  Consumer thread."""
        if self.reader is not None:
            self.reader.close()
            t0 = time.monotonic()
            try:
                self._pool.discard_pending(self._timeout_s)
            except WorkerError as exc:  # a worker died: the reader is closed, so next() raises this, not a
                raise self._fail(exc) from None  # closed stream (the pool raises it for good anyway)
            except TimeoutError as exc:
                raise (self._error or self._fail(self._late_worker(t0) or ReaderError(
                    f"{self.meta.path}: the augment workers did not finish their batches in {self._timeout_s:.3g} s; "
                    "raise timeout_s if the transform is that slow"))) from exc
        self._error = None
        self._submitted.clear()
        self._free = Channel(self._n_in)
        for k in range(self._n_in):
            self._free.put(k)
        self._stop = threading.Event()
        # The reader hands over whole fills at a time (it wakes once per fill, not once per batch): the queue
        # holds a fill's batches beyond the plan's queue depth.  What they hold is counted already: the fill's
        # batches exist while it is read, and their pixels, if any, are in input slots.
        per_fill = -(-self.plan.rows_per_fill // self.plan.batch_size) + 1
        self.reader = Reader(
            self.meta, self._layout, queue_depth=self.plan.queue_depth + per_fill,
            queue_resume_at=self.plan.queue_depth, start_epoch=epoch, start_batch=batch, allocate=self._allocate,
            stop=self._stop, defer_pixels=self.direct, cache_labels=self.plan.label_cache_bytes > 0,
            timeout_s=self._timeout_s, direct_io=self._direct_io, verify=self._verify,
        )

    def next(self) -> tuple[int, int, np.ndarray, np.ndarray]:
        """The next batch, or :class:`ReaderError` within ``timeout_s`` (reading and transforming together),
        naming the worker that has the batch when one has it; after that error every call raises it again.
        Consumer thread: it takes the reader's batches, submits them to the pool as output slots come free
        (no thread waits on the pool's slots), and takes the results in order."""
        if self._error is not None:
            raise self._error
        t0 = counted = time.monotonic()
        deadline = t0 + self._timeout_s
        # The slots the consumer dropped since the last call go back to the ring and take the reader's next
        # batches before this call waits: the workers get them as early as they can, and what follows the
        # wait (when the caches are cold) is little more than taking the result.
        self._lender.reclaim()
        self._top_up()
        if not self._submitted:
            try:
                b = self.reader.get(deadline)
            except ReaderError as exc:
                late = self._late_worker(t0)  # the reader waits for an input slot that a stuck worker holds
                if late is None:
                    raise
                raise self._fail(late) from exc
            counted = time.monotonic()  # the reader's get counted its own wait: count the rest from here
            # A reader that kept reading past the deadline was slow, not stuck (see Reader.get): the pool gets
            # its own timeout_s for this batch from here.
            if counted >= deadline:
                deadline = counted + self._timeout_s
            try:
                self._submit(b, max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                raise self._fail(ReaderError(
                    f"{self.meta.path}: no output slot of the augment pool came free in {self._timeout_s:.3g} s; "
                    "does the consumer keep every batch it got?"
                )) from None
            self._top_up()
        item = self._submitted[0]  # taken off once the pool has handed its batch over (or its error)
        try:
            # One wait until the deadline: the pool's wait runs a held-back Ctrl-C within POLL_S meanwhile.
            done = self._pool.get(timeout_s=max(deadline - time.monotonic(), 0.0))
        except WorkerError as exc:
            # The batch is gone from the pool: every later call raises this (the next batches would be out of step).
            self._submitted.popleft()
            if exc.stage != "read":
                self._fail(exc)
                raise
            # The workers read the pixels (direct reads): an I/O failure is the same ReaderError as without them.
            if exc.summary.startswith(f"{ChecksumError.__name__}: "):  # already says what to do
                raise self._fail(ChecksumError(exc.summary.split(": ", 1)[1])) from exc
            if exc.summary.startswith(f"{ImageDecodeError.__name__}: "):  # names the row; the file is ours to name
                raise self._fail(ImageDecodeError(f"{self.meta.path}: {exc.summary.split(': ', 1)[1]}")) from exc
            summary = exc.summary.replace(f"{self.meta.path}: ", "")
            raise self._fail(ReaderError(f"{self.meta.path}: reading failed in an augment worker: {summary}")) from exc
        except TimeoutError:
            raise self._fail(self._late_worker(t0) or ReaderError(
                f"{self.meta.path}: no augmented batch from the workers in {self._timeout_s:.3g} s; "
                "raise timeout_s if the transform is that slow"
            )) from None
        self._submitted.popleft()
        self.reader.add_wait(time.monotonic() - counted)
        if done.seq != item.seq:  # pragma: no cover - internal invariant
            raise RuntimeError(f"pool out of step: got batch {done.seq}, expected {item.seq}")
        copied = self._lender.copied
        try:
            # Lent as a view of its output slot while the consumer holds few (the usual loop holds the previous
            # batch), else copied: see SlotLender.
            x = self._lender.hand_over(done.slot, done.rows)
        finally:
            if item.in_slot is not None:
                self._free.put(item.in_slot)
        if self._lender.copied != copied:
            self._top_up()  # into the slot the copy freed, before the caller's training step
        return item.epoch, item.index, x, item.labels

    def _late_worker(self, t0: float) -> ReaderError | None:
        """The error naming the worker that has the next batch in order, if one has it.  Consumer thread."""
        from h5stream.augment.pool_state import stopped

        waiting = self._pool.waiting_on()
        if waiting is None:
            return None
        seq, w, pid = waiting
        waited = f"{time.monotonic() - t0:.3g} s"
        if stopped(pid):
            return ReaderError(
                f"{self.meta.path}: augment worker {w} (pid {pid}) is stopped (SIGSTOP or Ctrl-Z) with a batch the "
                f"stream has waited {waited} for; resume it (kill -CONT {pid}), then go on from the stream's "
                "state() (restore it, or open(..., resume=state))"
            )
        return ReaderError(
            f"{self.meta.path}: augment worker {w} (pid {pid}) has not finished its batch in {waited}; "
            "raise timeout_s if the transform is that slow"
        )

    def _fail(self, error: H5StreamError) -> H5StreamError:
        """Stop reading and keep ``error`` for every later call: the batches after a late or failed one are out
        of step.  Consumer thread."""
        self._error = error
        self._stop.set()
        return error

    @property
    def pool(self):
        """The feed's :class:`~h5stream.augment.pool.WorkerPool` (its output slots' spec, its pids, for the feeder
        process that runs this feed).  Consumer thread."""
        return self._pool

    def stats(self) -> dict:
        s = _reader_stats(self.reader)
        s["pool_in_flight"] = self._pool.in_flight
        s["copied_batches"] = self._lender.copied
        s["worker_pids"] = self._pool.pids
        return s

    def close(self) -> None:
        try:
            if self.reader is not None:
                self.reader.close()
        finally:
            try:
                self._pool.close()
            finally:
                self._inputs.close()


def _reader_stats(reader: Reader | None) -> dict:
    if reader is None:
        return {}
    depth, capacity = reader.queue_fill
    return {**reader.stats, "queue_depth": depth, "queue_capacity": capacity}

