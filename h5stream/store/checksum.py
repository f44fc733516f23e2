"""Block checksums: what they cover, how a writer records them, how :func:`verify_store` checks them.

A *block* is ``block_rows`` consecutive rows, the HDF5 chunk of ``/images``.  Each block has three xxh3-64
digests: of its image bytes (C order), of its labels (little-endian, in the store's label dtype) and of its paths
(of ``/path_ends`` and ``/path_bytes`` as :mod:`h5stream.store.pathrows` says, or the fixed-size bytes of a
format-1 store's ``/paths``).  Complete blocks have a row each in ``/checksums`` (uint64, columns :data:`PARTS`);
the last block, while partial, changes whenever rows are appended, so its digests live in the root attribute
``checksum_tail`` together with the row count they were computed for (see :mod:`h5stream.store.schema`).  Plain
h5py reads both.

Trust follows the ``committed_rows`` protocol: digests are written before
the count that publishes their rows, so every committed row has one, and a
committed row without one is damage (:mod:`h5stream.store.coverage`).  Digests
for rows past ``committed_rows`` are a commit in flight or torn by a crash: the
last committed block is then checked against the digest that covers it, read
to where that digest ends; :func:`resume` (called when a writer opens the
store) checks it so, drops the digests past the count and recomputes the
partial block from the committed rows.

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

from h5stream.errors import H5StreamError, StoreFormatError
from h5stream.store import coverage, encoded, pathrows, rowdigest, schema
from h5stream.store.coverage import PARTS, Digests, tail_from_json  # noqa: F401 - tail_from_json: part of this API
from h5stream.store.meta import read_meta
from h5stream.store.rowread import readable_by_h5py, row_reader  # noqa: F401 - part of this API

# xxh3-64: the fastest of the well-kept hashes (xxhash, crc32c, google-crc32c, zlib.crc32), and it releases the GIL.
ALGORITHM = "xxh3_64"
VERIFY_SLICE_BYTES = 64 << 20
"""Bytes (images + labels + paths) :func:`verify_store` reads per slice: large sequential reads."""


def _contiguous(a) -> np.ndarray:
    """``a`` as C-contiguous little-endian bytes: what a digest is taken over, whatever the machine (variable-length
    paths, :class:`~h5stream.store.pathrows.PathRows`, as they are: a :class:`~h5stream.store.pathrows.PathHasher`
    takes them)."""
    if isinstance(a, pathrows.PathRows):
        return a
    a = np.asarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return np.ascontiguousarray(a)


def digest(a) -> int:
    """xxh3-64 of the array's bytes (C order, little-endian), as an unsigned int (of variable-length paths:
    :func:`h5stream.store.pathrows.digest`)."""
    if isinstance(a, pathrows.PathRows):
        return pathrows.digest(a)
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

    def __init__(self, block_rows: int, rows: int = 0, vlen_paths: bool = False):
        if block_rows < 1:
            raise ValueError(f"block_rows must be >= 1, got {block_rows}")
        if rows % block_rows:
            raise ValueError(f"a hasher starts on a block boundary; {rows} is not a multiple of {block_rows}")
        self.block_rows = int(block_rows)
        self.rows = int(rows)
        # vlen_paths: paths come as PathRows (a store with /path_ends), hashed as h5stream.store.pathrows says.
        self._open = [xxhash.xxh3_64(), xxhash.xxh3_64(), pathrows.PathHasher() if vlen_paths else xxhash.xxh3_64()]
        self._complete: list[Digests] = []

    def add(self, images, labels, paths, image_digests=()) -> None:
        """Hash ``n`` more rows: ``images`` (n, H, W, C), ``labels`` (n, ...), ``paths`` (n,) as stored.

        ``image_digests`` (optional) are :func:`digest` of ``images[j * block_rows:(j + 1) * block_rows]``
        for j = 0, 1, ..., computed elsewhere (where the rows were decoded): a whole block that starts at
        ``images[0]`` on a block boundary takes its image digest from there instead of hashing its pixels again.
        """
        parts = [images if getattr(images, "encoded_rows", False) else np.asarray(images),  # see store/encoded.py
                 np.asarray(labels), paths if isinstance(paths, pathrows.PathRows) else np.asarray(paths)]
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

    Refuses (:class:`StoreFormatError`) a store whose committed rows lack digests or whose last committed block
    does not match the digest that covers it past ``committed_rows`` (a torn commit): appending would hash them
    anew and so hide the damage.  Then drops rows of ``/checksums`` that are not wholly below
    ``committed_rows`` (a crash's leftovers) and re-reads the committed rows of the last, partial block to hash
    them again.
    """
    root = h5file.root
    attrs = root._v_attrs
    has_attrs = schema.ATTR_CHECKSUM in attrs or schema.ATTR_CHECKSUM_TAIL in attrs
    if schema.CHECKSUMS not in root and not has_attrs:
        return None
    algorithm = attrs[schema.ATTR_CHECKSUM] if schema.ATTR_CHECKSUM in attrs else None
    block_rows = int(attrs[schema.ATTR_BLOCK_ROWS])
    sums = root._f_get_child(schema.CHECKSUMS) if schema.CHECKSUMS in root else None
    vlen = pathrows.is_vlen(root)
    images, labels, paths = (encoded.image_rows(h5file),
                             *(root._f_get_child(n) for n in (schema.LABELS, pathrows.row_node(root))))
    stored = min(images.nrows, labels.nrows, paths.nrows)

    def read_paths(start: int, stop: int):
        return pathrows.read_tables(root, start, stop) if vlen else paths.read(start, stop)

    tail = tail_from_json(attrs[schema.ATTR_CHECKSUM_TAIL] if schema.ATTR_CHECKSUM_TAIL in attrs else None)
    what = coverage.problem(committed_rows, stored, block_rows, None if sums is None else sums.nrows, tail,
                            has_checksum_attrs=has_attrs)
    if what is not None:
        raise coverage.damage_error(h5file.filename, what + "; nothing can be appended to it")
    if sums is None:
        return None  # an empty store whose table is gone: it goes on without checksums
    if algorithm != ALGORITHM:
        raise StoreFormatError(
            f"{h5file.filename}: checksums made with {algorithm!r}, this h5stream writes {ALGORITHM!r}; "
            "ingest into a new file"
        )
    want, stop = (coverage.expected(committed_rows, block_rows, sums.read(), tail, stored)[-1]
                  if committed_rows % block_rows else (None, committed_rows))
    if stop > committed_rows:  # a digest that also covers rows never committed: check the block with them
        start = committed_rows // block_rows * block_rows
        got = block_digests(images.read(start, stop), labels.read(start, stop), read_paths(start, stop))
        differ = [p for p, g, w in zip(PARTS, got, want) if g != w]
        if differ:
            raise StoreFormatError(
                f"{h5file.filename}: rows {start}-{committed_rows - 1} do not match their checksum "
                f"({', '.join(differ)}); nothing can be appended to it: {coverage.FIX}")
    complete = min(sums.nrows, committed_rows // block_rows)
    if sums.nrows > complete:
        sums.truncate(complete)
    hasher = BlockHasher(block_rows, complete * block_rows, vlen_paths=vlen)
    for start in range(complete * block_rows, committed_rows, block_rows):
        stop = min(start + block_rows, committed_rows)
        hasher.add(images.read(start, stop), labels.read(start, stop), read_paths(start, stop))
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

    ``parts`` names what differs (``"images"``, ``"labels"``, ``"paths"``, ``"row digests"``: rows whose digest
    differs while the block's images match, see :mod:`h5stream.store.rowdigest`), or is ``("unreadable",)`` when
    HDF5 could not read the rows; ``detail`` then holds its message, or says that the block's images digest is what
    is damaged (:func:`~h5stream.store.rowdigest.block_digest_note`), which ``images_digest`` then holds as the rows
    give it.  ``rows``: the rows that differ from their own digests (a store with row digests).
    """

    start: int
    stop: int
    parts: tuple[str, ...]
    detail: str = ""
    rows: tuple[int, ...] = ()
    images_digest: int | None = None


@dataclass(frozen=True)
class VerifyResult:
    """What :func:`verify_store` found.  Row ranges are ``(start, stop)``, stop exclusive.

    ``algorithm`` is ``None`` for a store without checksums (then nothing was
    read, and ``unchecked`` holds every row).  ``uncommitted``: rows past
    ``committed_rows`` that digests were written for, ``(committed_rows, R)``:
    an ingest is committing them, or a writer stopped between writing them and
    publishing them (``h5stream ingest --append`` drops them); the committed
    rows were checked all the same.
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
    uncommitted: tuple[int, int] | None = None

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


def _expected(f, rows: int, block_rows: int, path: str) -> list[tuple[Digests, int]] | None:
    """Per committed block of the open h5py file ``f``, its digests and the row where the rows they cover end
    (:func:`coverage.expected <h5stream.store.coverage.expected>`); None for a store written before checksums.
    :class:`StoreFormatError` for committed rows without digests, another algorithm or a table HDF5 cannot read."""
    attrs = f.attrs
    has_attrs = schema.ATTR_CHECKSUM in attrs or schema.ATTR_CHECKSUM_TAIL in attrs
    if schema.CHECKSUMS not in f and not has_attrs:
        return None
    table = coverage.read_table(f, path) if schema.CHECKSUMS in f else None
    tail = tail_from_json(attrs.get(schema.ATTR_CHECKSUM_TAIL))
    stored = min([encoded.image_rows(f).shape[0]] + [f[name].shape[0] for name in (schema.LABELS, pathrows.row_node(f))
                                                     if name in f])
    what = coverage.problem(rows, stored, block_rows, None if table is None else len(table), tail,
                            has_checksum_attrs=has_attrs)
    if what is not None:
        raise coverage.damage_error(path, what)
    algorithm = attrs.get(schema.ATTR_CHECKSUM)
    algorithm = algorithm.decode() if isinstance(algorithm, bytes) else algorithm
    if algorithm != ALGORITHM:
        raise StoreFormatError(f"{path}: checksums made with {algorithm!r}; this h5stream checks {ALGORITHM!r} "
                               "(open it with verify_reads=False to stream it unchecked)")
    return coverage.expected(rows, block_rows, table, tail, stored)


def trusted_digests(f, rows: int, block_rows: int, path: str) -> list[Digests | None] | None:
    """Per committed block, the digests of its committed rows, from an open h5py file; ``None`` for a store
    without checksums.  Raises :class:`StoreFormatError` where :func:`_expected` does.

    Where a commit is in flight or torn, the digest of the last committed block covers rows past
    ``committed_rows``: those rows are read here and checked with it, and the block's committed rows get
    digests of their own.  A part (images, labels, paths) that does not match keeps the digest it has, which
    its committed rows then fail against when the stream reads them (a :class:`ChecksumError` naming them).
    """
    expected = _expected(f, rows, block_rows, path)
    if expected is None:
        return None
    out: list[Digests | None] = [want for want, _ in expected]
    if expected and expected[-1][1] > rows and not readable_by_h5py(f[schema.IMAGES]):
        out[-1] = None  # a filter plain h5py lacks (blosc): the stream reads it through HDF5, unchecked there
    elif expected and expected[-1][1] > rows:
        want, stop = expected[-1]
        start = (len(expected) - 1) * block_rows
        arrays = [encoded.image_rows(f)[start:stop], f[schema.LABELS][start:stop],
                  pathrows.read_h5py(f, start, stop) if pathrows.is_vlen(f) else f[schema.PATHS][start:stop]]
        got = block_digests(*arrays)
        own = block_digests(*(a[:rows - start] for a in arrays))
        out[-1] = tuple(o if g == w else w for o, g, w in zip(own, got, want))
    return out


def verify_store(path: str | os.PathLike, *, slice_bytes: int = VERIFY_SLICE_BYTES,
                 progress: Callable[[int, int], None] | None = None, remote=None,
                 row_digests: bool = True) -> VerifyResult:
    """Read every committed row of ``path`` once, in order, and check each block against its digests.

    Reads slices of about ``slice_bytes`` (whole blocks) into buffers it
    allocates once.  ``progress(done_bytes, total_bytes)`` is called after each
    slice.  A slice HDF5 cannot read is read again block by block, so one
    damaged chunk marks only its own block.  Raises :class:`StoreNotFoundError`
    / :class:`StoreFormatError` (via :func:`read_meta`) for a missing or foreign
    file, and for committed rows without digests or a checksum table HDF5 cannot read (see
    :mod:`h5stream.store.coverage`), and for HDF5 structure outside the rows that cannot be read (a dataset's
    header); damage to rows is reported in the result, not raised.  Opens its own handles.  A URL is read with
    the ``remote`` options (see :func:`read_meta`).  ``row_digests=False``: blocks only, the row digests neither
    read nor counted (what a rebuild of a store whose row digests fall short checks).
    """
    try:
        return _verify_store(path, slice_bytes, progress, remote, row_digests)
    except H5StreamError:
        raise
    except (OSError, RuntimeError, KeyError) as exc:  # h5py's errors for a damaged header or index
        raise StoreFormatError(f"{os.fspath(path)}: cannot read as HDF5 ({exc}); the file is damaged: restore it "
                               "from a copy or re-ingest it") from None


def _verify_store(path, slice_bytes: int, progress, remote, use_digests: bool = True) -> VerifyResult:
    """:func:`verify_store`'s work; h5py's own errors escape it."""
    from h5stream.store.access import open_h5_readonly

    t0 = time.perf_counter()
    meta = read_meta(path, remote=remote)
    if meta.checksum_problem is not None:  # committed rows without digests, or a table HDF5 cannot read
        raise StoreFormatError(meta.checksum_problem)
    if meta.encoded:
        return _verify_encoded(meta, t0, progress, use_digests)
    rows, block_rows = meta.rows, meta.block_rows
    n_blocks = -(-rows // block_rows)
    with open_h5_readonly(meta.path, native_driver=True, remote=meta.remote) as f:
        # The count read with the digests it must match: an ingest may have committed more since read_meta.
        rows = int(f.attrs.get(schema.ATTR_COMMITTED, rows))
        n_blocks = -(-rows // block_rows)
        expected = _expected(f, rows, block_rows, meta.path)
        if expected is None:
            return VerifyResult(meta.path, None, rows, block_rows, n_blocks, (), ((0, rows),) if rows else (), 0,
                                time.perf_counter() - t0)
        tail = tail_from_json(f.attrs.get(schema.ATTR_CHECKSUM_TAIL))
        vlen = pathrows.is_vlen(f)
        fixed = (schema.IMAGES, schema.LABELS) if vlen else (schema.IMAGES, schema.LABELS, schema.PATHS)
        dtypes = {name: (f[name].dtype, f[name].shape[1:]) for name in fixed}
        # Variable-length paths: their ends and their bytes on average (read into arrays of their own).
        path_row_bytes = (8 + -(-f[schema.PATH_BYTES_NODE].shape[0] // max(1, f[schema.PATH_ENDS].shape[0]))
                          if vlen else 0)
        via_h5py = readable_by_h5py(f[schema.IMAGES])
        if rowdigest.has(f) and use_digests:
            rowdigest.check_count(f[schema.ROW_DIGESTS].shape[0], rows, meta.path)
    row_bytes = path_row_bytes + sum(np.dtype(dt).itemsize * int(np.prod(shape, dtype=np.int64))
                                     for dt, shape in dtypes.values())
    slice_rows = max(1, slice_bytes // row_bytes // block_rows) * block_rows
    slice_rows = min(slice_rows, -(-max(block_rows, rows) // block_rows) * block_rows)  # whole blocks
    bufs = {name: np.empty((slice_rows, *shape), dtype=dt) for name, (dt, shape) in dtypes.items()}
    order = (schema.IMAGES, schema.LABELS, schema.PATHS)
    if not via_h5py and meta.remote is not None:
        raise StoreFormatError(f"{meta.path}: compressed with a filter only PyTables reads, which cannot read a URL; "
                               "verify a local copy")
    source = row_reader(meta.path, via_h5py, meta.remote)
    with_digests = source.row_digests and use_digests
    if with_digests:
        bufs[schema.ROW_DIGESTS] = np.empty(slice_rows, np.uint64)

    def read(a: int, b: int, at: int) -> list:
        """Rows a..b-1 of each array, into the buffers from row ``at`` on (variable-length paths: their own)."""
        return [source.read(name, a, b, bufs[name][at:] if name in bufs else None) for name in order]

    bad: list[BadBlock] = []
    try:
        for start in range(0, rows, slice_rows):
            stop = min(start + slice_rows, rows)
            sums, readable = None, False
            with contextlib.suppress(*source.errors):
                got_rows = read(start, stop, 0)
                sums = source.read(schema.ROW_DIGESTS, start, stop, bufs[schema.ROW_DIGESTS]) if with_digests \
                    else None
                readable = True
            for b0 in range(start, stop, block_rows):
                b1 = min(b0 + block_rows, stop)
                want, covered = expected[b0 // block_rows]
                block_sums = None if sums is None else sums[b0 - start:b1 - start]
                if not readable or covered > b1:  # covered > b1: a digest also of rows past committed_rows
                    node = ""
                    try:
                        got = block_digests(*read(b0, covered, b0 - start))
                        if not readable and with_digests:  # the slice's row digests may be what failed
                            node, name = f"/{schema.ROW_DIGESTS}: ", schema.ROW_DIGESTS
                            block_sums = source.read(name, b0, b1, bufs[name][b0 - start:])
                    except source.errors as exc:
                        bad.append(BadBlock(b0, b1, ("unreadable",), node + (str(exc).splitlines() or [""])[0]))
                        continue
                else:
                    got = block_digests(*(part[b0 - start:covered - start] for part in got_rows))
                parts, rows_bad, note = tuple(p for p, g, w in zip(PARTS, got, want) if g != w), (), ""
                if block_sums is not None:
                    images = bufs[schema.IMAGES][b0 - start:b1 - start]
                    parts, rows_bad = rowdigest.judge(parts, rowdigest.bad_rows(block_sums, images, b0))
                    note = rowdigest.block_digest_note(parts, rows_bad, covered == b1)
                if parts:
                    bad.append(BadBlock(b0, b1, parts, note, rows=rows_bad, images_digest=got[0] if note else None))
            if progress is not None:
                progress(stop * row_bytes, rows * row_bytes)
    finally:
        source.close()
    uncommitted = (rows, tail[0]) if tail is not None and tail[0] > rows else None
    return VerifyResult(meta.path, ALGORITHM, rows, block_rows, n_blocks, tuple(bad), (), rows * row_bytes,
                        time.perf_counter() - t0, uncommitted)



def _verify_encoded(meta, t0: float, progress, use_digests: bool = True) -> VerifyResult:
    """:func:`verify_store` of an encoded store (:mod:`h5stream.store.encoded`): block by block with plain h5py
    (a URL too); a block HDF5 cannot read is reported unreadable and the next one read."""
    from h5stream.store.access import open_h5_readonly

    block_rows, bad = meta.block_rows, []
    with open_h5_readonly(meta.path, native_driver=True, remote=meta.remote, rdcc_nbytes=0) as f:
        rows = int(f.attrs.get(schema.ATTR_ENCODED_COMMITTED, meta.rows))
        n_blocks = -(-rows // block_rows)
        expected = _expected(f, rows, block_rows, meta.path)
        if expected is None:
            return VerifyResult(meta.path, None, rows, block_rows, n_blocks, (), ((0, rows),) if rows else (), 0,
                                time.perf_counter() - t0)
        tail = tail_from_json(f.attrs.get(schema.ATTR_CHECKSUM_TAIL))
        images, labels, vlen = encoded.EncodedArray.of(f), f[schema.LABELS], pathrows.is_vlen(f)
        sums = f[schema.ROW_DIGESTS] if rowdigest.has(f) and use_digests else None
        if sums is not None:
            rowdigest.check_count(sums.shape[0], rows, meta.path)
        total = images.byte_range(0, rows)[1]
        for b0 in range(0, rows, block_rows):
            b1 = min(b0 + block_rows, rows)
            want, covered = expected[b0 // block_rows]
            try:
                paths = pathrows.read_h5py(f, b0, covered) if vlen else f[schema.PATHS][b0:covered]
                rows_read = images.read(b0, covered)
                got = block_digests(rows_read, labels[b0:covered], paths)
                own = None if sums is None else sums[b0:b1]
            except (OSError, ValueError, IndexError) as exc:
                bad.append(BadBlock(b0, b1, ("unreadable",), str(exc).splitlines()[0] if str(exc) else ""))
                continue
            parts, rows_bad, note = tuple(p for p, g, w in zip(PARTS, got, want) if g != w), (), ""
            if own is not None:
                parts, rows_bad = rowdigest.judge(parts, rowdigest.bad_rows(own, rows_read[:b1 - b0], b0))
                note = rowdigest.block_digest_note(parts, rows_bad, covered == b1)
            if parts:
                bad.append(BadBlock(b0, b1, parts, note, rows=rows_bad, images_digest=got[0] if note else None))
            if progress is not None:
                progress(images.byte_range(0, b1)[1], total)
    uncommitted = (rows, tail[0]) if tail is not None and tail[0] > rows else None
    return VerifyResult(meta.path, ALGORITHM, rows, block_rows, n_blocks, tuple(bad), (), total,
                        time.perf_counter() - t0, uncommitted)
