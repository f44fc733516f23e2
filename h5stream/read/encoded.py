"""Reading an encoded (JPEG) store's rows into the batches, still encoded: they are decoded where the batch is
augmented (an augmenting worker, or the consumer's thread with ``workers=0``), one core per worker.

A batch of an encoded store has the same images array as any other (``batch_size`` rows of the decoded shape, an
input slot or an arena array, counted by the budget as they are); row ``k``'s JPEG bytes are copied to the start of
row ``k``'s place, and the batch's ``encoded_lengths[k]`` says how many there are.  A JPEG larger than the decoded
row (tiny images; ``--encoding auto`` stores those raw) is decoded here instead, into its place, and its length is
-1: the row holds pixels already.  So the shuffle, the fills, the batches' lifetimes, resume, shards and the feeds
are the raw store's; only the last step, :func:`h5stream.store.jpeg.decode_slot_rows`, differs.

The rows are read by byte offset (:class:`~h5stream.read.encbytes.ByteRows`: byte ranges of ``/image_bytes``
through the stream's byte source, by the reader's I/O threads), or, where ``/image_bytes`` cannot be read so,
through HDF5 in the reader thread; a run's blocks at a time: an encoded block is a few hundred KiB.
With ``verify_reads`` each block read is checked against its digest (the bytes and the row boundaries, see
:mod:`h5stream.store.encoded`) before any row of it is placed: every read with ``True``, the first read of each
block with ``"once"``; a mismatch raises :class:`~h5stream.errors.ChecksumError` naming the rows.  A store with row
digests (:mod:`h5stream.store.rowdigest`) reads only the run's rows and checks each against its own digest.
"""

from __future__ import annotations

import numpy as np

from h5stream.errors import ChecksumError
from h5stream.store.checksum import digest
from h5stream.store.jpeg import decode_rows


class EncodedRunReader:
    """Reads runs of an encoded store's rows into their batches.  ``rows``: a
    :class:`~h5stream.read.encbytes.ByteRows`, or the store's :class:`~h5stream.store.encoded.EncodedArray` (h5py);
    ``check``: the reader's
    :class:`~h5stream.read.verify.BlockCheck` (its trusted image digests are the encoded blocks'), or None.
    ``read_run`` runs in the reader's I/O threads (byte rows) or its thread (HDF5); two reads of one block may both
    check it under ``"once"``, never neither."""

    def __init__(self, meta, rows, check):
        self.meta, self._rows, self._check = meta, rows, check
        n_blocks = -(-meta.rows // meta.block_rows)
        self._checked = np.zeros(n_blocks, bool)  # blocks whose bytes matched once (``"once"``)

    def read_run(self, job, run) -> tuple[int, int]:
        """Read run ``run`` of fill ``job`` into its batches, one block at a time (the whole block where it is to
        be checked, else the run's rows of it); returns (bytes read, rows placed)."""
        dest, src, n, _off = run
        block_rows, meta = self.meta.block_rows, self.meta
        batches = job.batch[dest:dest + n].tolist()
        offsets = job.offset[dest:dest + n].tolist()
        nbytes = 0
        for block in range(src // block_rows, (src + n - 1) // block_rows + 1):
            lo, hi = max(src, block * block_rows), min(src + n, (block + 1) * block_rows)  # the run's rows in it
            if self._check is not None and self._check.by_row:  # each row against its digest: only the run read
                rows = self._read(lo, hi)
                self._check.images(lo, [rows.row(i) for i in range(hi - lo)], None)
                nbytes += len(rows.data)
                self._place(job.targets, rows, lo, lo, hi, batches[lo - src:hi - src], offsets[lo - src:hi - src])
                continue
            checked = self._to_check(block)
            a, b = (block * block_rows, min(meta.rows, (block + 1) * block_rows)) if checked else (lo, hi)
            rows = self._read(a, b)
            if checked:
                self._verify(rows, block, lo, hi)
            nbytes += len(rows.data)
            self._place(job.targets, rows, a, lo, hi, batches[lo - src:hi - src], offsets[lo - src:hi - src])
        return nbytes, n

    def _read(self, a: int, b: int):
        """Rows ``[a, b)``, read; OSError where ``/image_ends`` ends before them."""
        rows = self._rows.read(a, b)
        if len(rows) != b - a:
            raise OSError(f"{self.meta.path}: /image_ends holds {self._rows.nrows} rows, fewer than the {b} committed")
        return rows

    def _place(self, targets, rows, a: int, lo: int, hi: int, batches, offsets) -> None:
        """Copy store rows ``[lo, hi)`` of ``rows`` (which start at store row ``a``) into their batches."""
        row_bytes, lengths = self.meta.row_bytes, rows.lengths
        for i, (bt, k) in enumerate(zip(batches, offsets)):
            if bt < 0:
                continue
            batch = targets[bt].batch
            at = lo - a + i
            length = int(lengths[at])
            place = batch.images[k]
            if length <= row_bytes:
                place.reshape(-1)[:length] = rows.row(at)
                batch.encoded_lengths[k] = length
            else:  # a JPEG larger than the pixels it holds: decoded here
                decode_rows(rows[at:at + 1], lo + i, place[None], self.meta.path)
                batch.encoded_lengths[k] = -1

    def _to_check(self, block: int) -> bool:
        """Whether this read of ``block`` is checked: a trusted digest, and every read or not yet checked."""
        check = self._check
        return check is not None and bool(check.trusted[block]) and (check.every_read or not self._checked[block])

    def _verify(self, rows, block: int, lo: int, hi: int) -> None:
        """Check ``rows`` (the whole of ``block``) against its digest; a mismatch names rows ``[lo, hi)``."""
        if digest(rows) != self._check.image_digest(block):
            raise ChecksumError.for_rows(self.meta.path, lo, hi - 1, "images (encoded bytes)", block)
        self._checked[block] = True
