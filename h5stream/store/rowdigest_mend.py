"""Writing back damaged row digests from the rows they describe: what ``h5stream repair`` does for them.

A block that :func:`~h5stream.store.checksum.verify_store` reports with parts ``("row digests",)`` has images,
labels and paths that match the block's own digests: its rows are intact, the digests of some of them are not.
Their digests are taken again from the rows (:func:`h5stream.store.rowdigest.of_rows`, as the writer took them)
and written in place over the damaged ones: ``/row_digests`` is uncompressed, a chunk per block, so a block's
digests are one contiguous run of bytes in the file.  A block whose images (or labels, paths) differ too is left
alone: its rows are not known good, and a digest taken of damaged bytes would hide the damage.

The converse, a block whose images differ from its digest in ``/checksums`` while every row matches its own
digest: the rows are intact and the block's images digest is what is damaged; :func:`verify_store` reports the
digest the rows give (``BadBlock.images_digest``), and :func:`mend_block_digests` writes it over the damaged one,
8 bytes in place (``/checksums`` is uncompressed, 1,024 blocks a chunk).  A last, partial block's digest lies in the
``checksum_tail`` attribute, which is not written in place: such a block is left as it is.

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
        node = _in_place(path, f, schema.ROW_DIGESTS)
        places = []
        for b in blocks:
            at = _chunk_offset(node, (b.start,))
            if at is None or node.chunks[0] < b.stop - b.start or b.start % node.chunks[0]:
                raise StoreFormatError(f"{path}: the row digests of rows {b.start}-{b.stop - 1} are not one "
                                       "contiguous chunk; restore the file from a copy")
            places.append(at)
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


def block_digest_only(bad) -> list:
    """The bad blocks whose only damage is their images digest in ``/checksums``: every row matches its own digest
    (``BadBlock.images_digest`` set by :func:`~h5stream.store.checksum.verify_store`; pure)."""
    return [b for b in bad if b.parts == ("images",) and b.images_digest is not None]


def mend_block_digests(path: str, blocks, block_rows: int) -> int:
    """Write the images digest of each of ``blocks`` (:func:`block_digest_only`) again, the one its rows give, in
    place in ``/checksums``, then ``fsync``; a block whose digest is not in ``/checksums`` (the last, partial one:
    ``checksum_tail``) is left.  Returns the blocks written.  :class:`StoreFormatError` where ``/checksums`` is not
    stored uncompressed by chunks."""
    import h5py

    from h5stream.store.durable import write_in_place

    writes = []
    with h5py.File(path, "r", locking=False) as f:
        node = _in_place(path, f, schema.CHECKSUMS)
        per_chunk, width = node.chunks[0], node.shape[1]
        for b in blocks:
            k = b.start // block_rows
            if k >= node.shape[0]:
                continue
            at = _chunk_offset(node, (k - k % per_chunk, 0))
            if at is None:
                raise StoreFormatError(f"{path}: the checksums of rows {b.start}-{b.stop - 1} have no place in the "
                                       "file; restore the file from a copy")
            item = node.dtype.itemsize
            writes.append((at + (k % per_chunk) * width * item,
                           np.array([b.images_digest], dtype=node.dtype.newbyteorder("<"))))
    if writes:
        write_in_place(path, writes)
    return len(writes)


def _in_place(path: str, f, name: str):
    """The dataset ``name`` of the open file ``f``, where it may be written in place: uncompressed, by chunks;
    else :class:`StoreFormatError` (pure over the file's layout)."""
    node = f[name]
    if node.compression is not None or node.chunks is None:
        raise StoreFormatError(f"{path}: /{name} is not stored uncompressed by chunks, so its damaged digests "
                               "cannot be written in place; restore the file from a copy")
    return node


def _chunk_offset(node, coord: tuple[int, ...]) -> int | None:
    """Where in the file the chunk of ``node`` at ``coord`` starts, None where it was never written."""
    return node.id.get_chunk_info_by_coord(coord).byte_offset
