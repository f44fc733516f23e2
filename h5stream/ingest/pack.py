"""Decode files in parallel and append them to a store in a fixed order, resumably.

:func:`ingest` is the whole ``h5stream ingest`` job as a function:

1. **Validate** everything that can be checked without decoding (source,
   labels, OUT, compatibility with an existing store) before writing a byte.
2. **Order** the discovered files: sorted walk order, or a permutation seeded
   by ``seed`` (:func:`storage_permutation`).  On ``append`` the permutation is
   taken over *all* discovered files and then the ones already stored are
   dropped, so a run killed part-way and finished with ``append`` writes the
   same rows in the same order as a run that was never interrupted.
3. **Decode** in ``workers`` spawned processes (chunks of files, decoded into
   a fixed ring of shared-memory slots: at most ``4 * workers`` chunks in
   flight, fewer where /dev/shm is small, so memory stays bounded when the
   writer is slower) or in-process when ``workers == 0``.  A chunk is sized
   when a slot frees (:func:`next_task_size`): whole blocks from a block
   boundary while every worker has a block to do, so the workers also
   checksum the blocks they decode.
4. **Write** in order from this thread only, block by block: every chunk is
   written whole, once, straight from the decode slot where the rows fill it
   (:func:`block_split`; only rows around a skipped file, the chunks in flight
   when it was found, or a short task are copied, into one staging block, and
   hashed here).  The disk writes a chunk's blocks (the store's I/O thread)
   while this thread takes the next chunk (:data:`HELD_CHUNKS`).  After every
   ``commit_rows`` rows or more
   (ending on a block boundary) the store is flushed and then
   ``committed_rows`` raised (see :class:`~h5stream.store.writer.StoreWriter`).
   With the default 4 MiB blocks a crash loses at most max(1024 rows, one
   block) of decoding.  The skip report is flushed before each commit so it
   is never behind the ``skipped_files`` attribute.

One ingest writes a store at a time: :func:`ingest` takes the store's lock
(:class:`~h5stream.store.lock.StoreLock`) before anything else and refuses at
once, naming the other writer's pid, when it is held.  A write that fails
(disk full, file size limit, I/O error) ends the run with a
:class:`~h5stream.errors.StoreWriteError` that says how many rows are kept
and how to continue; the store is left as its last commit and the skip
report as its last flush, so ``--append`` afterwards ends with exactly what
an uninterrupted run writes.  A new store takes its name only with its first
commit of rows (see :class:`~h5stream.store.writer.StoreWriter`): a run that
ends before that, killed or failed, leaves no store, and a run in which every
file was skipped is an error that leaves none.  Running out of file
descriptors is a one-line :class:`~h5stream.errors.ResourceLimitError`
naming ``ulimit -n``; what was committed is kept.
"""

from __future__ import annotations

import errno
import numbers
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from h5stream.errors import (ConfigError, ResourceLimitError, SourceError, StoreExistsError, StoreFormatError,
                             StoreWriteError, descriptor_limit)
from h5stream.ingest import job
from h5stream.ingest.discover import IMAGE_EXTENSIONS, UNREADABLE, Item, Source, discover
from h5stream.ingest.pool import MAX_FILES_PER_TASK, DecodePool
from h5stream.ingest.report import LEFT_OUT, SkipReport, read_report
from h5stream.ingest.spec import DEFAULT_PAD_FILL, FD_LIMIT_ERRNOS, DecodeSpec
from h5stream.store import schema
from h5stream.store.lock import StoreLock

