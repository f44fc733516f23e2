"""Create and extend a store with PyTables EArrays.

:class:`StoreWriter` owns one PyTables file handle and is used from one thread
(the ingest writer).  Rows are appended to ``/images``, ``/labels`` and
``/paths``; :meth:`StoreWriter.commit` flushes them and only then raises the
``committed_rows`` attribute, so a writer killed at any moment leaves a file
whose first ``committed_rows`` rows are complete in all three arrays.  A crash
may leave extra, uncommitted rows past that count: readers ignore them and
:meth:`StoreWriter.open_append` truncates them before writing again.  Each
commit also records the block checksums of the rows it publishes (see
:mod:`h5stream.store.checksum`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np
import tables

from h5stream.errors import ConfigError, StoreExistsError, StoreFormatError
from h5stream.store import checksum, schema
from h5stream.store.meta import StoreMeta, read_meta

COMPRESSIONS = (None, "zlib", "blosc")
"""zlib (gzip) reads in plain h5py; blosc is PyTables-only (h5py needs the hdf5plugin package)."""


def _filters(compression: str | None, level: int = 4) -> tables.Filters | None:
    if compression is None:
        return None
    if compression == "zlib":
        return tables.Filters(complevel=level, complib="zlib", shuffle=False)
    if compression == "blosc":
        return tables.Filters(complevel=level, complib="blosc:lz4", shuffle=True)
    raise ConfigError(f"unknown compression {compression!r}; choose one of none, zlib, blosc")


class StoreWriter:
    """Append rows to a store.  Not thread-safe: one writer thread owns it.

    Use :meth:`create` for a new file or :meth:`open_append` to extend one;
    close with :meth:`close` or a ``with`` block (closing commits what was appended).
    """

    def __init__(self, h5file: tables.File):
        self._f = h5file
        root = h5file.root
        self.images = root._f_get_child(schema.IMAGES)
        self.labels = root._f_get_child(schema.LABELS)
        self.paths = root._f_get_child(schema.PATHS)
        self.committed_rows = int(root._v_attrs[schema.ATTR_COMMITTED])
        self._hasher = checksum.resume(h5file, self.committed_rows)  # None: a store without checksums

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
        storage_order: str = "shuffled",
        order_seed: int = 0,
        compression: str | None = None,
        overwrite: bool = False,
        expected_rows: int = 10_000,
    ) -> StoreWriter:
        path = os.fspath(path)
        if os.path.isdir(path):
            raise StoreExistsError(f"{path}: is a directory; give a file name such as {os.path.join(path, 'train.h5')}")
        if os.path.exists(path) and not overwrite:
            raise StoreExistsError(f"{path}: already exists; pass --append to add to it or --overwrite to replace it")
        h, w, c = (int(d) for d in image_shape)
        if min(h, w, c) < 1:
            raise ConfigError(f"image shape must be positive, got {tuple(image_shape)}")
        if label_kind not in (schema.LABEL_CLASS, schema.LABEL_REGRESSION):
            raise ConfigError(f"label_kind must be 'class' or 'regression', got {label_kind!r}")
        row_bytes = h * w * c
        block_rows = int(block_rows or schema.default_block_rows(row_bytes))
        if block_rows < 1:
            raise ConfigError(f"block_rows must be >= 1, got {block_rows}")
        label_shape = tuple(int(d) for d in label_shape)
        label_atom = tables.Int64Atom() if label_kind == schema.LABEL_CLASS else tables.Float32Atom()
        tmp = path + ".creating"
        f = tables.open_file(tmp, mode="w")
        try:
            filters = _filters(compression)
            f.create_earray(
                f.root, schema.IMAGES, tables.UInt8Atom(), shape=(0, h, w, c),
                chunkshape=(block_rows, h, w, c), filters=filters, expectedrows=expected_rows,
            )
            label_chunk = max(1024, block_rows)
            f.create_earray(
                f.root, schema.LABELS, label_atom, shape=(0, *label_shape),
                chunkshape=(label_chunk, *label_shape), expectedrows=expected_rows,
            )
            f.create_earray(
                f.root, schema.PATHS, tables.StringAtom(itemsize=schema.PATH_BYTES), shape=(0,),
                chunkshape=(1024,), expectedrows=expected_rows,
            )
            a = f.root._v_attrs
            a[schema.ATTR_FORMAT] = np.int64(schema.FORMAT_VERSION)
            a[schema.ATTR_COMMITTED] = np.int64(0)
            a[schema.ATTR_LABEL_KIND] = label_kind
            a[schema.ATTR_CLASS_NAMES] = json.dumps(list(class_names) if class_names is not None else None)
            a[schema.ATTR_LABEL_COLUMNS] = json.dumps(list(label_columns) if label_columns is not None else None)
            a[schema.ATTR_HEIGHT] = np.int64(h)
            a[schema.ATTR_WIDTH] = np.int64(w)
            a[schema.ATTR_CHANNELS] = np.int64(c)
            a[schema.ATTR_RESIZE] = resize_mode
            a[schema.ATTR_BACKGROUND] = json.dumps([int(v) for v in background])
            a[schema.ATTR_ORDER] = storage_order
            a[schema.ATTR_ORDER_SEED] = np.int64(order_seed if storage_order == "shuffled" else -1)
            a[schema.ATTR_BLOCK_ROWS] = np.int64(block_rows)
            a[schema.ATTR_SKIPPED] = np.int64(0)
            checksum.create_nodes(f)
            f.flush()
        except BaseException:
            f.close()
            os.unlink(tmp)
            raise
        f.close()
        # The empty store appears under its name only once it is complete.
        os.replace(tmp, path)
        return cls(tables.open_file(path, mode="a"))

    @classmethod
    def open_append(cls, path: str | os.PathLike) -> StoreWriter:
        """Open an existing store for appending, dropping rows past ``committed_rows`` left by a crash."""
        meta = read_meta(path)  # validates; raises StoreNotFoundError / StoreFormatError
        if meta.format_version != schema.FORMAT_VERSION:
            raise StoreFormatError(
                f"{meta.path}: format version {meta.format_version}, this h5stream writes {schema.FORMAT_VERSION}; "
                "ingest into a new file"
            )
        f = tables.open_file(os.fspath(path), mode="a")
        try:
            writer = cls(f)
            writer._truncate_to_committed()
        except BaseException:
            f.close()
            raise
        return writer

    # -- writing ------------------------------------------------------------------
    @property
    def attrs(self):
        return self._f.root._v_attrs

    @property
    def meta(self) -> dict:
        a = self.attrs
        return {
            "image_shape": tuple(self.images.shape[1:]),
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
        for arr in (self.images, self.labels, self.paths):
            if arr.nrows > n:
                arr.truncate(n)
        self._f.flush()

    def stored_paths(self) -> list[str]:
        """Relative source paths of the committed rows (for resume/dedup)."""
        n = self.committed_rows
        if n == 0:
            return []
        return [p.decode("utf-8") for p in self.paths.read(0, n)]

    def append(self, images: np.ndarray, labels: np.ndarray, paths: Sequence[str]) -> None:
        """Append rows (not yet committed).  Shapes must match the store."""
        images = np.asarray(images)
        labels = np.asarray(labels, dtype=self.labels.atom.dtype.base)
        n = images.shape[0]
        if images.dtype != np.uint8 or images.shape[1:] != self.images.shape[1:]:
            raise ConfigError(f"images must be uint8 {self.images.shape[1:]}, got {images.dtype} {images.shape[1:]}")
        if labels.shape != (n, *self.labels.shape[1:]):
            raise ConfigError(f"labels must have shape {(n, *self.labels.shape[1:])}, got {labels.shape}")
        if len(paths) != n:
            raise ConfigError(f"{n} images but {len(paths)} paths")
        encoded = np.array([p.encode("utf-8") for p in paths], dtype=f"S{schema.PATH_BYTES}")
        self.images.append(images)
        self.labels.append(labels)
        self.paths.append(encoded)
        if self._hasher is not None:
            self._hasher.add(images, labels, encoded)

    def commit(self) -> int:
        """Flush appended rows, then publish them by raising ``committed_rows``.  Returns the new count."""
        n = min(self.images.nrows, self.labels.nrows, self.paths.nrows)
        if self._hasher is not None:
            checksum.stage(self._f, self._hasher)  # block digests travel with the data they cover
        self._f.flush()  # data (and the arrays' new extents) first ...
        self.attrs[schema.ATTR_COMMITTED] = np.int64(n)
        self._f.flush()  # ... then the count that makes them visible
        self.committed_rows = n
        return n

    def rollback(self, rows: int) -> None:
        """Drop every row past ``rows``, committed or not (``--strict`` undoing its own append).

        ``committed_rows`` is lowered and flushed before the arrays shrink, so a
        crash in between still leaves a consistent file.
        """
        rows = int(rows)
        if not 0 <= rows <= self.committed_rows:
            raise ConfigError(f"cannot roll back to {rows} rows; {self.committed_rows} are committed")
        self.attrs[schema.ATTR_COMMITTED] = np.int64(rows)
        self._f.flush()
        self.committed_rows = rows
        self._truncate_to_committed()
        self._hasher = checksum.resume(self._f, rows)

    def set_attr(self, name: str, value) -> None:
        self.attrs[name] = value

    def close(self) -> None:
        if self._f.isopen:
            self.commit()
            self._f.close()

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
    """Write in-memory arrays as a store (tests, benchmarks, examples).  ``labels`` int -> class, float -> regression."""
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
