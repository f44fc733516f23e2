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
from h5stream.remote.config import is_url
from h5stream.store import coverage, pathrows, schema
from h5stream.store.access import read_consistent, writer_pids
from h5stream.store.attrs import attr_error, int_attr, json_attr, scalar_attr, str_attr
from h5stream.store.partattr import PartInfo
from h5stream.store.progress import IngestProgress, parse_source


@dataclass(frozen=True)
class StoreMeta:
    """What a reader needs to know about a store (:func:`read_meta`, ``stream.meta``); frozen.

    ``path``: the file or URL.  ``rows``: the committed row count (the rows readers use).  ``image_shape``:
    ``(H, W, C)`` of one stored image (uint8).  ``label_kind``: ``"class"``, ``"regression"`` or ``"none"``;
    ``label_shape`` / ``label_dtype``: one label's (``()`` int64 for classes, float32 targets).
    ``class_names``: label ``i`` is ``class_names[i]`` (None unless ``label_kind == "class"``);
    ``label_columns``: the CSV columns the labels came from, if any.  ``block_rows``: rows per HDF5 chunk;
    ``compression``: None, ``"zlib"`` or ``"blosc"``.  ``storage_order`` (``"shuffled"`` or ``"sorted"``) and
    ``order_seed``: how the ingest ordered the rows; ``resize_mode``: ``"stretch"``, ``"crop"`` or ``"pad"``.
    ``skipped_files``: how many source files the ingest skipped (listed in ``OUT.h5.skipped.csv``).
    ``format_version``: the file format's version; ``file_bytes``: the file's size.  ``checksum``: the block
    checksums' hash (None: no checksums); ``checksum_problem``: a line naming damage in them, else None;
    ``row_digest_problem``: a line saying ``/row_digests`` falls short of the rows, else None;
    ``uncommitted_rows``: rows past ``rows`` a writer had begun.  ``ingest``: how far the last ingest got;
    ``appended_from``: the first row an ``--append`` took from a grown source listing.  ``encoding``
    (``"raw"`` or ``"jpeg"``), ``jpeg_quality``, ``encoded_bytes`` and ``encoded_block_bytes``: an encoded
    store's.  ``part``: which part of a set it is (None: a whole store).  ``remote``: a URL's
    :class:`~h5stream.RemoteOptions`.  ``identity``: what a resumed state is checked against.  Each field is
    documented at length where it is declared.
    """

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
    ingest: IngestProgress | None = None
    """How far the last ingest got (:mod:`h5stream.store.progress`); None for a store written before it."""
    checksum_problem: str | None = None
    """One line (path first) saying which committed rows have no checksum, or that the checksum table cannot be
    read: damage (see :mod:`h5stream.store.coverage`), which verifying readers refuse; None when all is well."""
    row_digest_problem: str | None = None
    """One line (path first) saying which committed rows lack their row digest (``/row_digests`` shorter than
    ``rows``): damage, which ``verify``, ``--append`` and verifying readers refuse alike, and ``h5stream repair``
    mends by a rebuild; None when every row has its digest or the store keeps none."""
    row_digests: bool = False
    """Whether the store keeps a digest per row (``/row_digests``; :mod:`h5stream.store.rowdigest`); for a set of
    parts, whether every part does."""
    uncommitted_rows: int = 0
    """Rows past ``rows`` that checksums were written for: a commit in flight, or one a writer stopped half-way."""
    encoding: str = schema.ENCODING_RAW
    """How rows are stored: "raw" (pixels in ``/images``) or "jpeg" (see :mod:`h5stream.store.encoded`)."""
    encoded_bytes: int = 0
    """Bytes of the committed rows' encoded images (0 for a raw store)."""
    jpeg_quality: int | None = None
    encoded_block_bytes: int = 0
    """The most bytes one block of an encoded store's rows takes: what the reader holds of a block at once."""
    part: PartInfo | None = None
    """Which part of a set the store is (``h5stream ingest --part``), None for a whole store."""
    remote: object = field(default=None, compare=False, repr=False)
    """For a URL: the :class:`~h5stream.remote.RemoteOptions` it was opened with, for every later open."""
    appended_from: int | None = None
    """The first row that ``ingest --append`` stored from a source listing that had grown (new files): the rows
    from there on are shuffled among themselves, after the others, not with them; None when every row is one
    storage order of one listing (or the store does not say)."""
    identity: str | None = None
    """What a resumed state checks it is of this store (:func:`identity`): its committed rows, row shape and
    encoding and the checksums of up to :data:`IDENTITY_BLOCKS` of its whole blocks; None for a store without
    checksums."""

    @property
    def encoded(self) -> bool:
        """True for a store of encoded (JPEG) rows."""
        return self.encoding != schema.ENCODING_RAW

    @property
    def row_bytes(self) -> int:
        """Bytes of one stored image as pixels: ``H * W * C``."""
        h, w, c = self.image_shape
        return h * w * c

    @property
    def label_row_bytes(self) -> int:
        """Bytes of one stored label."""
        return int(np.prod(self.label_shape, dtype=np.int64)) * self.label_dtype.itemsize


