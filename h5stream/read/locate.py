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

BAND_CACHE_MAX_BYTES = 64 << 20
"""Largest band of chunks (see :func:`band_bytes`) a stream caches to read a store whose chunks split images."""


class Locations(NamedTuple):
    """What the reader learns about a store at open.

    ``image_chunks``: byte offset of each ``/images`` chunk, None when the pixels can only be read through HDF5;
    ``label_chunks``: ``(byte offset of each /labels chunk, rows per chunk)``, None likewise;
    ``labels``: every label in memory when asked for, else None;
    ``digests``: when asked for, the trusted block digests (see
    :func:`h5stream.store.checksum.trusted_digests`; None for a store without checksums);
    ``encoded``: an encoded store's :class:`~h5stream.read.encbytes.EncodedExtents` (None: not encoded, or its
    bytes only read through HDF5);
    ``row_digests``: with ``digests``, ``(byte offset of each /row_digests chunk, rows per chunk)`` of a store
    whose committed rows all have their digest (:mod:`h5stream.store.rowdigest`), else None.
    """

    image_chunks: np.ndarray | None
    label_chunks: tuple[np.ndarray, int] | None
    labels: np.ndarray | None
    digests: list | None = None
    encoded: object = None
    row_digests: tuple[np.ndarray, int] | None = None


def locate(meta: StoreMeta, cache_labels: bool, digests: bool = False) -> Locations:
    """The store's :class:`Locations` (and every label when ``cache_labels``, the block digests when
    ``digests``), read consistently."""
    return read_consistent(meta.path, lambda f: _locations(f, meta, cache_labels, digests), rdcc_nbytes=0,
                           remote=meta.remote)


def direct_reads(path: str, meta: StoreMeta) -> bool:
    """Whether every row of the store can be read straight from the file (uncompressed, all chunks stored)."""
    if meta.encoded:  # rows of every length, placed by the reader thread (see read/encoded.py)
        return False
    def readable(f: h5py.File) -> bool:
        return chunk_offsets(f[schema.IMAGES], meta.rows, meta.block_rows, path) is not None

    return read_consistent(path, readable, rdcc_nbytes=0, remote=meta.remote)


def band_bytes(chunks: tuple[int, ...] | None, shape: tuple[int, ...], itemsize: int) -> int:
    """Bytes of the chunks that rows ``[k * chunks[0], (k + 1) * chunks[0])`` lie in, a *band*: 0 where a chunk
    holds whole rows (pure).

    h5py's ``chunks=True`` cuts every image into pieces that each span many rows (``(250, 16, 16, 1)`` for
    128x128x3 images): reading any one row then means reading its whole band, and reading it through HDF5
    without a cache that holds the band reads byte by byte.
    """
    if chunks is None or tuple(chunks[1:]) == tuple(shape[1:]):
        return 0
    per_band = 1
    for size, chunk in zip(shape[1:], chunks[1:]):
        per_band *= -(-int(size) // int(chunk))
    return per_band * int(np.prod(chunks, dtype=np.int64)) * int(itemsize)


def chunk_cache(chunks: tuple[int, ...] | None, shape: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """``(bytes, slots)`` of the HDF5 chunk cache that reads a band (:func:`band_bytes`) once, not byte by byte;
    ``(0, 0)``: no cache needed (pure)."""
    band = band_bytes(chunks, shape, itemsize)
    if not band:
        return 0, 0
    n_chunks = band // (int(np.prod(chunks, dtype=np.int64)) * int(itemsize))
    slots = 20 * n_chunks + 1  # HDF5 hashes chunks into slots: a prime well above the chunk count avoids evictions
    while any(slots % d == 0 for d in range(2, int(slots ** 0.5) + 1)):
        slots += 2
    return band + band // 4, slots  # a cache filled to the last byte evicts: HDF5 counts more than the chunks


def check_chunks(meta: StoreMeta) -> int:
    """The bytes of the HDF5 chunk cache the reader will hold for the store ``meta`` (:func:`chunk_cache`; 0 for
    a store whose chunks hold whole images, as h5stream lays them out).  Refuses, in one line that says how to
    fix it, a store whose image chunks only stream by reading far more than the rows asked for: chunks that
    split images into bands larger than :data:`BAND_CACHE_MAX_BYTES`."""
    def shape_of(f: h5py.File):
        images = f[schema.IMAGES]
        return images.chunks, images.shape, images.dtype.itemsize

    chunks, shape, itemsize = read_consistent(meta.path, shape_of, rdcc_nbytes=0, remote=meta.remote)
    band = band_bytes(chunks, shape, itemsize)
    if band > BAND_CACHE_MAX_BYTES:
        whole = "x".join(str(d) for d in (meta.block_rows, *shape[1:]))
        raise StoreFormatError(
            f"{meta.path}: /{schema.IMAGES} is stored in chunks of {chunks}, which cut every image into pieces "
            f"spanning {chunks[0]} images, so reading one image reads {band / 2**20:.0f} MiB; store whole images "
            f"per chunk: `h5repack -l {schema.IMAGES}:CHUNK={whole} IN.h5 OUT.h5`, or ingest the images again "
            "with `h5stream ingest`"
        )
    return chunk_cache(chunks, shape, itemsize)[0]


def images_dataset(f: h5py.File) -> h5py.Dataset:
    """``/images`` of ``f`` with the chunk cache :func:`chunk_cache` asks for (the file's own, none, otherwise)."""
    images = f[schema.IMAGES]
    nbytes, slots = chunk_cache(images.chunks, images.shape, images.dtype.itemsize)
    if not nbytes:
        return images
    del images  # HDF5 hands out the dataset already open, with its cache, to a second open: close it first
    dapl = h5py.h5p.create(h5py.h5p.DATASET_ACCESS)
    dapl.set_chunk_cache(slots, nbytes, 1.0)  # w0=1: a chunk read whole is evicted first
    return h5py.Dataset(h5py.h5d.open(f.id, schema.IMAGES.encode(), dapl=dapl))


def _locations(f: h5py.File, meta: StoreMeta, cache_labels: bool, digests: bool = False) -> Locations:
    images, labels = f[schema.IMAGES], f[schema.LABELS]
    encoded = offsets = None
    if meta.encoded:  # rows of every length, by byte offset where they can be (read/encbytes.py)
        from h5stream.read.encbytes import locate_encoded

        encoded = locate_encoded(f, meta.rows, meta.path, chunk_offsets)
    else:
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
    row_chunks = None
    if trusted is not None and schema.ROW_DIGESTS in f and f[schema.ROW_DIGESTS].shape[0] >= meta.rows:
        node = f[schema.ROW_DIGESTS]
        found = chunk_offsets(node, meta.rows, node.chunks[0], meta.path) if node.chunks else None
        row_chunks = None if found is None else (found, node.chunks[0])
    return Locations(offsets, label_chunks, all_labels, trusted, encoded, row_chunks)


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
