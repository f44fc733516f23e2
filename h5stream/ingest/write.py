"""The writing loop of an ingest: decoded chunks appended to the store in order, block by block, with commits.

:func:`write_all` asks the decode pool for chunks of files (sized when a slot frees: :func:`next_task_size`, whole
blocks from a block boundary while every worker has a block to do) and writes every chunk whole, once, straight
from the decode slot where its rows fill whole blocks (:func:`block_split`; only rows around a skipped file, a short
task or a store that ends mid-block are copied, into one staging block, and hashed here).  The disk writes a
chunk's blocks (the store's I/O thread) while this thread takes the next chunk (:data:`HELD_CHUNKS`).  After every
``commit_rows`` rows or more (ending on a block boundary) the skip report is flushed, then the store committed.
Run by the ingest's one thread; the pure sizing functions are shared with tests and benchmarks.
"""

from __future__ import annotations

import os
import sys
from collections import deque

import numpy as np

from h5stream.errors import SourceError
from h5stream.ingest import job
from h5stream.ingest.discover import UNREADABLE, Item
from h5stream.ingest.pool import MAX_FILES_PER_TASK
from h5stream.ingest.report import LEFT_OUT
from h5stream.store import schema

#: Decoded chunks whose slots the pool keeps for the writing loop: the disk writes one chunk's blocks while the
#: loop takes the next (the writing process's work and the disk's time overlap instead of adding up).
HELD_CHUNKS = 1
#: The last tasks shrink to this many files, so no worker finishes long after the others.
MIN_FILES_PER_TASK = 4


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
    :func:`write_all`), written by the store's I/O thread while the ingest goes
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
        from h5stream.memory.rawio import aligned_empty

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



def write_all(opts, source, target, pending, rejected, left_out, pool, writer, report, decoding=None) -> int:
    """Decode ``pending`` through ``pool`` and append in order; returns the rows written.  ``rejected`` and
    ``left_out`` entries go to the report (``--strict`` stops on a rejected file or an unreadable folder).
    ``decoding`` (an :class:`~h5stream.ingest.crashes.InFlight`) is told the files being decoded before each
    task is handed out, so a run that dies decoding leaves which files they were.

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
        report.published(writer.published)  # a new store's report replaces the old one's once the store has

    # Files an earlier run listed that are stored now (fixed since, or newly listed) leave the report with the
    # last commit; files stored by a run killed before its report was rewritten leave it too.
    now_stored = set(report.paths & target.stored)
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
            if decoding is not None:  # before a worker (or this process) can die on it
                decoding.submitted(chunks[-1])
            yield chunks[-1]

    bar = tqdm(total=len(pending), unit="img", desc="ingest", file=sys.stderr, smoothing=0.1, dynamic_ncols=True,
               disable=None if opts.progress is None else not opts.progress)
    try:
        for chunk_no, (images, reasons, digests) in enumerate(
                pool.imap(source.root, next_chunks(), target.spec, block_rows, hold=HELD_CHUNKS)):
            paths, labels = chunks[chunk_no], labels_all[starts[chunk_no]:starts[chunk_no + 1]]
            delivered = starts[chunk_no + 1]
            if decoding is not None:
                decoding.delivered()
            kept = reasons.count(None)
            if kept < len(reasons):
                for rel, why in zip(paths, reasons):
                    if why is not None:
                        record_skip(rel, why)
                keep = np.fromiter((why is None for why in reasons), bool, len(reasons))
                paths, labels = [rel for rel, why in zip(paths, reasons) if why is None], labels[keep]
            if report.paths:  # a lookup per stored file (this run's own entries are files not stored)
                now_stored.update(report.paths.intersection(paths))
            if kept and writer.encoding != schema.ENCODING_RAW:  # encoded rows, hashed by the writer
                writer.append(images, labels, paths)
                ingested += kept
            elif kept:
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
        report.forget(now_stored)
        commit()
    finally:
        bar.close()
    return ingested
