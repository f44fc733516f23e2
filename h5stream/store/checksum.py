"""Block checksums: what they cover, how a writer records them, how :func:`verify_store` checks them.

A *block* is ``block_rows`` consecutive rows, the HDF5 chunk of ``/images``.
Each block has three xxh3-64 digests: of its image bytes (C order), of its
labels (little-endian, in the store's label dtype) and of its paths (the
fixed-size bytes of ``/paths``).  Complete blocks have a row each in
``/checksums`` (uint64, columns :data:`PARTS`); the last block, while partial,
changes whenever rows are appended, so its digests live in the root attribute
``checksum_tail`` together with the row count they were computed for (see
:mod:`h5stream.store.schema`).  Plain h5py reads both.

Trust follows the ``committed_rows`` protocol: row ``b`` of ``/checksums`` is
used only when block ``b`` lies wholly below ``committed_rows``, and the tail
only when its row count equals ``committed_rows``.  Anything else is left over
by a crash; :func:`resume` (called when a writer opens the store) drops it and
recomputes the partial block from the committed rows.

:class:`BlockHasher` is the pure part (bytes in, digests out, no I/O);
:func:`create_nodes`, :func:`resume` and :func:`stage` are what
:class:`~h5stream.store.writer.StoreWriter` calls; :func:`verify_store` is
what ``h5stream verify`` runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import xxhash

from h5stream.errors import StoreFormatError
from h5stream.store import schema
from h5stream.store.meta import read_meta

# xxh3-64: the fastest of the well-kept hashes (xxhash, crc32c, google-crc32c, zlib.crc32), and it releases the GIL.
ALGORITHM = "xxh3_64"
PARTS = ("images", "labels", "paths")
"""Column order of ``/checksums`` and keys of ``checksum_tail``."""

VERIFY_SLICE_BYTES = 64 << 20
"""Bytes (images + labels + paths) :func:`verify_store` reads per slice: large sequential reads."""

Digests = tuple[int, int, int]


def _contiguous(a) -> np.ndarray:
    """``a`` as C-contiguous little-endian bytes: what a digest is taken over, whatever the machine."""
    a = np.asarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return np.ascontiguousarray(a)


def digest(a) -> int:
    """xxh3-64 of the array's bytes (C order, little-endian), as an unsigned int."""
    return xxhash.xxh3_64_intdigest(_contiguous(a))


def block_digests(images, labels, paths) -> Digests:
    """The three digests of one block's rows (images, labels, paths)."""
    return digest(images), digest(labels), digest(paths)


