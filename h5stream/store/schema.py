"""The on-disk layout of an h5stream file: node names, attribute names, defaults.

Layout (format version 3; version 2 lacks /row_digests, version 1 also differs in its paths, see /paths below)::

    /images   EArray uint8 (N, H, W, C), chunked (block_rows, H, W, C)
    /labels   EArray int64 (N,)            label_kind == "class"
              EArray float32 (N,) / (N, K) label_kind == "regression"
              EArray int8 (N,), every row NO_LABEL (-1)   label_kind == "none" (a store without labels:
              the array stays, so every reader, checksum and repair path reads a store of any kind alike)
    /path_bytes  EArray uint8 (total bytes,): each row's source path relative to SRC, UTF-8 (a file name
              that is not valid UTF-8 keeps its own bytes, see :func:`encode_path`), joined, any length
    /path_ends   EArray int64 (N,): where row i's path ends in /path_bytes (it starts where row i - 1's
              ends, or at 0); see :mod:`h5stream.store.pathrows`
    /paths    (stores written before /path_bytes, format version 1) EArray of fixed-size 512 bytes (N,) in
              their place: still read, verified, repaired and appended to in that layout.  Which layout a
              store has is told by the arrays it holds, not by ``h5stream_format``
    /checksums  EArray uint64 (B, 3): per complete block (``block_rows`` rows), the
              digests of its images, labels and paths (see :mod:`h5stream.store.checksum`)
    /row_digests  EArray uint64 (N,), chunked (block_rows,): each row's xxh3-64 of its image bytes (format
              version 3; absent in older stores and in stores written with ``row_digests=False``; see
              :mod:`h5stream.store.rowdigest`)

Root attributes (plain ints and strings; lists are JSON text, so plain h5py
reads every one of them):

    h5stream_format   int    FORMAT_VERSION
    committed_rows    int    rows whose images, labels and paths are all flushed;
                             written only after those rows are on disk.  Readers
                             use rows [0, committed_rows) and nothing beyond.
    label_kind        str    "class", "regression" or "none" (no labels: /labels holds NO_LABEL)
    class_names       str    JSON list, index == label (class files), "null" otherwise
    label_columns     str    JSON list of CSV column names (regression), "null" otherwise
    image_height, image_width, channels   int
    resize_mode       str    "stretch" | "crop" | "pad"
    background        str    JSON [r, g, b] used to composite alpha (and to pad, in stores without pad_fill)
    pad_fill          str    JSON [r, g, b] around a ``pad`` resize; absent in stores written before it
    storage_order     str    "shuffled" | "sorted"
    order_seed        int    seed of the storage permutation (-1 when sorted)
    block_rows        int    HDF5 chunk length along axis 0: the unit of contiguous reads
    skipped_files     int    files (and unreadable folders) skipped over all ingest runs; details in
                             OUT.skipped.csv, which also lists what was left out on purpose
    checksum          str    hash of /checksums and checksum_tail ("xxh3_64"); absent in
                             stores written without checksums
    checksum_tail     str    JSON {"rows": R, "images": hex, "labels": hex, "paths": hex}:
                             the digests of the last, partial block when the store had R
                             rows ({"rows": R} alone when R is a multiple of block_rows)
    ingest_files       int   files the last ingest set out to store (its source's image files, the files it
                             rejected unopened, its unreadable folders); absent in stores written before it
                             (they count as finished; see :mod:`h5stream.store.progress`)
    ingest_rows_before int   committed rows that are not that ingest's files: it stored
                             committed_rows - ingest_rows_before of them
    ingest_skipped     int   its files skipped so far, each listed in OUT.skipped.csv
    ingest_source      str   JSON {"src": absolute SRC, "labels": absolute CSV or null, "options": [flags]}:
                             what ``h5stream ingest SRC OUT <flags> --append`` needs to finish it
    order_listing      str   hash of the source listing the rows' storage order is a permutation of (the last
                             ingest's; absent in stores written before it)
    appended_from      int   the first row an ``--append`` stored from a listing that had grown (new files):
                             those rows are shuffled among themselves, after the others; absent when none was

Encoded stores (format version 2; told apart by ``image_encoding``, never by the version alone): each row is an
image's encoded bytes (JPEG), concatenated in ``/image_bytes`` (uint8) with each row's end offset in
``/image_ends`` (int64); ``/images`` stays, empty, with the decoded shape.  See :mod:`h5stream.store.encoded`.

    image_encoding          str  "jpeg" (absent: "raw", pixels in /images)
    jpeg_quality            int  the quality the rows were encoded with
    encoded_committed_rows  int  what committed_rows is to a raw store (absent there)
    encoded_block_bytes     int  the most bytes one block's rows have taken (what a reader holds of a block)
"""