ORDERS = ("shuffled", "sorted")
#: Rows between commits (at least; a commit ends on a block boundary).  A commit costs the writing process the same
#: CPU whatever its size (two flushes with fsync, the labels, paths and checksums since the last one), so fewer
#: commits cost less per row; what a crash loses grows with it: at most 1024 rows (or one block) of decoding.  The
#: figures: docs/performance.md, "Commits every 1024 rows".
COMMIT_ROWS = 1024
#: Decoded chunks whose slots the pool keeps for the writing loop: the disk writes one chunk's blocks while the
#: loop takes the next (the writing process's work and the disk's time overlap instead of adding up).
HELD_CHUNKS = 1
#: The last tasks shrink to this many files, so no worker finishes long after the others.
MIN_FILES_PER_TASK = 4
#: Decode processes per CPU at most: beyond two, more only cost memory (decoding is CPU-bound; a second
#: process per core covers what waits on slow storage).
WORKERS_PER_CPU = 2
MAX_SEED = 2**63 - 1  # the order_seed attribute is an int64


@dataclass(frozen=True)
class IngestOptions:
    """Everything one ingest run needs.  ``spec.size`` etc. may be None on append (taken from the store)."""

    src: str
    out: str
    labels_csv: str | None = None
    label_columns: tuple[str, ...] | None = None
    path_column: str | None = None  # CSV: the column naming the files (default: path or filename)
    classes: tuple[str, ...] | None = None  # choose and order the classes (folders or a CSV class column)
    label_kind: str | None = None  # CSV: None decides by the column (text: class, numbers: regression)
    follow_links: bool = False  # enter symlinked folders below the class folders
    pad_fill: tuple[int, int, int] | None = None  # None: black on a new store, the store's on append
    size: tuple[int, int] | None = None
    resize: str | None = None
    channels: int | None = None
    order: str | None = None
    seed: int | None = None
    workers: int = 0
    block_rows: int | None = None
    compression: str | None = None
    append: bool = False
    overwrite: bool = False
    strict: bool = False
    commit_rows: int = COMMIT_ROWS
    progress: bool | None = None  # None: a bar only when stderr is a terminal


@dataclass(frozen=True)
class IngestTarget:
    """What one run writes, resolved from the options and, on ``--append``, from the store: the decoding, the
    storage order and its seed, the class list (new classes appended), the relative paths already stored, and the
    rows the store holds before the run."""

    spec: DecodeSpec
    order: str
    seed: int
    class_names: tuple[str, ...] | None
    stored: frozenset[str]
    start_rows: int


@dataclass(frozen=True)
class IngestResult:
    """What one run did.  ``skipped``: files that could not be ingested (unusable files, and the
    ``unreadable_folders`` among them); ``left_out``: what was left out on purpose, by kind (hidden, not in
    the labels CSV, not in a class folder, class not chosen, symlink not followed, symlink loop).  Both are
    listed in the skip report.  ``workers``: the decode processes used (``opts.workers`` capped by
    :func:`max_workers`).  ``phases``: ``(wall seconds, CPU seconds of this process)`` of each stage of the run in
    order (see :class:`PhaseClock`): where a run's time and its one serial process's CPU went; ``disk_wait_s``:
    the part of it this process waited for its direct writes to reach the disk."""

    out: str
    created: bool
    ingested: int
    skipped: int
    already_stored: int
    rows: int
    seconds: float
    file_bytes: int
    report_path: str | None
    left_out: dict[str, int] = field(default_factory=dict)
    unreadable_folders: int = 0
    workers: int = 0
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)
    disk_wait_s: float = 0.0

    @property
    def images_per_s(self) -> float:
        return self.ingested / self.seconds if self.seconds > 0 else 0.0


class PhaseClock:
    """Wall and CPU seconds of this process (all its threads: the serial stage every decode worker waits on) per
    stage of one ingest: ``find`` (lock, walk, validation, order), ``create`` (decode pool and store opened),
    ``write`` (decode and write every row), ``finish`` (last commit, store closed, workers stopped).  Marked by
    ingest's one thread."""

    def __init__(self):
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        self.phases: dict[str, tuple[float, float]] = {}

    def mark(self, name: str) -> None:
        """End stage ``name`` now (it began at the previous mark, or when the clock was made)."""
        wall, cpu = time.perf_counter(), time.process_time()
        self.phases[name] = (wall - self._wall, cpu - self._cpu)
        self._wall, self._cpu = wall, cpu


