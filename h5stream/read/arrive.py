"""Rows of a fill counted as arrived in their batches, and a URL stream's first batch handed out before its fill.

A fill's rows are shuffled across all its batches, so each batch's rows lie all over the fill's runs: the reader
counts a fill's batches as complete once every run is read (:meth:`~h5stream.read.reader.Reader._complete`).
For the first fill of a stream over a URL through the disk cache that means the first batch waits for every piece
the fill touches.  :func:`head_first` cuts that fill's runs into the rows of its first batch and the rest, so the
first batch's rows are advised (their pieces fetched ahead first) and read first, and the reader hands the first
batch out as soon as they have landed (:func:`arrive` of that batch alone), before the rest of its fill: no other
batch, no other order, no other memory (the fill's batches exist already), no other request (the cache fetches
whole pieces however the runs are cut; without the cache, cut runs would be more requests, so it is not done).

How much sooner depends on how many of the fill's pieces the first batch touches: of a 0.25 GB store's fill of
1,696 rows in 31 pieces of 8 MiB, batch 0 (64 rows in units of 16) touches 28 of the 30 the fill does; of a
10 GB store's, about 49 of 106 (computed: docs/design.md, "The local disk cache").

Reader thread.
"""

from __future__ import annotations

import numpy as np

from h5stream.read.fill import FillJob
from h5stream.read.runs import Run


def head_first(batch: np.ndarray, first_batch: int, runs: list[Run], row_bytes: int) -> tuple[list[Run], list[Run]]:
    """``(head, tail)``: the rows of ``runs`` that go to batch ``first_batch`` (``batch``: buffer position ->
    batch), as runs of consecutive such rows, and the rest of ``runs``, cut around them; each in the order of
    ``runs`` (pure).  A fill's runs merge neighbouring units, so a fill of the whole store may be one run: cut, its
    first batch's rows can be read on their own."""
    mine = batch == first_batch
    head, tail = [], []
    for run in runs:
        m = mine[run.dest:run.dest + run.rows]
        if not m.any():
            tail.append(run)
            continue
        cuts = [0, *(np.flatnonzero(m[1:] != m[:-1]) + 1).tolist(), run.rows]
        for a, b in zip(cuts[:-1], cuts[1:]):
            part = Run(run.dest + a, run.src + a, b - a, None if run.offset is None else run.offset + a * row_bytes)
            (head if m[a] else tail).append(part)
    return head, tail


def batch_ends(job: FillJob) -> np.ndarray:
    """Where each of the fill's batches ends in ``job.yielded`` (the buffer positions in yield order: batch
    after batch)."""
    ends = job.batch_ends
    if ends is None:
        ends = job.batch_ends = np.searchsorted(
            job.batch[job.yielded], np.arange(job.first_batch + 1, job.first_batch + job.n_batches + 1))
    return ends


def arrive(job: FillJob, stop: int, file_offsets: np.ndarray | None = None, check=None) -> int:
    """Count the rows of the fill's batches from ``job.arrived`` up to ``stop`` (exclusive) as arrived: their
    labels and row ids (for a batch without images, also its rows' file offsets, ``file_offsets`` by buffer
    position, and the digests to check them by, ``check.to_check(row_ids)``) put in place and ``missing``
    lowered.  Their
    pixels must have landed.  Returns how many of those rows went to batches without images (their receivers
    read them)."""
    first, start = job.first_batch, job.arrived
    stop = min(stop, first + job.n_batches)
    if stop <= start:
        return 0
    ends = batch_ends(job)
    lo = 0 if start == first else int(ends[start - first - 1])
    hi = int(ends[stop - first - 1])
    pos = job.yielded[lo:hi]
    labels, row_ids, first_row = job.labels[pos], job.row_ids[pos], job.offset[pos]
    offsets = checks = None
    if file_offsets is not None:
        offsets = file_offsets[pos]
        checks = None if check is None else check.to_check(row_ids)
    deferred_rows = 0
    a = 0
    for j, b in zip(range(start, stop), (ends[start - first:stop - first] - lo).tolist()):
        t, m = job.targets[j], b - a
        k = slice(int(first_row[a]), int(first_row[a]) + m)
        t.batch.labels[k] = labels[a:b]
        t.batch.row_ids[k] = row_ids[a:b]
        if t.batch.file_offsets is not None:
            t.batch.file_offsets[k] = offsets[a:b]
            if t.batch.checks is not None:
                t.batch.checks[0][k] = checks[0][a:b]
                t.batch.checks[1][k] = checks[1][a:b]
            deferred_rows += m
        t.missing -= m
        a = b
    job.arrived = stop
    return deferred_rows