MAX_CHUNK_BYTES = (4 << 30) - 1
"""HDF5's limit on one chunk: a block (``block_rows`` rows) can never be larger."""

def read_meta(path: str | os.PathLike, *, remote=None) -> StoreMeta:
    """Open ``path`` read-only, validate it, and describe it.

    ``path`` may be a URL (``s3://bucket/key``, ``https://host/path``), reached with the ``remote`` options
    (None, an :class:`h5stream.RemoteOptions`, or a dict of its fields); they are kept in ``StoreMeta.remote``.

    Raises :class:`StoreNotFoundError` if the file is missing,
    :class:`StorePermissionError` if it may not be read, :class:`StoreFormatError`
    if it is not HDF5 or not laid out as an h5stream store (no ``/images``, wrong
    dtype or rank, labels shorter than images, bad attributes, or a writer stopped
    while it rewrote the file in place: see :mod:`h5stream.store.rebuild`), and
    :class:`StoreBusyError` if another process writing it never let its metadata
    be read whole.
    """
    from h5stream.remote.config import remote_options

    if is_url(path):
        options = remote_options(remote)
        return replace(read_consistent(path, lambda f: _describe(path, f), remote=options), remote=options)
    path = os.fspath(path)
    _refuse_torn(path)
    return read_consistent(path, lambda f: _describe(path, f))


def _refuse_torn(path: str) -> None:
    """StoreFormatError for a store whose writer stopped while HDF5 rewrote it in place (its flushing marker is
    there and nobody holds the writer's lock: a writer that holds it is mid-flush, and reads settle)."""
    from h5stream.store.lock import is_held

    marker = schema.flushing_path(path)
    if os.path.exists(marker) and os.path.exists(path) and is_held(path) is False:
        raise StoreFormatError(
            f"{path}: its last writer stopped while it rewrote the file's structure in place ({marker} is there), "
            f"so the file may not read right; `h5stream repair {path}` rebuilds it from its committed rows "
            f"(`h5stream ingest SRC {path} --append` does too, then adds to it)")


def _dataset(path: str, f: h5py.File, name: str, *, required: bool = True) -> h5py.Dataset | None:
    """``f[name]`` if it is a dataset; None if absent and not ``required``; else :class:`StoreFormatError`."""
    if name not in f:
        if not required:
            return None
        raise StoreFormatError(f"{path}: no /{name} dataset; is this a file written by `h5stream ingest`?")
    try:  # the link is there: an object HDF5 cannot open is damage, never "absent" (h5py's get() says None)
        node = f[name]
    except (KeyError, OSError, RuntimeError) as exc:
        raise StoreFormatError(f"{path}: /{name} cannot be opened ({exc}); the file is damaged: restore it from a "
                               "copy or re-ingest it") from None
    if not isinstance(node, h5py.Dataset):
        raise StoreFormatError(f"{path}: /{name} is a {type(node).__name__}, not a dataset; the file is damaged or "
                               "was not written by h5stream")
    return node


def _check_attributes_readable(path: str, f: h5py.File) -> None:
    """StoreFormatError naming the first root attribute HDF5 cannot hand back (a damaged datatype: h5py raises
    TypeError or OSError), or whose name (or a node's) is not UTF-8 (h5py hands it back as bytes; the attribute
    h5stream looks for would read as absent), before any code reads one: damage, not a programming error."""
    name = "?"
    try:
        for name in f.attrs:
            f.attrs[name]
        bad = next((n for n in [*f.attrs, *f] if isinstance(n, bytes)), None)
    except (TypeError, UnicodeDecodeError, OSError, KeyError, RuntimeError) as exc:
        raise StoreFormatError(f"{path}: the root attributes cannot be read (at {name!r}: {exc}); the file is "
                               "damaged: restore it from a copy or re-ingest it") from None
    if bad is not None:
        raise StoreFormatError(f"{path}: a root attribute or node is named {bad!r}, which is not text: the file is "
                               "damaged: restore it from a copy or re-ingest it")