def default_workers() -> int:
    """All cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def max_workers() -> int:
    """The most decode processes :func:`ingest` starts: :data:`WORKERS_PER_CPU` per CPU this process may use."""
    return WORKERS_PER_CPU * default_workers()


def storage_permutation(n: int, order: str, seed: int) -> np.ndarray:
    """Row order for ``n`` items in walk order: identity (sorted) or a permutation seeded by ``seed``."""
    if order == "sorted":
        return np.arange(n, dtype=np.int64)
    if order == "shuffled":
        return np.random.default_rng(seed).permutation(n).astype(np.int64)
    raise ConfigError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")


# -- decode tasks ---------------------------------------------------------------------


def next_task_size(left: int, workers: int, offset: int = 0, block_rows: int = 1,
                   max_files: int = MAX_FILES_PER_TASK, min_files: int = MIN_FILES_PER_TASK) -> int:
    """How many files the next decode task takes (pure): ``left`` files still to hand out, the task's rows
    would start ``offset`` rows into a store block of ``block_rows`` rows.

    Guided self-scheduling: a task takes a quarter of what each worker still has to do
    (``left / (4 * workers)``), at most ``max_files`` and at least ``min_files``: big tasks while there is
    plenty (few messages, workers never waiting on the parent), small ones at the end (no worker decoding a
    long last task while the others are idle).  While every worker still has a block's worth to do and a task
    can hold a block, tasks are whole blocks from a block boundary (a multiple of ``block_rows``; after a
    skipped file, the next task ends on a boundary again), so the decode workers can checksum whole blocks and
    the writer writes them straight from the decode slot.
    """
    cap = max(1, int(max_files))
    floor = max(1, min(int(min_files), cap))
    per = 4 * max(1, int(workers))
    left, b = int(left), max(1, int(block_rows))
    balanced = min(left, cap, max(floor, -(-left // per)))
    if b > cap or left < max(1, int(workers)) * b:
        return balanced
    gap = -int(offset) % b
    return gap if gap else max(b, balanced // b * b)


def task_sizes(n_files: int, workers: int, max_files: int = MAX_FILES_PER_TASK,
               min_files: int = MIN_FILES_PER_TASK, block_rows: int = 1) -> list[int]:
    """The sizes :func:`next_task_size` gives, in order, for ``n_files`` files from a block boundary when no
    file is skipped (pure); they add up to ``n_files``."""
    sizes, left = [], int(n_files)
    while left > 0:
        k = next_task_size(left, workers, sum(sizes), block_rows, max_files, min_files)
        sizes.append(k)
        left -= k
    return sizes


def block_split(rows: int, staged: int, n: int, block_rows: int) -> tuple[int, int, int]:
    """How ``n`` new rows go to a store that holds ``rows`` rows with ``staged`` more waiting to complete its
    current block (pure): ``(head, whole, tail)``, in that order.

    ``head`` rows join the staged ones (up to the next block boundary, when one is still open), ``whole`` rows
    (a multiple of ``block_rows``, starting on a boundary) are written as they are, and ``tail`` rows (fewer than
    a block) start a new staged run.  So every write but the last starts on a block boundary and ends on one.
    """
    gap = -(rows + staged) % block_rows  # rows still missing from the open block (0: on a boundary)
    head = min(gap, n)
    if head < gap:
        return head, 0, 0
    rest = n - head
    whole = rest - rest % block_rows
    return head, whole, rest - whole


class _BlockWriter:
    """Hands decoded rows to a :class:`~h5stream.store.writer.StoreWriter` in whole blocks (HDF5 chunks).

    Whole blocks are appended straight from the rows given (a decode slot,
    which the pool keeps for the caller until its blocks are written: see
    ``_write_all``), written by the store's I/O thread while the ingest goes
    on, with the image digests the decode workers
    computed for them, so on the common path no row is copied or hashed here.
    Rows that do not make a whole block from a block boundary (around a
    skipped file, a short last task, a store that ends mid-block) are copied
    into a staging buffer of one block (page-aligned, so it too is written
    direct) and appended once it is full, or by :meth:`write_staged`.  Owned
    and used by the ingest thread.
    """

    def __init__(self, writer, block_rows: int, row_shape: tuple[int, ...], label_shape: tuple[int, ...],
                 label_dtype):
        from h5stream._io import aligned_empty

        self._writer = writer
        self.block_rows = block_rows
        self._images = aligned_empty((block_rows, *row_shape), np.uint8)
        self._labels = np.empty((block_rows, *label_shape), label_dtype)
        self._paths: list[str] = []

    @property
    def rows(self) -> int:
        """Rows appended or staged so far: where the next rows given will start in the store."""
        return self._writer.rows + len(self._paths)

    def add(self, images: np.ndarray, labels: np.ndarray, paths: list[str], digests=()) -> None:
        """Append (or stage) these rows, in order; ``digests``: the image checksums of whole blocks of
        ``images`` from its first row (see :meth:`~h5stream.store.writer.StoreWriter.append`).  StoreWriteError
        from the store."""
        head, whole, tail = block_split(self._writer.rows, len(self._paths), len(paths), self.block_rows)
        if head:
            self._stage(images[:head], labels[:head], paths[:head])
            if (self._writer.rows + len(self._paths)) % self.block_rows == 0:
                self.write_staged()
        if whole:
            end = head + whole
            self._writer.append(images[head:end], labels[head:end], paths[head:end], () if head else digests,
                                wait=False)
        if tail:
            self._stage(images[-tail:], labels[-tail:], paths[-tail:])

    def _stage(self, images: np.ndarray, labels: np.ndarray, paths: list[str]) -> None:
        at, n = len(self._paths), len(paths)
        self._images[at:at + n] = images
        self._labels[at:at + n] = labels
        self._paths.extend(paths)

    def write_staged(self) -> None:
        """Append the staged rows (a block, or the last rows of the run)."""
        n = len(self._paths)
        if n:
            self._writer.append(self._images[:n], self._labels[:n], self._paths)
            self._paths = []


def pending_labels(pending: list[Item], label_kind: str, class_index: dict[str, int],
                   label_shape: tuple[int, ...]) -> np.ndarray:
    """The label of every pending item, in order, as the store holds it (pure): class indices (int64) or
    regression targets (float32 of ``label_shape`` per row), or :data:`~h5stream.store.schema.NO_LABEL` (int8)
    for a store without labels."""
    if label_kind == schema.LABEL_NONE:  # unlabeled stores
        return np.full(len(pending), schema.NO_LABEL, np.int8)
    if label_kind == schema.LABEL_CLASS:
        return np.fromiter((class_index[it.label] for it in pending), np.int64, len(pending))
    return np.array([it.label for it in pending], dtype=np.float32).reshape((len(pending), *label_shape))


# -- validation ---------------------------------------------------------------------


def _check_options(opts: IngestOptions) -> None:
    """Everything about the options and OUT that can be refused before the store is locked."""
    if opts.append and opts.overwrite:
        raise ConfigError("--append and --overwrite contradict each other; pick one")
    if opts.workers < 0:
        raise ConfigError(f"--workers must be >= 0, got {opts.workers}")
    if opts.seed is not None and not 0 <= opts.seed <= MAX_SEED:
        raise ConfigError(f"--seed must be between 0 and {MAX_SEED}, got {opts.seed}")
    if opts.block_rows is not None and opts.block_rows < 1:
        raise ConfigError(f"--block-rows must be >= 1, got {opts.block_rows}")
    if isinstance(opts.commit_rows, bool) or not isinstance(opts.commit_rows, numbers.Integral) or opts.commit_rows < 1:
        raise ConfigError(f"--commit-rows must be an integer >= 1, got {opts.commit_rows!r}")
    if opts.order is not None and opts.order not in ORDERS:
        raise ConfigError(f"--order must be one of {', '.join(ORDERS)}, got {opts.order!r}")
    out = opts.out
    if os.path.isdir(out):
        if opts.append:
            raise StoreExistsError(f"{out}: is a directory; give the .h5 file to append to")
        raise StoreExistsError(f"{out}: is a directory; give a file name such as {os.path.join(out, 'train.h5')}")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise ConfigError(f"{out}: folder {parent} does not exist; create it first")


def _resolve_new(opts: IngestOptions, source: Source) -> IngestTarget:
    out = opts.out
    if os.path.exists(out) and not opts.overwrite:
        raise StoreExistsError(f"{out}: already exists; pass --append to add to it or --overwrite to replace it")
    size = opts.size or (128, 128)
    return IngestTarget(
        spec=DecodeSpec(size=size, resize=opts.resize or "stretch", channels=opts.channels or 3,
                        pad_fill=opts.pad_fill or DEFAULT_PAD_FILL),
        order=opts.order or "shuffled",
        seed=0 if opts.seed is None else opts.seed,
        class_names=tuple(source.class_names) if source.class_names is not None else None,
        stored=frozenset(),
        start_rows=0,
    )


def _resolve_append(opts: IngestOptions, source: Source) -> IngestTarget:
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
    if source.label_kind != meta.label_kind:
        raise ConfigError(
            f"{out}: store holds {meta.label_kind} labels but {source.root} gives {source.label_kind} labels; "
            "ingest into a new file"
        )
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
        paths = f[schema.PATHS]
        for start in range(0, meta.rows, 65536):  # slices: the fixed-width column is 512 bytes a row
            stored.update(schema.decode_path(p) for p in paths[start:min(meta.rows, start + 65536)])
    return IngestTarget(
        spec=DecodeSpec(size=(h, w), resize=meta.resize_mode, channels=c, background=background, pad_fill=pad_fill),
        order=meta.storage_order,
        seed=max(meta.order_seed, 0),
        class_names=tuple(class_names) if class_names is not None else None,
        stored=frozenset(stored),
        start_rows=meta.rows,
    )


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


def _continue_advice(exc: StoreWriteError) -> StoreWriteError:
    """``exc`` with what to do next: remove the cause, then ``--append`` (which also creates a missing store)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = "free some space"
    elif exc.errno == errno.EFBIG:
        fix = "lift the file size limit (ulimit -f) or write to a file system that allows larger files"
    elif exc.errno == errno.EIO:
        fix = "check the disk"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "make it writable"
    else:
        fix = "fix that"
    return StoreWriteError(f"{exc}; {fix}, then run the same command with --append to continue",
                           errno=exc.errno, strerror=exc.strerror, rows_committed=exc.rows_committed)