from __future__ import annotations

FORMAT_VERSION = 3
"""The newest layout this h5stream reads and writes: variable-length paths, encoded rows where ``image_encoding``
says so, and a digest per row (``/row_digests``, version 3).  Stores of versions 1 and 2 are read and appended to
as they are."""

IMAGES = "images"
LABELS = "labels"
PATHS = "paths"
# -- variable-length paths (format version 2): see h5stream.store.pathrows ----------
PATH_BYTES_NODE = "path_bytes"
PATH_ENDS = "path_ends"
FIXED_PATHS_VERSION = 1
"""The format version of stores with the fixed-width /paths (read, verified, repaired and appended to as they are)."""
# -- end variable-length paths ------------------------------------------------------
CHECKSUMS = "checksums"
# -- row digests (see h5stream.store.rowdigest) --
ROW_DIGESTS = "row_digests"
ROW_DIGESTS_FORMAT_VERSION = 3
"""The first format version with ``/row_digests``: a store that has them is stamped with it, so an h5stream that
would append rows without their digests refuses the store instead."""
# -- end of row digests --
# -- encoded rows (see h5stream.store.encoded) --
IMAGE_BYTES = "image_bytes"
IMAGE_ENDS = "image_ends"
ATTR_ENCODING = "image_encoding"
ATTR_JPEG_QUALITY = "jpeg_quality"
ATTR_ENCODED_COMMITTED = "encoded_committed_rows"
ATTR_ENCODED_BLOCK_BYTES = "encoded_block_bytes"
ENCODING_RAW = "raw"
ENCODING_JPEG = "jpeg"
ENCODINGS = (ENCODING_RAW, ENCODING_JPEG)
ENCODED_FORMAT_VERSION = 2
"""The first format version with encoded rows: an encoded store is stamped with at least this."""
# -- end of encoded rows --

ATTR_FORMAT = "h5stream_format"
ATTR_COMMITTED = "committed_rows"
ATTR_LABEL_KIND = "label_kind"
ATTR_CLASS_NAMES = "class_names"
ATTR_LABEL_COLUMNS = "label_columns"
ATTR_HEIGHT = "image_height"
ATTR_WIDTH = "image_width"
ATTR_CHANNELS = "channels"
ATTR_RESIZE = "resize_mode"
ATTR_BACKGROUND = "background"
ATTR_PAD_FILL = "pad_fill"
ATTR_ORDER = "storage_order"
ATTR_ORDER_SEED = "order_seed"
ATTR_BLOCK_ROWS = "block_rows"
ATTR_SKIPPED = "skipped_files"
ATTR_CHECKSUM = "checksum"
ATTR_CHECKSUM_TAIL = "checksum_tail"
ATTR_INGEST_FILES = "ingest_files"
ATTR_INGEST_ROWS_BEFORE = "ingest_rows_before"
ATTR_INGEST_SKIPPED = "ingest_skipped"
ATTR_INGEST_SOURCE = "ingest_source"
ATTR_PART = "part"  # JSON: which part of a set (h5stream.store.partattr); absent on a whole store
#: What the last ingest recorded of its progress: copied whole when a store is rebuilt.
INGEST_ATTRS = (ATTR_INGEST_FILES, ATTR_INGEST_ROWS_BEFORE, ATTR_INGEST_SKIPPED, ATTR_INGEST_SOURCE)
ATTR_ORDER_LISTING = "order_listing"  # hash of the source listing the rows' storage order is a permutation of
ATTR_APPENDED_FROM = "appended_from"  # first row --append stored from a listing that grew (absent: none)
#: Whether the rows are one storage order of one listing: copied whole when a store is rebuilt.
ORDER_ATTRS = (ATTR_ORDER_LISTING, ATTR_APPENDED_FROM)

