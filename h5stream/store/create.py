"""A new, empty store on disk: its arrays, attributes and layout, durable before any row is written.

:func:`new_store_attrs` checks what describes a store and gives its root
attributes (pure); :func:`write_empty` lays the file out (see
:mod:`h5stream.store.layout`), flushes it within reserved space, syncs it and
checks that it opens.  :class:`~h5stream.store.writer.StoreWriter.create`
calls both on the temporary name (:func:`~h5stream.store.handle.creating_path`)
and removes it on failure.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Sequence

import numpy as np
import tables

from h5stream.errors import ConfigError
from h5stream.store import checksum, handle, layout, pathrows, rowdigest, schema, sidecar
from h5stream.store import encoded as encoded_rows
from h5stream.store.meta import read_meta
from h5stream.store.space import SpaceGuard

COMPRESSIONS = (None, "zlib", "blosc")
"""zlib (gzip) reads in plain h5py; blosc is PyTables-only (h5py needs the hdf5plugin package)."""

#: New stores keep their paths variable-length (:mod:`h5stream.store.pathrows`); True lays out the fixed-width
#: ``/paths`` of format-1 stores instead, which tests set to make such a store with the code that made them.
FIXED_WIDTH_PATHS = False


def filters(compression: str | None, level: int = 4) -> tables.Filters | None:
    """PyTables filters of ``/images`` for ``compression`` (one of :data:`COMPRESSIONS`)."""
    if compression is None:
        return None
    if compression == "zlib":
        return tables.Filters(complevel=level, complib="zlib", shuffle=False)
    if compression == "blosc":
        return tables.Filters(complevel=level, complib="blosc:lz4", shuffle=True)
    raise ConfigError(f"unknown compression {compression!r}; choose one of none, zlib, blosc")


CLASS_NAMES_BYTES = 64_000
"""Bytes of JSON class names a store takes: HDF5's object header format (the one its stores are made in, which
crash-safe commits rely on) keeps at most 64 KiB in one attribute."""


def class_names_attr(class_names) -> str:
    """The ``class_names`` attribute's JSON text for ``class_names`` (None: no classes), or ConfigError where it
    would take more than :data:`CLASS_NAMES_BYTES` (pure)."""
    names = json.dumps(list(class_names) if class_names is not None else None)
    size = len(names.encode("utf-8"))
    if size > CLASS_NAMES_BYTES:
        raise ConfigError(f"the names of {len(class_names):,} classes take {size:,} bytes, and a store keeps them "
                          f"in one HDF5 attribute of at most {CLASS_NAMES_BYTES:,} (about 5,000 names such as "
                          "n01440764); use shorter class names or fewer classes per store")
    return names


def new_store_attrs(image_shape: Sequence[int], *, label_kind: str, class_names, label_columns, block_rows: int,
                    resize_mode: str, background: Sequence[int], pad_fill, storage_order: str,
                    order_seed: int, encoding: str = schema.ENCODING_RAW, jpeg_quality: int | None = None,
                    row_digests: bool = True) -> dict:
    """The root attributes of a new store (pure); ConfigError for an impossible shape, label kind or encoding.
    ``row_digests``: the store keeps ``/row_digests`` (:mod:`h5stream.store.rowdigest`), and so is stamped with
    format version 3; without them, version 2."""
    h, w, c = (int(d) for d in image_shape)
    if min(h, w, c) < 1:
        raise ConfigError(f"image shape must be positive, got {tuple(image_shape)}")
    if label_kind not in schema.LABEL_KINDS:
        raise ConfigError(f"label_kind must be 'class', 'regression' or 'none', got {label_kind!r}")
    if block_rows < 1:
        raise ConfigError(f"block_rows must be >= 1, got {block_rows}")
    if encoding not in schema.ENCODINGS:
        raise ConfigError(f"unknown encoding {encoding!r}; choose one of {', '.join(schema.ENCODINGS)}")
    names = class_names_attr(class_names)
    attrs = {
        schema.ATTR_FORMAT: np.int64(schema.ROW_DIGESTS_FORMAT_VERSION if row_digests
                                     else schema.ROW_DIGESTS_FORMAT_VERSION - 1),
        schema.ATTR_COMMITTED: np.int64(0),
        schema.ATTR_LABEL_KIND: label_kind,
        schema.ATTR_CLASS_NAMES: names,
        schema.ATTR_LABEL_COLUMNS: json.dumps(list(label_columns) if label_columns is not None else None),
        schema.ATTR_HEIGHT: np.int64(h),
        schema.ATTR_WIDTH: np.int64(w),
        schema.ATTR_CHANNELS: np.int64(c),
        schema.ATTR_RESIZE: resize_mode,
        schema.ATTR_BACKGROUND: json.dumps([int(v) for v in background]),
        schema.ATTR_ORDER: storage_order,
        schema.ATTR_ORDER_SEED: np.int64(order_seed if storage_order == "shuffled" else -1),
        schema.ATTR_BLOCK_ROWS: np.int64(block_rows),
        schema.ATTR_SKIPPED: np.int64(0),
    }
    if pad_fill is not None:
        attrs[schema.ATTR_PAD_FILL] = json.dumps([int(v) for v in pad_fill])
    if encoding != schema.ENCODING_RAW:  # encoded rows: see h5stream.store.encoded
        del attrs[schema.ATTR_COMMITTED]
        attrs[schema.ATTR_ENCODED_COMMITTED] = np.int64(0)
        attrs[schema.ATTR_ENCODING] = encoding
        attrs[schema.ATTR_JPEG_QUALITY] = np.int64(90 if jpeg_quality is None else jpeg_quality)
        attrs[schema.ATTR_FORMAT] = np.int64(max(attrs[schema.ATTR_FORMAT], schema.ENCODED_FORMAT_VERSION))
    return attrs


def write_empty(tmp: str, image_shape: tuple[int, int, int], label_kind: str, label_shape: tuple[int, ...],
                block_rows: int, image_filters, expected_rows: int, attrs: dict) -> tuple[int, int]:
    """Lay out an empty store in ``tmp`` (where nothing may lie yet), durable and verified to open; returns the
    (device, inode) of the file made, for the writer to check that it opens that one
    (:func:`~h5stream.store.handle.open_for_writing`).  Raises OSError (StoreFormatError if it does not open,
    StoreExistsError if something else is at ``tmp``) on any failure, leaving ``tmp`` for the caller to remove.

    HDF5 opens files by name and follows links (and opening an HDF5 file for writing writes to it).  Safe
    here: HDF5 creates ``tmp`` exclusively (``O_CREAT | O_EXCL`` never follows a link nor opens a file
    already there, so a link planted at ``tmp`` fails the create, its target untouched); the file made is
    then opened once more here, without following a link, and HDF5 reopens it through that descriptor
    (``/proc/self/fd/N`` names the open file itself, whatever lies at ``tmp`` by then)."""
    try:
        layout.create_empty_file(tmp)
    except RuntimeError as exc:  # h5py reports a close that could not write as RuntimeError
        code, reason = handle.describe(exc)
        raise OSError(code or errno.EIO, reason) from exc
    # The regular file HDF5 just made (ours by construction, whoever the file system says owns it), or a refusal.
    own = sidecar.open_fd(tmp, os.O_RDONLY, owner=False)
    try:
        made = sidecar.identity(own)
        _lay_out(sidecar.fd_path(own, tmp), os.fstat(own).st_size, image_shape, label_kind, label_shape, block_rows,
                 image_filters, expected_rows, attrs)
    finally:
        os.close(own)
    read_meta(tmp)  # the complete file opens; a close that failed unseen would show here
    return made


def _lay_out(name: str, size: int, image_shape: tuple[int, int, int], label_kind: str, label_shape: tuple[int, ...],
             block_rows: int, image_filters, expected_rows: int, attrs: dict) -> None:
    """Add the store's arrays and attributes to the empty HDF5 file that HDF5 opens as ``name`` (``size``
    bytes), flush it within reserved space and sync it (see :func:`write_empty`)."""
    encoded = attrs.get(schema.ATTR_ENCODING, schema.ENCODING_RAW) != schema.ENCODING_RAW
    early = image_filters is None and layout.EARLY_PIXEL_CHUNKS and not encoded
    if early:  # the writer writes whole blocks where HDF5 put them (see layout)
        try:
            layout.create_images_allocated_early(name, schema.IMAGES, image_shape, block_rows)
        except RuntimeError as exc:
            code, reason = handle.describe(exc)
            raise OSError(code or errno.EIO, reason) from exc
    f = tables.open_file(name, mode="a", chunk_cache_size=0)
    try:
        if not early:
            f.create_earray(
                f.root, schema.IMAGES, tables.UInt8Atom(), shape=(0, *image_shape),
                chunkshape=(block_rows, *image_shape), filters=image_filters, expectedrows=expected_rows,
            )
        if encoded:
            encoded_rows.create_nodes(f, expected_rows)
        label_atom = {schema.LABEL_CLASS: tables.Int64Atom(), schema.LABEL_NONE: tables.Int8Atom()}.get(
            label_kind, tables.Float32Atom())
        f.create_earray(
            f.root, schema.LABELS, label_atom, shape=(0, *label_shape),
            chunkshape=(layout.label_chunk_rows(label_atom.itemsize * int(np.prod(label_shape)), block_rows),
                        *label_shape), expectedrows=expected_rows,
        )
        if FIXED_WIDTH_PATHS:
            attrs = {**attrs, schema.ATTR_FORMAT: np.int64(1)}
            f.create_earray(
                f.root, schema.PATHS, tables.StringAtom(itemsize=schema.PATH_BYTES), shape=(0,),
                chunkshape=(1024,), expectedrows=expected_rows,
            )
        else:
            pathrows.create_nodes(f, expected_rows)
        if int(attrs[schema.ATTR_FORMAT]) >= schema.ROW_DIGESTS_FORMAT_VERSION:
            rowdigest.create_node(f, block_rows, expected_rows)
        for key, value in attrs.items():
            f.root._v_attrs[key] = value
        checksum.create_nodes(f)
        fd = handle.file_descriptor(f)
        guard = SpaceGuard(fd, f.get_filesize, size)
        guard.reserve(0)
        f.flush()
        guard.check_within()
        if fd is not None:
            os.fsync(fd)
        guard.trim()
        f.close()
    except BaseException as exc:
        if f.isopen:
            handle.close_cut_off(f)
        if isinstance(exc, tables.HDF5ExtError):
            code, reason = handle.describe(exc)
            raise OSError(code or errno.EIO, reason) from exc
        raise
