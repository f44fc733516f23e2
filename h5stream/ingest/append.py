"""``--append``: what an existing store dictates to the run that adds to it, and the store opened for it.

:func:`resolve_append` checks the options against the store (size, channels, resize mode, order and seed, block
rows, label kind and columns, pad fill, classes: a mismatch is one line naming the flag to drop) and takes from it
what the run writes (:class:`~h5stream.ingest.options.IngestTarget`): the decoding, the order, the class list (new
classes get new indices after the store's), the paths already stored, the rows it holds.  :func:`open_append`
opens it for writing: a store whose writer stopped while HDF5 rewrote it in place is rebuilt from its committed
rows first (:mod:`h5stream.store.rebuild`; the writer itself only refuses such a store), then a grown class list
is recorded.  Run by the ingest's one thread, under the store's lock.
"""

from __future__ import annotations

from dataclasses import replace

from h5stream.errors import ConfigError, StoreFormatError
from h5stream.ingest.discover import Source
from h5stream.ingest.options import IngestOptions, IngestTarget
from h5stream.ingest.spec import DecodeSpec
from h5stream.store import pathrows, schema
from h5stream.store.lock import StoreLock


def resolve_append(opts: IngestOptions, source: Source) -> IngestTarget:
    from h5stream.store.access import open_h5_readonly
    from h5stream.store.meta import read_meta

    out = opts.out
    try:
        meta = read_meta(out)
    except StoreFormatError as exc:  # not ours to judge: a file we cannot read is never removed
        raise StoreFormatError(f"{exc}; --append only adds to a store it can read: move {out} away "
                               "(it is left as it is) and run without --append to start a new one") from exc

    def mismatch(what, theirs, ours, flag):
        raise ConfigError(f"{out}: store has {what} {theirs}, this run asks for {ours}; "
                          f"drop {flag} or ingest into a new file")

    h, w, c = meta.image_shape
    if opts.size is not None and tuple(opts.size) != (h, w):
        mismatch("size", f"{h}x{w}", f"{opts.size[0]}x{opts.size[1]}", "--size")
    if opts.channels is not None and opts.channels != c:
        mismatch("channels", c, opts.channels, "--channels")
    if opts.resize is not None and opts.resize != meta.resize_mode:
        mismatch("resize mode", meta.resize_mode, opts.resize, "--resize")
    if opts.order is not None and opts.order != meta.storage_order:
        mismatch("order", meta.storage_order, opts.order, "--order")
    if opts.seed is not None and meta.storage_order == "shuffled" and opts.seed != meta.order_seed:
        mismatch("order seed", meta.order_seed, opts.seed, "--seed")
    if opts.block_rows is not None and opts.block_rows != meta.block_rows:
        mismatch("block rows", meta.block_rows, opts.block_rows, "--block-rows")
    if opts.compression is not None and opts.compression != meta.compression:  # rows append as the store's are
        mismatch("compression", meta.compression or "none", opts.compression, "--compression")
    if opts.encoding not in (None, "auto", meta.encoding):
        mismatch("encoding", meta.encoding, opts.encoding, "--encoding")
    if opts.quality is not None and meta.encoded and opts.quality != meta.jpeg_quality:
        mismatch("JPEG quality", meta.jpeg_quality, opts.quality, "--quality")
    if opts.quality is not None and not meta.encoded and opts.encoding is None:
        raise ConfigError(f"{out}: store keeps raw pixels, this run asks for JPEG quality {opts.quality}; appended "
                          "rows are stored as the store's are: drop --quality, or ingest into a new file with "
                          "--encoding jpeg")
    if source.label_kind != meta.label_kind:
        raise ConfigError(
            f"{out}: store holds {meta.label_kind} labels but {source.root} gives {source.label_kind} labels; "
            "ingest into a new file"
        )
    if opts.row_digests is False and _has_row_digests(out):
        raise ConfigError(f"{out}: store keeps a digest per row (/row_digests), this run asks for none; appended "
                          "rows are stored as the store's are: drop --no-row-digests or ingest into a new file")
    background, pad_fill = schema_background(out)
    if opts.pad_fill is not None and tuple(opts.pad_fill) != pad_fill:
        mismatch("pad fill", ",".join(map(str, pad_fill)), ",".join(map(str, opts.pad_fill)), "--pad-fill")
    class_names = None
    if meta.label_kind == schema.LABEL_CLASS:
        class_names = list(meta.class_names or ())
        if opts.classes is not None and tuple(opts.classes[:len(class_names)]) != tuple(class_names):
            raise ConfigError(f"{out}: store has classes {', '.join(class_names)} in this order, --classes gives "
                              f"{', '.join(opts.classes)}; label indices cannot change, so --classes must start "
                              "with the store's classes (new ones after them)")
        class_names += [n for n in source.class_names if n not in class_names]  # new classes get new indices
    elif meta.label_kind == schema.LABEL_REGRESSION:  # unlabeled stores: no columns to compare
        if tuple(meta.label_columns or ()) != tuple(source.label_columns):
            mismatch("label columns", list(meta.label_columns or ()), list(source.label_columns), "--label-columns")
    stored: set[str] = set()
    # Through a file object: no HDF5 lock to clash with a reader's, no handle shared with one of this process.
    with open_h5_readonly(out) as f:
        fixed_width = not pathrows.is_vlen(f)
        for start in range(0, meta.rows, 65536):  # slices: a format-1 store's fixed-width column is 512 bytes a row
            stored.update(schema.decode_path(p) for p in pathrows.stored_bytes(f, start, min(meta.rows, start + 65536)))
    return IngestTarget(
        spec=DecodeSpec(size=(h, w), resize=meta.resize_mode, channels=c, background=background, pad_fill=pad_fill,
                        encoding=meta.encoding, quality=meta.jpeg_quality or 90),
        order=meta.storage_order,
        seed=max(meta.order_seed, 0),
        class_names=tuple(class_names) if class_names is not None else None,
        stored=frozenset(stored),
        start_rows=meta.rows,
        path_limit=schema.PATH_BYTES if fixed_width else None,
    )


