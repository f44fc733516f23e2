"""The worker side of :class:`~h5stream.augment.pool.WorkerPool`: what runs in each spawned process.

A worker attaches the pool's sources and output slots, then serves tasks
from its pipe until told to stop or its parent is gone.  The messages:

* task (parent -> worker): ``(seq, slot, source_index, where, row_ids, epoch,
  seed, in_place, checks)``, plain ints and bytes; ``where`` is the first row of an
  in-place run, the rows' positions (``intp`` bytes), or for a
  :class:`FileSource` their byte offsets (``int64`` bytes); ``checks`` is None
  or, for a :class:`FileSource`, ``(digests, checked)`` (``uint64`` and
  ``bool`` bytes): the rows' xxh3-64 to check them against; ``None`` stops
  the worker;
* replies: ``("ready", worker_id, pid)`` once attached, ``("fatal",
  worker_id, traceback)`` if that failed; per task ``("read", seq)`` once its
  rows are copied out of a shared source, then ``("done", seq)`` or
  ``("error", seq, summary, traceback[, "read"])``.

A worker imports numpy and the modules the transform needs, never h5py; it
ignores SIGINT (the parent governs shutdown).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import selectors
import traceback
from dataclasses import dataclass

import numpy as np

from h5stream._io import first_mismatch, preadv_all
from h5stream._spawn import worker_signals
from h5stream.errors import ChecksumError
from h5stream.shm import SharedArray


@dataclass(frozen=True)
class FileSource:
    """Rows of ``row_shape``/``dtype`` stored uncompressed in a file, addressed by byte offset; picklable.

    A task on a file source names each row by its offset; the worker reads the
    rows itself (``preadv`` from the page cache into its gather buffer), so no
    pixel passes through the parent at all.
    """

    path: str
    shape: tuple[int, ...]  # (rows, *row_shape) like SharedSpec; tasks address rows by byte offset, not index
    dtype: str

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * np.dtype(self.dtype).itemsize


def worker_main(conn, worker_id, transform_bytes, source_specs, slot_spec, batch_rows):
    """Entry point of a worker process: attach the sources and slots, report, serve (see the module doc)."""
    worker_signals()
    parent = mp.parent_process()
    try:
        transform = pickle.loads(transform_bytes)
        sources = [_FileRows(spec) if isinstance(spec, FileSource) else SharedArray.attach(spec).array
                   for spec in source_specs]
        slots = SharedArray.attach(slot_spec)
    except BaseException:
        conn.send(("fatal", worker_id, traceback.format_exc()))
        return
    conn.send(("ready", worker_id, os.getpid()))
    try:
        _serve(conn, parent.sentinel, transform, sources, source_specs[0], slots.array, batch_rows)
    except (EOFError, OSError):
        pass  # the parent went away mid-message; nothing left to serve


class _FileRows:
    """A worker's handle on a :class:`FileSource`: reads rows at byte offsets into a buffer."""

    def __init__(self, spec: FileSource):
        self.path = spec.path
        self.row_bytes = spec.row_bytes
        self.fd = os.open(spec.path, os.O_RDONLY)

    def read(self, offsets: np.ndarray, out: np.ndarray) -> None:
        """Read row ``i`` of ``out`` from byte ``offsets[i]``; rows adjacent in both go in one call."""
        n, rb = len(offsets), self.row_bytes
        dest = memoryview(out.reshape(-1)).cast("B")
        # Runs: places where the next row's offset is not right after this one's.
        breaks = np.flatnonzero(offsets[1:] != offsets[:-1] + rb) + 1
        starts = [0, *breaks.tolist()]
        stops = [*breaks.tolist(), n]
        firsts = offsets[starts].tolist()
        for a, b, off in zip(starts, stops, firsts):
            preadv_all(self.fd, [dest[a * rb:b * rb]], off, self.path)

    def check(self, rows: np.ndarray, row_ids: np.ndarray, digests: bytes, checked: bytes) -> None:
        """Raise :class:`ChecksumError` naming the first row whose bytes differ from its digest (where checked)."""
        bad = first_mismatch(rows, np.frombuffer(digests, np.uint64), np.frombuffer(checked, bool))
        if bad >= 0:
            row = int(row_ids[bad])
            raise ChecksumError.for_rows(self.path, row, row, "images")


def _serve(conn, parent_sentinel, transform, sources, spec0, out_all, batch_rows) -> None:
    """The worker's task loop; returns on the stop message or when the parent is gone."""
    gather = np.empty((batch_rows,) + tuple(spec0.shape[1:]), dtype=np.dtype(spec0.dtype))
    watch = selectors.DefaultSelector()  # registered once: one wait per task, not a new selector each time
    watch.register(conn, selectors.EVENT_READ)
    watch.register(parent_sentinel, selectors.EVENT_READ)
    while True:
        if conn not in [key.fileobj for key, _ in watch.select()]:
            return  # parent died without close(): nothing left to serve
        msg = conn.recv()
        if msg is None:
            return
        seq, slot, src, where, row_ids, epoch, seed, in_place, checks = msg
        row_ids = np.frombuffer(row_ids, np.int64)
        n = len(row_ids)
        source = sources[src]
        if isinstance(source, _FileRows):
            # The rows' byte offsets in the file: read them here (no "read" message: nothing to free).
            images = gather[:n]
            try:
                source.read(np.frombuffer(where, np.int64), images)
                if checks is not None:
                    source.check(images, row_ids, *checks)
            except Exception as exc:
                conn.send(("error", seq, f"{type(exc).__name__}: {exc}", traceback.format_exc(), "read"))
                continue
        elif in_place:
            # The rows are one contiguous run the submitter keeps untouched until the result is taken:
            # transform straight from shared memory (no copy, no "read" message; "done" implies it).
            images = source[where:where + n]
        else:
            positions = np.frombuffer(where, np.intp)
            images = gather[:n]
            try:
                # mode="clip" avoids numpy's extra buffered copy; the parent validated the range.
                np.take(source, positions, axis=0, out=images, mode="clip")
            except Exception as exc:
                conn.send(("error", seq, f"{type(exc).__name__}: {exc}", traceback.format_exc(), "read"))
                continue
            conn.send(("read", seq))
        try:
            out = out_all[slot, :n]
            result = transform(images, seed=seed, epoch=epoch, row_ids=row_ids, out=out)
            if result is not None and result is not out:
                result = np.asarray(result)
                if result.shape != out.shape:
                    raise ValueError(f"transform returned shape {result.shape}, the pool expects {out.shape}")
                out[...] = result
        except BaseException as exc:  # SystemExit from user code too: report, keep serving
            conn.send(("error", seq, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
            continue
        conn.send(("done", seq))
