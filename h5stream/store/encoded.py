"""Encoded (JPEG) rows: how a store keeps variable-length rows, and what reads, hashes and truncates them.

An encoded store keeps each image's encoded bytes (a JPEG file's bytes) instead of its pixels::

    /image_bytes  EArray uint8 (T,), chunks of ENCODED_CHUNK_BYTES: every row's bytes, concatenated in row order
    /image_ends   EArray int64 (N,): row i's bytes are image_bytes[ends[i-1]:ends[i]] (ends[-1] taken as 0)
    /images       EArray uint8 (0, H, W, C), chunked (block_rows, H, W, C): no rows, only the decoded shape

and the root attributes ``image_encoding`` ("jpeg"), ``jpeg_quality`` and ``encoded_committed_rows`` (the
``committed_rows`` of a raw store, named otherwise so that an h5stream that predates encoded rows reads the store
as an empty one up to its format version and refuses it with its "upgrade h5stream" line, instead of calling it
damaged).  A block's rows are one contiguous byte range, read in one piece (plain h5py:
``f["image_bytes"][start:stop]``).  Concatenated bytes and an ends array read as fast as HDF5's variable-length
uint8 (20.7 ms against 18.1 ms for 4,096 rows of 4-8 KB, 256 rows a read, warm, h5py) but also by byte offset
(a ranged request, a ``pread``) and without an object array per read.

Block digests (:mod:`h5stream.store.checksum`) of an encoded store take, for the image part, every row's length
(int64, little-endian) followed by its bytes, row after row: the bytes and the boundaries between rows are both
covered, and the digest does not depend on how rows were grouped when they were appended.

:class:`EncodedRows` is a group of rows in memory (pure); :class:`EncodedArray` looks like the ``/images`` array
to the code that reads, hashes and truncates rows (a PyTables node's ``read``/``nrows``/``truncate`` and an h5py
dataset's ``[a:b]``/``shape``), over either library.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from h5stream.store import schema

ENCODED_CHUNK_BYTES = 1 << 20
"""Chunk of ``/image_bytes``: large sequential reads, and at most a chunk read past a block's end."""

ENDS_CHUNK_ROWS = 1 << 16
"""Chunk of ``/image_ends`` (512 KiB)."""


class EncodedRows:
    """Encoded rows in memory: ``data`` (uint8, every row's bytes concatenated) and ``ends`` (int64, row i ends at
    ``ends[i]`` in ``data``, starting at ``ends[i-1]`` or 0).  Pure; a slice is a view.  ``np.asarray`` of it
    gives the bytes its block digest is taken over (see the module docstring)."""

    encoded_rows = True  # what the checksum hasher recognises instead of an array of pixels

    def __init__(self, data, ends):
        self.data = np.asarray(data, dtype=np.uint8).reshape(-1)
        self.ends = np.asarray(ends, dtype=np.int64).reshape(-1)
        self._base = 0  # ends are relative to data[0] minus this

    @classmethod
    def from_bytes(cls, rows: Sequence) -> EncodedRows:
        """Rows from a sequence of bytes-like objects (one per row)."""
        arrays = [np.frombuffer(r, dtype=np.uint8) if not isinstance(r, np.ndarray) else r.reshape(-1).view(np.uint8)
                  for r in rows]
        ends = np.cumsum([len(a) for a in arrays], dtype=np.int64)
        data = np.concatenate(arrays) if arrays else np.empty(0, np.uint8)
        return cls(data, ends)

    def __len__(self) -> int:
        return len(self.ends)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.ends, prepend=self._base)

    def row(self, i: int) -> np.ndarray:
        """Row ``i``'s bytes (a view)."""
        start = int(self.ends[i - 1]) if i else self._base
        return self.data[start - self._base:int(self.ends[i]) - self._base]

    def __getitem__(self, key) -> EncodedRows:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("EncodedRows takes a slice of rows")
        a, b, _ = key.indices(len(self))
        b = max(a, b)
        start = int(self.ends[a - 1]) if a else self._base
        stop = int(self.ends[b - 1]) if b else self._base
        out = EncodedRows.__new__(EncodedRows)
        out.data = self.data[start - self._base:stop - self._base]
        out.ends = self.ends[a:b]
        out._base = start
        return out

    def __array__(self, dtype=None, copy=None):
        lengths = self.lengths.astype("<i8")
        pieces = []
        for i, n in enumerate(lengths):
            pieces.append(np.frombuffer(n.tobytes(), np.uint8))
            pieces.append(self.row(i))
        out = np.concatenate(pieces) if pieces else np.empty(0, np.uint8)
        return out if dtype is None else out.astype(dtype)


def is_encoded(attrs) -> bool:
    """Whether root attributes ``attrs`` (h5py's or PyTables') describe an encoded store."""
    return encoding_of(attrs) != schema.ENCODING_RAW