def fit_paths(source: Source, path_limit: int | None) -> Source:
    """``source`` with the files whose relative path takes more than ``path_limit`` bytes moved to its rejected
    files (with the reason): an append to a store with fixed-width paths keeps that layout.  Pure."""
    if path_limit is None:
        return source
    # A character takes at most 4 bytes (a surrogate escape 1): shorter names need no encoding to be sure.
    fits = [len(it.relpath) * 4 <= path_limit or len(schema.encode_path(it.relpath)) <= path_limit
            for it in source.items]
    if all(fits):
        return source
    why = (f"relative path longer than {path_limit} bytes, the most this store's fixed-width paths hold (a store "
           "written before paths of any length: ingest into a new store to keep it)")
    return replace(source, items=tuple(it for it, ok in zip(source.items, fits) if ok),
                   rejected=source.rejected + tuple((it.relpath, why) for it, ok in zip(source.items, fits) if not ok))



def _has_row_digests(path: str) -> bool:
    from h5stream.store import rowdigest
    from h5stream.store.access import open_h5_readonly

    with open_h5_readonly(path) as f:
        return rowdigest.has(f)


def schema_background(path: str) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """The store's (alpha background, pad fill); a store without ``pad_fill`` padded with its background."""
    import json

    from h5stream.store.access import open_h5_readonly

    with open_h5_readonly(path) as f:
        raws = f.attrs.get(schema.ATTR_BACKGROUND), f.attrs.get(schema.ATTR_PAD_FILL)

    def rgb(raw):
        raw = raw.decode() if isinstance(raw, bytes) else str(raw)
        return tuple(int(v) for v in json.loads(raw))

    background = (255, 255, 255) if raws[0] is None else rgb(raws[0])
    return background, (background if raws[1] is None else rgb(raws[1]))


def open_append(out: str, target: IngestTarget, label_kind: str, lock: StoreLock):
    """The store at ``out`` opened for appending under ``lock`` (the caller's): rebuilt from its committed rows
    first when its last writer stopped mid-flush, and given ``target``'s class list when that grew.  Returns
    the :class:`~h5stream.store.writer.StoreWriter`."""
    from h5stream.store import rebuild
    from h5stream.store.writer import StoreWriter

    if rebuild.needs_rebuild(out):  # a writer stopped while HDF5 rewrote the store in place
        rebuild.rebuild(out, lock)
    from h5stream.store.create import class_names_attr

    names = class_names_attr(target.class_names) if label_kind == schema.LABEL_CLASS else None  # before a write
    writer = StoreWriter.open_append(out, lock=lock)
    if label_kind == schema.LABEL_CLASS and len(target.class_names) != len(writer.meta["class_names"] or ()):
        writer.set_attr(schema.ATTR_CLASS_NAMES, names)
        writer.commit()
    return writer