class BlockHasher:
    """Running digests of the rows appended to a store, block by block.  Pure: no I/O.

    ``rows`` is the store's row count so far (the index of the next row).
    :meth:`add` takes rows in any grouping; digests of blocks it completes
    wait in :meth:`take_complete`; :meth:`tail` is the partial block's.
    """

    def __init__(self, block_rows: int, rows: int = 0):
        if block_rows < 1:
            raise ValueError(f"block_rows must be >= 1, got {block_rows}")
        if rows % block_rows:
            raise ValueError(f"a hasher starts on a block boundary; {rows} is not a multiple of {block_rows}")
        self.block_rows = int(block_rows)
        self.rows = int(rows)
        self._open = [xxhash.xxh3_64() for _ in PARTS]
        self._complete: list[Digests] = []

    def add(self, images, labels, paths, image_digests=()) -> None:
        """Hash ``n`` more rows: ``images`` (n, H, W, C), ``labels`` (n, ...), ``paths`` (n,) as stored.

        ``image_digests`` (optional) are :func:`digest` of ``images[j * block_rows:(j + 1) * block_rows]``
        for j = 0, 1, ..., computed elsewhere (where the rows were decoded): a whole block that starts at
        ``images[0]`` on a block boundary takes its image digest from there instead of hashing its pixels again.
        """
        parts = [np.asarray(images), np.asarray(labels), np.asarray(paths)]
        n = len(parts[0])
        if any(len(p) != n for p in parts):
            raise ValueError(f"images, labels and paths differ in length: {[len(p) for p in parts]}")
        b = self.block_rows
        given = len(image_digests) if self.rows % b == 0 else 0  # usable only from a block boundary
        i = 0
        while i < n:
            k = min(n - i, b - self.rows % b)
            known = k == b and i // b < given
            for h, part in zip(self._open[1:] if known else self._open, parts[1:] if known else parts):
                h.update(_contiguous(part[i:i + k]))
            self.rows += k
            if self.rows % b == 0:
                done = [h.intdigest() for h in self._open]
                if known:
                    done[0] = int(image_digests[i // b])
                self._complete.append(tuple(done))
                for h in self._open:
                    h.reset()
            i += k

    @property
    def pending_blocks(self) -> int:
        """Blocks completed and not yet taken by :meth:`take_complete`."""
        return len(self._complete)

    def take_complete(self) -> list[Digests]:
        """Digests of the blocks completed since the last call, in order (and forget them)."""
        done, self._complete = self._complete, []
        return done

    def tail(self) -> Digests | None:
        """Digests of the partial last block so far; ``None`` when ``rows`` is a multiple of ``block_rows``."""
        if self.rows % self.block_rows == 0:
            return None
        return tuple(h.intdigest() for h in self._open)


def tail_to_json(rows: int, digests: Digests | None) -> str:
    """The ``checksum_tail`` attribute: the row count and, for a partial block, its digests in hex."""
    value: dict = {"rows": int(rows)}
    if digests is not None:
        value.update({name: f"{d:016x}" for name, d in zip(PARTS, digests)})
    return json.dumps(value)


def tail_from_json(text) -> tuple[int, Digests | None] | None:
    """Parse ``checksum_tail``; ``None`` when it is missing or unreadable (the tail then counts as unchecked)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    try:
        value = json.loads(str(text))
        rows = int(value["rows"])
        digests = tuple(int(value[name], 16) for name in PARTS) if PARTS[0] in value else None
    except (TypeError, ValueError, KeyError):
        return None
    return rows, digests


# -- the writer's side (PyTables) ------------------------------------------------------


def create_nodes(h5file) -> None:
    """Add an empty ``/checksums`` and the checksum attributes to a new store (a ``tables.File``)."""
    import tables

    h5file.create_earray(h5file.root, schema.CHECKSUMS, tables.UInt64Atom(), shape=(0, len(PARTS)),
                         chunkshape=(1024, len(PARTS)))
    attrs = h5file.root._v_attrs
    attrs[schema.ATTR_CHECKSUM] = ALGORITHM
    attrs[schema.ATTR_CHECKSUM_TAIL] = tail_to_json(0, None)


def resume(h5file, committed_rows: int) -> BlockHasher | None:
    """The hasher for rows appended after ``committed_rows``; ``None`` for a store without checksums.

    Drops rows of ``/checksums`` that are not wholly below ``committed_rows``
    (a crash's leftovers) and re-reads the committed rows of the last, partial
    block (and of any complete block missing its row) to hash them again.
    """
    root = h5file.root
    if schema.CHECKSUMS not in root:
        return None
    algorithm = root._v_attrs[schema.ATTR_CHECKSUM] if schema.ATTR_CHECKSUM in root._v_attrs else None
    if algorithm != ALGORITHM:
        raise StoreFormatError(
            f"{h5file.filename}: checksums made with {algorithm!r}, this h5stream writes {ALGORITHM!r}; "
            "ingest into a new file"
        )
    block_rows = int(root._v_attrs[schema.ATTR_BLOCK_ROWS])
    sums = root._f_get_child(schema.CHECKSUMS)
    complete = min(sums.nrows, committed_rows // block_rows)
    if sums.nrows > complete:
        sums.truncate(complete)
    hasher = BlockHasher(block_rows, complete * block_rows)
    images, labels, paths = (root._f_get_child(n) for n in (schema.IMAGES, schema.LABELS, schema.PATHS))
    for start in range(complete * block_rows, committed_rows, block_rows):
        stop = min(start + block_rows, committed_rows)
        hasher.add(images.read(start, stop), labels.read(start, stop), paths.read(start, stop))
    stage(h5file, hasher)  # the rows re-hashed above may complete blocks
    return hasher


def stage(h5file, hasher: BlockHasher) -> None:
    """Write the hasher's digests: complete blocks appended to ``/checksums``, the partial one in the tail.

    Called before the flush that precedes raising ``committed_rows``; the tail
    names its own row count, so a crash in between leaves it recognisably stale.
    """
    done = hasher.take_complete()
    if done:
        h5file.root._f_get_child(schema.CHECKSUMS).append(np.array(done, dtype=np.uint64))
    h5file.root._v_attrs[schema.ATTR_CHECKSUM_TAIL] = tail_to_json(hasher.rows, hasher.tail())


# -- verifying (any reader) ------------------------------------------------------------


@dataclass(frozen=True)
class BadBlock:
    """Rows ``[start, stop)`` whose bytes do not match their digests.

    ``parts`` names what differs (``"images"``, ``"labels"``, ``"paths"``), or is
    ``("unreadable",)`` when HDF5 could not read the rows; ``detail`` then holds its message.
    """

    start: int
    stop: int
    parts: tuple[str, ...]
    detail: str = ""


@dataclass(frozen=True)
class VerifyResult:
    """What :func:`verify_store` found.  Row ranges are ``(start, stop)``, stop exclusive.

    ``algorithm`` is ``None`` for a store without checksums (then nothing was
    read).  ``unchecked`` lists committed rows that have no trusted digest: an
    ingest is writing the file, or a crash interrupted a commit (``h5stream
    ingest --append`` recomputes it).
    """

    path: str
    algorithm: str | None
    rows: int
    block_rows: int
    blocks: int
    bad: tuple[BadBlock, ...]
    unchecked: tuple[tuple[int, int], ...]
    bytes_read: int
    seconds: float

    @property
    def has_checksums(self) -> bool:
        return self.algorithm is not None

    @property
    def checked_rows(self) -> int:
        if not self.has_checksums:
            return 0
        return self.rows - sum(b - a for a, b in self.unchecked)

    @property
    def ok(self) -> bool:
        """Every committed row was checked and matched."""
        return self.has_checksums and not self.bad and not self.unchecked


def _expected(f, rows: int, block_rows: int) -> list[Digests | None]:
    """Trusted digests per committed block (``None``: none to trust), from an open h5py file."""
    n_blocks = -(-rows // block_rows)
    complete = min(rows // block_rows, f[schema.CHECKSUMS].shape[0])
    table = f[schema.CHECKSUMS][:complete].astype(np.uint64)
    expected: list[Digests | None] = [tuple(int(v) for v in row) for row in table]
    expected += [None] * (n_blocks - complete)
    tail = tail_from_json(f.attrs.get(schema.ATTR_CHECKSUM_TAIL))
    if rows % block_rows and tail is not None and tail[0] == rows and tail[1] is not None:
        expected[-1] = tail[1]
    return expected


def trusted_digests(f, rows: int, block_rows: int, path: str) -> list[Digests | None] | None:
    """Per committed block, the digests a reader may trust (``None`` where there are none), from an open h5py
    file; ``None`` for a store without checksums.  Raises :class:`StoreFormatError` for another algorithm."""
    if schema.CHECKSUMS not in f:
        return None
    algorithm = f.attrs.get(schema.ATTR_CHECKSUM)
    algorithm = algorithm.decode() if isinstance(algorithm, bytes) else algorithm
    if algorithm != ALGORITHM:
        raise StoreFormatError(f"{path}: checksums made with {algorithm!r}; this h5stream checks {ALGORITHM!r} "
                               "(open it with verify_reads=False to stream it unchecked)")
    return _expected(f, rows, block_rows)


def readable_by_h5py(dataset) -> bool:
    """Whether plain h5py has every filter of h5py ``dataset`` (not blosc, without hdf5plugin)."""
    import h5py

    dcpl = dataset.id.get_create_plist()
    return all(h5py.h5z.filter_avail(dcpl.get_filter(i)[0]) for i in range(dcpl.get_nfilters()))


class _H5pyRows:
    """Reads row ranges of the three arrays into caller-owned buffers with h5py ``read_direct``."""

    errors = (OSError,)

    def __init__(self, path: str, remote=None):
        from h5stream.store.access import open_h5_readonly

        self._stack = contextlib.ExitStack()
        self._f = self._stack.enter_context(open_h5_readonly(path, native_driver=True, remote=remote, rdcc_nbytes=0))
        self._ds = {name: self._f[name] for name in (schema.IMAGES, schema.LABELS, schema.PATHS)}

    def read(self, name: str, start: int, stop: int, out: np.ndarray) -> None:
        self._ds[name].read_direct(out, np.s_[start:stop], np.s_[0:stop - start])

    def close(self) -> None:
        self._stack.close()


class _TablesRows(_H5pyRows):
    """The same through PyTables, for filters plain h5py lacks (blosc)."""

    errors = (OSError, RuntimeError)  # PyTables raises HDF5ExtError, a RuntimeError

    def __init__(self, path: str):
        import tables

        self._f = tables.open_file(path, "r")
        self._ds = {name: self._f.root._f_get_child(name) for name in (schema.IMAGES, schema.LABELS, schema.PATHS)}

    def read(self, name: str, start: int, stop: int, out: np.ndarray) -> None:
        self._ds[name].read(start, stop, out=out[:stop - start])

    def close(self) -> None:
        self._f.close()


def row_reader(path: str, via_h5py: bool, remote=None):
    """A reader of row ranges of a store's three arrays into caller-owned buffers (``read(name, start, stop,
    out)``, ``close()``, ``errors``): plain h5py (a URL with the ``remote`` options), or PyTables, for a local
    file, where h5py lacks a filter (``via_h5py`` False, see :func:`readable_by_h5py`)."""
    return _H5pyRows(path, remote) if via_h5py else _TablesRows(path)


def verify_store(path: str | os.PathLike, *, slice_bytes: int = VERIFY_SLICE_BYTES,
                 progress: Callable[[int, int], None] | None = None, remote=None) -> VerifyResult:
    """Read every committed row of ``path`` once, in order, and check each block against its digests.

    Reads slices of about ``slice_bytes`` (whole blocks) into buffers it
    allocates once.  ``progress(done_bytes, total_bytes)`` is called after each
    slice.  A slice HDF5 cannot read is read again block by block, so one
    damaged chunk marks only its own block.  Raises :class:`StoreNotFoundError`
    / :class:`StoreFormatError` (via :func:`read_meta`) for a missing or foreign
    file; damage is reported in the result, not raised.  Opens its own handles.  A URL is read with the
    ``remote`` options (see :func:`read_meta`).
    """
    from h5stream.store.access import open_h5_readonly

    t0 = time.perf_counter()
    meta = read_meta(path, remote=remote)
    rows, block_rows = meta.rows, meta.block_rows
    n_blocks = -(-rows // block_rows)
    with open_h5_readonly(meta.path, native_driver=True, remote=meta.remote) as f:
        if schema.CHECKSUMS not in f:
            return VerifyResult(meta.path, None, rows, block_rows, n_blocks, (), ((0, rows),) if rows else (), 0,
                                time.perf_counter() - t0)
        algorithm = f.attrs.get(schema.ATTR_CHECKSUM)
        algorithm = algorithm.decode() if isinstance(algorithm, bytes) else algorithm
        if algorithm != ALGORITHM:
            raise StoreFormatError(
                f"{meta.path}: checksums made with {algorithm!r}; this h5stream checks {ALGORITHM!r}"
            )
        # The count read with the tail it must match: an ingest may have committed more since read_meta.
        rows = int(f.attrs.get(schema.ATTR_COMMITTED, rows))
        n_blocks = -(-rows // block_rows)
        expected = _expected(f, rows, block_rows)
        dtypes = {name: (f[name].dtype, f[name].shape[1:]) for name in (schema.IMAGES, schema.LABELS, schema.PATHS)}
        via_h5py = readable_by_h5py(f[schema.IMAGES])
    row_bytes = sum(np.dtype(dt).itemsize * int(np.prod(shape, dtype=np.int64)) for dt, shape in dtypes.values())
    slice_rows = max(1, slice_bytes // row_bytes // block_rows) * block_rows
    slice_rows = min(slice_rows, max(block_rows, rows))
    bufs = {name: np.empty((slice_rows, *shape), dtype=dt) for name, (dt, shape) in dtypes.items()}
    order = (schema.IMAGES, schema.LABELS, schema.PATHS)
    if not via_h5py and meta.remote is not None:
        raise StoreFormatError(f"{meta.path}: compressed with a filter only PyTables reads, which cannot read a URL; "
                               "verify a local copy")
    source = row_reader(meta.path, via_h5py, meta.remote)
    bad: list[BadBlock] = []
    try:
        for start in range(0, rows, slice_rows):
            stop = min(start + slice_rows, rows)
            try:
                for name in order:
                    source.read(name, start, stop, bufs[name])
                readable = True
            except source.errors:
                readable = False
            for b0 in range(start, stop, block_rows):
                b1 = min(b0 + block_rows, stop)
                want = expected[b0 // block_rows]
                if want is None:
                    continue
                if not readable:
                    try:
                        for name in order:
                            source.read(name, b0, b1, bufs[name][b0 - start:])
                    except source.errors as exc:
                        bad.append(BadBlock(b0, b1, ("unreadable",), str(exc).splitlines()[0] if str(exc) else ""))
                        continue
                got = block_digests(*(bufs[name][b0 - start:b1 - start] for name in order))
                parts = tuple(p for p, g, w in zip(PARTS, got, want) if g != w)
                if parts:
                    bad.append(BadBlock(b0, b1, parts))
            if progress is not None:
                progress(stop * row_bytes, rows * row_bytes)
    finally:
        source.close()
    unchecked = _merge([(b * block_rows, min((b + 1) * block_rows, rows)) for b, w in enumerate(expected) if w is None])
    return VerifyResult(meta.path, ALGORITHM, rows, block_rows, n_blocks, tuple(bad), unchecked, rows * row_bytes,
                        time.perf_counter() - t0)


def _merge(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return tuple(out)
