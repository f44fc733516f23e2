"""The Python writer: :class:`Writer` (``with Writer(path) as w: w.add(image, label)``), which
:func:`h5stream.write` (:mod:`~h5stream.ingest.writesource`) drives over a whole source.

Rows are made as ``h5stream ingest`` makes them from files (:mod:`~h5stream.ingest.items`: the ingest's decoder,
mode conversion and resize) and written by the ingest's store writer
(:class:`~h5stream.store.writer.StoreWriter`), so its guarantees hold as they are: a new store appears under its
name only with its first commit; every commit makes the rows, their labels, paths and checksums durable before
``committed_rows`` is raised; the store's lock keeps a second writer out; a write failure leaves the store as its
last commit.  An item that cannot become a row is skipped and listed in the skip report ``OUT.skipped.csv``
(``path`` = the item's index in the source), flushed before each commit; a store of which no item became a row is
not created.  Each row's ``/paths`` entry is the item's source index.

**Where a write stopped.**  Every commit records, in the store's ``ingest_source`` attribute (the attribute ingest
records its source in, which :mod:`~h5stream.store.rebuild` keeps), the last two triples ``[rows, consumed,
skipped]``: the store's row count once that commit is published, the source items consumed (storage positions
``0 .. consumed-1``: stored, or skipped and in the flushed skip report) and how many of those were skipped.  The
triple is written with the rows, in the commit's first flush, before ``committed_rows`` is raised; so the latest
triple whose ``rows`` equals the store's ``committed_rows`` tells exactly where its last published commit stopped,
whenever the writer was killed (a kill between a commit's two flushes leaves the newer triple unmatched, and the
one before it applies).  ``resume=True`` reopens the store (rebuilt first if its writer stopped mid-flush: what
``h5stream repair`` does), drops rows past ``committed_rows`` and continues from storage position ``consumed``:
an array or a map-style dataset is read from there by index (the storage permutation is a function of the
source's length and the seed, both recorded), an iterable is advanced past ``consumed`` items.  What is required
of the source: the same items in the same order as in the first run (for an iterable: the same sequence from its
start; for a sized source: the same length, checked, and the same item at each index).  The store also records
the ingest's progress attributes (:mod:`~h5stream.store.progress`), so until every item is consumed it reads as
unfinished in ``info``, ``verify`` and :func:`h5stream.open`, naming the call that continues it.

Options: those of :class:`~h5stream.ingest.options.IngestOptions` that apply to a Python source (see
:mod:`~h5stream.ingest.writeoptions`), checked by the ingest's own checks and taken to the store's creation whole.
Decoding runs in the calling thread.  A :class:`Writer` is used by one thread at a time: a call of ``add``,
``add_rows`` or ``close`` while another thread is inside one raises :class:`ConfigError` at once (rows added
from two threads together would mix their rows, labels and paths).
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import os
import threading
import time

import numpy as np

from h5stream.concurrency.guard import Entered
from h5stream.errors import ConfigError, SourceError, StoreExistsError, StoreFormatError, StoreWriteError
from h5stream.ingest import job
from h5stream.ingest.decode import SkipFile
from h5stream.ingest.items import LabelCoder, encode_all, label_kind_of, natural_shape, to_pixels
from h5stream.ingest.options import IngestOptions
from h5stream.ingest.report import SkipReport, read_report
from h5stream.ingest.writeoptions import write_options
from h5stream.ingest.spec import DEFAULT_BACKGROUND, DEFAULT_PAD_FILL, DecodeSpec
from h5stream.store import schema
from h5stream.store.lock import StoreLock
from h5stream.store.pathrows import PathRows
from h5stream.store.progress import WRITER_SOURCE

__all__ = ["WriteResult", "Writer"]

ARRAY_COMMIT_BYTES = 32 << 20
"""With the default ``commit_rows``, rows appended whole from arrays (no decode: :meth:`Writer.add_rows`) are
committed every this many bytes of pixels or more: a commit costs two ``fsync`` (about 10-20 ms), which every 1024
rows of 48 bytes would be most of the write; a killed write redoes at most this much copying."""

@dataclasses.dataclass(frozen=True)
class WriteResult:
    """What one write did: ``rows`` in the store, ``written`` by this run, ``skipped`` items of the whole source
    so far (listed in ``report_path``), ``consumed`` source items accounted for, ``resumed_from`` the position
    this run started at (0 for a new store), ``seconds`` of this run."""

    out: str
    rows: int
    written: int
    skipped: int
    consumed: int
    resumed_from: int
    seconds: float
    report_path: str | None

    @property
    def rows_per_s(self) -> float:
        return self.written / self.seconds if self.seconds > 0 else 0.0


def _position(meta, path: str) -> dict:
    """The writer's record in a store (see the module docstring) and the triple that matches its committed rows:
    ``{"consumed", "skipped", "total", "classes_given"}``.  ConfigError for a store no writer made."""
    raw = None
    from h5stream.store.access import open_h5_readonly

    with open_h5_readonly(path) as f:
        raw = f.attrs.get(schema.ATTR_INGEST_SOURCE)
    raw = raw.decode() if isinstance(raw, bytes) else raw
    try:
        record = json.loads(raw) if raw is not None else None
    except ValueError:
        record = None
    if not isinstance(record, dict) or record.get("src") != WRITER_SOURCE or "write" not in record:
        raise ConfigError(f"{path}: was not made by h5stream.write (it has no record of the source items it "
                          "consumed), so resume=True cannot continue it; `h5stream ingest --append` continues an "
                          "ingest, overwrite=True replaces the store")
    matching = [t for t in record["write"] if int(t[0]) == meta.rows]
    if not matching:
        raise StoreFormatError(f"{path}: its {meta.rows} committed rows match none of its write records "
                               f"{record['write']} (rows changed by hand, or rolled back); write it again with "
                               "overwrite=True")
    _, consumed, skipped = (int(v) for v in matching[-1])
    return {"consumed": consumed, "skipped": skipped, "total": record.get("total"),
            "classes_given": bool(record.get("classes_given"))}


class Writer:
    """Write images and labels to a new store (or, with ``resume=True``, continue one), item by item::

        with h5stream.Writer("train.h5", size=32) as w:
            for image, label in items[w.consumed:]:
                w.add(image, label)

    The shape of MosaicML Streaming's ``MDSWriter`` (``with ... as out: out.write(sample)``); :func:`write`
    takes a whole source instead.  The store's shape, channels and label kind come from the options or, where
    not given, from the first item that becomes a row (its own size; 1 channel for grayscale, else 3; class
    labels for ints and names, regression for floats, none for None).  Rows are stored in the order added.

    Args:
        path: the ``.h5`` store to write.
        resume: continue the store at ``path`` that an interrupted write left (see the module docstring):
            :attr:`consumed` says how many items of the source it already holds or skipped; the caller adds the
            items from there on.  Without a store at ``path``, a new one is started.
        total: the number of items the source holds, where known: the store reads as unfinished until that many
            are consumed (without it, until :meth:`close`).
        **options: see :func:`~h5stream.ingest.writeoptions.write_options` (``size``, ``resize``, ``channels``,
            ``classes``, ...).

    Raises:
        ConfigError: an unknown option or a bad value, options that contradict the store being continued.
        StoreExistsError: ``path`` exists (pass ``overwrite=True`` or ``resume=True``).
        StoreBusyError: another writer holds ``path``.
    """

    def __init__(self, path, *, resume: bool = False, total: int | None = None, _order: str | None = None,
                 **options):
        self._t0 = time.perf_counter()
        if total is not None and (isinstance(total, bool) or not isinstance(total, numbers.Integral) or total < 0):
            raise ConfigError(f"total must be the count of items the source holds (an int >= 0) or None, got {total!r}")
        opts = write_options(path, resume=resume, **options)
        self._commit_rows_given = options.get("commit_rows") is not None
        if opts.order == "shuffled" and _order is None:
            raise ConfigError("Writer stores rows in the order they are added; to store a source shuffled, give "
                              "the whole source to h5stream.write(path, source, order='shuffled')")
        # _order: the default order of h5stream.write's source (a store being continued keeps its own)
        self.opts = dataclasses.replace(opts, order=opts.order or _order or "sorted",
                                        seed=0 if opts.seed is None else opts.seed)
        self.path = opts.out
        self.report_path = schema.skipped_report_path(self.path)
        self.total = None if total is None else int(total)
        self._store = None  # the StoreWriter, once the first row is there (or opened to resume)
        self._spec: DecodeSpec | None = None
        self._labels: LabelCoder | None = None
        self._buf = self._buf_labels = None
        self._buf_paths: list[str] = []
        self._history: list[list[int]] = []
        self.consumed = self.skipped = self.resumed_from = self._rows_before = self.written = 0
        self._appended = (0, 0)  # (consumed, skipped) once the rows appended so far are in
        self._closed = False
        self._result: WriteResult | None = None
        self._first_skip: tuple[int, str] | None = None  # for the error when no item became a row
        busy = threading.Lock()  # held by the one thread inside add(), add_rows() or close(); never waited on
        self._in_add, self._in_add_rows, self._in_close = (Entered(busy, lambda what=what: ConfigError(
            f"{self.path}: {what} while another thread is inside this Writer; a Writer is used by one thread at a "
            "time: add from one thread (hand it the items through a queue), or write one store per thread and open "
            "them as a set")) for what in ("add()", "add_rows()", "close()"))
        self._lock = StoreLock.acquire(self.path)
        try:
            self._open(opts)
        except BaseException:
            self._lock.release()
            raise

    # -- opening --------------------------------------------------------------------
    def _open(self, opts: IngestOptions) -> None:
        exists = os.path.exists(self.path)
        if exists and not (opts.append or opts.overwrite):
            raise StoreExistsError(f"{self.path}: already exists; pass overwrite=True to replace it or "
                                   "resume=True to continue the write that made it")
        if exists and opts.append:
            return self._open_resume(opts)
        if not exists and os.path.exists(self.report_path):  # an older store keeps its own until replaced
            os.unlink(self.report_path)
        self._report = SkipReport(self.report_path, {}, replacing=exists)

    def _open_resume(self, opts: IngestOptions) -> None:
        from h5stream.ingest.append import schema_background
        from h5stream.store import rebuild
        from h5stream.store.meta import read_meta
        from h5stream.store.writer import StoreWriter

        if rebuild.needs_rebuild(self.path):  # its writer stopped while HDF5 rewrote it in place
            rebuild.rebuild(self.path, self._lock)
        meta = read_meta(self.path)
        where = _position(meta, self.path)
        h, w, c = meta.image_shape
        asked = {"size": (opts.size, (h, w)), "channels": (opts.channels, c), "resize": (opts.resize, meta.resize_mode),
                 "order": (opts.order, meta.storage_order), "block_rows": (opts.block_rows, meta.block_rows),
                 "label_kind": (opts.label_kind, meta.label_kind)}
        if meta.storage_order == "shuffled":
            asked["seed"] = (opts.seed, meta.order_seed)
        if opts.compression is not None:
            asked["compression"] = (opts.compression, meta.compression or "none")
        if opts.encoding != "auto":
            asked["encoding"] = (opts.encoding, meta.encoding)
        if meta.encoding != schema.ENCODING_RAW:
            asked["quality"] = (opts.quality, meta.jpeg_quality)
        elif opts.quality is not None and opts.encoding is None:
            raise ConfigError(f"{self.path}: store keeps raw pixels, this write asks for JPEG quality {opts.quality}; "
                              "resume without quality=, or write a new store with encoding='jpeg'")
        for name, (ours, theirs) in asked.items():
            if ours is not None and ours != theirs:
                raise ConfigError(f"{self.path}: store has {name} {theirs}, this write asks for {ours}; resume with "
                                  "the options of the write that made it, or write a new store")
        if opts.classes is not None and (where["classes_given"] is False or
                                         tuple(meta.class_names or ()) != tuple(opts.classes)):
            raise ConfigError(f"{self.path}: store has classes {list(meta.class_names or ())}"
                              f"{'' if where['classes_given'] else ' (none were given to the write that made it)'}, "
                              f"this write gives {list(opts.classes)}; resume with the classes that made it")
        if self.total is not None and where["total"] is not None and self.total != where["total"]:
            raise ConfigError(f"{self.path}: was written from a source of {where['total']} items, this one has "
                              f"{self.total}; resume needs the same source in the same order")
        background, pad_fill = schema_background(self.path)
        self._spec = DecodeSpec(size=(h, w), resize=meta.resize_mode, channels=c, background=background,
                                pad_fill=pad_fill)
        self._labels = LabelCoder(meta.label_kind, meta.class_names, tuple(meta.label_shape),
                                  fixed_classes=where["classes_given"])
        self.opts = dataclasses.replace(self.opts, order=meta.storage_order, seed=meta.order_seed,
                                        classes=tuple(meta.class_names or ()) if where["classes_given"] else None)
        self.total = self.total if self.total is not None else where["total"]
        self.consumed = self.resumed_from = where["consumed"]
        self.skipped = where["skipped"]
        self._appended = (self.consumed, self.skipped)
        self._history = [[meta.rows, self.consumed, self.skipped]]  # the triple this run continues from
        self._rows_before = meta.rows - meta.ingest.stored if meta.ingest is not None else 0
        self._store = StoreWriter.open_append(self.path, lock=self._lock)
        self._make_buffer()
        self._report = SkipReport(self.report_path, read_report(self.report_path))

    def _encoding_for(self, first: np.ndarray | None) -> tuple[str, int | None]:
        """The new store's encoding and JPEG quality: as asked; ``auto`` decides by the first row (its JPEG
        size against its pixels, one core's decode rate of it: :func:`h5stream.ingest.encode.choose`)."""
        from h5stream.ingest import encode

        encoding, quality = self.opts.encoding or schema.ENCODING_RAW, self.opts.quality or encode.DEFAULT_QUALITY
        if encoding == encode.ENCODING_AUTO:
            sample = np.repeat(first[None], encode.AUTO_SAMPLE_FILES, axis=0) if first is not None else None
            encoding = encode.choose(encode.probe(sample, quality)) if sample is not None else schema.ENCODING_RAW
        return encoding, (quality if encoding != schema.ENCODING_RAW else None)

    def _rows(self, images: np.ndarray):
        """``images`` as this store keeps them: the pixels, or each row JPEG-encoded (an encoded store)."""
        if self._store.encoding == schema.ENCODING_RAW:
            return images
        from h5stream.ingest.encode import encode_rows

        return encode_rows(images, int(self._store.attrs[schema.ATTR_JPEG_QUALITY]))

    def _create(self, shape: tuple[int, int, int], label, first: np.ndarray | None = None) -> None:
        """The new store, for a first row of ``shape`` whose label is ``label`` (decides the label kind) and
        whose pixels are ``first`` (what ``encoding="auto"`` measures)."""
        from h5stream.store.writer import StoreWriter

        opts = self.opts
        kind = opts.label_kind or (schema.LABEL_CLASS if opts.classes is not None else label_kind_of(label))
        label_shape = np.shape(label) if kind == schema.LABEL_REGRESSION else ()
        labels = LabelCoder(kind, opts.classes, label_shape, fixed_classes=opts.classes is not None)
        labels.encode(label)  # SkipFile before anything is created
        self._labels = labels
        encoding, quality = self._encoding_for(first)
        self._store = StoreWriter.create(
            self.path, image_shape=shape, label_kind=kind, label_shape=label_shape,
            encoding=encoding, jpeg_quality=quality,
            class_names=labels.class_names if kind == schema.LABEL_CLASS else None,
            block_rows=opts.block_rows, resize_mode=self._spec.resize, background=self._spec.background,
            pad_fill=self._spec.pad_fill, storage_order=opts.order, order_seed=opts.seed,
            compression=opts.compression, overwrite=opts.overwrite, expected_rows=max(1, self.total or 10_000),
            lock=self._lock, row_digests=opts.row_digests is not False)
        self._make_buffer()

    def _make_buffer(self) -> None:
        from h5stream.memory.rawio import aligned_empty

        block_rows = int(self._store.meta["block_rows"])
        self._buf = aligned_empty((block_rows, *self._spec.shape), np.uint8)
        self._buf_labels = np.empty((block_rows, *self._labels.shape), self._labels.dtype)

    # -- adding ---------------------------------------------------------------------
    @property
    def created(self) -> bool:
        """Whether the store is there (made by the first row, or opened to continue)."""
        return self._store is not None

    @property
    def block_rows(self) -> int:
        """Rows per block of the store (once :attr:`created`)."""
        return len(self._buf)

    @property
    def row_shape(self) -> tuple[int, int, int] | None:
        """``(height, width, channels)`` of a row, once the first image decided it."""
        return None if self._spec is None else self._spec.shape

    @property
    def rows(self) -> int:
        """Rows in the store once what was added so far is committed."""
        return (self._store.rows if self._store is not None else 0) + len(self._buf_paths)

    def add(self, image, label=None, *, index: int | None = None) -> bool:
        """Add ``image``, ``label`` (as :func:`h5stream.write`'s items) at position :attr:`consumed`: True if it became
        a row, False if skipped (listed in the skip report under ``index``, default its position; SourceError with
        ``strict``)."""
        with self._in_add:
            return self._add(image, label, index)

    def _add(self, image, label, index: int | None) -> bool:
        self._check_open()
        index = self.consumed if index is None else int(index)
        if self.opts.label_kind == schema.LABEL_NONE:
            label = None  # asked for a store without labels: the source's are not read (as --label-kind none)
        try:
            if self._spec is None:
                self._first_spec(image)
            row = to_pixels(image, self._spec)
            if self._store is None:
                self._create(self._spec.shape, label, row)
            value = self._labels.encode(label)
        except SkipFile as exc:
            self._skip(index, str(exc) or "skipped")
            return False
        n = len(self._buf_paths)
        self._buf[n] = row
        self._buf_labels[n] = value
        self._buf_paths.append(str(index))
        self.consumed += 1
        if n + 1 + self._store.rows % len(self._buf) >= len(self._buf):
            self._append_buffer()
        return True

    def _first_spec(self, image) -> None:
        h, w, c = natural_shape(image)
        size = self.opts.size or (h, w)
        self._spec = DecodeSpec(size=size, resize=self.opts.resize or "stretch", channels=self.opts.channels or c,
                                background=DEFAULT_BACKGROUND, pad_fill=self.opts.pad_fill or DEFAULT_PAD_FILL)

    def add_rows(self, images: np.ndarray, labels, indices) -> None:
        """Add a run of items (``images`` already ``uint8`` of the store's row shape, ``labels``, source ``indices``):
        appended as they are when every label fits (after rows staged by :meth:`add`, with them, the run ending
        at most at their block's end), else item by item.  Needs the store created (after a first :meth:`add`)."""
        with self._in_add_rows:
            self._add_rows(images, labels, indices)

    def _add_rows(self, images: np.ndarray, labels, indices) -> None:
        self._check_open()
        encoded = None
        staged, k = len(self._buf_paths), len(indices)
        if self._store is not None and images.shape[1:] == self._spec.shape and (
                not staged or self._store.rows % len(self._buf) + staged + k <= len(self._buf)):
            encoded = encode_all(self._labels, None if self.opts.label_kind == schema.LABEL_NONE else labels, k)
        if encoded is None:
            for j, index in enumerate(indices):
                self._add(images[j], None if labels is None else labels[j], int(index))
            return
        if staged:  # the first row, added alone to make the store: this run goes with it (once per write)
            self._buf[staged:staged + k] = images
            self._buf_labels[staged:staged + k] = encoded
            self._buf_paths.extend(str(int(i)) for i in indices)
            self.consumed += k
            self._append_buffer(commit=False)
        else:
            self._store.append(self._rows(images), encoded, PathRows.from_indices(indices))
            self.consumed += k
            self.written += k
            self._appended = (self.consumed, self.skipped)
        self._maybe_commit(self._array_commit_rows)

    def _skip(self, index: int, why: str) -> None:
        if self.opts.strict:
            raise SourceError(f"item {index}: {why}; strict=True stops on any item that cannot become a row")
        self._report.add(str(index), why)
        self._first_skip = self._first_skip or (index, why)
        self.consumed += 1
        self.skipped += 1
        if not self._buf_paths:  # nothing staged: the skip follows the appended rows directly
            self._appended = (self.consumed, self.skipped)

    def _append_buffer(self, commit: bool = True) -> None:
        n = len(self._buf_paths)
        if n:
            self._store.append(self._rows(self._buf[:n]), self._buf_labels[:n], self._buf_paths)
            self.written += n
            self._buf_paths = []
        self._appended = (self.consumed, self.skipped)
        if commit:
            self._maybe_commit()

    @property
    def _array_commit_rows(self) -> int:
        """Rows between commits of rows appended whole from arrays: ``commit_rows``, or with the default, at least
        :data:`ARRAY_COMMIT_BYTES` of rows (a killed write loses no decoding there, only a copy)."""
        if self._commit_rows_given:
            return self.opts.commit_rows
        return max(self.opts.commit_rows, ARRAY_COMMIT_BYTES // max(1, int(np.prod(self._spec.shape))))

    def _maybe_commit(self, every_rows: int | None = None) -> None:
        if self._store.rows - self._store.committed_rows >= (every_rows or self.opts.commit_rows):
            self._commit(final=False)

    def _commit(self, final: bool) -> None:
        """Skip report flushed, then the record and counts set, then the store committed (see the module
        docstring: the order is what makes a continued write exact)."""
        store = self._store
        self._report.flush()
        consumed, skipped = self._appended
        self._history = (self._history + [[store.rows, consumed, skipped]])[-2:]
        files = self.total if self.total is not None else consumed + (0 if final else 1)
        record = {"src": WRITER_SOURCE, "labels": None, "options": [], "write": self._history, "total": self.total,
                  "classes_given": self.opts.classes is not None}
        store.set_attr(schema.ATTR_INGEST_SOURCE, json.dumps(record))
        store.set_attr(schema.ATTR_INGEST_FILES, np.int64(max(files, consumed)))
        store.set_attr(schema.ATTR_INGEST_ROWS_BEFORE, np.int64(self._rows_before))
        job.record_skipped(store, skipped)
        store.set_attr(schema.ATTR_SKIPPED, np.int64(self._report.skipped))
        if self._labels.kind == schema.LABEL_CLASS:
            store.set_attr(schema.ATTR_CLASS_NAMES, json.dumps(self._labels.class_names))
        store.commit()
        self._report.published(store.published)  # the old store's report goes once the old store has

    # -- closing --------------------------------------------------------------------
    def close(self) -> WriteResult:
        """Append and commit what was added, close the store and release its lock; the result.  Idempotent.
        SourceError when no item became a row of a new store (none is created)."""
        with self._in_close:
            return self._finish(interrupted=False)

    def _finish(self, interrupted: bool) -> WriteResult:
        """:meth:`close`; ``interrupted``: the write stopped on an error, so a source without a known length is not
        recorded as consumed to its end (the store stays unfinished)."""
        if self._closed:
            if self._result is None:
                raise ConfigError(f"{self.path}: this Writer stopped on an error; resume=True continues it")
            return self._result
        self._closed = True
        try:
            if self._store is None:
                self._report.close()
                if self.consumed:
                    where = "the old store keeps its report" if self._report.replacing else f"all in {self.report_path}"
                    raise SourceError(f"{self.path}: not created: every one of the {self.consumed} items was "
                                      f"skipped (item {self._first_skip[0]}: {self._first_skip[1]}; {where})")
                raise SourceError(f"{self.path}: not created: the source gave no items")
            try:
                self._append_buffer(commit=False)  # the commit below takes it
                self._appended = (self.consumed, self.skipped)
                self._commit(final=not interrupted)
                self._report.close()
                self._store.close()
            except StoreWriteError as exc:
                self._report.discard()
                self._store.discard()
                raise StoreWriteError(f"{exc}; fix that, then run the same write with resume=True to continue",
                                      errno=exc.errno, strerror=exc.strerror,
                                      rows_committed=exc.rows_committed) from exc
        finally:
            self._lock.release()
        self._result = WriteResult(
            out=self.path, rows=int(self._store.committed_rows), written=self.written, skipped=self.skipped,
            consumed=self.consumed, resumed_from=self.resumed_from, seconds=time.perf_counter() - self._t0,
            report_path=self.report_path if os.path.exists(self.report_path) else None)
        return self._result

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError(f"{self.path}: this Writer is closed; open a new one (resume=True continues it)")

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # commits what was added (also on Ctrl-C), so resume=True continues from here
            if self._store is not None or self.consumed:
                self._finish(interrupted=True)
        except Exception:
            pass  # the error that stopped the write is the one to see
        finally:
            self._closed = True
            self._lock.release()

