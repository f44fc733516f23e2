"""Where every row of a fill lands, as addresses: the I/O threads then read a run with one C call and no Python
object per row.

A fill's runs are read from a local file straight into their batches' rows, one ``preadv`` buffer a row
(:mod:`h5stream.read.rows`).  Made in Python, each buffer is a ``memoryview`` slice of its batch, built per row by
the I/O thread that reads it and held by the GIL it takes back: about half a microsecond a row, on the threads
whose copy is the stream's whole work.  Here the reader thread lays out, once per fill and with numpy, one
``struct iovec`` per buffer position (its batch row's address, or the scratch row's for a row read but not used),
and an I/O thread reads run ``[dest, dest + rows)`` from slice ``[dest, dest + rows)`` of it
(:func:`~h5stream.memory.rawio.preadv_rows`).  The batches are the same arrays, the rows land in the same
places (the addresses are taken from the batches' own arrays), and the fill's batches stay alive until its reads
are done (the fill job holds them), as with memoryviews.

Pure but for the addresses it reads; the reader thread runs it.
"""

from __future__ import annotations

import numpy as np

from h5stream.memory.rawio import IOVEC


def fill_iovecs(batch: np.ndarray, offset: np.ndarray, targets: dict, first_batch: int, row_bytes: int,
                scratch: np.ndarray) -> np.ndarray | None:
    """One :data:`~h5stream.memory.rawio.IOVEC` per buffer position of a fill whose position ``p`` goes to batch
    ``batch[p]`` (-1: none) at row ``offset[p]``, the batches being ``targets`` (batch index ->
    :class:`~h5stream.read.fill.Pending`, from ``first_batch`` on): ``row_bytes`` bytes at that row of the
    batch's images, or at ``scratch`` (a row's worth, written and never read) for a position that goes nowhere or
    to a batch without images.  None when some batch's images are not one writable C-contiguous array of whole
    rows (then each run is read through memoryviews)."""
    if not targets:
        return None
    n_batches = max(targets) + 1 - first_batch
    base = np.full(n_batches + 1, scratch.ctypes.data, np.uint64)  # last entry: positions that go nowhere
    into = np.zeros(n_batches + 1, bool)  # whether the batch's rows are written (else its positions: scratch)
    known = np.zeros(n_batches + 1, bool)
    known[n_batches] = True
    for j, t in targets.items():
        known[j - first_batch] = True
        if t.rows is None:
            continue
        images = t.batch.images
        if not (images.flags.c_contiguous and images.flags.writeable) or images.nbytes != len(images) * row_bytes:
            return None
        base[j - first_batch], into[j - first_batch] = images.ctypes.data, True
    batch = np.asarray(batch, np.int64)
    index = np.where(batch >= 0, batch - first_batch, n_batches)
    if len(index) and (index.min() < 0 or index.max() > n_batches or not known[index].all()):
        return None  # a position of a batch not in targets: the memoryview path says so
    placed = into[index]
    # 16 bytes a row of the fill, within the plan's allowance for its index (budget.FILL_INDEX_ROW_BYTES): a fill
    # read into its batches has no file offsets, which the allowance counts
    out = np.empty(len(batch), IOVEC)
    out["base"] = base[index] + np.where(placed, np.asarray(offset, np.int64), 0).astype(np.uint64) * row_bytes
    out["len"] = row_bytes
    return out
