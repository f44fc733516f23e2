"""Where an encoded store's rows lie in its file, and reading them by byte offset.

An encoded store keeps every row's JPEG bytes joined in ``/image_bytes``, an uncompressed chunked 1-D dataset,
and where each row ends in ``/image_ends`` (see :mod:`h5stream.store.encoded`).  The reader learns, once at open
and inside :func:`~h5stream.store.access.read_consistent` (:func:`locate_encoded`): the byte offset of every chunk
of ``/image_bytes`` that holds committed bytes, and the ends of the committed rows (8 bytes a row, counted by the
budget).  From then on a run of rows is one contiguous range of ``/image_bytes``, read as one byte range per
chunk it crosses (ranges of neighbouring chunks that follow each other in the file are read as one), through the
stream's byte source: the page cache, ``O_DIRECT`` or a URL's ranged requests, as a raw store's pixels are.  The
bytes of committed rows and the chunks holding them never move, so an encoded store streams while another
process appends to it, and a set of encoded parts reads each part by byte offset.

A store whose ``/image_bytes`` cannot be read so (compressed or unallocated chunks, as after an ``h5repack``) is
read through HDF5 (:class:`~h5stream.store.encoded.EncodedArray`) instead: :func:`locate_encoded` gives None.
"""

from __future__ import annotations

from typing import NamedTuple

import h5py
import numpy as np

from h5stream.errors import StoreFormatError
from h5stream.store import schema
from h5stream.store.encoded import EncodedRows

ENDS_BYTES_PER_ROW = 8
"""Memory a stream holds per committed row of an encoded store read by byte offset: its end (int64)."""


class EncodedExtents(NamedTuple):
    """Where an encoded store's committed rows lie: ``chunk_offsets[k]``, the byte offset in the file of chunk
    ``k`` of ``/image_bytes`` (``chunk_bytes`` bytes each); ``ends[i]``, where row ``i`` ends in ``/image_bytes``
    (its start is ``ends[i - 1]``, 0 for row 0)."""

    chunk_offsets: np.ndarray
    chunk_bytes: int
    ends: np.ndarray


def locate_encoded(f: h5py.File, rows: int, path: str, chunk_offsets) -> EncodedExtents | None:
    """The :class:`EncodedExtents` of the first ``rows`` (committed) rows of the encoded store open as ``f``, or
    None where ``/image_bytes`` cannot be read by byte offset (compressed, or a chunk without storage).  Raises
    :class:`StoreFormatError` for fewer ends than committed rows, or a chunk said to lie past the end of the file
    (which :func:`~h5stream.store.access.read_consistent` judges: metadata caught mid-rewrite, or damage).
    ``chunk_offsets``: :func:`h5stream.read.locate.chunk_offsets`, which finds a dataset's chunks."""
    data, ends_ds = f[schema.IMAGE_BYTES], f[schema.IMAGE_ENDS]
    if ends_ds.shape[0] < rows:
        raise StoreFormatError(f"{path}: /{schema.IMAGE_ENDS} holds {ends_ds.shape[0]} rows, fewer than the {rows} "
                               "committed")
    ends = np.empty(rows, np.int64)
    if rows:
        ends_ds.read_direct(ends, np.s_[0:rows], np.s_[0:rows])
    total = int(ends[-1]) if rows else 0
    backwards = np.flatnonzero(np.diff(ends, prepend=0) < 0) if rows else ()
    if total > data.shape[0] or len(backwards):
        where = (f"row {backwards[0]} ends at byte {ends[backwards[0]]}, before "
                 + (f"row {backwards[0] - 1} does ({ends[backwards[0] - 1]})" if backwards[0] else "the first byte")
                 if len(backwards) else f"the committed rows end at byte {total}, past the {data.shape[0]} bytes of "
                 f"/{schema.IMAGE_BYTES}")
        raise StoreFormatError(f"{path}: /{schema.IMAGE_ENDS} is damaged: {where}; `h5stream verify {path}` names "
                               "the damaged rows: restore the file from a copy or re-ingest it")
    if data.chunks is None:
        return None
    offsets = chunk_offsets(data, total, int(data.chunks[0]), path)  # None: compressed, or unallocated
    if offsets is None:
        return None
    return EncodedExtents(offsets, int(data.chunks[0]), ends)