LABEL_CLASS = "class"
LABEL_REGRESSION = "regression"
LABEL_NONE = "none"
LABEL_KINDS = (LABEL_CLASS, LABEL_REGRESSION, LABEL_NONE)

NO_LABEL = -1
"""What every row of ``/labels`` holds in a store of ``label_kind`` ``"none"`` (int8): no class index."""

PATH_BYTES = 512
"""Item size of the fixed-width /paths of a format-1 store; a longer relative path appended to one is skipped
with a reason (a store with /path_bytes has no limit)."""

TARGET_CHUNK_BYTES = 4 << 20
"""Default chunk target: a block is the largest power of two of rows that fits in 4 MiB."""


def default_block_rows(row_bytes: int, target_bytes: int = TARGET_CHUNK_BYTES) -> int:
    """Largest power of two of rows whose block fits in ``target_bytes`` (at least 1, at most 8192)."""
    if row_bytes < 1:
        raise ValueError(f"row_bytes must be >= 1, got {row_bytes}")
    rows = 1
    while rows < 8192 and rows * 2 * row_bytes <= target_bytes:
        rows *= 2
    return rows


def encode_path(relpath: str) -> bytes:
    """The bytes stored in /paths for ``relpath``: UTF-8, and a name Python read from disk as
    surrogate escapes (not valid UTF-8) gets back its original bytes, so nothing is lost."""
    return relpath.encode("utf-8", "surrogateescape")


def encode_paths(relpaths) -> list[bytes]:
    """:func:`encode_path` of each of ``relpaths``, with one encode for them all (a file name holds no NUL,
    which joins them; a list where one does is encoded path by path)."""
    relpaths = list(relpaths)
    joined = "\0".join(relpaths)
    if not relpaths or joined.count("\0") != len(relpaths) - 1:
        return [encode_path(p) for p in relpaths]
    return joined.encode("utf-8", "surrogateescape").split(b"\0")


def decode_path(stored: bytes) -> str:
    """Inverse of :func:`encode_path`: ``decode_path(encode_path(p)) == p``, and the str opens the same file."""
    return stored.decode("utf-8", "surrogateescape")


#: A new store (or a rebuilt one) is written as ``OUT`` + this until it takes its name (see
#: :mod:`h5stream.store.writer`); named here so that :mod:`h5stream.store.sidecar` needs no PyTables.
CREATING_SUFFIX = ".creating"

#: ``OUT`` + this lies beside a published store while HDF5 rewrites it in place (a flush, a close): one left
#: behind says a writer stopped half-way, and the store is rebuilt before it is read or written again (see
#: :mod:`h5stream.store.rebuild`).  Named here, with no PyTables import, because every reader looks for it.
FLUSHING_SUFFIX = ".flushing"


#: ``OUT`` + this lies beside a store while an ingest decodes files for it: the files being decoded, so that the
#: next run can decode them alone first when the ingest died (see :mod:`h5stream.ingest.crashes`).
DECODING_SUFFIX = ".decoding"


def flushing_path(out_path) -> str:
    """The marker beside the store at ``out_path`` that HDF5 is rewriting it in place (:data:`FLUSHING_SUFFIX`)."""
    return str(out_path) + FLUSHING_SUFFIX


def skipped_report_path(out_path: str) -> str:
    """Where ingest lists skipped files (CSV: path,reason) for the store at ``out_path``."""
    return str(out_path) + ".skipped.csv"


REPORT_REPLACING_SUFFIX = ".replacing"
"""Beside the skip report: the report of a new store that replaces an old one (``--overwrite``), until the new store
takes its name and this is renamed over the old report."""

REPORT_REWRITE_SUFFIX = ".rewrite"
"""Beside the skip report: the new report an ``--append`` writes whole, then renames over it, when it drops
entries (files it stored)."""
