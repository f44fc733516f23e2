"""Reading an encoded (JPEG) store's rows into the batches, still encoded: they are decoded where the batch is
augmented (an augmenting worker, or the consumer's thread with ``workers=0``), one core per worker.

A batch of an encoded store has the same images array as any other (``batch_size`` rows of the decoded shape, an
input slot or an arena array, counted by the budget as they are); row ``k``'s JPEG bytes are copied to the start of
row ``k``'s place, and the batch's ``encoded_lengths[k]`` says how many there are.  A JPEG larger than the decoded
row (tiny images; ``--encoding auto`` stores those raw) is decoded here instead, into its place, and its length is
-1: the row holds pixels already.  So the shuffle, the fills, the batches' lifetimes, resume, shards and the feeds
are the raw store's; only the last step, :func:`h5stream.store.jpeg.decode_slot_rows`, differs.

The rows are read through HDF5 (``/image_bytes`` by the byte ranges ``/image_ends`` gives; a URL through the
remote file object), in the reader thread, a run's whole blocks at a time: an encoded block is a few hundred KiB.
With ``verify_reads`` each block read is checked against its digest (the bytes and the row boundaries, see
:mod:`h5stream.store.encoded`) before any row of it is placed: every read with ``True``, the first read of each
block with ``"once"``; a mismatch raises :class:`~h5stream.errors.ChecksumError` naming the rows.
"""

from __future__ import annotations

import numpy as np

from h5stream.errors import ChecksumError
from h5stream.store.checksum import digest
from h5stream.store.jpeg import decode_rows


class EncodedRunReader:
    """Reads runs of an encoded store's rows into their batches.  ``rows``: the store's
    :class:`~h5stream.store.encoded.EncodedArray` (h5py); ``check``: the reader's
    :class:`~h5stream.read.verify.BlockCheck` (its trusted image digests are the encoded blocks'), or None.
    Reader thread only."""

    def __init__(self, meta, rows, check):
        self.meta, self._rows, self._check = meta, rows, check
        n_blocks = -(-meta.rows // meta.block_rows)
        self._checked = np.zeros(n_blocks, bool)  # blocks whose bytes matched once (``"once"``)

    def read_run(self, job, run) -> tuple[int, int]:
        """Read run ``run`` of fill ``job`` into its batches; returns (bytes read, rows placed)."""
        dest, src, n, _off = run
        block_rows, meta = self.meta.block_rows, self.meta
        first_block, last_block = src // block_rows, (src + n - 1) // block_rows
        a = first_block * block_rows
        b = min(meta.rows, (last_block + 1) * block_rows)
        rows = self._rows.read(a, b)
        if len(rows) != b - a:
            raise OSError(f"{meta.path}: /image_ends holds {self._rows.nrows} rows, fewer than the {b} committed")
        if self._check is not None:
            self._verify(rows, a, first_block, last_block, src, n)
        targets = job.targets
        batches = job.batch[dest:dest + n].tolist()
        offsets = job.offset[dest:dest + n].tolist()
        row_bytes = meta.row_bytes
        lengths = rows.lengths
        for i, (bt, k) in enumerate(zip(batches, offsets)):
            if bt < 0:
                continue
            batch = targets[bt].batch
            at = src - a + i
            length = int(lengths[at])
            place = batch.images[k]
            if length <= row_bytes:
                place.reshape(-1)[:length] = rows.row(at)
                batch.encoded_lengths[k] = length
            else:  # a JPEG larger than the pixels it holds: decoded here
                decode_rows(rows[at:at + 1], src + i, place[None], meta.path)
                batch.encoded_lengths[k] = -1
        return len(rows.data), n

    def _verify(self, rows, a: int, first_block: int, last_block: int, src: int, n: int) -> None:
        """Check each block of ``rows`` (from store row ``a``) with a trusted digest, as ``verify_reads`` says."""
        check, block_rows = self._check, self.meta.block_rows
        for block in range(first_block, last_block + 1):
            if not check.trusted[block] or (self._checked[block] and not check.every_read):
                continue
            b0 = block * block_rows
            b1 = min(self.meta.rows, b0 + block_rows)
            if digest(rows[b0 - a:b1 - a]) != check.image_digest(block):
                first, last = max(src, b0), min(src + n, b1) - 1
                raise ChecksumError.for_rows(self.meta.path, first, last, "images (encoded bytes)", block)
            self._checked[block] = True
