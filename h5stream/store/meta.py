"""Read and validate an h5stream file's metadata with plain h5py.

:func:`read_meta` is what every reader starts from: it opens the file (the
way :mod:`h5stream.store.access` opens it: no HDF5 lock, so it works while an
ingest writes the file and beside the user's own h5py / PyTables handles),
checks the layout of :mod:`h5stream.store.schema`, and returns a frozen
:class:`StoreMeta`.  It never reads pixels.  It is safe to call from any thread
(it opens and closes its own handle).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace

import h5py
import numpy as np

from h5stream.errors import StoreFormatError
from h5stream.store import schema
from h5stream.store.access import read_consistent


@dataclass(frozen=True)
class StoreMeta:
    """What a reader needs to know about a store.  ``rows`` is the committed row count."""

    path: str
    rows: int
    image_shape: tuple[int, int, int]
    label_kind: str
    label_shape: tuple[int, ...]
    label_dtype: np.dtype
    class_names: tuple[str, ...] | None
    label_columns: tuple[str, ...] | None
    block_rows: int
    compression: str | None
    storage_order: str
    order_seed: int
    resize_mode: str
    skipped_files: int
    format_version: int
    file_bytes: int
    checksum: str | None = None
    """Hash of the stored block checksums (``"xxh3_64"``), ``None`` for a store without them."""
    remote: object = field(default=None, compare=False, repr=False)
    """For a URL: the :class:`~h5stream.remote.RemoteOptions` it was opened with, for every later open."""

    @property
    def row_bytes(self) -> int:
        h, w, c = self.image_shape
        return h * w * c

    @property
    def label_row_bytes(self) -> int:
        return int(np.prod(self.label_shape, dtype=np.int64)) * self.label_dtype.itemsize


def _attr(attrs, name, default=None):
    if name not in attrs:
        return default
    value = attrs[name]
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value.item()
    return value


def _json_attr(attrs, name):
    raw = _attr(attrs, name)
    if raw is None:
        return None
    value = json.loads(raw)
    return tuple(value) if value is not None else None


def read_meta(path: str | os.PathLike, *, remote=None) -> StoreMeta:
    """Open ``path`` read-only, validate it, and describe it.

    ``path`` may be a URL (``s3://bucket/key``, ``https://host/path``), reached with the ``remote`` options
    (None, an :class:`h5stream.RemoteOptions`, or a dict of its fields); they are kept in ``StoreMeta.remote``.

    Raises :class:`StoreNotFoundError` if the file is missing,
    :class:`StorePermissionError` if it may not be read, :class:`StoreFormatError`
    if it is not HDF5 or not laid out as an h5stream store (no ``/images``, wrong
    dtype or rank, labels shorter than images, bad attributes), and
    :class:`StoreBusyError` if another process writing it never let its metadata
    be read whole.
    """
    from h5stream.remote.config import is_url, remote_options

    if is_url(path):
        options = remote_options(remote)
        return replace(read_consistent(path, lambda f: _describe(path, f), remote=options), remote=options)
    path = os.fspath(path)
    return read_consistent(path, lambda f: _describe(path, f))


def _describe(path: str, f: h5py.File) -> StoreMeta:
    if schema.IMAGES not in f:
        raise StoreFormatError(f"{path}: no /{schema.IMAGES} dataset; is this a file written by `h5stream ingest`?")
    if schema.LABELS not in f:
        raise StoreFormatError(f"{path}: no /{schema.LABELS} dataset; is this a file written by `h5stream ingest`?")
    images, labels = f[schema.IMAGES], f[schema.LABELS]
    if images.dtype != np.uint8 or images.ndim != 4:
        raise StoreFormatError(
            f"{path}: /{schema.IMAGES} must be uint8 of shape (N, H, W, C), found {images.dtype} {images.shape}"
        )
    if labels.ndim not in (1, 2):
        raise StoreFormatError(f"{path}: /{schema.LABELS} must have shape (N,) or (N, K), found {labels.shape}")
    attrs = f.attrs
    stored = min(images.shape[0], labels.shape[0])
    committed = _attr(attrs, schema.ATTR_COMMITTED)
    if committed is None:
        # A file written by other tools: every row present in both arrays is usable.
        if labels.shape[0] < images.shape[0]:
            raise StoreFormatError(
                f"{path}: /{schema.LABELS} has {labels.shape[0]} rows but /{schema.IMAGES} has {images.shape[0]}; "
                "every image needs a label"
            )
        committed = stored
    committed = int(committed)
    if committed > stored:
        raise StoreFormatError(
            f"{path}: committed_rows={committed} but only {stored} rows are stored in both "
            f"/{schema.IMAGES} and /{schema.LABELS}; the file is damaged"
        )
    label_kind = _attr(attrs, schema.ATTR_LABEL_KIND)
    if label_kind is None:
        label_kind = schema.LABEL_CLASS if np.issubdtype(labels.dtype, np.integer) else schema.LABEL_REGRESSION
    chunks = images.chunks
    block_rows = int(_attr(attrs, schema.ATTR_BLOCK_ROWS, chunks[0] if chunks else min(64, max(1, images.shape[0]))))
    return StoreMeta(
        path=path,
        rows=committed,
        image_shape=tuple(int(d) for d in images.shape[1:]),
        label_kind=str(label_kind),
        label_shape=tuple(int(d) for d in labels.shape[1:]),
        label_dtype=np.dtype(labels.dtype),
        class_names=_json_attr(attrs, schema.ATTR_CLASS_NAMES),
        label_columns=_json_attr(attrs, schema.ATTR_LABEL_COLUMNS),
        block_rows=block_rows,
        compression=images.compression,
        storage_order=str(_attr(attrs, schema.ATTR_ORDER, "unknown")),
        order_seed=int(_attr(attrs, schema.ATTR_ORDER_SEED, -1)),
        resize_mode=str(_attr(attrs, schema.ATTR_RESIZE, "unknown")),
        skipped_files=int(_attr(attrs, schema.ATTR_SKIPPED, 0)),
        format_version=int(_attr(attrs, schema.ATTR_FORMAT, 0)),
        file_bytes=int(f.id.get_filesize()),
        checksum=str(_attr(attrs, schema.ATTR_CHECKSUM, "unknown")) if schema.CHECKSUMS in f else None,
    )