def _out_of_descriptors(exc: OSError, workers: int) -> ResourceLimitError:
    """The one line for EMFILE / ENFILE: which limit, how to raise it, and that committed rows are kept."""
    what, fix = descriptor_limit(exc.errno) or descriptor_limit(errno.ENFILE)
    if workers:
        fix += f" or lower --workers (now {workers}; --workers 0 opens the fewest)"
    return ResourceLimitError(f"{what}; {fix}; rows already committed are kept: run the same command with "
                              "--append to continue", errno=exc.errno)


def _nothing_ingested(opts: IngestOptions, source: Source, skipped: int, report_path: str) -> SourceError:
    """The one line for a new store that would hold no row: every file found was skipped."""
    where = (f"the files {opts.labels_csv} lists under {source.root}" if opts.labels_csv
             else f"the class folders of {source.root}" if source.label_kind != schema.LABEL_NONE
             else source.root)  # unlabeled stores: the whole folder
    return SourceError(
        f"{opts.out}: not created: every one of the {skipped} files found in {where} was skipped "
        f"(reasons in {report_path}); it needs image files Pillow can read "
        f"({', '.join(sorted(IMAGE_EXTENSIONS))})"
    )


# -- the job ------------------------------------------------------------------------


def _open_writer(opts: IngestOptions, source: Source, target: IngestTarget, appending: bool, n_pending: int,
                 lock: StoreLock):
    """The store to write: opened for append (class list extended) or created.  Returns (writer, start rows)."""
    from h5stream.store.writer import StoreWriter

    spec = target.spec
    if appending:
        writer = StoreWriter.open_append(opts.out, lock=lock)
        if source.label_kind == schema.LABEL_CLASS and len(target.class_names) != len(writer.meta["class_names"] or ()):
            import json

            writer.set_attr(schema.ATTR_CLASS_NAMES, json.dumps(list(target.class_names)))
            writer.commit()
    else:
        # unlabeled stores: one NO_LABEL per row, as a class store holds one index
        label_shape = () if source.label_kind != schema.LABEL_REGRESSION or len(source.label_columns) == 1 else (
            len(source.label_columns),)
        writer = StoreWriter.create(
            opts.out, image_shape=spec.shape, label_kind=source.label_kind, label_shape=label_shape,
            class_names=target.class_names, label_columns=source.label_columns, block_rows=opts.block_rows,
            resize_mode=spec.resize, background=spec.background, pad_fill=spec.pad_fill, storage_order=target.order,
            order_seed=target.seed, compression=opts.compression, overwrite=opts.overwrite,
            expected_rows=max(1, n_pending), lock=lock,
        )
    return writer, writer.committed_rows


