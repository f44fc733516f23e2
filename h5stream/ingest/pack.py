"""Decode files in parallel and append them to a store in a fixed order, resumably.

:func:`ingest` is the whole ``h5stream ingest`` job as a function:

1. **Validate** everything that can be checked without decoding (source,
   labels, OUT: :mod:`h5stream.ingest.options`; compatibility with an
   existing store: :mod:`h5stream.ingest.append`) before writing a byte.
2. **Order** the discovered files: sorted walk order, or a permutation seeded
   by ``seed`` (:func:`storage_permutation`).  On ``append`` the permutation is
   taken over *all* discovered files and then the ones already stored are
   dropped, so a run killed part-way and finished with ``append`` writes the
   same rows in the same order as a run that was never interrupted.
3. **Decode** in ``workers`` spawned processes (chunks of files, decoded into
   a fixed ring of shared-memory slots: at most ``4 * workers`` chunks in
   flight, fewer where /dev/shm is small, so memory stays bounded when the
   writer is slower) or in-process when ``workers == 0``.  A chunk is sized
   when a slot frees (:func:`~h5stream.ingest.write.next_task_size`): whole
   blocks from a block boundary while every worker has a block to do, so the
   workers also checksum the blocks they decode.
4. **Write** in order from this thread only, block by block
   (:mod:`h5stream.ingest.write`): every chunk is written whole, once,
   straight from the decode slot where the rows fill it
   (:func:`~h5stream.ingest.write.block_split`; only rows around a skipped
   file, the chunks in flight when it was found, or a short task are copied,
   into one staging block, and hashed here).  The disk writes a chunk's
   blocks (the store's I/O thread) while this thread takes the next chunk
   (:data:`~h5stream.ingest.write.HELD_CHUNKS`).  After every
   ``commit_rows`` rows or more (ending on a block boundary) the store is
   flushed and then ``committed_rows`` raised (see
   :class:`~h5stream.store.writer.StoreWriter`).  With the default 4 MiB
   blocks a crash loses at most max(1024 rows, one block) of decoding.  The
   skip report is flushed before each commit so it is never behind the
   ``skipped_files`` attribute.

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
import os
import time
from dataclasses import dataclass, field

import numpy as np

from h5stream.errors import ConfigError, ResourceLimitError, SourceError, StoreWriteError, descriptor_limit
from h5stream.ingest import crashes, job
from h5stream.ingest.append import fit_paths, open_append, resolve_append
from h5stream.ingest.discover import IMAGE_EXTENSIONS, UNREADABLE, Item, Source, discover
from h5stream.ingest.options import ORDERS, IngestOptions, IngestTarget, check_options, resolve_new
from h5stream.ingest.encode import resolve_auto
from h5stream.ingest.pool import DecodePool
from h5stream.ingest.report import SkipReport, read_report, settle_replacement
from h5stream.ingest.spec import FD_LIMIT_ERRNOS
from h5stream.ingest.write import write_all
from h5stream.store import schema
from h5stream.store.lock import StoreLock

__all__ = ["IngestOptions", "IngestResult", "ingest"]

#: Decode processes per CPU at most: beyond two, more only cost memory (decoding is CPU-bound; a second
#: process per core covers what waits on slow storage).
WORKERS_PER_CPU = 2


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


def _nothing_ingested(opts: IngestOptions, source: Source, skipped: int, report_path: str,
                      first: tuple[str, str] | None) -> SourceError:
    """The one line for a new store that would hold no row: every file found was skipped.  An old store left in
    place keeps its own report, so the line names this run's first skipped file (``first``) instead."""
    where = (f"the files {opts.labels_csv} lists under {source.root}" if opts.labels_csv
             else f"the class folders of {source.root}" if source.label_kind != schema.LABEL_NONE
             else source.root)  # unlabeled stores: the whole folder
    replaced = opts.overwrite and os.path.exists(opts.out)
    reasons = f"reasons in {report_path}"
    if replaced:
        reasons = (f"{os.path.join(source.root, first[0])}: {first[1]}" if first else "no reason recorded") + (
            f", and {skipped - 1} more; {report_path} is still the old store's" if skipped > 1 else "")
    return SourceError(
        f"{opts.out}: not {'replaced' if replaced else 'created'}: every one "
        f"of the {skipped} files found in {where} was skipped ({reasons}); it needs image files "
        f"Pillow can read ({', '.join(sorted(IMAGE_EXTENSIONS))})"
    )


# -- the job ------------------------------------------------------------------------


def _open_writer(opts: IngestOptions, source: Source, target: IngestTarget, appending: bool, n_pending: int,
                 lock: StoreLock):
    """The store to write: opened for append (class list extended; a store whose writer stopped mid-flush rebuilt
    first) or created.  Returns (writer, start rows)."""
    from h5stream.store.writer import StoreWriter

    spec = target.spec
    if appending:
        writer = open_append(opts.out, target, source.label_kind, lock)
    else:
        # unlabeled stores: one NO_LABEL per row, as a class store holds one index
        label_shape = () if source.label_kind != schema.LABEL_REGRESSION or len(source.label_columns) == 1 else (
            len(source.label_columns),)
        writer = StoreWriter.create(
            opts.out, image_shape=spec.shape, label_kind=source.label_kind, label_shape=label_shape,
            class_names=target.class_names, label_columns=source.label_columns, block_rows=opts.block_rows,
            resize_mode=spec.resize, background=spec.background, pad_fill=spec.pad_fill, storage_order=target.order,
            order_seed=target.seed, compression=opts.compression, overwrite=opts.overwrite,
            expected_rows=max(1, n_pending), lock=lock, encoding=spec.encoding, jpeg_quality=spec.quality,
            row_digests=opts.row_digests is not False,
        )
    return writer, writer.committed_rows


