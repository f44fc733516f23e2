"""The reader thread: the one place that touches the HDF5 file while streaming.

:class:`Reader` owns a thread, the shuffle buffers and a bounded queue.  The
thread opens the file itself, walks epochs laid out by
:func:`h5stream.order.epoch_layout`, reads each fill's segments straight into a
preallocated buffer, and hands batches to a *sink* (see :class:`InlineSink`):
by default the batch is gathered into fresh arrays and queued for the consumer.

Reads: for an uncompressed store the chunk byte offsets are looked up once and
each segment (one contiguous byte range of a chunk) is read with ``os.preadv``
straight into the buffer -- adjacent segments coalesce into one call, the GIL is
released while the kernel copies, and ``POSIX_FADV_WILLNEED`` asks the kernel to
start fetching a whole fill at once.  Compressed stores fall back to h5py's
``read_direct`` (HDF5 decompresses).

Every blocking queue call uses a short timeout and checks the stop flag, so
:meth:`Reader.close` always returns promptly.  An exception in the thread is
queued and re-raised by the consumer as :class:`ReaderError` with the cause.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import h5py
import numpy as np

from h5stream.errors import ReaderError, StreamClosedError
from h5stream.order.epoch import EpochLayout
from h5stream.store import schema
from h5stream.store.meta import StoreMeta

POLL_S = 0.1
"""How often blocked queue calls wake up to look at the stop flag."""


class _Stopped(Exception):
    """Raised inside the reader thread when the stop flag is set."""


@dataclass
class _Slot:
    """One shuffle buffer and what it currently holds."""

    pixels: np.ndarray
    labels: np.ndarray
    key: bytes | None = None  # the segments it holds (skip re-reading identical fills)
    fill: tuple[int, int] | None = None  # (epoch, fill) it is assigned to
    loaded: int = 0  # reads done so far (index into runs)
    runs: list = field(default_factory=list)  # coalesced reads: (dest_row, src_row, n_rows, byte_offset|None)
    perm: np.ndarray | None = None
    row_ids: np.ndarray | None = None

    @property
    def complete(self) -> bool:
        return self.loaded >= len(self.runs)


@dataclass(frozen=True)
class Batch:
    """A batch as queued for the consumer (arrays owned by whoever receives it)."""

    epoch: int
    index: int
    images: np.ndarray
    labels: np.ndarray
    row_ids: np.ndarray


@dataclass(frozen=True)
class _Failure:
    exc: BaseException


def gather(slot: _Slot, positions: np.ndarray, x: np.ndarray, y: np.ndarray, ids: np.ndarray) -> None:
    """Copy the rows at buffer ``positions`` of ``slot`` into the given outputs (same length)."""
    np.take(slot.pixels, positions, axis=0, out=x)
    np.take(slot.labels, positions, axis=0, out=y)
    np.take(slot.row_ids, positions, out=ids)


class InlineSink:
    """Gathers each batch into new arrays in the reader thread and queues it for the consumer.

    A sink receives batches from the reader thread: ``emit`` for a batch whose
    rows all sit in one buffer (``slot``), ``emit_gathered`` for one the reader
    already assembled (it straddled two fills).  ``before_refill(slot_index)``
    is called before a buffer is overwritten, so a sink whose consumers read
    buffers asynchronously can wait for them.
    """

    def __init__(self, reader: Reader):
        self._reader = reader

    def emit(self, epoch: int, index: int, slot_index: int, positions: np.ndarray) -> None:
        slot = self._reader.slots[slot_index]
        x, y, ids = self._reader.new_batch(len(positions))
        gather(slot, positions, x, y, ids)
        self._reader.put(Batch(epoch, index, x, y, ids))

    def emit_gathered(self, epoch: int, index: int, x: np.ndarray, y: np.ndarray, ids: np.ndarray) -> None:
        self._reader.put(Batch(epoch, index, x, y, ids))

    def before_refill(self, slot_index: int) -> None:
        """Inline gathers are complete when emit returns: nothing to wait for."""


class Reader:
    """Owns the reader thread, its HDF5 handle, the shuffle buffers and the batch queue.

    ``layout(epoch) -> EpochLayout`` describes each epoch; reading starts at
    ``(start_epoch, start_batch)`` and goes on epoch after epoch until
    :meth:`close`.  :meth:`get` (consumer side, one thread) returns the next
    :class:`Batch` in order.  Thread-safety: ``get`` from one consumer thread;
    ``close`` from any thread, idempotent.
    """

    def __init__(
        self,
        meta: StoreMeta,
        layout: Callable[[int], EpochLayout],
        *,
        rows_per_fill: int,
        n_buffers: int,
        queue_depth: int,
        start_epoch: int = 0,
        start_batch: int = 0,
        timeout_s: float = 60.0,
        buffers: list[tuple[np.ndarray, np.ndarray]] | None = None,
        sink_factory: Callable[[Reader], object] = InlineSink,
        name: str = "h5stream-reader",
    ):
        self.meta = meta
        self._layout = layout
        self._timeout_s = float(timeout_s)
        self._queue: queue.Queue = queue.Queue(maxsize=queue_depth)
        self._stop = threading.Event()
        self._start = (int(start_epoch), int(start_batch))
        if buffers is None:
            buffers = [
                (np.empty((rows_per_fill, *meta.image_shape), np.uint8),
                 np.empty((rows_per_fill, *meta.label_shape), meta.label_dtype))
                for _ in range(n_buffers)
            ]
        self.slots = [_Slot(p, l) for p, l in buffers]
        self._sink = sink_factory(self)
        self.stats = {"read_bytes": 0, "read_s": 0.0, "fills": 0, "fills_reused": 0, "wait_s": 0.0, "batches": 0}
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False
        self._thread.start()

    # -- consumer side -----------------------------------------------------------
    def get(self):
        """Next item in order: a :class:`Batch` (or what the sink queued).  Raises :class:`ReaderError`."""
        if self._closed:
            raise StreamClosedError("the stream is closed; open it again with h5stream.open(...)")
        t0 = time.perf_counter()
        while True:
            try:
                item = self._queue.get(timeout=POLL_S)
                break
            except queue.Empty:
                waited = time.perf_counter() - t0
                if not self._thread.is_alive() and self._queue.empty():
                    raise ReaderError(f"{self.meta.path}: the reader thread stopped without a result") from None
                if waited > self._timeout_s:
                    raise ReaderError(
                        f"{self.meta.path}: no batch from the reader in {self._timeout_s:.0f} s "
                        "(storage too slow or stuck?); raise timeout_s if this is expected"
                    ) from None
        self.stats["wait_s"] += time.perf_counter() - t0
        if isinstance(item, _Failure):
            raise ReaderError(f"{self.meta.path}: reading failed: {item.exc!r}") from item.exc
        self.stats["batches"] += 1
        return item

    @property
    def queue_fill(self) -> tuple[int, int]:
        return self._queue.qsize(), self._queue.maxsize

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
    def new_batch(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Fresh output arrays for an ``n``-row batch (owned by whoever receives them)."""
        first = self.slots[0]
        return (np.empty((n, *first.pixels.shape[1:]), first.pixels.dtype),
                np.empty((n, *first.labels.shape[1:]), first.labels.dtype),
                np.empty(n, np.int64))

    def put(self, item) -> None:
        """Queue ``item`` for the consumer, waking every POLL_S to honour the stop flag."""
        while True:
            if self._stop.is_set():
                raise _Stopped
            try:
                self._queue.put(item, timeout=POLL_S)
                return
            except queue.Full:
                continue

    def _run(self) -> None:
        try:
            with h5py.File(self.meta.path, "r", rdcc_nbytes=0) as f:
                self._images = f[schema.IMAGES]
                self._labels = f[schema.LABELS]
                self._offsets = _chunk_offsets(self._images, self.meta)
                fd = os.open(self.meta.path, os.O_RDONLY) if self._offsets is not None else None
                try:
                    self._fd = fd
                    epoch, batch = self._start
                    while True:
                        self._run_epoch(self._layout(epoch), batch)
                        epoch, batch = epoch + 1, 0
                finally:
                    if fd is not None:
                        os.close(fd)
        except _Stopped:
            pass
        except BaseException as exc:  # delivered to the consumer, never lost
            try:
                self.put(_Failure(exc))
            except _Stopped:
                pass

    def _run_epoch(self, layout: EpochLayout, start_batch: int) -> None:
        sizes = layout.batch_sizes
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        fill_bounds = np.concatenate([[0], np.cumsum(layout.fill_rows)])
        n_fills = len(layout.fills)
        prefetch = len(self.slots) > 1
        for j in range(start_batch, len(sizes)):
            if self._stop.is_set():
                raise _Stopped
            a, b = int(bounds[j]), int(bounds[j + 1])
            f0 = int(np.searchsorted(fill_bounds, a, side="right")) - 1
            f1 = int(np.searchsorted(fill_bounds, b - 1, side="right")) - 1
            if f0 == f1:
                slot = self._load(layout, f0, complete=True)
                lo = a - fill_bounds[f0]
                self._sink.emit(layout.epoch, j, f0 % len(self.slots), slot.perm[lo:lo + b - a])
            else:
                # The batch straddles fills: gather it piece by piece, loading each fill in turn
                # (a fill's buffer may be reused by the next piece once its rows are copied).
                x, y, ids = self.new_batch(b - a)
                for f in range(f0, f1 + 1):
                    slot = self._load(layout, f, complete=True)
                    lo, hi = max(a, fill_bounds[f]), min(b, fill_bounds[f + 1])
                    pos = slot.perm[lo - fill_bounds[f]:hi - fill_bounds[f]]
                    gather(slot, pos, x[lo - a:hi - a], y[lo - a:hi - a], ids[lo - a:hi - a])
                self._sink.emit_gathered(layout.epoch, j, x, y, ids)
            if prefetch and f1 + 1 < n_fills:
                # Keep the next fill's reading in step with how much of this fill is consumed.
                done = (b - fill_bounds[f1]) / max(1, layout.fill_rows[f1])
                self._load(layout, f1 + 1, fraction=min(1.0, done + 0.1))

    def _load(self, layout: EpochLayout, fill: int, complete: bool = False, fraction: float = 1.0) -> _Slot:
        """Make sure ``fill`` is (at least ``fraction``) read into its buffer and return the buffer."""
        slot_index = fill % len(self.slots)
        slot = self.slots[slot_index]
        tag = (layout.epoch, fill)
        if slot.fill != tag:
            segments = layout.fill_segments(fill)
            key = segments.tobytes()
            self._sink.before_refill(slot_index)
            slot.fill = tag
            slot.perm = layout.fill_permutation(fill)
            slot.row_ids = layout.fill_row_ids(fill)
            if key == slot.key and slot.complete:
                self.stats["fills_reused"] += 1  # same rows already resident (whole file fits)
            else:
                slot.key = key
                slot.runs = self._plan_runs(segments)
                slot.loaded = 0
                self.stats["fills"] += 1
                self._advise(slot.runs)
        target = len(slot.runs) if complete else int(np.ceil(fraction * len(slot.runs)))
        while slot.loaded < target:
            if self._stop.is_set():
                raise _Stopped
            self._read_run(slot, slot.runs[slot.loaded])
            slot.loaded += 1
        return slot

    def _plan_runs(self, segments: np.ndarray) -> list[tuple[int, int, int, int | None]]:
        """Coalesce the fill's segments into reads: (dest_row, src_row, n_rows, byte_offset or None)."""
        runs: list[list] = []
        dest = 0
        row_bytes = self.meta.row_bytes
        block = self.meta.block_rows
        for start, stop in segments:
            start, stop = int(start), int(stop)
            n = stop - start
            off = None
            if self._offsets is not None:
                off = int(self._offsets[start // block]) + (start % block) * row_bytes
            if runs:
                r = runs[-1]
                rows_adjacent = r[1] + r[2] == start
                bytes_adjacent = off is None and r[3] is None or (
                    off is not None and r[3] is not None and r[3] + r[2] * row_bytes == off
                )
                if rows_adjacent and bytes_adjacent:
                    r[2] += n
                    dest += n
                    continue
            runs.append([dest, start, n, off])
            dest += n
        return [tuple(r) for r in runs]

    def _advise(self, runs) -> None:
        if self._fd is None or not hasattr(os, "posix_fadvise"):
            return
        row_bytes = self.meta.row_bytes
        for _dest, _src, n, off in runs:
            os.posix_fadvise(self._fd, off, n * row_bytes, os.POSIX_FADV_WILLNEED)

    def _read_run(self, slot: _Slot, run) -> None:
        dest, src, n, off = run
        t0 = time.perf_counter()
        if off is not None:
            view = memoryview(slot.pixels[dest:dest + n]).cast("B")
            want = len(view)
            got = os.preadv(self._fd, [view], off)
            while got < want:  # short reads are legal; finish the run
                more = os.preadv(self._fd, [view[got:]], off + got)
                if more == 0:
                    raise OSError(f"{self.meta.path}: unexpected end of file reading rows {src}..{src + n}")
                got += more
        else:
            self._images.read_direct(slot.pixels, np.s_[src:src + n], np.s_[dest:dest + n])
        self._labels.read_direct(slot.labels, np.s_[src:src + n], np.s_[dest:dest + n])
        self.stats["read_s"] += time.perf_counter() - t0
        self.stats["read_bytes"] += n * (self.meta.row_bytes + self.meta.label_row_bytes)


def _chunk_offsets(images: h5py.Dataset, meta: StoreMeta) -> np.ndarray | None:
    """Byte offset of each block's chunk, or None when direct reads are not possible (compressed, odd layout)."""
    chunks = images.chunks
    if chunks is None or images.compression is not None or images.id.get_create_plist().get_nfilters() > 0:
        return None
    if chunks[0] != meta.block_rows or tuple(chunks[1:]) != tuple(images.shape[1:]):
        return None
    n_blocks = -(-meta.rows // meta.block_rows)
    offsets = np.full(n_blocks, -1, dtype=np.int64)

    def visit(info):
        b = info.chunk_offset[0] // meta.block_rows
        if b < n_blocks:
            offsets[b] = info.byte_offset

    images.id.chunk_iter(visit)
    if (offsets < 0).any():
        return None  # a chunk without storage: let HDF5 handle it (fill value)
    return offsets
