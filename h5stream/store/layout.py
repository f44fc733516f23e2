"""How a new store's file is laid out: file-space pages, chunk-index fanout, label chunk size.

Three choices made when a store is created, each for one reader:

* **Pages** (HDF5's paged file-space strategy, :data:`PAGE_BYTES`): every chunk of at least a page starts on a
  page boundary, so a direct (``O_DIRECT``) read of whole rows can land straight in the batches.
* **Chunk-index fanout** (HDF5's ``istore_k``, :data:`INDEX_K`): the B-tree that maps chunks to file offsets
  gets nodes of up to ``2 * INDEX_K`` chunks instead of 64.  HDF5 writes a node where the chunks it indexes
  lie, so finding every chunk reads one node per node's worth of chunks: over a network, one request per 64
  chunks with the default, one per 2,048 here.
* **Label chunks** of about :data:`LABEL_CHUNK_BYTES`: reading every label (the stream keeps them in memory)
  costs one read per label chunk, and those lie between the pixel chunks.
* **Pixel chunks allocated when the array grows** (HDF5's early allocation, never filled), for the writer: the
  file offset of a whole block is known before a byte of it is written, so the writer writes it there itself
  (:mod:`h5stream.store.rawchunks`) instead of copying it through HDF5 and the page cache.  Only uncompressed
  ``/images`` (a compressed chunk's size is known only once it is compressed).

All four are plain HDF5 (1.10 or later reads the pages); h5py, PyTables and ``h5dump`` read the file as any
other.  PyTables cannot set the first two nor the allocation time, so :func:`create_empty_file` makes the empty
file with h5py, :func:`create_images_allocated_early` adds an uncompressed ``/images`` with h5py (with the
attributes PyTables gives an extendable array, so PyTables opens it as one), and the writer adds the other arrays
with PyTables.  Where h5py's HDF5 library cannot be reached to set the fanout (an h5py not installed from its
wheel), the file keeps HDF5's default fanout and is otherwise the same.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os

import h5py
import numpy as np

PAGE_BYTES = 4096
"""File-space page: chunks of at least this size start on a multiple of it."""

INDEX_K = 1024
"""Half the most chunks one node of the chunk index holds (HDF5's default: 32)."""

LABEL_CHUNK_BYTES = 512 << 10
"""Target size of a ``/labels`` chunk."""

EARLY_PIXEL_CHUNKS = True
"""Whether a new uncompressed store's ``/images`` chunks are allocated as the array grows (stores made by
earlier versions have them allocated as written; tests make one by setting this False)."""


MAX_CHUNK_BYTES = (1 << 32) - 1
"""HDF5 refuses a chunk of 4 GiB or more (and of 2**32 elements or more)."""


def block_rows_refusal(block_rows: int, image_shape: tuple[int, int, int], label_row_bytes: int) -> str | None:
    """Why ``block_rows`` rows a block cannot be a store's chunk (pure): a block of pixels, of labels
    (``label_row_bytes`` a row) or of 8-byte row digests of :data:`MAX_CHUNK_BYTES` or more; None when it can."""
    h, w, c = image_shape
    widest = max(h * w * c, int(label_row_bytes), 8)
    if block_rows * widest <= MAX_CHUNK_BYTES:
        return None
    return (f"{block_rows:,} rows a block of {h}x{w}x{c} images make chunks of {block_rows * widest:,} bytes, and "
            f"HDF5 keeps a chunk under 4 GiB: give at most {MAX_CHUNK_BYTES // widest:,} rows a block (--block-rows, "
            "block_rows=), or leave it to the default (blocks of 4 MiB)")


def label_chunk_rows(label_row_bytes: int, block_rows: int) -> int:
    """Rows per ``/labels`` chunk: about :data:`LABEL_CHUNK_BYTES`, at least 1,024 rows and one image block."""
    return max(1024, int(block_rows), LABEL_CHUNK_BYTES // max(1, int(label_row_bytes)))


def index_node_bytes(rank: int, k: int = INDEX_K) -> int:
    """File space of one node of the chunk index of a ``rank``-dimensional array: HDF5's version-1 B-tree
    nodes are allocated whole (a 24-byte header, ``2k`` child addresses, ``2k + 1`` keys of a chunk size, a
    filter mask and ``rank + 1`` offsets)."""
    return 24 + 2 * k * 8 + (2 * k + 1) * (8 + 8 * (int(rank) + 1))


def create_empty_file(path: str) -> None:
    """A new, empty HDF5 file at ``path`` with pages of :data:`PAGE_BYTES` and a chunk-index fanout of
    :data:`INDEX_K` (where it can be set).  Created exclusively (``O_CREAT | O_EXCL``): anything at ``path``,
    a link included, fails it, and nothing is written there.  Raises what h5py raises on failure: OSError
    (FileExistsError when something is at ``path``), or RuntimeError for a close that could not write."""
    fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE)
    fcpl.set_file_space_strategy(h5py.h5f.FSPACE_STRATEGY_PAGE, False, 1)
    fcpl.set_file_space_page_size(PAGE_BYTES)
    set_index_k(fcpl, INDEX_K)
    h5py.h5f.create(os.fsencode(path), h5py.h5f.ACC_EXCL, fcpl=fcpl).close()


def create_images_allocated_early(path: str, name: str, image_shape: tuple[int, ...], block_rows: int) -> None:
    """Add an empty uint8 array ``name`` of rows ``image_shape`` to the HDF5 file at ``path``: extendable along
    its first axis, chunks of ``block_rows`` rows, allocated as soon as the array grows over them and never
    filled by HDF5.  PyTables opens it as an ``EArray``.  Raises what h5py raises on failure."""
    shape = tuple(int(d) for d in image_shape)
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_chunk((int(block_rows), *shape))
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    space = h5py.h5s.create_simple((0, *shape), (h5py.h5s.UNLIMITED, *shape))
    with h5py.File(path, "a") as f:
        dataset = h5py.Dataset(h5py.h5d.create(f.id, name.encode(), h5py.h5t.NATIVE_UINT8, space, dcpl=dcpl))
        for key, value in _EARRAY_ATTRS.items():
            dataset.attrs[key] = value


#: What PyTables writes on an extendable array it creates (and reads to know one).
_EARRAY_ATTRS = {"CLASS": np.bytes_(b"EARRAY"), "EXTDIM": np.int32(0), "TITLE": np.bytes_(b""),
                 "VERSION": np.bytes_(b"1.1")}


def set_index_k(fcpl, k: int) -> bool:
    """Set the chunk-index fanout on h5py's file-creation property list ``fcpl``; False where h5py's HDF5
    library is not found (h5py does not wrap ``H5Pset_istore_k``)."""
    lib = _h5py_hdf5()
    if lib is None:
        return False
    from h5py._objects import phil  # h5py's lock around every HDF5 call: another thread may be in the library

    with phil:
        return lib.H5Pset_istore_k(ctypes.c_int64(fcpl.id), ctypes.c_uint(k)) >= 0


@functools.cache
def _h5py_hdf5():
    """The HDF5 library h5py's wheel ships (``h5py.libs/libhdf5-*.so*``), loaded once; None elsewhere."""
    found = glob.glob(os.path.join(os.path.dirname(os.path.dirname(h5py.__file__)), "h5py.libs", "libhdf5-*.so*"))
    if len(found) != 1:
        return None
    try:
        lib = ctypes.CDLL(found[0])  # already loaded by h5py: the same library, the same ids
        lib.H5Pset_istore_k.restype = ctypes.c_int
        lib.H5Pset_istore_k.argtypes = [ctypes.c_int64, ctypes.c_uint]
    except (OSError, AttributeError):
        return None
    return lib
