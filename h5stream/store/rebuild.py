"""Rebuild a store whose writer stopped while HDF5 rewrote its structure in place.

HDF5 updates a file's headers, indexes and attributes in place, several writes
per flush.  A writer killed between two of them (SIGKILL, the OOM killer, a
failed flush) can leave a file whose committed rows still read, but whose
structure no longer takes a write: appending to it fails inside HDF5, or worse.
The writer leaves a marker beside the store for as long as HDF5 writes in place
(:func:`~h5stream.store.schema.flushing_path`); :func:`rebuild` is what the next
writer runs when it finds one (``h5stream repair``, and ``h5stream ingest
--append`` before it opens the store to append: the writer itself refuses a
marked store): check the committed rows against their block
checksums, copy them into a fresh file under the temporary name, and give that
file the store's name.  The old file stays as it is until the new one replaces
it, so a rebuild that fails or is killed can simply be run again.
"""

from __future__ import annotations

import json
import os

import h5py
import numpy as np

from h5stream.errors import StoreFormatError
from h5stream.store import handle, pathrows, schema
from h5stream.store.checksum import readable_by_h5py, row_reader, verify_store
from h5stream.store.lock import StoreLock
from h5stream.store.meta import read_meta
from h5stream.store.writer import StoreWriter

#: Rows copied per step: about this many bytes of pixels (whole blocks).
COPY_BYTES = 64 << 20

#: HDF5's filter id of Blosc (PyTables' ``blosc`` compression).
_BLOSC_FILTER = 32001


