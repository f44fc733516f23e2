"""Reading rows by byte offset (or, compressed, through HDF5) straight into the batches of a fill.

:class:`RowReader` is what the reader thread (:class:`h5stream.read.reader.Reader`) reads with once it has
opened the store: the byte source, where every chunk lies, the HDF5 datasets for what only HDF5 can read, and
the block check.  Pixel runs are read into their batches' rows (one scatter read a run, the GIL released); labels
and learned blocks are read whole where the check needs them.  Each method says which thread runs it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np

from h5stream.memory.rawio import aligned_empty
from h5stream.concurrency.wait import Stopped
from h5stream.read.fill import FillJob
from h5stream.read.iovec import fill_iovecs
from h5stream.read.runs import Run, chunk_pieces, spans
from h5stream.read.scatter import PIECE_BYTES, SMALL_ROW_BYTES, place, placement
from h5stream.read.source import ByteSource
from h5stream.read.verify import BlockCheck
from h5stream.store.meta import StoreMeta

CACHE_SPAN_GAP_BYTES = 1 << 20
"""Runs of a fill at most this far apart in the file are asked about together whether they are in the page
cache: asking about the pages between them costs less than asking once more.  ``cachestat`` walks the page cache
entry by entry: a MiB of 4 KiB pages (what a stream's own cold epoch leaves) costs about as much as a call, a MiB
of large folios a tenth of it (the figures: docs/performance.md, "Design figures")."""


class RowReader:
    """Reads the rows of one open store.  ``offsets``: the byte offset of each image chunk (None: read through
    HDF5, ``images``); ``label_offsets``: ``(byte offset of each label chunk, rows per chunk)`` where labels are
    stored uncompressed (else ``labels``, the HDF5 dataset); ``encoded``: an encoded store's
    :class:`~h5stream.read.encbytes.EncodedExtents`, its rows then read by byte offset (None: through HDF5,
    ``images`` being its :class:`~h5stream.store.encoded.EncodedArray`); ``check``: the block check, or None;
    ``stop``: the reader's stop flag, which ends a read between runs.  Owned by the reader thread; ``read_runs``,
    ``read_pixels`` and ``read_block`` also run in its I/O threads.  ``advised_bytes`` has one writer, the
    reader thread."""

    def __init__(self, meta: StoreMeta, source: ByteSource, *, offsets: np.ndarray | None, label_offsets,
                 images, labels, check: BlockCheck | None, stop: threading.Event, encoded=None):
        self.meta, self._source, self._offsets, self._label_offsets = meta, source, offsets, label_offsets
        self._encoded = self._byte_rows = None
        if meta.encoded:  # rows placed still encoded (see read/encoded.py)
            from h5stream.read.encbytes import ByteRows
            from h5stream.read.encoded import EncodedRunReader

            self._byte_rows = None if encoded is None else ByteRows(encoded, source)
            self._encoded = EncodedRunReader(meta, images if encoded is None else self._byte_rows, check)
        self._images, self._labels, self.check, self._stop = images, labels, check, stop
        self._scratch = aligned_empty(meta.row_bytes)  # destination of rows that are read but not used
        self._learned: set[int] = set()  # blocks whose digests are learned (by learn_runs)
        self.advised_bytes = 0
        self._pieces = threading.local()  # each I/O thread's buffer for pieces of runs of small rows
        self.progress = 0  # reads done, for the consumer's timeout (several threads add: a lost add still moves it)

    def learn_runs(self, runs: list[Run]) -> None:
        """Learn the digests of every block ``runs`` touch (see
        :meth:`~h5stream.read.verify.BlockCheck.learn_rows`), asking only about blocks not known learned yet: a
        learned block stays learned.  Reader thread."""
        block_rows, known = self.meta.block_rows, self._learned
        if len(known) >= -(-self.meta.rows // block_rows):
            return  # every block is learned: the usual case from the second epoch on
        for run in runs:
            blocks = range(run.src // block_rows, (run.src + run.rows - 1) // block_rows + 1)
            if not known.issuperset(blocks):
                self.check.learn_rows(run.src, run.rows, self.read_block)
                known.update(blocks)

    def advise(self, runs: list[Run]) -> list[Run]:
        """Advise the source to fetch a fill's runs ahead, skipping runs already cached; return the runs not
        known to be cached (every run where the source cannot tell).  Reader thread."""
        if self._byte_rows is not None:  # an encoded store's rows: byte ranges of /image_bytes
            missing, advised = self._byte_rows.advise(runs)
            self.advised_bytes += advised
            return missing
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
                self.advised_bytes += length
        return missing

    def prepare(self, job: FillJob) -> None:
        """Once a fill's batches are allocated: where its rows land, when they are small enough to be read a
        piece of a run at a time and placed by numpy (:mod:`h5stream.read.scatter`), else, from a local file and
        where the reads need no checking, as addresses (:mod:`h5stream.read.iovec`).  Reader thread."""
        job.placement = job.iovecs = None
        if self._offsets is None or self._encoded is not None or not job.to_read:
            return
        # A local file only: a URL's reads are requests, which pieces would multiply, and cost far more than rows.
        if self.meta.row_bytes <= SMALL_ROW_BYTES and self.meta.remote is None:
            job.placement = placement(job.batch, job.offset, job.targets, job.first_batch, self.meta.row_bytes)
        check = self.check  # reads still to be checked need views (every read checked: always)
        quiet = check is None or (not check.every_read and check.quiet(job.to_read[0].src, job.to_read[0].rows))
        if job.placement is None and quiet and getattr(self._source, "reads_rows", False):  # read/iovec.py
            iovecs = fill_iovecs(job.batch, job.offset, job.targets, job.first_batch, self.meta.row_bytes,
                                 self._scratch)
            job.iovecs = None if iovecs is None else (iovecs, iovecs.ctypes.data)

    def read_runs(self, job: FillJob, runs: Iterator[Run], lock: threading.Lock) -> tuple[float, int]:
        """Read runs taken one by one from ``runs`` (shared with the other I/O threads) until none is left;
        return the seconds and bytes read.  An I/O thread."""
        return drain_runs(self.read_pixels, job, runs, lock)

    def read_pixels(self, job: FillJob, run: Run) -> tuple[float, int]:
        """Read one run of rows straight into their batches; return the seconds and bytes it took.  An I/O
        thread when there are any, else the reader thread."""
        if self._stop.is_set():
            raise Stopped
        dest, src, n, off = run
        t0 = time.perf_counter()
        if self._encoded is not None:
            nbytes, _ = self._encoded.read_run(job, run)
            return time.perf_counter() - t0, nbytes
        row_bytes = self.meta.row_bytes
        if off is not None and getattr(job, "placement", None) is not None:
            self._read_placed(job, run)
            self.progress += 1
            return time.perf_counter() - t0, n * row_bytes
        iovecs = job.iovecs
        if off is not None and iovecs is not None and (self.check is None or self.check.quiet(src, n)):
            self._source.readinto_rows(off, iovecs[0], dest, n, row_bytes, iovecs[1])  # nothing to check
            self.progress += 1
            return time.perf_counter() - t0, n * row_bytes
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
            if self.check is not None:
                self.check.images(src, [None if v is scratch else v for v in views], self.read_block)
        else:  # compressed: HDF5 decodes; only ever called from the reader thread
            rows = self._images[src:src + n]
            if self.check is not None:
                self.check.images(src, [rows[i] if b >= 0 else None for i, b in enumerate(batches)],
                                   self.read_block)
            for i, (b, k) in enumerate(zip(batches, offsets)):
                if b >= 0:
                    targets[b].batch.images[k] = rows[i]
        self.progress += 1
        return time.perf_counter() - t0, n * row_bytes

    def _read_placed(self, job: FillJob, run: Run) -> None:
        """Read a run of small rows a piece at a time into this thread's buffer, check them there, and copy them
        to their batches (see :mod:`h5stream.read.scatter`).  An I/O thread, or the reader thread."""
        dest, src, n, off = run
        row_bytes = self.meta.row_bytes
        per_piece = max(1, PIECE_BYTES // row_bytes)
        buf = getattr(self._pieces, "buf", None)
        if buf is None:
            buf = self._pieces.buf = aligned_empty(per_piece * row_bytes)
        rows = buf.view(np.dtype((np.void, row_bytes)))
        where = job.placement
        for first in range(0, n, per_piece):
            if self._stop.is_set():
                raise Stopped
            k = min(per_piece, n - first)
            view = memoryview(buf)[:k * row_bytes]
            self._source.readinto(off + first * row_bytes, [view])
            if self.check is not None:
                used = (where.group[dest + first:dest + first + k] >= 0).tolist()
                self.check.images(src + first, [view[i * row_bytes:(i + 1) * row_bytes] if u else None
                                                for i, u in enumerate(used)], self.read_block)
            place(where, dest + first, rows[:k])
            self.progress += 1

    def read_block(self, start: int, stop: int, out: memoryview) -> None:
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
        self.progress += 1

    def read_labels(self, runs: list[Run], n: int) -> np.ndarray:
        """Labels of a fill in buffer order, run by run (when they are not all cached).  Checked reads take
        the whole blocks around each run, checked against their digests.  Reader thread."""
        labels = np.empty((n, *self.meta.label_shape), self.meta.label_dtype)
        for dest, src, k, _off in runs:
            span = None if self.check is None else self.check.widen(src, k)
            if span is None:
                self._read_label_rows(src, src + k, labels[dest:dest + k])
                continue
            a, b = span
            rows = np.empty((b - a, *self.meta.label_shape), self.meta.label_dtype)
            self._read_label_rows(a, b, rows)
            self.check.labels(a, rows)
            labels[dest:dest + k] = rows[src - a:src - a + k]
        return labels

    def _read_label_rows(self, start: int, stop: int, out: np.ndarray) -> None:
        """Labels of rows ``[start, stop)`` into ``out``: by byte offset where the labels are stored
        uncompressed, else through HDF5.  Reader thread."""
        if stop <= start:
            return
        if self._label_offsets is None:
            self._labels.read_direct(out, np.s_[start:stop], np.s_[0:stop - start])
            self.progress += 1
            return
        chunk_offsets, chunk_rows = self._label_offsets
        row_bytes = self.meta.label_row_bytes
        view = memoryview(out.reshape(-1).view(np.uint8))
        for first, chunk, within, m in chunk_pieces(start, stop - start, chunk_rows):  # may span label chunks
            a = first * row_bytes
            self._source.readinto(int(chunk_offsets[chunk]) + within * row_bytes, [view[a:a + m * row_bytes]])
        self.progress += 1


def drain_runs(read_pixels, job, runs: Iterator[Run], lock: threading.Lock) -> tuple[float, int]:
    """``read_pixels(job, run)`` of runs taken one by one from ``runs`` (shared with the other I/O threads, under
    ``lock``) until none is left; the seconds and bytes read, summed.  An I/O thread."""
    seconds = nbytes = 0
    while True:
        with lock:
            run = next(runs, None)
        if run is None:
            return seconds, nbytes
        t, n = read_pixels(job, run)
        seconds += t
        nbytes += n
