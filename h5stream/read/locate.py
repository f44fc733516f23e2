"""Where a store's rows lie in its file: the byte offset of every chunk of ``/images`` and ``/labels``.

Read once through HDF5's chunk index (h5py), inside
:func:`~h5stream.store.access.read_consistent` so metadata caught while a
writer rewrites it is read again.  From the offsets on, an uncompressed store
is read by byte offset only: the bytes of committed rows never move, so
reading them stays right while another process appends to the file.
"""

from __future__ import annotations

from typing import NamedTuple

import h5py
import numpy as np

from h5stream.errors import StoreFormatError
from h5stream.store import schema
from h5stream.store.access import read_consistent
from h5stream.store.checksum import trusted_digests
from h5stream.store.meta import StoreMeta


class Locations(NamedTuple):
    """What the reader learns about a store at open.

    ``image_chunks``: byte offset of each ``/images`` chunk, None when the pixels can only be read through HDF5;
    ``label_chunks``: ``(byte offset of each /labels chunk, rows per chunk)``, None likewise;
    ``labels``: every label in memory when asked for, else None;
    ``digests``: when asked for, the trusted block digests (see
    :func:`h5stream.store.checksum.trusted_digests`; None for a store without checksums).
    """

    image_chunks: np.ndarray | None
    label_chunks: tuple[np.ndarray, int] | None
    labels: np.ndarray | None
    digests: list | None = None


def locate(meta: StoreMeta, cache_labels: bool, digests: bool = False) -> Locations:
    """The store's :class:`Locations` (and every label when ``cache_labels``, the block digests when
    ``digests``), read consistently."""
    return read_consistent(meta.path, lambda f: _locations(f, meta, cache_labels, digests), rdcc_nbytes=0,
                           remote=meta.remote)


def direct_reads(path: str, meta: StoreMeta) -> bool:
    """Whether every row of the store can be read straight from the file (uncompressed, all chunks stored)."""
    def readable(f: h5py.File) -> bool:
        return chunk_offsets(f[schema.IMAGES], meta.rows, meta.block_rows, path) is not None

    return read_consistent(path, readable, rdcc_nbytes=0, remote=meta.remote)


def _locations(f: h5py.File, meta: StoreMeta, cache_labels: bool, digests: bool = False) -> Locations:
    images, labels = f[schema.IMAGES], f[schema.LABELS]
    offsets = chunk_offsets(images, meta.rows, meta.block_rows, meta.path)
    label_chunks = None
    if labels.chunks is not None:
        chunk_rows = labels.chunks[0]
        found = chunk_offsets(labels, meta.rows, chunk_rows, meta.path)
        label_chunks = None if found is None else (found, chunk_rows)
    all_labels = None
    if cache_labels:
        all_labels = np.empty((meta.rows, *meta.label_shape), meta.label_dtype)
        if meta.rows:
            labels.read_direct(all_labels, np.s_[0:meta.rows], np.s_[0:meta.rows])
    trusted = trusted_digests(f, meta.rows, meta.block_rows, meta.path) if digests else None
    return Locations(offsets, label_chunks, all_labels, trusted)


def chunk_offsets(data: h5py.Dataset, rows: int, chunk_rows: int, path: str) -> np.ndarray | None:
    """Byte offset of each chunk holding rows ``[0, rows)`` of ``data`` (in the file at ``path``), or None when
    they cannot be read directly (compressed, chunks not of whole rows, a chunk without storage: HDF5's fill
    value).

    Raises :class:`StoreFormatError` for a chunk said to lie past the end of the file (metadata caught
    while a writer rewrites it, or damage), which :func:`read_consistent` judges.
    """
    chunks = data.chunks
    if chunks is None or data.id.get_create_plist().get_nfilters() > 0:
        return None
    if chunks[0] != chunk_rows or tuple(chunks[1:]) != tuple(data.shape[1:]):
        return None
    n_chunks = -(-rows // chunk_rows)
    offsets = np.full(n_chunks, -1, dtype=np.int64)

    def visit(info):
        b = info.chunk_offset[0] // chunk_rows
        if b < n_chunks:
            offsets[b] = info.byte_offset

    data.id.chunk_iter(visit)
    if (offsets < 0).any():
        return None
    if n_chunks:
        row_bytes = int(np.prod(data.shape[1:], dtype=np.int64)) * data.dtype.itemsize
        rows_in_chunk = np.minimum(chunk_rows, rows - np.arange(n_chunks, dtype=np.int64) * chunk_rows)
        end = int((offsets + rows_in_chunk * row_bytes).max())
        size = int(data.file.id.get_filesize())  # as the driver sees it: a local file or a remote object
        if end > size:
            raise StoreFormatError(f"{path}: a chunk of /{data.name.lstrip('/')} ends at byte {end}, "
                                   f"past the end of the file ({size} bytes)")
    return offsets