def copy_rows(block_rows: int, row_bytes: int, copy_bytes: int = COPY_BYTES) -> int:
    """Rows per copy step (pure): whole blocks of about ``copy_bytes``, at least one block."""
    blocks = max(1, copy_bytes // max(1, block_rows * row_bytes))
    return blocks * block_rows


def _compression(images: h5py.Dataset) -> str | None:
    """The writer's name for ``images``' compression: ``"zlib"``, ``"blosc"`` or None."""
    plist = images.id.get_create_plist()
    codes = {plist.get_filter(i)[0] for i in range(plist.get_nfilters())}
    if h5py.h5z.FILTER_DEFLATE in codes:
        return "zlib"
    return "blosc" if _BLOSC_FILTER in codes else None


def rebuild(path: str, lock: StoreLock, row_digests: bool = True) -> int:
    """Copy the committed rows of the store at ``path`` (whose flushing marker says a writer stopped half-way)
    into a fresh file that takes its name, then remove the marker.  Returns the rows kept.  The caller holds
    the store's ``lock``.  ``row_digests=False``: the rows are checked against their block checksums alone (a store
    whose ``/row_digests`` falls short of its rows; the copy has the digest of every row).

    Raises :class:`~h5stream.errors.StoreFormatError` when the store does not open or its committed rows do
    not match their checksums (the file and the marker are left as they are), and
    :class:`~h5stream.errors.StoreWriteError` when the copy cannot be written (the temporary file is removed,
    the store is left as it is).
    """
    advice = "ingest again into a new file (--overwrite)"
    try:
        meta = read_meta(path)
    except StoreFormatError as exc:
        raise StoreFormatError(f"{exc}; a writer stopped while it updated this store's structure, which cannot "
                               f"be rebuilt: {advice}") from exc
    checked = verify_store(path, row_digests=row_digests)
    stopped = (f"{path}: a writer stopped while it updated this store's structure" if row_digests else
               f"{path}: committed rows lack their row digest")
    if checked.bad:
        bad = checked.bad[0]
        raise StoreFormatError(
            f"{stopped}, and rows {bad.start}-{bad.stop - 1} no longer match their checksums "
            f"({', '.join(bad.parts)}), so it cannot be rebuilt: {advice}")
    if not checked.has_checksums:
        raise StoreFormatError(f"{stopped}, and it has no checksums to check its rows against (it was written "
                               f"before h5stream stored them), so it cannot be rebuilt safely: {advice}")
    if checked.unchecked:
        a, b = checked.unchecked[0]
        raise StoreFormatError(f"{stopped}, and rows {a}-{b - 1} have no checksum to check them against, so it "
                               f"cannot be rebuilt safely: {advice}")
    order = (schema.IMAGES, schema.LABELS, schema.PATHS)
    with h5py.File(path, "r", locking=False) as f:
        attrs = f.attrs
        pad_fill = json.loads(attrs[schema.ATTR_PAD_FILL]) if schema.ATTR_PAD_FILL in attrs else None
        background = json.loads(attrs[schema.ATTR_BACKGROUND])
        # unfinished stays so, a part of a set stays that part, rows appended from a grown listing stay marked
        kept = (*schema.INGEST_ATTRS, *schema.ORDER_ATTRS, schema.ATTR_PART)
        progress = {name: attrs[name] for name in kept if name in attrs}
        compression = _compression(f[schema.IMAGES])
        via_h5py = readable_by_h5py(f[schema.IMAGES])
        step = copy_rows(meta.block_rows, meta.row_bytes)
        fixed = [pathrows.row_node(f) if name == schema.PATHS else name for name in order]
        bufs = {name: np.empty((min(step, max(1, meta.rows)), *f[node].shape[1:]), f[node].dtype)
                for name, node in zip(order, fixed)}
    target = os.path.realpath(path)  # a symlinked store is rebuilt where the link points: the link stays a link
    source = row_reader(path, via_h5py)  # PyTables where plain h5py lacks the filter (blosc)
    try:
        writer = StoreWriter.create(
            target, image_shape=meta.image_shape, label_kind=meta.label_kind, label_shape=meta.label_shape,
            class_names=meta.class_names, label_columns=meta.label_columns, block_rows=meta.block_rows,
            resize_mode=meta.resize_mode, background=background, pad_fill=pad_fill,
            storage_order=meta.storage_order, order_seed=meta.order_seed, compression=compression, overwrite=True,
            expected_rows=max(1, meta.rows), lock=lock, publish_early=False, encoding=meta.encoding,
            jpeg_quality=meta.jpeg_quality)
        try:
            if meta.encoded:  # encoded rows: copied block by block as they are (see store/encoded.py)
                copy_encoded_rows(path, writer, meta)
            for start in range(0, meta.rows if not meta.encoded else 0, step):
                stop = min(meta.rows, start + step)
                images, labels, paths = (source.read(name, start, stop, bufs[name]) for name in order)
                stored = paths.to_bytes() if isinstance(paths, pathrows.PathRows) else paths
                writer.append(images, labels, [schema.decode_path(bytes(p)) for p in stored])
                writer.commit()  # durable under the temporary name; the store keeps its name meanwhile
            writer.set_attr(schema.ATTR_SKIPPED, np.int64(meta.skipped_files))
            for name, value in progress.items():
                writer.set_attr(name, value)
        except BaseException:
            writer.discard()  # removes the temporary file: the store and its marker stay
            raise
    finally:
        source.close()
    writer.close()  # commits, takes the store's name (a rename) and syncs the folder
    handle.remove(schema.flushing_path(path))
    return meta.rows


def copy_encoded_rows(path: str, writer: StoreWriter, meta) -> None:
    """Append the committed rows of the encoded store at ``path`` to ``writer``, a block at a time, each block
    committed (under the writer's temporary name)."""
    from h5stream.store.encoded import EncodedArray

    with h5py.File(path, "r", locking=False) as f:
        rows, labels = EncodedArray.of(f), f[schema.LABELS]
        for start in range(0, meta.rows, meta.block_rows):
            stop = min(meta.rows, start + meta.block_rows)
            writer.append(rows.read(start, stop), labels[start:stop],
                          [schema.decode_path(p) for p in pathrows.stored_bytes(f, start, stop)])
            writer.commit()


def needs_rebuild(path: str | os.PathLike) -> bool:
    """Whether a writer left the store at ``path`` half-way through an in-place update (its marker is there)."""
    return os.path.exists(schema.flushing_path(path))