def _rows_written(images: h5py.Dataset) -> int:
    """Rows of ``images`` that have storage in the file (an upper bound: HDF5 hands out its fill value, zeros,
    for the others).  Counts chunks, not bytes, so it is cheap for any size."""
    row_elems = int(np.prod(images.shape[1:], dtype=np.int64))
    if images.chunks is not None:
        return images.id.get_num_chunks() * int(np.prod(images.chunks, dtype=np.int64)) // row_elems
    return images.id.get_storage_size() // (row_elems * images.dtype.itemsize)


def _describe(path: str, f: h5py.File) -> StoreMeta:
    """Validate the open file ``f`` against :mod:`h5stream.store.schema` and describe it.

    Every attribute and dataset h5stream reads later is checked here, so one :class:`StoreFormatError` (one line:
    what, where, how to fix) is all a damaged or foreign file can produce, whatever it holds."""
    _check_attributes_readable(path, f)
    images = _dataset(path, f, schema.IMAGES)
    labels = _dataset(path, f, schema.LABELS)
    if images.dtype != np.uint8 or images.ndim != 4 or min(images.shape[1:], default=0) < 1:
        raise StoreFormatError(
            f"{path}: /{schema.IMAGES} must be uint8 of shape (N, H, W, C) with H, W, C >= 1, "
            f"found {images.dtype} {images.shape}"
        )
    if labels.ndim not in (1, 2) or (labels.ndim == 2 and labels.shape[1] < 1) or labels.dtype.kind not in "iuf":
        raise StoreFormatError(f"{path}: /{schema.LABELS} must be numbers of shape (N,) or (N, K), found "
                               f"{labels.dtype} {labels.shape}")
    attrs = f.attrs
    encoding = str_attr(attrs, schema.ATTR_ENCODING, schema.ENCODING_RAW, path=path, choices=schema.ENCODINGS)
    rows_of = images if encoding == schema.ENCODING_RAW else _encoded_array(path, f)
    stored = min(rows_of.shape[0], labels.shape[0])
    committed_attr = schema.ATTR_COMMITTED if encoding == schema.ENCODING_RAW else schema.ATTR_ENCODED_COMMITTED
    committed = int_attr(attrs, committed_attr, None, path=path, low=0) if committed_attr in attrs else None
    if committed is None and schema.ATTR_FORMAT in attrs:  # h5stream writes the count with the store: damage
        raise StoreFormatError(f"{path}: attribute {committed_attr} is missing, which every h5stream store has; the "
                               "file is damaged: restore it from a copy or re-ingest it")
    if committed is None:
        # A file written by other tools: every row present in both arrays is usable.
        if labels.shape[0] < images.shape[0]:
            raise StoreFormatError(
                f"{path}: /{schema.LABELS} has {labels.shape[0]} rows but /{schema.IMAGES} has {images.shape[0]}; "
                "every image needs a label"
            )
        committed = stored
    if committed > stored:
        raise StoreFormatError(
            f"{path}: committed_rows={committed} but only {stored} rows are stored in both "
            f"/{schema.IMAGES} and /{schema.LABELS}; the file is damaged"
        )
    written = _rows_written(images) if encoding == schema.ENCODING_RAW else _encoded_written(rows_of, committed)
    if committed > written and encoding != schema.ENCODING_RAW:
        raise StoreFormatError(
            f"{path}: /{schema.IMAGE_ENDS} is damaged: its committed row {committed - 1} ends at byte "
            f"{int(rows_of.ends[committed - 1])}, outside the {rows_of.data.shape[0]} bytes of /{schema.IMAGE_BYTES} "
            "(a truncated copy, or edited by hand): restore the file from a copy or re-ingest it")
    if committed > written:
        raise StoreFormatError(
            f"{path}: committed_rows={committed} but only {written} rows of /{schema.IMAGES} were ever written; "
            "the file is damaged (a truncated copy, or attributes edited by hand): re-ingest it"
        )
    label_kind = str_attr(attrs, schema.ATTR_LABEL_KIND,
                           schema.LABEL_CLASS if labels.dtype.kind in "iu" else schema.LABEL_REGRESSION,
                           path=path, choices=schema.LABEL_KINDS)
    if label_kind == schema.LABEL_CLASS and labels.dtype.kind not in "iu":
        raise StoreFormatError(f"{path}: label_kind is 'class' but /{schema.LABELS} holds {labels.dtype}, not "
                               "integer class indices; the file is damaged or was not written by h5stream")
    if label_kind == schema.LABEL_NONE and (labels.ndim != 1 or labels.dtype.kind not in "iu"):
        raise StoreFormatError(f"{path}: label_kind is 'none' but /{schema.LABELS} holds {labels.dtype} "
                               f"{labels.shape}, not one integer per row; the file is damaged or was not written "
                               "by h5stream")
    row_bytes = int(np.prod(images.shape[1:], dtype=np.int64))
    chunks = images.chunks
    most_rows = max(1, MAX_CHUNK_BYTES // row_bytes)
    block_rows = int_attr(attrs, schema.ATTR_BLOCK_ROWS, chunks[0] if chunks else min(64, max(1, images.shape[0])),
                           path=path, low=1, high=most_rows,
                           want=f"the rows of one /{schema.IMAGES} chunk" + (f" ({chunks[0]})" if chunks else ""))
    if chunks and block_rows != chunks[0]:
        raise attr_error(path, schema.ATTR_BLOCK_ROWS, block_rows,
                         f"the rows of one /{schema.IMAGES} chunk ({chunks[0]})")
    format_version = int_attr(attrs, schema.ATTR_FORMAT, 0, path=path, low=0)
    if format_version > schema.FORMAT_VERSION:
        raise StoreFormatError(f"{path}: format version {format_version}, and this h5stream reads up to "
                               f"{schema.FORMAT_VERSION}; upgrade h5stream (pip install -U h5stream)")
    checksums = _dataset(path, f, schema.CHECKSUMS, required=False)
    checksum = None
    if checksums is not None:
        if checksums.ndim != 2 or checksums.shape[1] != 3 or checksums.dtype.kind not in "iu":
            raise StoreFormatError(f"{path}: /{schema.CHECKSUMS} must be integers of shape (B, 3), found "
                                   f"{checksums.dtype} {checksums.shape}; the file is damaged (re-ingest it)")
        _check_paths(path, f, committed)
        checksum = str_attr(attrs, schema.ATTR_CHECKSUM, "unknown", path=path)
    problem, uncommitted = _checksum_problem(path, f, committed, block_rows, checksums, stored)
    digests_problem = None
    if schema.ROW_DIGESTS in f:  # appended before the count that publishes their rows: a shortfall is damage
        from h5stream.store.rowdigest import missing_text

        digests_problem = missing_text(int(f[schema.ROW_DIGESTS].shape[0]), committed, path)
    sampled = None
    if checksums is not None and problem is None:
        whole = min(committed // block_rows, checksums.shape[0])
        at = np.unique(np.linspace(0, whole - 1, min(whole, IDENTITY_BLOCKS)).astype(np.int64))
        sampled = np.asarray(checksums[at], np.int64) if whole else np.zeros((0, 3), np.int64)
    return StoreMeta(
        path=path,
        rows=committed,
        image_shape=tuple(int(d) for d in images.shape[1:]),
        label_kind=label_kind,
        label_shape=tuple(int(d) for d in labels.shape[1:]),
        label_dtype=np.dtype(labels.dtype),
        class_names=json_attr(attrs, schema.ATTR_CLASS_NAMES, path=path),
        label_columns=json_attr(attrs, schema.ATTR_LABEL_COLUMNS, path=path),
        block_rows=block_rows,
        compression=images.compression,
        storage_order=str_attr(attrs, schema.ATTR_ORDER, "unknown", path=path),
        order_seed=int_attr(attrs, schema.ATTR_ORDER_SEED, -1, path=path, low=-1),
        resize_mode=str_attr(attrs, schema.ATTR_RESIZE, "unknown", path=path),
        skipped_files=int_attr(attrs, schema.ATTR_SKIPPED, 0, path=path, low=0),
        format_version=format_version,
        file_bytes=int(f.id.get_filesize()),
        checksum=checksum,
        ingest=_ingest_progress(path, attrs, committed),
        checksum_problem=problem,
        row_digest_problem=digests_problem,
        row_digests=schema.ROW_DIGESTS in f,
        uncommitted_rows=uncommitted,
        encoding=encoding,
        encoded_bytes=rows_of.byte_range(0, committed)[1] if encoding != schema.ENCODING_RAW else 0,
        jpeg_quality=int_attr(attrs, schema.ATTR_JPEG_QUALITY, 90, path=path, low=1, high=100)
        if encoding != schema.ENCODING_RAW else None,
        encoded_block_bytes=int_attr(attrs, schema.ATTR_ENCODED_BLOCK_BYTES, 0, path=path, low=0),
        part=_part(path, attrs),
        appended_from=int_attr(attrs, schema.ATTR_APPENDED_FROM, None, path=path, low=0)
        if schema.ATTR_APPENDED_FROM in attrs else None,
        identity=None if sampled is None else identity(committed, images.shape[1:], encoding, sampled),
    )


IDENTITY_BLOCKS = 8
"""Whole blocks whose checksums a store's :attr:`StoreMeta.identity` holds, spread over its rows."""


def identity(rows: int, row_shape, encoding: str, block_checksums) -> str:
    """A store's identity (pure): xxh3-64 of its committed ``rows``, ``row_shape``, ``encoding`` and the
    ``block_checksums`` sampled over its rows, as 16 hex digits.  Stores with other rows almost surely differ;
    the same rows written again (or restored by ``repair``) give the same."""
    import xxhash

    h = xxhash.xxh3_64()
    h.update(json.dumps([int(rows), [int(d) for d in row_shape], str(encoding)]).encode())
    h.update(np.ascontiguousarray(block_checksums, dtype="<i8").tobytes())
    return h.hexdigest()


def _encoded_array(path: str, f: h5py.File):
    """The encoded rows of an encoded store (:class:`~h5stream.store.encoded.EncodedArray`), checked."""
    from h5stream.store.encoded import EncodedArray

    data = _dataset(path, f, schema.IMAGE_BYTES)
    ends = _dataset(path, f, schema.IMAGE_ENDS)
    if data.ndim != 1 or data.dtype != np.uint8 or ends.ndim != 1 or ends.dtype.kind not in "iu":
        raise StoreFormatError(f"{path}: an encoded store needs /{schema.IMAGE_BYTES} uint8 (T,) and "
                               f"/{schema.IMAGE_ENDS} integers (N,), found {data.dtype} {data.shape} and "
                               f"{ends.dtype} {ends.shape}; the file is damaged (re-ingest it)")
    return EncodedArray(data, ends)


def _encoded_written(rows, committed: int) -> int:
    """Rows of an encoded store whose bytes were ever written: every committed row when the last one ends within
    the bytes stored (and allocated), else 0.  Reads one end offset."""
    if committed == 0:
        return 0
    end = int(rows.ends[committed - 1])
    data = rows.data
    allocated = data.id.get_num_chunks() * int(data.chunks[0]) if data.chunks is not None else data.shape[0]
    return committed if 0 <= end <= min(data.shape[0], allocated) else 0


def _part(path: str, attrs) -> PartInfo | None:
    """The ``part`` attribute (:mod:`h5stream.store.partattr`), None when absent."""
    from h5stream.store import partattr

    raw = scalar_attr(attrs, schema.ATTR_PART, path=path)
    if raw is None:
        return None
    part = partattr.decode(raw)
    if part is None:
        raise attr_error(path, schema.ATTR_PART, raw, 'JSON {"index": i, "count": N, "listing": "..."} with 0 <= i < N')
    return part


def _ingest_progress(path: str, attrs, committed: int) -> IngestProgress | None:
    """The last ingest's progress from the root attributes, None when it recorded none (an older store)."""
    if schema.ATTR_INGEST_FILES not in attrs:
        return None
    files = int_attr(attrs, schema.ATTR_INGEST_FILES, 0, path=path, low=0)
    before = int_attr(attrs, schema.ATTR_INGEST_ROWS_BEFORE, 0, path=path, low=0, high=committed,
                       want=f"an integer in 0..{committed} (committed_rows)")
    skipped = int_attr(attrs, schema.ATTR_INGEST_SKIPPED, 0, path=path, low=0)
    raw = str_attr(attrs, schema.ATTR_INGEST_SOURCE, "", path=path)
    source = parse_source(raw)
    if source is None:
        raise attr_error(path, schema.ATTR_INGEST_SOURCE, raw, 'JSON {"src": ..., "labels": ..., "options": [...]}')
    return IngestProgress(files, committed - before, skipped, *source)


def _check_paths(path: str, f: h5py.File, committed: int) -> None:
    """StoreFormatError unless ``f`` holds the paths of ``committed`` rows, in either layout (see
    :mod:`h5stream.store.pathrows`)."""
    if schema.PATH_ENDS in f:
        ends, data = (_dataset(path, f, n, required=False) for n in (schema.PATH_ENDS, schema.PATH_BYTES_NODE))
        if (ends.ndim != 1 or ends.dtype.kind not in "iu" or ends.shape[0] < committed or data is None
                or data.ndim != 1 or data.dtype != np.uint8):
            found = f"{ends.dtype} {ends.shape}" + ("" if data is None else f", {data.dtype} {data.shape}")
            raise StoreFormatError(f"{path}: /{schema.PATH_ENDS} must be integers of shape (N,) with N >= "
                                   f"{committed} beside /{schema.PATH_BYTES_NODE} uint8 (M,), found {found}; the "
                                   "file is damaged (re-ingest it)")
        return
    paths = _dataset(path, f, schema.PATHS, required=False)
    if paths is None or paths.ndim != 1 or paths.dtype.kind != "S" or paths.shape[0] < committed:
        found = "none" if paths is None else f"{paths.dtype} {paths.shape}"
        raise StoreFormatError(f"{path}: a store with /{schema.CHECKSUMS} needs /{schema.PATHS}, bytes of shape "
                               f"(N,) with N >= {committed}, found {found}; the file is damaged (re-ingest it)")


def read_paths(path: str | os.PathLike, start: int, stop: int, *, remote=None) -> list[str]:
    """Rows ``start..stop-1`` of the stored paths (either layout, :mod:`~h5stream.store.pathrows`) as str
    (:func:`~h5stream.store.schema.decode_path`: each row's source path relative to the ingest's SRC), in row
    order; on a handle of its own, in the calling thread.

    Raises StoreFormatError where the store has no paths or fewer rows than ``stop``."""
    def read(f: h5py.File) -> list[str]:
        name = pathrows.row_node(f)
        paths = _dataset(os.fspath(path), f, name)
        if paths.shape[0] < stop:
            raise StoreFormatError(f"{path}: /{name} has {paths.shape[0]} rows, fewer than the {stop} "
                                   "committed; the store is damaged: re-ingest it")
        return [schema.decode_path(p) for p in pathrows.stored_bytes(f, start, stop)]

    return read_consistent(path, read, remote=remote)


def _checksum_problem(path: str, f: h5py.File, committed: int, block_rows: int, checksums: h5py.Dataset | None,
                      stored: int) -> tuple[str | None, int]:
    """:attr:`StoreMeta.checksum_problem` and :attr:`StoreMeta.uncommitted_rows` of the open file ``f``.  While
    another process writes the file, a problem is raised instead (:func:`read_consistent` reads again: the writer
    may be mid-flush)."""
    attrs = f.attrs
    has_attrs = schema.ATTR_CHECKSUM in attrs or schema.ATTR_CHECKSUM_TAIL in attrs
    if checksums is None and not has_attrs:
        return None, 0  # written before checksums existed
    tail = coverage.tail_from_json(attrs.get(schema.ATTR_CHECKSUM_TAIL))
    paths = f[pathrows.row_node(f)] if pathrows.row_node(f) in f else None
    stored = min(stored, paths.shape[0]) if paths is not None else stored
    what = coverage.problem(committed, stored, block_rows, None if checksums is None else checksums.shape[0], tail,
                            has_checksum_attrs=has_attrs)
    try:
        if what is not None:
            raise coverage.damage_error(path, what)
        if checksums is not None and checksums.shape[0]:
            # Its first and last rows: damage to the table's index (HDF5's B-tree) is found here, in one line,
            # rather than by the reader thread.
            coverage.read_table(f, path, 0, 1)
            coverage.read_table(f, path, checksums.shape[0] - 1)
    except StoreFormatError as exc:
        if not is_url(path) and writer_pids(path):
            raise
        return str(exc), 0
    return None, max(0, tail[0] - committed) if tail is not None else 0
