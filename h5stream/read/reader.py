"""The reader thread: where the stream opens the HDF5 file and decides what is read when.

:class:`Reader` owns a thread and a bounded queue.  The thread opens the file
itself and walks fills (see :mod:`h5stream.order.epoch`) epoch after epoch.  For
each fill it knows, before reading, where every row must land: batch ``j``, row
``k``.  It then reads each contiguous run of rows **straight into those places**
with one scatter read (``os.preadv`` with one buffer per row): the kernel copies
from the page cache into the shuffled batches, so a row is copied once, the
GIL is released meanwhile, and no separate shuffle buffer or gather pass exists.
The batches being filled *are* the shuffle buffer; the plan bounds them to two
fills' worth of rows.  ``POSIX_FADV_WILLNEED`` asks the kernel to fetch a whole
fill ahead (the runs not already cached).  Compressed stores (no raw chunk
access) read each run through h5py into a small scratch array and copy rows
out.

The thread starts by reading where every committed row lies (the byte offsets
of the chunks of ``/images`` and ``/labels``, through
:func:`~h5stream.store.access.read_consistent`).  From then on an uncompressed
store is read by byte offset only, pixels and labels alike: their bytes never
move, so it streams while another process appends to the file.  A compressed
store is read through HDF5, which relies on metadata a writer rewrites; it is
refused with :class:`StoreBusyError` while another process writes it.

With ``defer_pixels``, a fill already in the page cache is not copied at all:
its batches carry their rows' byte offsets for worker processes to read (see
:class:`Reader`).

Reading overlaps handing out batches: while the batches of fill ``f`` go to
the consumer, fill ``f + 1`` is read -- by the I/O threads, all its runs
submitted at once, or (compressed stores, read through HDF5 in this thread)
a few runs between batches, so the queue keeps moving.

Every blocking queue call uses a short timeout and checks the stop flag, so
:meth:`Reader.close` always returns promptly.  An exception in the thread is
queued and re-raised by the consumer as :class:`ReaderError` with the cause.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import h5py
import numpy as np

from h5stream import _interrupt as interrupt
from h5stream.errors import ReaderError, StoreBusyError, StoreFormatError, StreamClosedError
from h5stream.order.epoch import EpochLayout
from h5stream.read.pagecache import Residency, preadv_all
from h5stream.store import schema
from h5stream.store.access import busy_error, open_h5_readonly, read_consistent, writer_pids
from h5stream.store.meta import StoreMeta

POLL_S = 0.1
"""How often blocked queue calls wake up to look at the stop flag."""

_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", None)  # Linux: a read that fails instead of waiting for the disk

IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") and "SC_IOV_MAX" in os.sysconf_names else 1024


class Stopped(Exception):
    """Raised inside the reader thread (and its hooks) when the stop flag is set; ends the thread quietly."""


@dataclass
class Batch:
    """A batch as the reader hands it on.  ``images``/``labels``/``row_ids`` belong to the receiver.

    ``slot`` is whatever the allocator attached (e.g. a shared-memory slot index), else None.
    """

    epoch: int
    index: int
    images: np.ndarray
    labels: np.ndarray
    row_ids: np.ndarray
    slot: object = None
    file_offsets: np.ndarray | None = None


@dataclass(frozen=True)
class _Failure:
    exc: BaseException


class ArrayArena:
    """Recycles batch-sized arrays so writers fill memory that is already mapped.

    Fresh multi-megabyte arrays cost a page fault per 4 KiB on first touch, which
    makes writing into them several times slower than the copy itself.  The arena
    keeps up to ``max_sets`` arrays of ``batch_rows`` rows and hands out views of
    them.  An array is reused only once nothing outside the arena refers to it
    (its reference count, which every view of it raises, is back to the arena's
    own), so a caller may keep a batch as long as it likes: it is never
    overwritten.  Used from one thread.
    """

    def __init__(self, batch_rows: int, row_shape, dtype, max_sets: int):
        self.batch_rows = int(batch_rows)
        self.row_shape = tuple(row_shape)
        self.dtype = np.dtype(dtype)
        self.max_sets = int(max_sets)
        self._sets: list[np.ndarray] = []
        self._next = 0

    def __call__(self, n: int) -> np.ndarray:
        if n > self.batch_rows:
            return np.empty((n, *self.row_shape), self.dtype)
        count = len(self._sets)
        for i in range(count):
            k = (self._next + i) % count
            # Free when only the list and getrefcount's argument refer to it.
            if sys.getrefcount(self._sets[k]) <= 2:
                self._next = (k + 1) % count
                return self._sets[k][:n]
        base = np.empty((self.batch_rows, *self.row_shape), self.dtype)
        if count < self.max_sets:
            self._sets.append(base)
        return base[:n]


class _Pending:
    """A batch being assembled: arrays, a byte view of its images, and how many rows are still missing."""

    __slots__ = ("batch", "missing", "rows")

    def __init__(self, batch: Batch, missing: int):
        self.batch = batch
        self.missing = missing
        images = batch.images
        self.rows = memoryview(images.reshape(-1)).cast("B") if images is not None and images.size else None


class _FillJob:
    """Reading one fill: its runs and, for every row, the batch and offset it lands at.

    Pixels go straight into the batches; labels and row ids are gathered into
    small per-fill arrays and scattered when the fill is complete, which is also
    when its batches count the rows as arrived.  With I/O threads the pixel reads
    are all submitted at :meth:`start` and run while the reader thread hands out
    the previous fill; without them :meth:`step` reads a few runs at a time.
    """

    def __init__(self, reader: Reader, layout: EpochLayout, fill: int, bounds: np.ndarray, fill_start: int,
                 first_batch: int):
        self.reader = reader
        self.epoch = layout.epoch
        n = int(layout.fill_rows[fill])
        # Buffer position p (rows in segment order) is yielded at epoch position fill_start + inv[p].
        inv = np.empty(n, np.int64)
        inv[layout.fill_permutation(fill)] = np.arange(n)
        pos = fill_start + inv
        batch = np.searchsorted(bounds, pos, side="right") - 1
        keep = (pos < bounds[-1]) & (batch >= first_batch)  # rows before a resume point, or dropped, are skipped
        self.batch = np.where(keep, batch, -1)
        self.offset = np.where(keep, pos - bounds[np.minimum(batch, len(bounds) - 2)], -1)
        self.row_ids = layout.fill_row_ids(fill)
        self.labels = None if reader.all_labels is None else reader.all_labels[self.row_ids]
        self.runs = reader.plan_runs(layout.fill_segments(fill))
        self.to_read = self.runs  # runs read into batches (step / the I/O threads)
        self.done = 0
        self.targets: dict[int, _Pending] = {}
        self.futures: list = []

    def start(self) -> None:
        """Ask the kernel to read ahead, allocate the fill's batches (may block on a bounded allocator),
        and hand the pixel reads to the I/O threads when there are any.

        With deferred pixels a fill whose runs are all in the page cache gets batches without images (their
        receivers read the rows); a fill with runs missing is read into batches as usual, since the page
        cache may drop what it fetches before a receiver gets to it.  A batch shared with the previous fill
        keeps the kind it was made with: its rows are read here if it has images, else read past.
        """
        missing = self.reader.advise(self.runs)
        deferred = self.reader.defer_pixels and not missing
        for j in np.unique(self.batch[self.batch >= 0]):
            self.targets[int(j)] = self.reader.pending(self.epoch, int(j), images=not deferred)
        self.reader.stats["fills"] += 1
        if self.reader.defer_pixels:
            with_images = [j for j, t in self.targets.items() if t.rows is not None]
            into_batches = np.isin(self.batch, with_images)
            self.to_read = [r for r in self.runs if into_batches[r[0]:r[0] + r[2]].any()]
        if self.reader.io is not None:
            # One future per I/O thread, each taking every k-th run: both walk the fill in file order, and
            # a fill costs k futures instead of one per run.
            k = self.reader.io_threads
            self.futures = [self.reader.io.submit(self.reader.read_runs, self, self.to_read[i::k]) for i in range(k)]
            self.done = len(self.to_read)

    def step(self, n_runs: int) -> None:
        """Read up to ``n_runs`` more runs in this thread (no-op when the I/O threads have them)."""
        stop = min(len(self.to_read), self.done + n_runs)
        while self.done < stop:
            self.reader.read_pixels(self, self.to_read[self.done])
            self.done += 1

    def complete(self) -> None:
        """Finish every read of the fill, then count its rows as arrived in their batches."""
        self.step(len(self.to_read))
        self.reader.wait_all(self.futures)
        self.futures = []
        if self.labels is None:
            self.labels = self.reader.read_labels(self.runs, len(self.row_ids))
        file_offsets = None
        if any(t.batch.file_offsets is not None for t in self.targets.values()):
            file_offsets = self.reader.file_offsets(self.runs, len(self.row_ids))
        kept = np.flatnonzero(self.batch >= 0)
        order = kept[np.argsort(self.batch[kept], kind="stable")]
        split = np.flatnonzero(np.diff(self.batch[order])) + 1
        for group in np.split(order, split) if len(order) else []:
            t = self.targets[int(self.batch[group[0]])]
            k = self.offset[group]
            t.batch.labels[k] = self.labels[group]
            t.batch.row_ids[k] = self.row_ids[group]
            if t.batch.file_offsets is not None:
                t.batch.file_offsets[k] = file_offsets[group]
                self.reader.stats["deferred_bytes"] += len(group) * self.reader.meta.row_bytes
            t.missing -= len(group)
        self.targets = {}


class Reader:
    """Owns the reader thread, its HDF5 handle and the batch queue.

    ``layout(epoch) -> EpochLayout`` describes each epoch; reading starts at
    ``(start_epoch, start_batch)`` and goes on epoch after epoch until
    :meth:`close`.  ``allocate(n, images)`` returns ``(images, labels, slot)``
    for an ``n``-row batch (``images`` None when asked for none) and may block; ``on_batch(batch)`` turns a finished batch
    into what is queued (default: the batch itself) and may block; both must
    raise :class:`Stopped` once ``stop`` is set.  ``cache_labels``
    reads every label once up front instead of run by run; ``io_threads``
    threads run the raw pixel reads (``preadv``, GIL released) so reading overlaps
    handing out batches and several reads are in flight on cold storage.
    ``defer_pixels=True`` (uncompressed stores only, see :func:`direct_reads`)
    lets the batches of a fill that is wholly in the page cache go out without
    images: such a batch carries ``file_offsets``, the byte offset of every row,
    for its receivers (the worker processes) to read from the page cache.  A
    fill with runs missing from the page cache is read into batches as usual
    (the disk then being read in file order, several reads in flight, and
    nothing left for the page cache to drop before a receiver reads it).
    Thread-safety: ``get`` from one consumer thread; ``close`` from any thread,
    idempotent.
    """

    def __init__(
        self,
        meta: StoreMeta,
        layout: Callable[[int], EpochLayout],
        *,
        queue_depth: int,
        start_epoch: int = 0,
        start_batch: int = 0,
        timeout_s: float = 60.0,
        cache_labels: bool = False,
        io_threads: int = 2,
        defer_pixels: bool = False,
        allocate: Callable[[int], tuple[np.ndarray, np.ndarray, object]],
        on_batch: Callable[[Batch], object] | None = None,
        stop: threading.Event | None = None,
        name: str = "h5stream-reader",
    ):
        self.meta = meta
        self._layout = layout
        self._timeout_s = float(timeout_s)
        self._queue: queue.Queue = queue.Queue(maxsize=queue_depth)
        self._stop = stop or threading.Event()
        self._on_batch = on_batch
        self._start = (int(start_epoch), int(start_batch))
        self._allocate = allocate
        self._scratch = np.empty(meta.row_bytes, np.uint8)  # destination of rows that are read but not used
        self.stats = {"read_bytes": 0, "read_s": 0.0, "fills": 0, "wait_s": 0.0, "batches": 0, "advised_bytes": 0,
                      "deferred_bytes": 0}
        self._probe = bytearray(1)  # destination of the one-byte page-cache probes in advise()
        self._fd = None
        self._residency: Residency | None = None  # deferred pixels: which fills are wholly cached
        self._offsets = None
        self._label_offsets = None  # (byte offset of each label chunk, rows per chunk) where stored uncompressed
        self._cache_labels = bool(cache_labels)
        self.defer_pixels = bool(defer_pixels)
        self._io_threads = int(io_threads)
        self.io: concurrent.futures.ThreadPoolExecutor | None = None
        self._stats_lock = threading.Lock()
        self.all_labels: np.ndarray | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False
        self._thread.start()

    # -- consumer side -----------------------------------------------------------
    def get(self) -> Batch:
        """Next batch in order.  Raises :class:`ReaderError` if the thread failed or went quiet."""
        if self._closed:
            raise StreamClosedError("the stream is closed; open it again with h5stream.open(...)")
        t0 = time.perf_counter()
        while True:
            try:
                item = self._queue.get(timeout=POLL_S)
                break
            except queue.Empty:
                interrupt.raise_pending()
                if not self._thread.is_alive() and self._queue.empty():
                    raise ReaderError(f"{self.meta.path}: the reader thread stopped without a result") from None
                if time.perf_counter() - t0 > self._timeout_s:
                    raise ReaderError(
                        f"{self.meta.path}: no batch from the reader in {self._timeout_s:.0f} s "
                        "(storage too slow or stuck?); raise timeout_s if this is expected"
                    ) from None
        self.stats["wait_s"] += time.perf_counter() - t0
        if isinstance(item, _Failure):
            if isinstance(item.exc, StoreBusyError):  # already one line that says what to do
                raise StoreBusyError(str(item.exc)) from item.exc
            raise ReaderError(f"{self.meta.path}: reading failed: {item.exc!r}") from item.exc
        self.stats["batches"] += 1
        return item

    @property
    def queue_fill(self) -> tuple[int, int]:
        return self._queue.qsize(), self._queue.maxsize

    @property
    def stopping(self) -> threading.Event:
        return self._stop

    def close(self) -> None:
        """Stop the thread and drop queued batches.  Idempotent; returns once the thread has ended."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join(timeout=self._timeout_s)
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- reader thread -------------------------------------------------------------
    def put(self, item) -> None:
        """Queue ``item`` for the consumer, waking every POLL_S to honour the stop flag."""
        while True:
            if self._stop.is_set():
                raise Stopped
            try:
                self._queue.put(item, timeout=POLL_S)
                return
            except queue.Full:
                continue

    def _run(self) -> None:
        path = self.meta.path
        try:
            # Where every committed row's pixels and labels lie, read once; after that an uncompressed store is
            # read by byte offset only, which stays right while another process appends to the file.
            snap = read_consistent(path, lambda f: _snapshot(f, self.meta, self._cache_labels), rdcc_nbytes=0)
            self._offsets, self._label_offsets, self.all_labels = snap
            if self.defer_pixels and self._offsets is None:
                raise ValueError("defer_pixels needs an uncompressed store whose rows can be read directly")
            with contextlib.ExitStack() as stack:
                if self._offsets is None or (self.all_labels is None and self._label_offsets is None):
                    # Only HDF5 can read these rows (compressed), and it trusts metadata a writer rewrites.
                    writers = writer_pids(path)
                    if writers:
                        raise busy_error(path, writers, "a compressed store can only be read through HDF5 "
                                                        "metadata that the writer keeps changing")
                    f = stack.enter_context(open_h5_readonly(path, rdcc_nbytes=0))
                    self._images = f[schema.IMAGES]
                    self._labels = f[schema.LABELS]
                self._fd = os.open(path, os.O_RDONLY)
                stack.callback(self._close_fd)
                if self._offsets is not None:
                    if self.defer_pixels:
                        self._residency = Residency(self._fd)
                    if self._io_threads > 0:
                        self.io = concurrent.futures.ThreadPoolExecutor(
                            self._io_threads, thread_name_prefix=self._thread.name + "-io"
                        )
                try:
                    self._pump()
                finally:
                    if self.io is not None:
                        self.io.shutdown(wait=True, cancel_futures=True)
                    if self._residency is not None:
                        self._residency.close()
                        self._residency = None
        except Stopped:
            pass
        except BaseException as exc:  # delivered to the consumer, never lost
            try:
                self.put(_Failure(exc))
            except Stopped:
                pass

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _jobs(self) -> Iterator[_FillJob]:
        """Fill jobs in reading order, epoch after epoch, from the start position."""
        epoch, first_batch = self._start
        while True:
            layout = self._layout(epoch)
            bounds = np.concatenate([[0], np.cumsum(layout.batch_sizes)])
            fill_bounds = np.concatenate([[0], np.cumsum(layout.fill_rows)])
            self._bounds[epoch] = bounds
            first_fill = int(np.searchsorted(fill_bounds, bounds[first_batch], side="right")) - 1
            self._next_emit.setdefault("pos", (epoch, first_batch))
            for fill in range(first_fill, len(layout.fills)):
                if fill_bounds[fill] >= bounds[-1]:
                    break  # only dropped rows left in this epoch
                yield _FillJob(self, layout, fill, bounds, int(fill_bounds[fill]), first_batch)
            self._bounds.pop(epoch - 2, None)
            epoch, first_batch = epoch + 1, 0

    def _pump(self) -> None:
        self._pending: dict[tuple[int, int], _Pending] = {}
        self._bounds: dict[int, np.ndarray] = {}
        self._next_emit: dict = {}
        jobs = self._jobs()
        job = next(jobs)
        job.start()
        job.complete()
        for nxt in jobs:
            ready = self._ready()
            nxt.start()
            # Hand out this fill's batches while the next one is read (by the I/O threads, or here in step).
            per_batch = math.ceil(len(nxt.runs) / max(1, len(ready)))
            for key in ready:
                self._emit(key)
                nxt.step(per_batch)
            nxt.complete()

    def _ready(self) -> list[tuple[int, int]]:
        """Complete batches that can go out now, in order (stops at the first incomplete one)."""
        out = []
        epoch, j = self._next_emit["pos"]
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
        self._next_emit["pos"] = (epoch, j)
        return out

    def _emit(self, key) -> None:
        p = self._pending.pop(key)
        self.put(p.batch if self._on_batch is None else self._on_batch(p.batch))

    def pending(self, epoch: int, j: int, images: bool = True) -> _Pending:
        """The batch ``(epoch, j)`` being assembled, allocated on first use (with or without images)."""
        key = (epoch, j)
        p = self._pending.get(key)
        if p is None:
            bounds = self._bounds[epoch]
            n = int(bounds[j + 1] - bounds[j])
            x, y, slot = self._allocate(n, images)
            offsets = None if images else np.empty(n, np.int64)
            p = self._pending[key] = _Pending(Batch(epoch, j, x, y, np.empty(n, np.int64), slot, offsets), n)
        return p

    # -- I/O -------------------------------------------------------------------------
    def plan_runs(self, segments: np.ndarray) -> list[tuple[int, int, int, int | None]]:
        """Coalesce a fill's segments into reads: (buffer_pos, src_row, n_rows, byte_offset or None)."""
        runs: list[list] = []
        dest = 0
        row_bytes = self.meta.row_bytes
        block = self.meta.block_rows
        for start, stop in segments:
            start, stop = int(start), int(stop)
            n = stop - start
            off = None if self._offsets is None else int(self._offsets[start // block]) + (start % block) * row_bytes
            if runs:
                r = runs[-1]
                same_kind = (off is None) == (r[3] is None)
                contiguous = r[1] + r[2] == start and (off is None or r[3] + r[2] * row_bytes == off)
                if same_kind and contiguous:
                    r[2] += n
                    dest += n
                    continue
            runs.append([dest, start, n, off])
            dest += n
        return [tuple(r) for r in runs]

    def advise(self, runs) -> list:
        """Ask the kernel to fetch a fill's runs ahead (``POSIX_FADV_WILLNEED``), skipping runs already cached;
        return the runs not known to be cached.

        On cached data WILLNEED still walks every page of the range (16 us per MiB measured, in the reader
        thread), while two one-byte ``RWF_NOWAIT`` reads at a run's ends tell in ~2.5 us whether it is
        there; a run with either end missing is advised as before.  With deferred pixels a run counts as
        cached only if every page of it is (``cachestat`` / ``mincore``, see :meth:`_run_cached`).
        """
        if self._fd is None or self._offsets is None:
            return []
        row_bytes = self.meta.row_bytes
        missing = []
        for run in runs:
            _dest, _src, n, off = run
            length = n * row_bytes
            if self._run_cached(off, length):
                continue
            missing.append(run)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self._fd, off, length, os.POSIX_FADV_WILLNEED)
                self.stats["advised_bytes"] += length
        return missing

    def _run_cached(self, offset: int, length: int) -> bool:
        """Whether a run is in the page cache: every page of it where ``cachestat`` / ``mincore`` can tell
        (deferred pixels depend on it), else its two ends (enough to skip advice for runs read whole)."""
        if self._residency is not None and self._residency.method is not None:
            return self._residency.cached(offset, length)
        return self._cached(offset) and self._cached(offset + length - 1)

    def _cached(self, offset: int) -> bool:
        """Whether the byte at ``offset`` is in the page cache (a read that must not wait); False when unknown."""
        if _RWF_NOWAIT is None:
            return False
        try:
            return os.preadv(self._fd, [self._probe], offset, _RWF_NOWAIT) == 1
        except OSError:  # EAGAIN: not cached; EOPNOTSUPP and the like: cannot tell
            return False

    @property
    def io_threads(self) -> int:
        return self._io_threads

    def read_runs(self, job: _FillJob, runs) -> None:
        for run in runs:
            self.read_pixels(job, run)

    def read_pixels(self, job: _FillJob, run) -> None:
        """Read one run of rows straight into their batches.  Runs on an I/O thread when there are any."""
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
            for i in range(0, n, IOV_MAX):
                preadv_all(self._fd, views[i:i + IOV_MAX], off + i * row_bytes, self.meta.path)
        else:  # compressed: HDF5 decodes; only ever called from the reader thread
            rows = self._images[src:src + n]
            for i, (b, k) in enumerate(zip(batches, offsets)):
                if b >= 0:
                    targets[b].batch.images[k] = rows[i]
        with self._stats_lock:
            self.stats["read_s"] += time.perf_counter() - t0
            self.stats["read_bytes"] += n * row_bytes

    def file_offsets(self, runs, n: int) -> np.ndarray:
        """Byte offset in the file of every row of a fill, in buffer order (raw stores)."""
        dest = np.array([r[0] for r in runs], np.int64)
        count = np.array([r[2] for r in runs], np.int64)
        first = np.array([r[3] for r in runs], np.int64)
        out = np.empty(n, np.int64)
        within = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
        out[np.repeat(dest, count) + within] = np.repeat(first, count) + within * self.meta.row_bytes
        return out

    def read_labels(self, runs, n: int) -> np.ndarray:
        """Labels of a fill in buffer order, run by run (when they are not all cached): by byte offset where
        the labels are stored uncompressed, else through HDF5."""
        labels = np.empty((n, *self.meta.label_shape), self.meta.label_dtype)
        if self._label_offsets is None:
            for dest, src, k, _off in runs:
                self._labels.read_direct(labels, np.s_[src:src + k], np.s_[dest:dest + k])
            return labels
        chunk_offsets, chunk_rows = self._label_offsets
        row_bytes = self.meta.label_row_bytes
        out = memoryview(labels.reshape(-1).view(np.uint8)) if labels.size else None
        for dest, src, k, _off in runs:
            while k > 0:  # a run may span label chunks
                chunk, within = divmod(src, chunk_rows)
                m = min(k, chunk_rows - within)
                preadv_all(self._fd, [out[dest * row_bytes:(dest + m) * row_bytes]],
                           int(chunk_offsets[chunk]) + within * row_bytes, self.meta.path)
                dest, src, k = dest + m, src + m, k - m
        return labels

    def wait_all(self, futures) -> None:
        """Wait for I/O futures, waking to honour the stop flag; re-raise the first failure."""
        pending = set(futures)
        while pending:
            if self._stop.is_set():
                raise Stopped
            done, pending = concurrent.futures.wait(pending, timeout=POLL_S, return_when="FIRST_EXCEPTION")
            for f in done:
                f.result()


def direct_reads(path: str, meta: StoreMeta) -> bool:
    """Whether every row of the store can be read straight from the file (uncompressed, all chunks stored)."""
    return read_consistent(path, lambda f: _chunk_offsets(f[schema.IMAGES], meta.rows, meta.block_rows, path) is not None,
                           rdcc_nbytes=0)


def _snapshot(f: h5py.File, meta: StoreMeta, cache_labels: bool):
    """(image chunk offsets or None, (label chunk offsets, label chunk rows) or None, every label or None)."""
    images, labels = f[schema.IMAGES], f[schema.LABELS]
    offsets = _chunk_offsets(images, meta.rows, meta.block_rows, meta.path)
    label_offsets = None
    if labels.chunks is not None:
        chunk_rows = labels.chunks[0]
        found = _chunk_offsets(labels, meta.rows, chunk_rows, meta.path)
        label_offsets = None if found is None else (found, chunk_rows)
    all_labels = None
    if cache_labels:
        all_labels = np.empty((meta.rows, *meta.label_shape), meta.label_dtype)
        if meta.rows:
            labels.read_direct(all_labels, np.s_[0:meta.rows], np.s_[0:meta.rows])
    return offsets, label_offsets, all_labels


def _chunk_offsets(data: h5py.Dataset, rows: int, chunk_rows: int, path: str) -> np.ndarray | None:
    """Byte offset of each chunk holding rows ``[0, rows)`` of ``data`` (in the file at ``path``), or None when they cannot be read
    directly (compressed, chunks not of whole rows, a chunk without storage: HDF5's fill value).

    Raises :class:`StoreFormatError` for a chunk said to lie past the end of the file (metadata caught
    while a writer rewrites it, or damage), which :func:`read_consistent` judges.
    """
    chunks = data.chunks
    if chunks is None or data.id.get_create_plist().get_nfilters() > 0:
        return None
    if chunks[0] != chunk_rows or tuple(chunks[1:]) != tuple(data.shape[1:]):
        return None
    n_chunks = -(-rows // chunk_rows)
    offsets = np.full(n_chunks, -1, dtype=np.int64)

    def visit(info):
        b = info.chunk_offset[0] // chunk_rows
        if b < n_chunks:
            offsets[b] = info.byte_offset

    data.id.chunk_iter(visit)
    if (offsets < 0).any():
        return None
    if n_chunks:
        row_bytes = int(np.prod(data.shape[1:], dtype=np.int64)) * data.dtype.itemsize
        rows_in_chunk = np.minimum(chunk_rows, rows - np.arange(n_chunks, dtype=np.int64) * chunk_rows)
        end = int((offsets + rows_in_chunk * row_bytes).max())
        size = os.path.getsize(path)
        if end > size:
            raise StoreFormatError(f"{path}: a chunk of /{data.name.lstrip('/')} ends at byte {end}, "
                                   f"past the end of the file ({size} bytes)")
    return offsets
