"""Small rows read whole runs at a time, then put in their batches by numpy: no step per row in Python.

A fill's pixels are read run by run (:mod:`h5stream.read.runs`), each row straight into its place in its batch:
one ``preadv`` buffer per row.  For rows of a few dozen bytes that costs far more than the bytes (building a
view per row, the kernel walking an ``iovec`` per row: about a microsecond a row, a second for a fill of a
million 4x4 rows).  So rows of at most :data:`SMALL_ROW_BYTES` of a local file are read instead as contiguous
pieces of a run (:data:`PIECE_BYTES`, one read each) into a buffer of the I/O thread's, checked there (where
reads are checked), and copied from there to their places with one numpy assignment per piece and batch buffer:
the batches of a fill lie in a few buffers (the arena maps them :data:`~h5stream.memory.lend.SLAB_BYTES` at a
time), and :func:`placement` says, once per fill, at which row of which buffer each of the fill's rows lands.
A URL's rows are still read in place: there a piece would be a request of its own.

Pure but for the buffers it looks at; each function says which thread runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SMALL_ROW_BYTES = 1024
"""Rows of at most this many bytes are read a piece of a run at a time and placed by numpy (above it, reading
each row in place costs less than the copy)."""

PIECE_BYTES = 32 << 10
"""Bytes read at once into an I/O thread's buffer (whole rows: at least one row).  One buffer per I/O thread:
256 KiB with a URL's 8 reads in flight, within the plan's fixed allowance for small arrays
(:data:`h5stream.streaming.budget.BOOKKEEPING_BYTES`); a read of 32 KiB of rows and its numpy copies cost a
few microseconds, a few nanoseconds a row."""


@dataclass(frozen=True)
class Placement:
    """Where each buffer position of a fill lands: ``group[p]`` (int16) the index in ``buffers`` of the memory its
    batch lies in (-1: not placed, a row read past or read by a receiver), ``row[p]`` (int32) its row there.
    ``buffers[g]`` is that memory as rows (a 1-D array of ``row_bytes``-byte void items)."""

    buffers: tuple[np.ndarray, ...]
    group: np.ndarray
    row: np.ndarray


def _memory_of(a: np.ndarray):
    """The object at the end of ``a``'s chain of bases: the memory it lies in (an ``mmap``, a shared segment)."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a


def placement(batch: np.ndarray, offset: np.ndarray, targets: dict, first_batch: int,
              row_bytes: int) -> Placement | None:
    """The :class:`Placement` of a fill whose buffer positions go to batch ``batch[p]`` (-1: none) at row
    ``offset[p]``, the batches being ``targets`` (batch index -> :class:`~h5stream.read.fill.Pending`, from
    ``first_batch`` on); None when some batch's images are not whole rows of a buffer numpy can write (then the
    rows are read in place).  Reader thread, after the fill's batches are allocated."""
    n_batches = max(targets) + 1 - first_batch if targets else 0
    batch_group = np.full(max(n_batches, 1), -1, np.int32)
    batch_row = np.zeros(max(n_batches, 1), np.int64)
    buffers: list[np.ndarray] = []
    found: dict[int, tuple[int, int]] = {}  # id of the memory -> (group, address of its first byte)
    for j, t in targets.items():
        if t.rows is None:
            continue  # a batch without images: its rows are read by its receiver
        images = t.batch.images
        if images.dtype != np.uint8 or not images.flags.c_contiguous or not images.flags.writeable:
            return None
        memory = _memory_of(images)
        key = id(memory)
        if key not in found:
            try:
                flat = np.frombuffer(memory, np.uint8)
            except (TypeError, ValueError):
                return None
            if not flat.flags.writeable:
                return None
            whole = len(flat) // row_bytes
            found[key] = (len(buffers), flat.ctypes.data)
            buffers.append(flat[:whole * row_bytes].view(np.dtype((np.void, row_bytes))))
        g, start = found[key]
        delta = images.ctypes.data - start
        if delta < 0 or delta % row_bytes or delta // row_bytes + len(images) > len(buffers[g]):
            return None
        batch_group[j - first_batch] = g
        batch_row[j - first_batch] = delta // row_bytes
    if len(buffers) > np.iinfo(np.int16).max or max(len(b) for b in buffers or [()]) > np.iinfo(np.int32).max:
        return None
    batch = np.asarray(batch)
    placed = batch >= 0
    index = np.where(placed, batch - first_batch, 0)
    # 6 bytes a row of the fill, within the plan's allowance for laying a fill out (FILL_INDEX_ROW_BYTES)
    group = np.where(placed, batch_group[index], -1).astype(np.int16)
    row = (batch_row[index] + np.asarray(offset, np.int64)).astype(np.int32)
    return Placement(tuple(buffers), group, row)


def place(where: Placement, dest: int, rows: np.ndarray) -> None:
    """Copy ``rows`` (a 1-D array of row-sized void items, buffer positions ``dest, dest + 1, ...``) to their
    places.  An I/O thread (each writes other rows)."""
    n = len(rows)
    group = where.group[dest:dest + n]
    row = where.row[dest:dest + n]
    first = int(group[0]) if n else -1
    if n and first >= 0 and (group == first).all():
        where.buffers[first][row] = rows  # the usual case: the fill's batches in one buffer
        return
    for g in np.unique(group):
        if g >= 0:
            mine = group == g
            where.buffers[g][row[mine]] = rows[mine]
