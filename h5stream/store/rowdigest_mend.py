"""Writing back damaged row digests from the rows they describe: what ``h5stream repair`` does for them.

A block that :func:`~h5stream.store.checksum.verify_store` reports with parts ``("row digests",)`` has images,
labels and paths that match the block's own digests: its rows are intact, the digests of some of them are not.
Their digests are taken again from the rows (:func:`h5stream.store.rowdigest.of_rows`, as the writer took them)
and written in place over the damaged ones: ``/row_digests`` is uncompressed, a chunk per block, so a block's
digests are one contiguous run of bytes in the file.  A block whose images (or labels, paths) differ too is left
alone: its rows are not known good, and a digest taken of damaged bytes would hide the damage.

The caller holds the store's lock (:class:`~h5stream.store.lock.StoreLock`).  A kill mid-write leaves digests
that are either the old (damaged) ones or the new ones, a row at a time; the next ``verify`` or ``repair`` finds
any left damaged and mends them again.
"""

from __future__ import annotations


import numpy as np

from h5stream.errors import StoreFormatError
from h5stream.store import rowdigest, schema


def digest_only(bad) -> list:
    """The bad blocks (:class:`~h5stream.store.checksum.BadBlock`) whose only damage is to row digests (pure)."""
    return [b for b in bad if b.parts == ("row digests",)]


def mend(path: str, blocks) -> int:
    """Write the digests of every row of ``blocks`` (each with parts ``("row digests",)``) again from the rows
    themselves, in place, then ``fsync``; returns the rows written.  :class:`StoreFormatError` where
    ``/row_digests`` is not stored as one contiguous uncompressed chunk per block."""
    import h5py

    from h5stream.store.durable import write_in_place
    from h5stream.store.encoded import EncodedArray
    from h5stream.store.meta import read_meta
    from h5stream.store.rowread import readable_by_h5py, row_reader

    if not blocks:
        return 0
    meta = read_meta(path)
    with h5py.File(path, "r", locking=False) as f:
        node = f[schema.ROW_DIGESTS]
        if node.compression is not None or node.chunks is None:
            raise StoreFormatError(f"{path}: /{schema.ROW_DIGESTS} is not stored uncompressed by chunks, so its "
                                   "damaged digests cannot be written in place; restore the file from a copy")
        places = []
        for b in blocks:
            info = node.id.get_chunk_info_by_coord((b.start,))
            if info.byte_offset is None or node.chunks[0] < b.stop - b.start or b.start % node.chunks[0]:
                raise StoreFormatError(f"{path}: the row digests of rows {b.start}-{b.stop - 1} are not one "
                                       "contiguous chunk; restore the file from a copy")
            places.append(info.byte_offset)
        stored = node.dtype
        if meta.encoded:  # an encoded row's digest is of its encoded bytes
            encoded = EncodedArray.of(f)
            digests = [rowdigest.of_rows(encoded.read(b.start, b.stop)) for b in blocks]
        else:
            via_h5py, images = readable_by_h5py(f[schema.IMAGES]), f[schema.IMAGES]
            shape, dtype = images.shape[1:], images.dtype
    if not meta.encoded:
        source = row_reader(path, via_h5py)
        try:
            digests = [rowdigest.of_rows(source.read(schema.IMAGES, b.start, b.stop,
                                                     np.empty((b.stop - b.start, *shape), dtype)))
                       for b in blocks]
        finally:
            source.close()
    write_in_place(path, [(at, np.ascontiguousarray(sums, stored)) for at, sums in zip(places, digests)])
    return sum(b.stop - b.start for b in blocks)