def ingest(opts: IngestOptions) -> IngestResult:
    """Run one ingest: what ``h5stream ingest`` runs (see the module docstring).

    Args:
        opts: an :class:`IngestOptions`: the source folder (and labels CSV),
            the store to write or ``append`` to, the size and resize mode, the
            storage order, the decode workers, the block and commit sizes.

    Returns:
        An :class:`IngestResult`: rows ingested, files skipped and left out
        (all listed in ``OUT.h5.skipped.csv``), the time each stage took.

    Raises:
        SourceError: a source that is not a class folder, a labels CSV or (``--labels none``) a folder of images;
            with ``strict``, the first skipped file, after which whatever this run wrote is removed (new file)
            or rolled back (append).
        ConfigError: options that do not fit each other or, on ``append``, the store.
        StoreBusyError: another writer holds OUT (at once).
        StoreWriteError: writing failed (a full disk, a file size limit): the message says what is kept and how
            to continue (``--append``).
        ResourceLimitError: too few file descriptors for the decode workers; the message names the limit.
    """
    clock = PhaseClock()
    check_options(opts)
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
    part = None
    if opts.part is not None:
        from h5stream.ingest.parts import select_part

        source, part = select_part(source, *opts.part)
    appending = opts.append and os.path.exists(opts.out)
    target = resolve_append(opts, source) if appending else resolve_new(opts, source)
    source = fit_paths(source, target.path_limit)
    if appending:
        from h5stream.store.meta import read_meta

        job.check_continues(read_meta(opts.out), opts)
        job.check_part(read_meta(opts.out), opts)

    report_path = schema.skipped_report_path(opts.out)
    if appending:
        settle_replacement(report_path, os.fspath(opts.out) + schema.CREATING_SUFFIX)
    reported = read_report(report_path) if appending else {}
    rejected = [(rel, why) for rel, why in source.rejected if rel not in target.stored]
    left_out = [entry for entry in source.left_out if entry[0] not in target.stored]
    order = storage_permutation(len(source.items), target.order, target.seed)
    pending: list[Item] = [source.items[i] for i in order if source.items[i].relpath not in target.stored]
    already = len(source.items) - len(pending)
    # Files a killed run was decoding, or that an earlier run's decoder died on, are decoded alone first: one that
    # kills the decoder again is skipped with why, before any decoding here could die on it.
    in_flight_path = os.fspath(opts.out) + schema.DECODING_SUFFIX
    suspect = crashes.suspects(crashes.read_in_flight(in_flight_path), reported, {it.relpath for it in pending})
    if suspect:
        culprits = crashes.find_culprits(source.root, suspect, target.spec, DecodePool.DEFAULT_TIMEOUT_S)
        rejected += list(culprits.items())
        pending = [it for it in pending if it.relpath not in culprits]
    if opts.strict:
        failing = rejected + [(rel, why) for rel, kind, why in left_out if kind == UNREADABLE]
        if failing:
            rel, why = failing[0]
            raise SourceError(f"{os.path.join(source.root, rel)}: {why}; --strict stops on any skipped file")
    clock.mark("find")

    pool = DecodePool(workers, target.spec.shape)
    try:
        pool.start()  # workers boot while the store is created
        if target.spec.encoding == "auto":
            target = resolve_auto(target, source.root, pending, pool)
        writer, start_rows = _open_writer(opts, source, target, appending, len(pending), lock)
        folders = sum(kind == UNREADABLE for _, kind, _ in left_out)  # each skipped, as a file is
        files = already + len(pending) + len(rejected) + folders
        job.record_order(writer, source, appending, files, bool(pending))  # before start() records this run's files
        job.start(writer, opts, files, start_rows - already, part)
        # An older store of this name stays, with its report, until the new one's first commit replaces it (an
        # atomic rename; the report follows it: SkipReport.published): a run that stores nothing, fails or is
        # stopped before then leaves both as they were.  A report with no store beside it applies to nothing.
        replacing = not appending and os.path.exists(opts.out)
        try:
            if not appending and not replacing and os.path.exists(report_path):
                os.unlink(report_path)
            report = SkipReport(report_path, reported, replacing=replacing)
        except OSError as exc:
            writer.discard()
            raise StoreWriteError(f"{report_path}: cannot prepare the skip report ({exc.strerror}); nothing was "
                                  "written", errno=exc.errno, strerror=exc.strerror, rows_committed=0) from exc
        except BaseException:
            writer.discard()
            raise
        try:
            in_flight = crashes.InFlight(in_flight_path)
        except BaseException:
            report.discard()
            writer.discard()
            raise
        clock.mark("create")
        try:
            ingested = write_all(opts, source, target, pending, rejected, left_out, pool, writer, report, in_flight)
            in_flight.close()  # nothing is being decoded any more
            clock.mark("write")
            report.close()
            if ingested or writer.published:
                writer.close()
            else:
                writer.discard()  # a new store with no row is not left behind (the error is raised below)
        except StoreWriteError as exc:
            in_flight.close()
            report.discard()  # both as of their last flush: --append continues from there
            writer.discard()
            if exc.rows_committed is None:  # the report failed: say what the store keeps too
                kept = (f"{opts.out} is as its last commit left it: {writer.committed_rows} complete rows"
                        if writer.published else f"{opts.out} was not created")
                raise StoreWriteError(f"{exc}; {kept}", errno=exc.errno, strerror=exc.strerror,
                                      rows_committed=writer.committed_rows) from exc
            raise
        except BaseException:
            in_flight.close()  # this process lives: no file it was decoding killed it (a death leaves the record)
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
        raise _nothing_ingested(opts, source, len(rejected) + len(pending), report_path, report.first)
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