def _write_all(opts, source, target, pending, rejected, left_out, pool, writer, report) -> int:
    """Decode ``pending`` through ``pool`` and append in order; returns the rows written.  ``rejected`` and
    ``left_out`` entries go to the report (``--strict`` stops on a rejected file or an unreadable folder).

    Per chunk the work is per block, not per row, where no file was skipped: the labels and paths are slices
    taken once, and whole blocks go from the decode slot to the file.  A commit follows every ``commit_rows``
    rows or more (ending on a block boundary), the skip report flushed first."""
    from tqdm import tqdm

    block_rows = int(writer.meta["block_rows"])
    label_shape = tuple(writer.labels.shape[1:])
    labels_all = pending_labels(pending, source.label_kind, {n: i for i, n in enumerate(target.class_names or ())},
                                label_shape)

    run_skipped = 0  # this run's files skipped so far (each once), for its progress (see ingest.job)

    def record_skip(rel: str, why: str) -> None:
        nonlocal run_skipped
        if opts.strict:
            raise SourceError(f"{os.path.join(source.root, rel)}: {why}; --strict stops on any skipped file")
        report.add(rel, why)
        run_skipped += 1

    written_skipped = None  # the skipped_files value this run last set (an attribute write costs ~0.4 ms)
    written_run_skipped = 0

    def commit() -> None:
        nonlocal written_skipped, written_run_skipped
        report.flush()  # the report is never behind the count that points to it
        if report.skipped != written_skipped:
            writer.set_attr(schema.ATTR_SKIPPED, np.int64(report.skipped))
            written_skipped = report.skipped
        if run_skipped != written_run_skipped:
            job.record_skipped(writer, run_skipped)
            written_run_skipped = run_skipped
        writer.commit()

    for rel, why in rejected:
        record_skip(rel, why)
    for rel, kind, why in left_out:
        if kind == UNREADABLE:
            record_skip(rel, why)
        else:
            report.add(rel, LEFT_OUT + why)
    blocks = _BlockWriter(writer, block_rows, tuple(writer.images.shape[1:]), label_shape, labels_all.dtype)
    # The disk writes a chunk's blocks while the next chunk is taken: the pool keeps the last HELD_CHUNKS slots
    # for this loop, and before it asks for the next chunk (which frees the oldest) that chunk's writes are done.
    written_by: deque[int] = deque()  # per chunk kept, the direct writes submitted once it was added
    ingested = 0
    starts, chunks = [0], []  # task k covers pending[starts[k]:starts[k + 1]], files chunks[k]
    delivered = 0  # files of the tasks handed back so far

    def next_chunks():
        """Each task sized when a slot frees, to end on a block boundary if none of the files in flight is
        skipped (see next_task_size)."""
        while starts[-1] < len(pending):
            in_flight = starts[-1] - delivered
            k = next_task_size(len(pending) - starts[-1], pool.workers, blocks.rows + in_flight, block_rows,
                               pool.rows_per_task)
            chunks.append([it.relpath for it in pending[starts[-1]:starts[-1] + k]])
            starts.append(starts[-1] + k)
            yield chunks[-1]

    bar = tqdm(total=len(pending), unit="img", desc="ingest", file=sys.stderr, smoothing=0.1, dynamic_ncols=True,
               disable=None if opts.progress is None else not opts.progress)
    try:
        for chunk_no, (images, reasons, digests) in enumerate(
                pool.imap(source.root, next_chunks(), target.spec, block_rows, hold=HELD_CHUNKS)):
            paths, labels = chunks[chunk_no], labels_all[starts[chunk_no]:starts[chunk_no + 1]]
            delivered = starts[chunk_no + 1]
            kept = reasons.count(None)
            if kept < len(reasons):
                for rel, why in zip(paths, reasons):
                    if why is not None:
                        record_skip(rel, why)
                keep = np.fromiter((why is None for why in reasons), bool, len(reasons))
                paths, labels = [rel for rel, why in zip(paths, reasons) if why is None], labels[keep]
            if kept:
                blocks.add(images, labels, paths, digests)
                ingested += kept
            if writer.rows - writer.committed_rows >= opts.commit_rows:
                commit()
            written_by.append(writer.direct_writes)
            if len(written_by) > HELD_CHUNKS:
                writer.wait_direct_writes(written_by.popleft())  # its slot is freed by the next request
            bar.update(len(reasons))
        pool.finish()
        blocks.write_staged()
        commit()
    finally:
        bar.close()
    return ingested


