"""Source paths of variable length: ``/path_bytes`` and ``/path_ends``, and the fixed-width ``/paths`` before them.

A store written since format version 2 keeps each row's path (its bytes as :func:`~h5stream.store.schema.encode_path`
gives them, any length) in two arrays that plain h5py reads::

    /path_bytes  EArray uint8 (total bytes,): every row's path, joined without separator
    /path_ends   EArray int64 (N,): where row i's bytes end in /path_bytes (they start at row i - 1's end, or 0)

    ends = f["path_ends"][:n]; data = f["path_bytes"][:ends[-1]].tobytes()
    paths = [data[a:b].decode("utf-8", "surrogateescape") for a, b in zip([0, *ends[:-1]], ends)]

A path costs its bytes and 8 more.  Neither array is compressed: a commit rewrites the last, partly filled chunk
of each, and a writer killed during that write must leave the committed rows' bytes as they were, which an
uncompressed chunk does (the same bytes are written over them) and a compressed one, written whole elsewhere, does
not (zlib on the ends, about a byte a row, failed exactly so under SIGKILL at every write step); and a changed byte
makes exactly its block's paths fail their checksum, where a compressed chunk would fail to read whole.  An older
store has
``/paths`` of fixed-size 512-byte strings instead; the layout is told by which array the file holds
(:func:`is_vlen`), not by its format version, and an append keeps the layout a store has.

:class:`PathRows` is rows of the new layout in memory (lengths and joined bytes); the checksum of its
rows (:class:`PathHasher`) is the xxh3-64 of two xxh3-64 digests, of the rows' lengths (int64, little-endian) and
of their joined bytes, so a changed byte of either array changes it, and rows can be hashed in any grouping.
"""

from __future__ import annotations

import struct

import numpy as np
import xxhash

from h5stream.errors import ConfigError
from h5stream.store import schema

#: Rows of ``/path_ends`` and bytes of ``/path_bytes`` per HDF5 chunk, 16 KiB each (the last chunk is allocated
#: whole: a small one keeps a small store's paths small).
ENDS_CHUNK_ROWS = 2048
BYTES_CHUNK = 16384


def is_vlen(group) -> bool:
    """Whether the store (an open h5py file or a PyTables root group) keeps its paths variable-length."""
    return schema.PATH_ENDS in group


def row_node(group) -> str:
    """The name of the array with a row per stored row's path: ``path_ends`` or the fixed-width ``paths``."""
    return schema.PATH_ENDS if is_vlen(group) else schema.PATHS


#: 10, 100, ..., 10**18: a non-negative int64 has one more digit than the number of these it reaches.
_POWERS_OF_TEN = np.array([10 ** k for k in range(1, 19)], np.int64)


class PathRows:
    """Paths of consecutive rows of the variable-length layout: ``lengths`` (int64, one per row) and ``data``
    (uint8, their bytes joined).  A damaged store's lengths may not add up to ``data``: the rows' bytes are
    then cut to what there is, and their digest (which hashes the lengths as stored) tells the damage."""

    __slots__ = ("lengths", "data", "_starts")

    def __init__(self, lengths, data):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.data = np.asarray(data, dtype=np.uint8)
        starts = np.concatenate((np.zeros(1, np.int64), np.cumsum(self.lengths, dtype=np.int64)))
        self._starts = np.clip(np.maximum.accumulate(starts), 0, len(self.data))

    @classmethod
    def from_bytes(cls, raw) -> PathRows:
        """Rows holding the byte strings ``raw`` (each one row's encoded path)."""
        raw = list(raw)
        return cls(np.fromiter(map(len, raw), np.int64, len(raw)), np.frombuffer(b"".join(raw), np.uint8))

    @classmethod
    def from_indices(cls, indices) -> PathRows:
        """Rows whose paths are the decimal numbers ``indices`` (ints >= 0): the same rows as
        ``from_bytes(str(i).encode() for i in indices)``, made without a step per row (a Python writer's rows
        from arrays, whose path is the item's source index)."""
        values = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(values) and int(values.min()) < 0:
            raise ValueError(f"indices must be >= 0, got {int(values.min())}")
        lengths = np.searchsorted(_POWERS_OF_TEN, values, side="right") + 1
        width = int(lengths.max(initial=1))
        digits = np.empty((len(values), width), np.uint8)
        # uint32 where the values fit: numpy divides it by a constant 3x faster than int64
        rest = values.astype(np.uint32 if width <= 9 else np.uint64)
        for column in range(width - 1, -1, -1):  # digits right-aligned in rows of ``width``
            quotient = rest // 10
            digits[:, column] = rest - quotient * 10
            rest = quotient
        digits += ord("0")
        used = np.arange(width) >= width - lengths[:, None]
        return cls(lengths, digits[used])

    @classmethod
    def from_ends(cls, ends, data, base: int) -> PathRows:
        """Rows whose ``/path_ends`` are ``ends`` and whose bytes ``data`` start at offset ``base``."""
        ends = np.asarray(ends, dtype=np.int64)
        return cls(np.diff(ends, prepend=np.int64(base)), data)

    @classmethod
    def concat(cls, parts) -> PathRows:
        parts = list(parts)
        return cls(np.concatenate([p.lengths for p in parts]), np.concatenate([p.data for p in parts]))

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, key) -> PathRows:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("PathRows takes a slice of rows with step 1")
        start, stop, _ = key.indices(len(self.lengths))
        stop = max(start, stop)
        return PathRows(self.lengths[start:stop], self.data[self._starts[start]:self._starts[stop]])

    def to_bytes(self) -> list[bytes]:
        """Each row's stored bytes, in order."""
        data, starts = self.data.tobytes(), self._starts.tolist()
        return [data[a:b] for a, b in zip(starts[:-1], starts[1:])]