def encoding_of(attrs) -> str:
    """The ``image_encoding`` of root attributes ``attrs`` ("raw" when absent)."""
    if schema.ATTR_ENCODING not in attrs:
        return schema.ENCODING_RAW
    value = attrs[schema.ATTR_ENCODING]
    if isinstance(value, np.ndarray):
        value = value.reshape(()).item() if value.size == 1 else value
    if isinstance(value, np.generic):
        value = value.item()
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def committed_attr(attrs) -> str:
    """The name of the attribute that holds the committed row count of the store with root attributes ``attrs``."""
    return schema.ATTR_ENCODED_COMMITTED if is_encoded(attrs) else schema.ATTR_COMMITTED


class EncodedArray:
    """``/image_bytes`` and ``/image_ends`` of an open store seen as one array of rows, in place of ``/images``:
    ``nrows``/``shape[0]`` (rows with ends), ``read(start, stop)`` and ``[start:stop]`` (an :class:`EncodedRows`),
    ``truncate(n)`` and ``append(rows)`` (PyTables).  ``data``/``ends``: PyTables nodes or h5py datasets.  Used by
    the thread that owns the file."""

    def __init__(self, data, ends):
        self.data, self.ends = data, ends

    @classmethod
    def of(cls, f) -> EncodedArray:
        """The encoded rows of ``f``: a ``tables.File`` or an ``h5py.File``."""
        root = getattr(f, "root", None)
        if root is not None:
            return cls(root._f_get_child(schema.IMAGE_BYTES), root._f_get_child(schema.IMAGE_ENDS))
        return cls(f[schema.IMAGE_BYTES], f[schema.IMAGE_ENDS])

    @property
    def nrows(self) -> int:
        return int(self.ends.shape[0])

    @property
    def shape(self) -> tuple[int]:
        return (self.nrows,)

    def byte_range(self, start: int, stop: int) -> tuple[int, int]:
        """Where rows ``[start, stop)`` lie in ``/image_bytes``."""
        if stop <= start:
            return 0, 0
        ends = self.ends[max(0, start - 1):stop]
        return (int(ends[0]) if start else 0), int(ends[-1])

    def read(self, start: int, stop: int) -> EncodedRows:
        stop = min(stop, self.nrows)
        start = min(start, stop)
        ends = np.asarray(self.ends[max(0, start - 1):stop], dtype=np.int64)
        first = int(ends[0]) if start and len(ends) else 0
        ends = ends[1:] if start else ends
        data = np.asarray(self.data[first:int(ends[-1])] if len(ends) else np.empty(0, np.uint8), dtype=np.uint8)
        rows = EncodedRows(data, ends)
        rows._base = first
        return rows

    def __getitem__(self, key) -> EncodedRows:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("encoded rows are read by a slice of rows")
        a, b, _ = key.indices(self.nrows)
        return self.read(a, max(a, b))

    def append(self, rows: EncodedRows) -> None:
        """Append ``rows``: their bytes first, then their ends (PyTables)."""
        base = int(self.ends[-1]) if self.nrows else 0
        self.data.append(rows.data)
        self.ends.append(rows.ends - rows._base + base)

    def truncate(self, n: int) -> None:
        """Keep rows ``[0, n)``: the ends, then the bytes past the last kept row (PyTables)."""
        end = int(self.ends[n - 1]) if n else 0
        if self.ends.nrows > n:
            self.ends.truncate(n)
        if self.data.nrows > end:
            self.data.truncate(end)

    @property
    def stored_bytes(self) -> int:
        return int(self.data.shape[0])


def largest_block_bytes(ends: np.ndarray, first_row: int, block_rows: int, before: int = 0) -> int:
    """The most bytes any block of rows takes among the blocks rows ``first_row..first_row + len(ends) - 1`` touch,
    from those rows' ``ends`` and the end of the row before ``first_row`` (``before``; 0 for row 0).  Pure."""
    if not len(ends):
        return 0
    rows = np.arange(first_row, first_row + len(ends))
    starts = np.concatenate([[before], ends[:-1]])
    block = rows // block_rows
    # Rows of the first block before first_row are not here: its bytes from first_row on count (a lower bound
    # the writer raises with the block's earlier rows, see StoreWriter.commit).
    sizes = np.bincount(block - block[0], weights=(ends - starts).astype(np.float64))
    return int(sizes.max())


def create_nodes(h5file, expected_rows: int) -> None:
    """Add empty ``/image_bytes`` and ``/image_ends`` to a new store (a ``tables.File``)."""
    import tables

    h5file.create_earray(h5file.root, schema.IMAGE_BYTES, tables.UInt8Atom(), shape=(0,),
                         chunkshape=(ENCODED_CHUNK_BYTES,), expectedrows=max(1, expected_rows) * 8192)
    h5file.create_earray(h5file.root, schema.IMAGE_ENDS, tables.Int64Atom(), shape=(0,),
                         chunkshape=(ENDS_CHUNK_ROWS,), expectedrows=expected_rows)


def image_rows(f):
    """What holds the image rows of the open store ``f`` (``tables.File`` or ``h5py.File``): ``/images``, or an
    :class:`EncodedArray` for an encoded store."""
    root = getattr(f, "root", None)
    attrs = root._v_attrs if root is not None else f.attrs
    if is_encoded(attrs):
        return EncodedArray.of(f)
    return root._f_get_child(schema.IMAGES) if root is not None else f[schema.IMAGES]