def ingest(opts: IngestOptions) -> IngestResult:
    """Run one ingest (see the module docstring).  Raises H5StreamError subclasses on bad input.

    With ``strict`` the first skipped file raises :class:`SourceError`, and
    whatever this run wrote is removed (new file) or rolled back (append).
    Raises :class:`~h5stream.errors.StoreBusyError` at once when another
    writer holds OUT, and :class:`~h5stream.errors.StoreWriteError` when
    writing fails (the message says what is kept and how to continue).
    """
    clock = PhaseClock()
    _check_options(opts)
    try:
        with StoreLock.acquire(opts.out) as lock:
            try:
                return _ingest_locked(opts, lock, clock)
            except StoreWriteError as exc:
                if exc.errno in FD_LIMIT_ERRNOS:
                    raise
                raise _continue_advice(exc) from exc
    except OSError as exc:  # the lock, the store, the report, a decode worker or starting one
        if exc.errno in FD_LIMIT_ERRNOS:
            raise _out_of_descriptors(exc, min(opts.workers, max_workers())) from exc
        raise


def _ingest_locked(opts: IngestOptions, lock: StoreLock, clock: PhaseClock) -> IngestResult:
    workers = min(opts.workers, max_workers())
    source = discover(opts.src, opts.labels_csv, list(opts.label_columns) if opts.label_columns else None,
                      classes=opts.classes, label_kind=opts.label_kind, follow_links=opts.follow_links,
                      path_col=opts.path_column)
    appending = opts.append and os.path.exists(opts.out)
    target = _resolve_append(opts, source) if appending else _resolve_new(opts, source)
    if appending:
        from h5stream.store.meta import read_meta

        job.check_continues(read_meta(opts.out), opts)

    report_path = schema.skipped_report_path(opts.out)
    reported = read_report(report_path) if appending else {}
    rejected = [(rel, why) for rel, why in source.rejected if rel not in target.stored]
    left_out = [entry for entry in source.left_out if entry[0] not in target.stored]
    if opts.strict:
        failing = rejected + [(rel, why) for rel, kind, why in left_out if kind == UNREADABLE]
        if failing:
            rel, why = failing[0]
            raise SourceError(f"{os.path.join(source.root, rel)}: {why}; --strict stops on any skipped file")

    order = storage_permutation(len(source.items), target.order, target.seed)
    pending: list[Item] = [source.items[i] for i in order if source.items[i].relpath not in target.stored]
    already = len(source.items) - len(pending)
    clock.mark("find")

    pool = DecodePool(workers, target.spec.shape)
    try:
        pool.start()  # workers boot while the store is created
        writer, start_rows = _open_writer(opts, source, target, appending, len(pending), lock)
        folders = sum(kind == UNREADABLE for _, kind, _ in left_out)  # each skipped, as a file is
        job.start(writer, opts, already + len(pending) + len(rejected) + folders, start_rows - already)
        # A report from an older file of this name no longer applies; --overwrite drops that file with it, so
        # no store is ever paired with another run's report.
        for old in ([] if appending else [report_path] + ([opts.out] if opts.overwrite else [])):
            try:
                if os.path.exists(old):
                    os.unlink(old)
            except OSError as exc:
                writer.discard()
                raise StoreWriteError(f"{old}: cannot remove it ({exc.strerror}); nothing was written",
                                      errno=exc.errno, strerror=exc.strerror, rows_committed=0) from exc
        report = SkipReport(report_path, reported)
        clock.mark("create")
        try:
            ingested = _write_all(opts, source, target, pending, rejected, left_out, pool, writer, report)
            clock.mark("write")
            report.close()
            if ingested or writer.published:
                writer.close()
            else:
                writer.discard()  # a new store with no row is not left behind (the error is raised below)
        except StoreWriteError as exc:
            report.discard()  # both as of their last flush: --append continues from there
            writer.discard()
            if exc.rows_committed is None:  # the report failed: say what the store keeps too
                kept = (f"{opts.out} is as its last commit left it: {writer.committed_rows} complete rows"
                        if writer.published else f"{opts.out} was not created")
                raise StoreWriteError(f"{exc}; {kept}", errno=exc.errno, strerror=exc.strerror,
                                      rows_committed=writer.committed_rows) from exc
            raise
        except BaseException:
            try:
                report.close()
            finally:
                if not opts.strict and not writer.published and not writer.rows:
                    writer.discard()  # stopped before its first row: no empty store is left
                elif not opts.strict:
                    writer.close()  # commits what was appended (also on Ctrl-C), so --append resumes from here
                elif appending:
                    writer.rollback(start_rows)
                    writer.close()
                else:
                    was_published = writer.published
                    writer.discard()  # not yet published: nothing is left
                    for p in ([opts.out] if was_published else []) + [report_path]:
                        if os.path.exists(p):
                            os.unlink(p)
            raise
    finally:
        pool.close()
    clock.mark("finish")
    if not appending and not ingested:
        raise _nothing_ingested(opts, source, len(rejected) + len(pending), report_path)
    kinds: dict[str, int] = {}
    for _, kind, _ in left_out:
        kinds[kind] = kinds.get(kind, 0) + 1
    unreadable = kinds.pop(UNREADABLE, 0)
    return IngestResult(
        out=opts.out, created=not appending, ingested=ingested,
        skipped=len(rejected) + unreadable + len(pending) - ingested,
        already_stored=already, rows=start_rows + ingested, seconds=sum(wall for wall, _ in clock.phases.values()),
        file_bytes=os.path.getsize(opts.out), report_path=report_path if os.path.exists(report_path) else None,
        left_out=kinds, unreadable_folders=unreadable, workers=workers, phases=dict(clock.phases),
        disk_wait_s=writer.direct_wait_s,
    )
