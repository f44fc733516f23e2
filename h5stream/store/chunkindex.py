"""The chunk index as plain h5py reads it: what ``h5stream verify`` checks beside the rows' checksums.

h5stream's own readers take a chunk's bytes from its recorded offset and the length its rows need
(:mod:`h5stream.read.locate`), and ``verify`` reads without HDF5's chunk cache; both pass over the *size* each
chunk's index entry records.  Plain h5py (and so ``h5stream info``, PyTables, any other reader) reads an
unfiltered chunk through the cache, by that size: an entry whose size was flipped leaves the rows intact for
h5stream and unreadable for everyone else.  :func:`chunk_index_problem` finds such entries: an unfiltered chunk
whose recorded size is not the chunk's, or any chunk that ends past the end of the file.  Pure apart from reading
the index (``chunk_iter``: one pass, no chunk data).
"""

from __future__ import annotations

import h5py
import numpy as np


def chunk_index_problem(f: h5py.File, path: str) -> str | None:
    """The first damaged chunk-index entry of the root datasets of open file ``f``, in words (None when none)."""
    file_bytes = int(f.id.get_filesize())
    for name in f:  # in the file's order (a damaged link name comes back as bytes, which sorted() would refuse)
        node = f.get(name)
        if not isinstance(node, h5py.Dataset) or node.chunks is None:
            continue
        whole = int(np.prod(node.chunks, dtype=np.int64)) * node.dtype.itemsize
        filtered = node.id.get_create_plist().get_nfilters() > 0
        bad = _bad_entries(node, file_bytes, None if filtered else whole)
        if bad:
            info = bad[0]
            end = info.byte_offset + info.size
            what = (f"ends at byte {end:,}, past the end of the file ({file_bytes:,} bytes)" if end > file_bytes
                    else f"is recorded as {info.size:,} bytes where the chunk is {whole:,}")
            return (f"{path}: the chunk of /{name} from row {info.chunk_offset[0]} {what}: HDF5's chunk index is "
                    "damaged, so plain h5py (and PyTables) cannot read those rows, though h5stream's readers can; "
                    "restore the file from a copy or re-ingest it")
    return None


def _bad_entries(node: h5py.Dataset, file_bytes: int, whole: int | None) -> list:
    """``chunk_iter`` entries of ``node`` that end past ``file_bytes`` or (``whole`` given: unfiltered) whose size
    is not ``whole``."""
    bad = []
    node.id.chunk_iter(lambda info: bad.append(info) if info.byte_offset + info.size > file_bytes
                       or (whole is not None and info.size != whole) else None)
    return bad
