"""Create and extend a store with PyTables EArrays.

:class:`StoreWriter` owns one PyTables file handle and the store's
:class:`~h5stream.store.lock.StoreLock`, and is used from one thread (the
ingest writer).  Rows are appended to ``/images``, ``/labels`` and the paths;
:meth:`StoreWriter.commit` makes them durable and only then raises the
``committed_rows`` attribute, so a writer killed at any moment leaves a file
whose first ``committed_rows`` rows are complete in all three arrays.  A crash
may leave extra, uncommitted rows past that count: readers ignore them and
:meth:`StoreWriter.open_append` truncates them before writing again.  Each
commit also records the block checksums of the rows it publishes (see
:mod:`h5stream.store.checksum`).

How a write is made so that a failure never publishes a row (space
allocated first, checked writes, the cut back to the last good flush), the
temporary name a new store is written under and the marker beside a store
that HDF5 rewrites in place are :mod:`h5stream.store.durable`'s, which
:class:`StoreWriter` builds on.  A store whose marker was left behind (a
writer stopped mid-flush) is refused by :meth:`StoreWriter.open_append`:
whoever appends rebuilds it from its committed rows first
(:mod:`h5stream.store.rebuild`; ``h5stream ingest --append`` and ``h5stream
repair`` do).

A new store's file is laid out as :mod:`h5stream.store.layout` says (pages,
chunk-index fanout, label chunk size) by :mod:`h5stream.store.create`; stores
laid out otherwise are appended to as they are.  The file-level steps (open,
cut off, rename) are :mod:`h5stream.store.handle`'s.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np
import tables

from h5stream.errors import ConfigError, StoreExistsError, StoreFormatError, StoreWriteError
from h5stream.store import checksum, handle, layout, pathrows, schema  # noqa: F401 - layout: tests patch it
from h5stream.store import encoded, rowdigest, sidecar
from h5stream.store.durable import DurableFile
from h5stream.store.create import COMPRESSIONS, filters, new_store_attrs, write_empty
from h5stream.store.handle import CREATING_SUFFIX, creating_path
from h5stream.store.lock import StoreLock
from h5stream.store.meta import StoreMeta, read_meta
from h5stream.store.rawchunks import RawChunks, writes_whole_chunks
from h5stream.store.space import space_for

#: Labels and paths of appended rows wait for the next commit, or until this many rows wait.
PENDING_ROWS = 8192

__all__ = ["COMPRESSIONS", "CREATING_SUFFIX", "StoreWriter", "creating_path", "write_arrays"]


class StoreWriter(DurableFile):
    """Append rows to a store.  Not thread-safe: one writer thread owns it.

    Use :meth:`create` for a new file or :meth:`open_append` to extend one;
    close with :meth:`close` or a ``with`` block (closing commits what was
    appended), or :meth:`discard` (closing drops it).  Both take the store's
    lock unless given one (which then stays the caller's) and raise
    :class:`~h5stream.errors.StoreBusyError` while another writer holds it.
    Write failures raise :class:`~h5stream.errors.StoreWriteError` and leave
    the file as its last commit; the writer is closed then.  A store made by
    :meth:`create` takes its name at its first commit of rows or at
    :meth:`close` (:attr:`published`); failing or discarded before that, it
    leaves nothing.  Every write goes through :class:`~h5stream.store.durable.DurableFile`'s guard.
    """

    def __init__(self, h5file: tables.File, *, lock: StoreLock | None = None):
        root = h5file.root
        self._committed_attr = encoded.committed_attr(root._v_attrs)
        super().__init__(h5file, lock=lock, committed_rows=int(root._v_attrs[self._committed_attr]))
        self.images = encoded.image_rows(h5file)  # /images, or an encoded store's bytes and ends
        self.labels = root._f_get_child(schema.LABELS)
        # Paths: /path_ends with /path_bytes, or a format-1 store's fixed-width /paths (kept so when appended to).
        self._vlen_paths = pathrows.is_vlen(root)
        self.paths = root._f_get_child(pathrows.row_node(root))
        self._path_bytes = root._f_get_child(schema.PATH_BYTES_NODE) if self._vlen_paths else None
        self.encoding = encoded.encoding_of(root._v_attrs)
        self._whole_chunks = self.encoding == schema.ENCODING_RAW and writes_whole_chunks(self.images)
        self._pending: list[tuple] = []  # (labels, encoded paths, row digests or None) appended, not written
        self._pending_rows = 0
        self._hasher: checksum.BlockHasher | None = None  # None: a store without checksums
        # Each appended row's digest (see store/rowdigest.py), queued and written with its label; None: none kept.
        self._row_digests = rowdigest.writer_node(h5file, self.committed_rows)
        self._resume_checksums()
        # Owned; None where the file system refuses direct writes.  Used for chunks HDF5 allocated ahead.
        self._raw = RawChunks.open(self._file, self._fd) if self._whole_chunks else None

    # -- construction -------------------------------------------------------------
    @classmethod
    def create(
        cls,
        path: str | os.PathLike,
        *,
        image_shape: Sequence[int],
        label_kind: str = schema.LABEL_CLASS,
        label_shape: Sequence[int] = (),
        class_names: Sequence[str] | None = None,
        label_columns: Sequence[str] | None = None,
        block_rows: int | None = None,
        resize_mode: str = "stretch",
        background: Sequence[int] = (255, 255, 255),
        pad_fill: Sequence[int] | None = None,
        storage_order: str = "shuffled",
        order_seed: int = 0,
        compression: str | None = None,
        overwrite: bool = False,
        expected_rows: int = 10_000,
        lock: StoreLock | None = None,
        publish_early: bool = True,
        encoding: str = schema.ENCODING_RAW,
        jpeg_quality: int | None = None,
        row_digests: bool = True,
    ) -> StoreWriter:
        """A new, empty store for ``path``, written under :func:`creating_path` until its first commit of
        rows (or :meth:`close`; only :meth:`close` with ``publish_early=False``) renames it to ``path``
        (replacing the file there with ``overwrite``).  ``encoding="jpeg"``: rows are appended encoded
        (:meth:`append` takes an :class:`~h5stream.store.encoded.EncodedRows`); no ``compression`` then.
        ``row_digests=False``: no ``/row_digests`` (8 bytes a row; see :mod:`h5stream.store.rowdigest`)."""
        if encoding != schema.ENCODING_RAW and compression is not None:
            raise ConfigError(f"an encoded ({encoding}) store is not compressed again; drop --compression")
        path = os.fspath(path)
        if os.path.isdir(path):
            raise StoreExistsError(f"{path}: is a directory; give a file name such as {os.path.join(path, 'train.h5')}")
        if os.path.exists(path) and not overwrite:
            raise StoreExistsError(f"{path}: already exists; pass --append to add to it or --overwrite to replace it")
        h, w, c = (int(d) for d in image_shape)
        block_rows = int(block_rows or schema.default_block_rows(max(1, h * w * c)))
        label_row_bytes = {schema.LABEL_CLASS: 8, schema.LABEL_NONE: 1}.get(label_kind, 4) * int(np.prod(label_shape))
        refusal = layout.block_rows_refusal(block_rows, (h, w, c), label_row_bytes)
        if refusal is not None:  # before a byte is written: HDF5 would refuse it mid-way, as a ValueError
            raise ConfigError(f"{path}: {refusal}")
        attrs = new_store_attrs((h, w, c), label_kind=label_kind, class_names=class_names,
                                label_columns=label_columns, block_rows=block_rows, resize_mode=resize_mode,
                                background=background, pad_fill=pad_fill, storage_order=storage_order,
                                order_seed=order_seed, encoding=encoding, jpeg_quality=jpeg_quality,
                                row_digests=row_digests)
        image_filters = filters(compression)
        label_shape = tuple(int(d) for d in label_shape)
        owned = lock is None
        lock = StoreLock.acquire(path) if owned else lock
        try:
            if os.path.exists(path) and not overwrite:  # again, now that no other writer can make it
                raise StoreExistsError(f"{path}: already exists; pass --append to add to it "
                                       "or --overwrite to replace it")
            sidecar.refuse_link(path)  # the rename would replace a link, not the file it names
            tmp = creating_path(path)
            sidecar.clear(tmp)  # a killed run's leftover is ours (we hold the lock); anything else is refused
            try:
                made = write_empty(tmp, (h, w, c), label_kind, label_shape, block_rows, image_filters,
                                   expected_rows, attrs)
                writer = cls(handle.open_for_writing(tmp, made), lock=lock if owned else None)
            except (StoreWriteError, StoreFormatError, OSError) as exc:
                handle.remove(tmp)
                code = getattr(exc, "errno", None)
                reason = getattr(exc, "strerror", None) or str(exc)
                raise StoreWriteError(f"{path}: cannot create it ({reason}); nothing was written",
                                      errno=code, strerror=reason, rows_committed=None) from exc
            except BaseException:  # whatever else stopped it (Ctrl-C, a library's refusal): no file of it is left
                handle.remove(tmp)
                raise
            writer.path, writer._publish_to = path, path
            writer._publish_early = publish_early
            return writer
        except BaseException:
            if owned:
                lock.release()
            raise

    @classmethod
    def open_append(cls, path: str | os.PathLike, *, lock: StoreLock | None = None) -> StoreWriter:
        """Open an existing store for appending, dropping rows past ``committed_rows`` left by a crash.

        A store whose flushing marker is there (a writer stopped while HDF5 rewrote it in place) is refused
        with :class:`~h5stream.errors.StoreFormatError`: the caller rebuilds it first
        (:func:`h5stream.store.rebuild.rebuild`, under the same lock)."""
        owned = lock is None
        lock = StoreLock.acquire(path) if owned else lock
        try:
            sidecar.clear(creating_path(path))  # a new store's leftover from a killed --overwrite: never published
            marker = schema.flushing_path(path)
            if os.path.exists(marker):  # its structure may be torn: appending could fail inside HDF5, or worse
                raise StoreFormatError(
                    f"{path}: its last writer stopped while it rewrote the file's structure in place ({marker} is "
                    f"there); rebuild it before appending: `h5stream repair {path}`")
            meta = read_meta(path)  # validates; raises StoreNotFoundError / StoreFormatError
            # Version 1 (fixed-width /paths) keeps its layout when appended to: see h5stream.store.pathrows.
            if meta.format_version > schema.FORMAT_VERSION:
                raise StoreFormatError(
                    f"{meta.path}: format version {meta.format_version}, this h5stream writes {schema.FORMAT_VERSION}; "
                    "ingest into a new file"
                )
            if meta.checksum_problem is not None:  # appending would hash damaged rows anew and hide the damage
                raise StoreFormatError(f"{meta.checksum_problem}; nothing can be appended to it")
            h5 = handle.open_for_writing(os.fspath(path))
            try:
                writer = cls(h5, lock=lock if owned else None)
            except BaseException:  # refused by its checksums (checksum.resume), nothing written: not left open
                h5.close()
                raise
        except BaseException:
            if owned:
                lock.release()
            raise
        try:
            writer._truncate_to_committed()
        except BaseException:
            writer.discard()
            raise
        return writer

    # -- writing ------------------------------------------------------------------
    @property
    def rows(self) -> int:
        """Rows appended so far, committed or not (the committed count once closed)."""
        return self.committed_rows if self._closed or not self._f.isopen else int(self.images.nrows)

    @property
    def attrs(self):
        return self._f.root._v_attrs

    @property
    def meta(self) -> dict:
        a = self.attrs
        return {
            "image_shape": tuple(int(a[k]) for k in (schema.ATTR_HEIGHT, schema.ATTR_WIDTH, schema.ATTR_CHANNELS)),
            "encoding": self.encoding,
            "label_kind": str(a[schema.ATTR_LABEL_KIND]),
            "label_shape": tuple(self.labels.shape[1:]),
            "class_names": json.loads(a[schema.ATTR_CLASS_NAMES]),
            "label_columns": json.loads(a[schema.ATTR_LABEL_COLUMNS]),
            "block_rows": int(a[schema.ATTR_BLOCK_ROWS]),
            "resize_mode": str(a[schema.ATTR_RESIZE]),
            "background": tuple(json.loads(a[schema.ATTR_BACKGROUND])),
            "storage_order": str(a[schema.ATTR_ORDER]),
            "order_seed": int(a[schema.ATTR_ORDER_SEED]),
        }

    def _truncate_to_committed(self) -> None:
        n = self.committed_rows
        self._pending, self._pending_rows = [], 0  # rows past the count: dropped with them
        for arr in (self.images, self.labels) if self._vlen_paths else (self.images, self.labels, self.paths):
            if arr.nrows > n:
                arr.truncate(n)
        if self._vlen_paths:
            pathrows.truncate(self._f.root, n)
        rowdigest.truncate(self._f.root, n)
        self._flush()

    def append(self, images: np.ndarray, labels: np.ndarray, paths: Sequence[str], image_digests=(), *,
               wait: bool = True) -> None:
        """Append rows (not yet committed).  Shapes must match the store.  ``image_digests``: the block checksums
        of whole blocks of ``images`` from its first row, where they are known already (see
        :meth:`~h5stream.store.checksum.BlockHasher.add`); they are what :func:`h5stream.store.checksum.digest`
        gives for those rows, or the store's checksums are wrong.

        The rows' pixel chunks are written here, into file space allocated first; raises
        :class:`~h5stream.errors.StoreWriteError` (the file left as its last commit) when that fails.  Rows that
        start on a block boundary and fill whole blocks are written as HDF5 chunks straight from ``images``
        (no copy); the caller keeps ``images`` unchanged only until this returns, or with ``wait=False`` until
        :meth:`wait_direct_writes` says they are written (this returns once they are submitted: the disk writes
        them while the caller goes on).  Their labels and paths (a few
        hundred bytes a row, copied here) are written with the next :meth:`commit`, in one write per array, or
        once :data:`PENDING_ROWS` wait.
        """
        self._check_open()
        if self.encoding != schema.ENCODING_RAW or getattr(images, "encoded_rows", False):
            self._append_encoded(images, labels, paths)
            return
        images = np.ascontiguousarray(images)
        labels = np.asarray(labels, dtype=self.labels.atom.dtype.base)
        n = images.shape[0]
        if images.dtype != np.uint8 or images.shape[1:] != self.images.shape[1:]:
            raise ConfigError(f"images must be uint8 {self.images.shape[1:]}, got {images.dtype} {images.shape[1:]}")
        if labels.shape != (n, *self.labels.shape[1:]):
            raise ConfigError(f"labels must have shape {(n, *self.labels.shape[1:])}, got {labels.shape}")
        if len(paths) != n:
            raise ConfigError(f"{n} images but {len(paths)} paths")
        encoded = pathrows.stored(paths, self._vlen_paths)

        self._write_guarded(space_for((self.images,), n), lambda: self._append_images(images))
        if wait:
            self.wait_direct_writes()
        self._hash_and_queue(images, labels, encoded, image_digests)

    def _hash_and_queue(self, images, labels: np.ndarray, encoded: np.ndarray, image_digests=()) -> None:
        """Hash appended rows and queue their labels and paths for the next write of them."""
        if self._hasher is not None:
            self._hasher.add(images, labels, encoded, image_digests)
        rows = rowdigest.of_rows(images) if self._row_digests is not None else None
        self._pending.append((labels.copy(), encoded, rows))  # the caller may reuse its labels' memory
        self._pending_rows += len(encoded)
        if self._pending_rows >= PENDING_ROWS:
            self._write_pending()

    def _append_encoded(self, rows, labels, paths: Sequence[str]) -> None:
        """:meth:`append` of an encoded store: ``rows`` an :class:`~h5stream.store.encoded.EncodedRows`."""
        if self.encoding == schema.ENCODING_RAW or not getattr(rows, "encoded_rows", False):
            raise ConfigError(f"a store of encoding {self.encoding!r} takes "
                              f"{'pixel rows' if self.encoding == schema.ENCODING_RAW else 'encoded rows'}")
        labels = np.asarray(labels, dtype=self.labels.atom.dtype.base)
        n = len(rows)
        if labels.shape != (n, *self.labels.shape[1:]):
            raise ConfigError(f"labels must have shape {(n, *self.labels.shape[1:])}, got {labels.shape}")
        if len(paths) != n:
            raise ConfigError(f"{n} images but {len(paths)} paths")
        stored = pathrows.stored(paths, self._vlen_paths)
        nbytes = space_for((self.images.data,), len(rows.data)) + space_for((self.images.ends,), n)
        self._write_guarded(nbytes, lambda: self.images.append(rows))
        self._hash_and_queue(rows, labels, stored)

    def _write_pending(self, checksums: bool = False) -> None:
        """Write the labels and paths of the rows appended since the last call (one write per array), and with
        ``checksums`` the digests of the blocks hashed so far (one guarded write for all)."""
        sums = self._f.root._f_get_child(schema.CHECKSUMS) if checksums and self._hasher is not None else None
        if not self._pending and sums is None:
            return
        labels = np.concatenate([lab for lab, _, _ in self._pending]) if self._pending else None
        paths = row_digests = None
        if self._pending:
            encoded = [enc for _, enc, _ in self._pending]
            if self._row_digests is not None:
                row_digests = np.concatenate([d for _, _, d in self._pending])
            paths = pathrows.PathRows.concat(encoded) if self._vlen_paths else np.concatenate(encoded)
        nbytes = space_for((self.labels, self.paths), len(paths)) if paths is not None else 0
        if paths is not None and self._vlen_paths:
            nbytes += space_for((self._path_bytes,), len(paths.data))
        if row_digests is not None:
            nbytes += space_for((self._row_digests,), len(row_digests))
        if sums is not None:
            nbytes += space_for((sums,), self._hasher.pending_blocks)

        def write() -> None:
            if paths is not None:
                self.labels.append(labels)
                if self._vlen_paths:  # the bytes, then where each row's end: see h5stream.store.pathrows
                    ends = np.cumsum(paths.lengths, dtype=np.int64) + np.int64(self._path_bytes.nrows)
                    self._path_bytes.append(paths.data)
                    self.paths.append(ends)
                else:
                    self.paths.append(paths)
                if row_digests is not None:  # before the count that publishes their rows, as the labels
                    self._row_digests.append(row_digests)
            if sums is not None:
                checksum.stage(self._f, self._hasher)

        self._write_guarded(nbytes, write)
        self._pending, self._pending_rows = [], 0

    def _append_images(self, images: np.ndarray) -> None:
        """Append C-contiguous ``images``: whole blocks from a block boundary on as raw chunks (one write each,
        from ``images`` itself: HDF5 neither fills nor copies a chunk first; written direct to the disk where
        HDF5 allocated the chunk as the array grew), the rest through HDF5's append."""
        arr = self.images
        per_chunk = int(arr.chunkshape[0])
        start, n = int(arr.nrows), len(images)
        whole = n - n % per_chunk if self._whole_chunks and start % per_chunk == 0 else 0
        if whole:
            arr.truncate(start + whole)  # grows the extent only: no chunk is written for it
            chunks = images[:whole].reshape(whole // per_chunk, -1)
            coords = [0] * arr.ndim
            for k, chunk in enumerate(chunks):
                coords[0] = start + k * per_chunk
                at = arr.chunk_info(tuple(coords)).offset if self._raw is not None else None
                if at is None or not self._raw.write(chunk, at):
                    arr.write_chunk(tuple(coords), chunk)
        if whole < n:
            arr.append(images[whole:])

    def commit(self) -> int:
        """Make appended rows durable, then publish them by raising ``committed_rows``.  Returns the new count."""
        self._write_pending(checksums=True)  # digests with their rows, flushed before the count: see store/coverage.py
        n = min(self.images.nrows, self.labels.nrows, self.paths.nrows,
                *(() if self._row_digests is None else (self._row_digests.nrows,)))
        if self.encoding != schema.ENCODING_RAW and n > self.committed_rows:
            self._record_block_bytes(n)
        self._flush()  # data, the arrays' new extents and attributes set since: on disk, or StoreWriteError
        self.attrs[self._committed_attr] = np.int64(n)
        self._flush()  # ... then the count that makes them visible
        self.committed_rows = n
        if n and not self.published and self._publish_early:
            self._publish()
        return n

    def _record_block_bytes(self, n: int) -> None:
        """Raise the ``encoded_block_bytes`` attribute to the largest block among rows up to ``n`` appended since
        the last commit (their whole blocks, read back from ``/image_ends``)."""
        block_rows = int(self.attrs[schema.ATTR_BLOCK_ROWS])
        first = self.committed_rows // block_rows * block_rows
        ends = np.asarray(self.images.ends[max(0, first - 1):n], np.int64)
        before = int(ends[0]) if first else 0
        most = encoded.largest_block_bytes(ends[1:] if first else ends, first, block_rows, before)
        known = int(self.attrs[schema.ATTR_ENCODED_BLOCK_BYTES]) if schema.ATTR_ENCODED_BLOCK_BYTES in self.attrs else 0
        if most > known:
            self.attrs[schema.ATTR_ENCODED_BLOCK_BYTES] = np.int64(most)

    def rollback(self, rows: int) -> None:
        """Drop every row past ``rows``, committed or not (``--strict`` undoing its own append).

        ``committed_rows`` is lowered and flushed before the arrays shrink, so a
        crash in between still leaves a consistent file.
        """
        rows = int(rows)
        if not 0 <= rows <= self.committed_rows:
            raise ConfigError(f"cannot roll back to {rows} rows; {self.committed_rows} are committed")
        self.attrs[self._committed_attr] = np.int64(rows)
        self._flush()
        self.committed_rows = rows
        self._resume_checksums()  # while the rows its digests cover are there to check the block they cut
        self._truncate_to_committed()

    def set_attr(self, name: str, value) -> None:
        self.attrs[name] = value

    def _resume_checksums(self) -> None:
        """Set up the block hasher for rows appended after ``committed_rows`` (writes the re-hashed tail)."""
        if schema.CHECKSUMS not in self._f.root:
            return
        sums = self._f.root._f_get_child(schema.CHECKSUMS)
        block_rows = int(self.attrs[schema.ATTR_BLOCK_ROWS])
        most_new = max(0, self.committed_rows // block_rows - sums.nrows)  # blocks resume() may hash again

        def resume() -> None:
            self._hasher = checksum.resume(self._f, self.committed_rows)

        self._write_guarded(space_for((sums,), most_new), resume)

    # -- closing ------------------------------------------------------------------
    def close(self) -> None:
        """Commit what was appended, close, publish a new store (even with no rows) and release the lock.
        Idempotent; after a write failure (or :meth:`discard`) there is nothing left to do."""
        try:
            if not self._closed and self._f.isopen:
                self.commit()
                if not self.published:  # no rows: an empty store, published all the same
                    self._publish()
                self._close_file()
        except BaseException:
            self._discard(cut_back=True)  # interrupted half-way: keep the last commit, not half of this one
            raise
        finally:
            self._closed = True
            self._release_lock()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_arrays(
    path: str | os.PathLike,
    images: np.ndarray,
    labels: np.ndarray,
    *,
    class_names: Sequence[str] | None = None,
    label_columns: Sequence[str] | None = None,
    block_rows: int | None = None,
    storage_order: str = "sorted",
    compression: str | None = None,
    overwrite: bool = False,
    rows_per_write: int = 4096,
) -> StoreMeta:
    """Write in-memory arrays as a store (tests, benchmarks, examples).  ``labels``: int -> class labels,
    float -> regression targets."""
    images = np.asarray(images, dtype=np.uint8)
    labels = np.asarray(labels)
    if images.ndim == 3:
        images = images[..., None]
    kind = schema.LABEL_CLASS if np.issubdtype(labels.dtype, np.integer) else schema.LABEL_REGRESSION
    if kind == schema.LABEL_CLASS and class_names is None:
        class_names = [str(i) for i in range(int(labels.max()) + 1 if labels.size else 0)]
    with StoreWriter.create(
        path, image_shape=images.shape[1:], label_kind=kind, label_shape=labels.shape[1:],
        class_names=class_names if kind == schema.LABEL_CLASS else None, label_columns=label_columns,
        block_rows=block_rows, storage_order=storage_order, compression=compression, overwrite=overwrite,
        expected_rows=len(images),
    ) as w:
        for start in range(0, len(images), rows_per_write):
            stop = start + rows_per_write
            w.append(images[start:stop], labels[start:stop], [f"row{i}" for i in range(start, min(stop, len(images)))])
            w.commit()
    return read_meta(path)