class PathHasher:
    """A running digest of :class:`PathRows` (``update``, ``intdigest``, ``reset``, as an ``xxhash.xxh3_64``)."""

    def __init__(self):
        self._lengths, self._bytes = xxhash.xxh3_64(), xxhash.xxh3_64()

    def update(self, rows: PathRows) -> None:
        self._lengths.update(np.ascontiguousarray(rows.lengths, dtype="<i8"))
        self._bytes.update(rows.data)

    def intdigest(self) -> int:
        return xxhash.xxh3_64_intdigest(struct.pack("<QQ", self._lengths.intdigest(), self._bytes.intdigest()))

    def reset(self) -> None:
        self._lengths.reset()
        self._bytes.reset()


def digest(rows: PathRows) -> int:
    h = PathHasher()
    h.update(rows)
    return h.intdigest()


def _bounds(ends_before: int, ends: np.ndarray, nbytes: int) -> tuple[int, int]:
    """The byte range of ``/path_bytes`` (``nbytes`` long) that rows with ``ends`` (after ``ends_before``) take,
    cut to the array: damaged ends then read what there is."""
    lo = min(max(0, ends_before), nbytes)
    hi = min(max(lo, int(ends[-1]) if len(ends) else lo), nbytes)
    return lo, hi


def read_h5py(f, start: int, stop: int) -> PathRows:
    """Rows ``start..stop-1`` of the variable-length layout from open h5py file ``f``."""
    ends_ds, bytes_ds = f[schema.PATH_ENDS], f[schema.PATH_BYTES_NODE]
    got = ends_ds[max(0, start - 1):stop]
    before, ends = (int(got[0]), got[1:]) if start > 0 else (0, got)
    lo, hi = _bounds(before, ends, bytes_ds.shape[0])
    return PathRows.from_ends(ends, bytes_ds[lo:hi] if hi > lo else np.empty(0, np.uint8), before)


def read_tables(root, start: int, stop: int) -> PathRows:
    """The same from a PyTables root group."""
    ends_arr, bytes_arr = root._f_get_child(schema.PATH_ENDS), root._f_get_child(schema.PATH_BYTES_NODE)
    got = ends_arr.read(max(0, start - 1), stop)
    before, ends = (int(got[0]), got[1:]) if start > 0 else (0, got)
    lo, hi = _bounds(before, ends, int(bytes_arr.nrows))
    return PathRows.from_ends(ends, bytes_arr.read(lo, hi) if hi > lo else np.empty(0, np.uint8), before)


def stored_bytes(f, start: int, stop: int) -> list[bytes]:
    """Rows ``start..stop-1`` of an open h5py file's paths as stored bytes, in either layout."""
    if is_vlen(f):
        return read_h5py(f, start, stop).to_bytes()
    return [bytes(p) for p in f[schema.PATHS][start:stop]]


# -- the writer's side (PyTables) ------------------------------------------------------


def create_nodes(h5file, expected_rows: int) -> None:
    """Add the empty ``/path_bytes`` and ``/path_ends`` to a new store (a ``tables.File``)."""
    import tables

    h5file.create_earray(h5file.root, schema.PATH_BYTES_NODE, tables.UInt8Atom(), shape=(0,),
                         chunkshape=(BYTES_CHUNK,), expectedrows=max(1, expected_rows) * 64)
    h5file.create_earray(h5file.root, schema.PATH_ENDS, tables.Int64Atom(), shape=(0,),
                         chunkshape=(ENDS_CHUNK_ROWS,), expectedrows=expected_rows)


def truncate(root, rows: int) -> None:
    """Cut the variable-length paths of PyTables root ``root`` to their first ``rows`` rows (and those rows' bytes)."""
    ends_arr, bytes_arr = root._f_get_child(schema.PATH_ENDS), root._f_get_child(schema.PATH_BYTES_NODE)
    if ends_arr.nrows > rows:
        ends_arr.truncate(rows)
    keep = int(ends_arr.read(rows - 1, rows)[0]) if rows else 0
    if bytes_arr.nrows > keep:
        bytes_arr.truncate(keep)


def stored(paths, vlen: bool):
    """``paths`` (strings, or a :class:`PathRows`) as a store keeps them (pure): a :class:`PathRows` (any length)
    where ``vlen``, else a format-1 store's fixed-width array (ConfigError for a path too long for it)."""
    if isinstance(paths, PathRows):
        if vlen:
            return paths
        paths = [schema.decode_path(b) for b in paths.to_bytes()]
    raw = schema.encode_paths(paths)
    if vlen:
        return PathRows.from_bytes(raw)
    if max(map(len, raw), default=0) > schema.PATH_BYTES:
        too_long = next(p for p, b in zip(paths, raw) if len(b) > schema.PATH_BYTES)
        raise ConfigError(f"path {too_long!r} is longer than {schema.PATH_BYTES} bytes, the most this "
                          "store's fixed-width /paths holds (a new store has no limit)")
    return np.array(raw, dtype=f"S{schema.PATH_BYTES}")
