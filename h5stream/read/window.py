"""A window of whole pieces in memory, in front of a remote byte source: large aligned requests, small reads.

Under the two-level order (:mod:`h5stream.order.twolevel`) the reader still reads units (0.5 to 4 MiB runs of
rows); :class:`PieceWindow` serves those reads from whole *pieces* (``piece_rows`` rows of contiguous chunks,
8 MiB or more) that it fetches with one ranged request each (:func:`fetch_piece`, the one place a piece is
fetched: a disk cache sits under it).  A piece is dropped as soon as every byte of its rows has been served
(once per epoch for an unsharded epoch, whose order reads each row once), and, beyond ``capacity`` pieces, the
least recently used one first (a shard's pieces, or a split's edge, are not served whole).  Reads outside any
piece (labels, chunks not laid out contiguously) go to the source as they are.

Thread-safety: ``readinto`` from any number of I/O threads; a piece wanted by several at once is fetched once
(the others wait for it).  ``close`` is idempotent and closes the source.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np


def fetch_piece(source, start: int, end: int) -> bytearray:
    """The bytes ``[start, end)`` of ``source`` in one request: the one function that fetches a piece."""
    buf = bytearray(end - start)
    source.readinto(start, [memoryview(buf)])
    return buf


def piece_spans(chunk_offsets: np.ndarray, block_rows: int, row_bytes: int, rows: int,
                piece_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Byte spans ``[start, end)`` (an ``(P, 2)`` int64 array, sorted) of the pieces whose chunks lie end to end
    in the file, and each one's payload (the bytes of its committed rows).  Pure."""
    blocks_per_piece = max(1, piece_rows // block_rows)
    chunk_bytes = block_rows * row_bytes
    offsets = np.asarray(chunk_offsets, dtype=np.int64)
    spans, payload = [], []
    for first in range(0, len(offsets), blocks_per_piece):
        group = offsets[first:first + blocks_per_piece]
        if len(group) > 1 and not np.all(np.diff(group) == chunk_bytes):
            continue  # not contiguous: read as it is
        row0 = first * block_rows
        n_rows = max(0, min(rows, row0 + len(group) * block_rows) - row0)
        if n_rows == 0:
            continue
        spans.append((int(group[0]), int(group[0]) + n_rows * row_bytes))
        payload.append(n_rows * row_bytes)
    if not spans:
        return np.zeros((0, 2), np.int64), np.zeros(0, np.int64)
    spans_arr = np.array(spans, np.int64)
    keep = np.argsort(spans_arr[:, 0], kind="stable")
    return spans_arr[keep], np.array(payload, np.int64)[keep]


class PieceWindow:
    """A byte source serving reads from whole pieces of ``source`` held in memory (see the module doc)."""

    def __init__(self, source, spans: np.ndarray, payload: np.ndarray, capacity: int):
        self.source = source
        self.name = source.name
        self.size = source.size
        self.max_in_flight = source.max_in_flight
        self._starts = spans[:, 0].copy()
        self._ends = spans[:, 1].copy()
        self._payload = payload
        self._capacity = max(1, int(capacity))
        self._lock = threading.Lock()
        self._held: OrderedDict[int, bytearray] = OrderedDict()
        self._served: dict[int, int] = {}
        self._fetching: dict[int, threading.Event] = {}
        self.pieces_fetched = 0
        self.piece_bytes_fetched = 0
        self.peak_held = 0


    @property
    def landed(self) -> int:
        """Bytes the source behind the window received so far (progress: any thread)."""
        return getattr(self.source, "landed", 0)
    def readinto(self, offset: int, buffers: Sequence[memoryview]) -> None:
        """Fill ``buffers`` with the bytes at ``offset`` onward (preadv semantics).  Any thread."""
        views = [memoryview(b).cast("B") for b in buffers]
        total = sum(len(v) for v in views)
        pos, end = int(offset), int(offset) + total
        out = _Scatter(views)
        while pos < end:
            i = int(np.searchsorted(self._starts, pos, side="right")) - 1
            if i >= 0 and pos < self._ends[i]:
                stop = min(end, int(self._ends[i]))
                piece = self._piece(i)
                out.write(memoryview(piece)[pos - int(self._starts[i]):stop - int(self._starts[i])])
                self._serve(i, stop - pos)
            else:
                stop = end if i + 1 >= len(self._starts) else min(end, int(self._starts[i + 1]))
                part = bytearray(stop - pos)
                self.source.readinto(pos, [memoryview(part)])
                out.write(memoryview(part))
            pos = stop

    def _piece(self, i: int) -> bytearray:
        while True:
            with self._lock:
                held = self._held.get(i)
                if held is not None:
                    self._held.move_to_end(i)
                    return held
                waiting = self._fetching.get(i)
                if waiting is None:
                    self._fetching[i] = threading.Event()
                    break
            waiting.wait()
        data = None
        try:
            data = fetch_piece(self.source, int(self._starts[i]), int(self._ends[i]))
        finally:  # the threads waiting for this piece go on, and fetch it themselves if this failed
            with self._lock:
                if data is not None:
                    self._held[i] = data
                    self._served[i] = 0
                    self.pieces_fetched += 1
                    self.piece_bytes_fetched += len(data)
                    while len(self._held) > self._capacity:
                        self._held.popitem(last=False)
                    self.peak_held = max(self.peak_held, len(self._held))
                self._fetching.pop(i).set()
        return data

    def _serve(self, i: int, nbytes: int) -> None:
        with self._lock:
            if i not in self._held:
                return
            self._served[i] = self._served.get(i, 0) + nbytes
            if self._served[i] >= self._payload[i]:  # every row of it served: this epoch needs it no more
                del self._held[i]
                self._served.pop(i, None)

    def __getattr__(self, name):  # the source's own counters and extras (requests, bytes_read, ...)
        if name == "source":
            raise AttributeError(name)
        return getattr(self.source, name)

    def close(self) -> None:
        with self._lock:
            self._held.clear()
        self.source.close()


class _Scatter:
    """Copies byte pieces, in order, into consecutive buffers (``preadv`` order)."""

    def __init__(self, views: list[memoryview]):
        self.views = [v for v in views if len(v)]
        self.index = 0
        self.within = 0

    def write(self, piece: memoryview) -> None:
        pos, n = 0, len(piece)
        while pos < n:
            dst = self.views[self.index]
            k = min(n - pos, len(dst) - self.within)
            dst[self.within:self.within + k] = piece[pos:pos + k]
            pos += k
            self.within += k
            if self.within == len(dst):
                self.index += 1
                self.within = 0


def piece_window(source, chunk_offsets, meta, piece_rows: int, capacity: int) -> PieceWindow:
    """``source`` behind a :class:`PieceWindow` of ``capacity`` pieces of ``piece_rows`` rows of the store
    ``meta``, whose image chunks start at ``chunk_offsets``."""
    spans, payload = piece_spans(chunk_offsets, meta.block_rows, meta.row_bytes, meta.rows, piece_rows)
    return PieceWindow(source, spans, payload, capacity)
