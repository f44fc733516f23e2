"""Row digests: the xxh3-64 of every row's image bytes, kept next to the rows so a read checks exactly what it read.

A store of format version :data:`~h5stream.store.schema.ROW_DIGESTS_FORMAT_VERSION` keeps::

    /row_digests  EArray uint64 (N,), chunked (block_rows,): row i's xxh3-64 of its image bytes (C order; an
                  encoded store's: of the row's encoded bytes, image_bytes[ends[i-1]:ends[i]])

beside the per-block digests of :mod:`h5stream.store.checksum`, which stay.  The block digest of a block cannot be
put together from parts of it, so a reader that reads part of a block could only check it by reading the rest;
with a digest per row it checks each row it read against that row's digest, and reads 8 bytes a row more
(:class:`~h5stream.read.verify.BlockCheck`: under ``"once"`` a read's own rows' digests, alongside it; where every
read is checked, a block's digests when a read first touches it, kept).

Written as the labels are: queued with the rows, appended before the flush that precedes raising
``committed_rows``, dropped past the count by a writer that opens the store (:func:`truncate`), so every committed
row has its digest and a digest past the count is a commit in flight or a crash's leftover, never trusted.
``h5stream verify`` checks every committed row against its digest, and so finds a flipped byte in a digest too
(:func:`bad_rows`).  A store without ``/row_digests`` (every store written before it) is checked by blocks only.

The functions here are pure or take an open file; :class:`~h5stream.store.writer.StoreWriter` calls
:func:`create_node`, :func:`of_rows` and :func:`truncate`.
"""

from __future__ import annotations

import numpy as np
import xxhash

from h5stream.errors import StoreFormatError
from h5stream.store import schema


def of_rows(images) -> np.ndarray:
    """uint64 xxh3-64 of each row of ``images``: a pixel array ``(n, ...)`` (each row's C-order bytes) or an
    :class:`~h5stream.store.encoded.EncodedRows` (each row's encoded bytes).  Pure."""
    if getattr(images, "encoded_rows", False):
        return np.fromiter((xxhash.xxh3_64_intdigest(images.row(i)) for i in range(len(images))),
                           np.uint64, len(images))
    rows = np.ascontiguousarray(images)
    flat = rows.reshape(len(rows), -1).view(np.uint8) if len(rows) else rows
    return np.fromiter((xxhash.xxh3_64_intdigest(r) for r in flat), np.uint64, len(rows))


def has(root) -> bool:
    """Whether a store (a PyTables root group or an h5py file) keeps row digests."""
    return schema.ROW_DIGESTS in root


def create_node(h5file, block_rows: int, expected_rows: int) -> None:
    """Add an empty ``/row_digests`` to a new store (a ``tables.File``): a chunk per block, uncompressed, so the
    digests of a block's rows are one contiguous read by byte offset."""
    import tables

    h5file.create_earray(h5file.root, schema.ROW_DIGESTS, tables.UInt64Atom(), shape=(0,),
                         chunkshape=(int(block_rows),), expectedrows=expected_rows)


def writer_node(h5file, committed_rows: int):
    """A writer's ``/row_digests`` of the open ``tables.File`` (None for a store without them).  Refuses
    (:class:`StoreFormatError`) a store with committed rows lacking their digests: appending would put the next
    rows' digests against the wrong rows."""
    root = h5file.root
    if not has(root):
        return None
    node = root._f_get_child(schema.ROW_DIGESTS)
    lacking = missing(node.nrows, committed_rows)
    if lacking is not None:
        raise StoreFormatError(f"{h5file.filename}: {lacking}; nothing can be appended to it: "
                               f"`h5stream repair {h5file.filename}` rebuilds it")
    return node


def truncate(root, rows: int) -> None:
    """Drop the row digests past ``rows`` (a PyTables root group): a crash's leftovers, or rows rolled back."""
    if has(root):
        node = root._f_get_child(schema.ROW_DIGESTS)
        if node.nrows > rows:
            node.truncate(rows)


def missing(stored_digests: int, committed_rows: int) -> str | None:
    """What is wrong with a store holding ``stored_digests`` row digests for ``committed_rows`` committed rows
    (pure): None when every committed row has its digest."""
    if stored_digests >= committed_rows:
        return None
    return (f"rows {stored_digests}-{committed_rows - 1} are committed without a row digest "
            f"(/{schema.ROW_DIGESTS} holds {stored_digests})")


def bad_rows(digests: np.ndarray, images, first_row: int) -> list[int]:
    """Rows (store indices, from ``first_row``) of ``images`` whose digest differs from ``digests`` (pure)."""
    got = of_rows(images)
    return (np.flatnonzero(got != np.asarray(digests, np.uint64)[:len(got)]) + int(first_row)).tolist()


def judge(parts: tuple[str, ...], bad: list[int]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``(parts, rows)`` that ``verify`` reports of a block whose block digests differ in ``parts`` and whose rows
    ``bad`` differ from their row digests (pure): where the block's images match its digest, a row that differs
    from its own digest is a damaged digest, reported as the part ``"row digests"``."""
    if bad and "images" not in parts:
        parts = (*parts, "row digests")
    return parts, tuple(bad)


def block_digest_note(parts: tuple[str, ...], bad: list[int], whole: bool) -> str:
    """What ``verify`` adds to a block whose images differ from the block's digest while every row matches its own
    digest (pure): the rows are intact and the block's recorded digest (in ``/checksums``, or ``checksum_tail``) is
    what is damaged -- the converse of :func:`judge`'s damaged row digest.  ``whole``: the block's digest covers
    exactly the rows checked by row (not rows of a commit in flight past them).  ``""`` otherwise."""
    if "images" in parts and not bad and whole:
        return "every row matches its own digest, so the block's images checksum is what is damaged"
    return ""


def damage_text(block) -> str:
    """``do not match their checksum (images: row 83)`` for a :class:`~h5stream.store.checksum.BadBlock` that
    is not unreadable (pure): its parts, then the rows that differ from their own digests or its detail."""
    more = f": {rows_text(block.rows)}" if block.rows else (f"; {block.detail}" if block.detail else "")
    return f"do not match their checksum ({', '.join(block.parts)}{more})"


def rows_text(rows: tuple[int, ...]) -> str:
    """``row 83`` / ``rows 83, 90, 91 and 4 more`` (pure)."""
    if len(rows) == 1:
        return f"row {rows[0]}"
    return f"rows {', '.join(map(str, rows[:3]))}" + (f" and {len(rows) - 3} more" if len(rows) > 3 else "")


def missing_text(stored_digests: int, committed_rows: int, path: str) -> str | None:
    """The one line for committed rows without their row digest (see :func:`missing`; pure), None if none: what
    ``verify``, ``--append`` and a verifying stream all say."""
    lacking = missing(stored_digests, committed_rows)
    if lacking is None:
        return None
    return (f"{path}: {lacking}; the file is damaged: `h5stream repair {path}` rebuilds it from its rows, checked "
            "against their block checksums, or restore it from a copy")


def check_count(stored_digests: int, committed_rows: int, path: str) -> None:
    """Raise :class:`StoreFormatError` where committed rows lack their row digest (see :func:`missing_text`)."""
    lacking = missing_text(stored_digests, committed_rows, path)
    if lacking is not None:
        raise StoreFormatError(lacking)