def byte_pieces(start: int, stop: int, chunk_offsets: np.ndarray, chunk_bytes: int) -> list[tuple[int, int, int]]:
    """Bytes ``[start, stop)`` of ``/image_bytes`` as ``(file offset, first byte relative to start, length)``
    pieces, one per chunk crossed, neighbouring pieces that follow each other in the file joined (pure)."""
    pieces: list[tuple[int, int, int]] = []
    pos = start
    while pos < stop:
        chunk, within = divmod(pos, chunk_bytes)
        n = min(stop - pos, chunk_bytes - within)
        offset = int(chunk_offsets[chunk]) + within
        if pieces and pieces[-1][0] + pieces[-1][2] == offset:
            first_offset, first, m = pieces[-1]
            pieces[-1] = (first_offset, first, m + n)
        else:
            pieces.append((offset, pos - start, n))
        pos += n
    return pieces


class ByteRows:
    """An encoded store's committed rows read by byte offset from ``source`` (a
    :class:`~h5stream.read.source.ByteSource`), as :class:`~h5stream.read.encoded.EncodedRunReader` reads rows:
    ``nrows`` and ``read(start, stop)`` (an :class:`EncodedRows` in a buffer of its own).  ``read`` from any
    thread (the source's reads may run at once)."""

    def __init__(self, extents: EncodedExtents, source):
        self._extents, self._source = extents, source
        self.nrows = len(extents.ends)

    def read(self, start: int, stop: int) -> EncodedRows:
        ends = self._extents.ends
        stop = min(stop, self.nrows)
        start = min(start, stop)
        first = int(ends[start - 1]) if start else 0
        last = int(ends[stop - 1]) if stop > start else first
        data = np.empty(last - first, np.uint8)
        view = memoryview(data)
        for offset, at, n in byte_pieces(first, last, self._extents.chunk_offsets, self._extents.chunk_bytes):
            self._source.readinto(offset, [view[at:at + n]])
        rows = EncodedRows(data, ends[start:stop])
        rows._base = first
        return rows

    def advise(self, runs) -> tuple[list, int]:
        """Advise the source to fetch ``runs`` (:class:`~h5stream.read.runs.Run` s of rows) ahead, skipping runs
        it says are cached, as a raw store's runs are advised; returns the runs not known to be cached (every run
        where the source cannot tell) and the bytes advised.  Reader thread."""
        cached = getattr(self._source, "cached", None)
        advise = getattr(self._source, "advise_willneed", None)
        ends, missing, advised = self._extents.ends, [], 0
        for run in runs:
            first = int(ends[run.src - 1]) if run.src else 0
            pieces = byte_pieces(first, int(ends[run.src + run.rows - 1]), self._extents.chunk_offsets,
                                 self._extents.chunk_bytes)
            if cached is not None and all(cached(offset, n) for offset, _, n in pieces):
                continue
            missing.append(run)
            for offset, _, n in pieces if advise is not None else ():
                advise(offset, n)
                advised += n
        return missing, advised


def encoded_read_bytes(meta, workers: int, direct_io: bool, in_flight: int | None = None) -> int:
    """Memory a stream of the encoded store (or set of encoded parts) ``meta`` takes to read and decode its rows
    (pure): the committed rows' ends (:data:`ENDS_BYTES_PER_ROW` a row), one block's encoded bytes per read in
    flight (the reader thread's I/O threads, as many as its byte source keeps in flight, or ``in_flight``), and
    each decoder's (a worker, or the consumer's thread) one row's JPEG copied out of its place (see
    :mod:`h5stream.read.encoded`)."""
    from h5stream.read.source import DIRECT_IN_FLIGHT, LocalFile

    parts = getattr(meta, "parts", ()) or (meta,)
    in_flight = in_flight or max(p.remote.max_in_flight if p.remote is not None else DIRECT_IN_FLIGHT if direct_io
                    else LocalFile.max_in_flight for p in parts)
    return (ENDS_BYTES_PER_ROW * meta.rows + in_flight * meta.encoded_block_bytes
            + (int(workers) + 1) * meta.row_bytes)
