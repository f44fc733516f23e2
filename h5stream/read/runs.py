"""Run geometry: which contiguous byte ranges a fill reads, and where every row of it lands.  Pure functions.

A *fill* (see :mod:`h5stream.order.epoch`) is a list of segments, row ranges
of the store laid end to end in *buffer order*.  :func:`plan_runs` coalesces
them into :class:`Run` s, each one contiguous read; :func:`placement` says,
for every buffer position, which batch and which row of it the row goes to;
:func:`row_offsets` gives every row's byte offset in the file (for receivers
that read rows themselves); :func:`chunk_pieces` cuts a run of rows at chunk
boundaries (labels, whose chunks are not contiguous with each other);
:func:`spans` groups runs that lie close together in the file; :func:`aligned_span`
widens a byte range to whole blocks (direct I/O);
:func:`inner_ends` picks the bytes that tell whether a range is cached.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np


class Run(NamedTuple):
    """``rows`` rows read in one piece: stored rows ``[src, src + rows)`` land at buffer positions
    ``[dest, dest + rows)``; ``offset`` is the byte offset of row ``src`` in the file, None where the rows
    can only be read through HDF5 (compressed)."""

    dest: int
    src: int
    rows: int
    offset: int | None


def plan_runs(segments, chunk_offsets: np.ndarray | None, block_rows: int, row_bytes: int) -> list[Run]:
    """Coalesce a fill's ``(k, 2)`` segments (row ranges, in buffer order) into runs.

    ``chunk_offsets[b]`` is the byte offset of block ``b`` (``block_rows`` rows of ``row_bytes`` bytes), or
    None for a store read through HDF5.  Neighbouring segments merge when their rows follow each other in
    the store and, for byte-addressed stores, in the file.
    """
    seg = np.asarray(segments, np.int64).reshape(-1, 2)
    if not len(seg):
        return []
    start, stop = seg[:, 0], seg[:, 1]
    n = stop - start
    dest = np.cumsum(n) - n
    # A segment starts a new run unless it goes on where the previous one stopped (in the file too): one pass
    # of array arithmetic, not a Python step per segment (a fill has hundreds).
    new = np.ones(len(seg), bool)
    new[1:] = stop[:-1] != start[1:]
    if chunk_offsets is None:
        offsets = [None] * len(seg)
    else:
        off = np.asarray(chunk_offsets, np.int64)[start // block_rows] + (start % block_rows) * row_bytes
        new[1:] |= off[:-1] + n[:-1] * row_bytes != off[1:]
        offsets = off[new].tolist()
    first = np.flatnonzero(new)
    rows = np.add.reduceat(n, first)
    return list(map(Run._make, zip(dest[first].tolist(), start[first].tolist(), rows.tolist(), offsets)))


def placement(permutation: np.ndarray, fill_start: int, bounds: np.ndarray,
              first_batch: int, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Where each buffer position of a fill goes: ``(batch, row)`` int64 arrays, -1 where it goes nowhere.

    ``permutation[i]`` is the buffer position yielded ``i``-th in the fill, whose first row is yielded at
    epoch position ``fill_start``; ``bounds`` are the epoch's batch boundaries (``bounds[j]`` = first epoch
    position of batch ``j``, ``bounds[-1]`` = rows yielded).  Rows past the last batch (dropped) and rows of
    batches before ``first_batch`` (a resume point) go nowhere.  ``n``: the fill's rows (default
    ``len(permutation)``); positions missing from ``permutation`` (rows of a fill another shard serves) go
    nowhere either.
    """
    n = len(permutation) if n is None else int(n)
    inv = np.full(n, -1, np.int64)
    inv[permutation] = np.arange(len(permutation))
    pos = fill_start + inv
    batch = np.searchsorted(bounds, pos, side="right") - 1
    keep = (inv >= 0) & (pos < bounds[-1]) & (batch >= first_batch)
    row = pos - bounds[np.minimum(batch, len(bounds) - 2)]
    return np.where(keep, batch, -1), np.where(keep, row, -1)


def row_offsets(runs: list[Run], n: int, row_bytes: int) -> np.ndarray:
    """Byte offset in the file of each of the ``n`` rows of a fill, in buffer order (byte-addressed runs)."""
    dest = np.array([r.dest for r in runs], np.int64)
    count = np.array([r.rows for r in runs], np.int64)
    first = np.array([r.offset for r in runs], np.int64)
    if int(count.sum()) == n and np.array_equal(dest, np.cumsum(count) - count):
        # The runs of a fill lay its rows end to end (plan_runs): each row is its run's offset plus its place.
        return np.repeat(first - dest * row_bytes, count) + np.arange(n, dtype=np.int64) * row_bytes
    out = np.empty(n, np.int64)
    within = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    out[np.repeat(dest, count) + within] = np.repeat(first, count) + within * row_bytes
    return out


def spans(runs: list[Run], row_bytes: int, max_gap_bytes: int) -> list[tuple[int, int, list[Run]]]:
    """Byte-addressed ``runs`` grouped in file order into spans ``(offset, length, runs)``: a run joins the span
    before it when the bytes between them are at most ``max_gap_bytes``.  A span holds its runs and the gaps
    between them, so a span wholly in the page cache says each of its runs is, in one question."""
    if not runs:
        return []
    offset = np.array([r.offset for r in runs], np.int64)
    end = offset + np.array([r.rows for r in runs], np.int64) * row_bytes
    order = np.argsort(offset, kind="stable")
    offset, end = offset[order], np.maximum.accumulate(end[order])
    new = np.ones(len(runs), bool)
    new[1:] = offset[1:] - end[:-1] > max_gap_bytes
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(runs)) - 1
    members = np.split(order, first[1:])
    return [(a, b - a, [runs[i] for i in m]) for a, b, m in zip(offset[first].tolist(), end[last].tolist(),
                                                                  (m.tolist() for m in members))]


def chunk_pieces(src: int, rows: int, chunk_rows: int) -> Iterator[tuple[int, int, int, int]]:
    """Rows ``[src, src + rows)`` cut at chunk boundaries: ``(first row of the piece relative to src, chunk,
    row within the chunk, rows)`` per piece."""
    done = 0
    while done < rows:
        chunk, within = divmod(src + done, chunk_rows)
        m = min(rows - done, chunk_rows - within)
        yield done, chunk, within, m
        done += m



def aligned_span(offset: int, length: int, align: int) -> tuple[int, int]:
    """``[start, stop)``: the smallest range of whole ``align``-byte blocks that holds ``[offset, offset + length)``."""
    start = offset - offset % align
    stop = -(-(offset + length) // align) * align
    return start, stop


def inner_ends(offset: int, length: int, page: int) -> tuple[int, int]:
    """The first and last byte of ``[offset, offset + length)`` that lie on pages wholly inside it, or, for a
    range that holds no whole page at one end, its own first or last byte there.

    A page the range shares with a neighbour may be cached because the neighbour was read; a byte of a page
    that belongs to the range alone says whether the range itself was.
    """
    start, stop = aligned_span(offset, length, page)
    first = offset if offset == start else start + page
    last = offset + length - 1 if offset + length == stop else stop - page - 1
    if first > last:  # less than two whole pages: only the ends themselves are left
        return offset, offset + length - 1
    return first, last
