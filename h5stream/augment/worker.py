"""The worker side of :class:`~h5stream.augment.pool.WorkerPool`: what runs in each spawned process.

Each worker runs the core's loop (:func:`h5stream.concurrency.procpool.serve`) with
:func:`setup` (attach the sources and output slots, unpickle the transform)
and :func:`run_task`.  A task's body is bytes (:func:`pack_task`, sent with
:meth:`~h5stream.concurrency.procpool.Workers.send_raw`: no pickling either way), which
:func:`unpack_task` reads as ``(slot, source_index, where, row_ids, epoch,
seed, checks)``: ``where`` is the first row of a run in a shared-memory source
(transformed where it lies, never copied), or for a :class:`FileSource` the
rows' byte offsets (``int64``); ``checks`` is None or, for a
:class:`FileSource`, ``(digests, checked)`` (``uint64`` and ``bool``): the
rows' xxh3-64 to check them against; for a shared-memory run of an encoded store's rows, ``checks`` is their
JPEG lengths (``int64``, see :mod:`h5stream.read.encoded`), decoded here.  A task's result is
None: the rows are in the slot.  A failure to get a task's rows is reported
with stage ``"read"``, one of the transform with stage ``"transform"``.

The transform :func:`copy_rows` is the plain stream's (``workers`` without an
augmentation): a worker reads a file source's rows straight into the output
slot, or copies an input slot's rows there, the one copy of every pixel.

A worker imports numpy and the modules the transform needs, never h5py; it
ignores SIGINT (the parent governs shutdown).
"""

from __future__ import annotations

import os
import pickle
import struct
from dataclasses import dataclass

import numpy as np

from h5stream.memory.rawio import first_mismatch, preadv_all
from h5stream.concurrency.procpool import TaskFailed
from h5stream.errors import ChecksumError
from h5stream.memory.shm import SharedArray


_HEAD = struct.Struct("<iiqiqBB")
"""A task's head: slot, source, first row (-1: the rows follow by byte offset), rows, epoch, whether checks
follow, length of the seed's bytes."""


def pack_task(slot: int, source: int, first: int, row_ids: bytes, epoch: int, seed: int,
              offsets: bytes | None = None, checks: tuple[bytes, bytes] | None = None) -> bytes:
    """One task as bytes (pure): the head, the seed (any Python int), ``row_ids`` (``int64`` bytes), then for a
    file source ``offsets`` (``int64`` bytes, ``first`` -1) and ``checks`` (``uint64`` digests, ``bool`` flags)."""
    seed_bytes = seed.to_bytes(seed.bit_length() // 8 + 1, "little", signed=True)
    head = _HEAD.pack(slot, source, first, len(row_ids) // 8, epoch, checks is not None, len(seed_bytes))
    if offsets is None:
        return b"".join((head, seed_bytes, row_ids))
    if checks is None:
        return b"".join((head, seed_bytes, row_ids, offsets))
    return b"".join((head, seed_bytes, row_ids, offsets, *checks))


def unpack_task(body) -> tuple:
    """``(slot, source, where, row_ids, epoch, seed, checks)`` of a :func:`pack_task` body (pure; the arrays are
    read-only views of ``body``)."""
    slot, source, first, n, epoch, checked, seed_len = _HEAD.unpack_from(body)
    at = _HEAD.size + seed_len
    seed = int.from_bytes(body[_HEAD.size:at], "little", signed=True)
    row_ids = np.frombuffer(body, np.int64, n, at)
    where, checks = first, None
    if first < 0:
        where = np.frombuffer(body, np.int64, n, at + 8 * n)
        if checked:
            checks = (np.frombuffer(body, np.uint64, n, at + 16 * n), np.frombuffer(body, bool, n, at + 24 * n))
    elif len(body) >= at + 16 * n:  # a shared-memory run of an encoded store's rows: their lengths follow
        checks = np.frombuffer(body, np.int64, n, at + 8 * n)
    return slot, source, where, row_ids, epoch, seed, checks


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

    def check(self, rows: np.ndarray, row_ids: np.ndarray, digests: np.ndarray, checked: np.ndarray) -> None:
        """Raise :class:`ChecksumError` naming the first row whose bytes differ from its digest (where checked)."""
        bad = first_mismatch(rows, digests, checked)
        if bad >= 0:
            row = int(row_ids[bad])
            raise ChecksumError.for_rows(self.path, row, row, "images")


def copy_rows(images: np.ndarray, *, seed, epoch, row_ids, out: np.ndarray) -> None:
    """The identity transform: ``images`` into ``out`` as they are (uint8 as stored).  The pool's transform for
    a stream with workers and no augmentation; :func:`run_task` reads a file source's rows straight into the
    output slot for it instead of through the gather buffer."""
    out[...] = images


class _Worker:
    """What one worker holds between tasks: the transform, the sources, the output slots, a buffer for file rows."""

    def __init__(self, transform, sources, slots: SharedArray, gather: np.ndarray | None):
        self.transform, self.sources, self.slots, self.gather = transform, sources, slots, gather


def setup(transform_bytes: bytes, source_specs, slot_spec, batch_rows: int) -> _Worker:
    """A worker's set-up: the transform, every source attached (or opened), the output slots attached."""
    transform = pickle.loads(transform_bytes)
    sources = [_FileRows(spec) if isinstance(spec, FileSource) else SharedArray.attach(spec).array
               for spec in source_specs]
    file_spec = next((spec for spec in source_specs if isinstance(spec, FileSource)), None)
    gather = None  # rows read from a file land here; shared-memory rows are transformed where they lie
    if file_spec is not None and transform is not copy_rows:  # the plain copy reads into the output slot
        gather = np.empty((batch_rows, *file_spec.shape[1:]), dtype=np.dtype(file_spec.dtype))
    return _Worker(transform, sources, SharedArray.attach(slot_spec), gather)


def run_task(worker: _Worker, body) -> None:
    """One task (see the module doc): the rows, the transform written into the output slot."""
    slot, src, where, row_ids, epoch, seed, checks = unpack_task(body)
    n = len(row_ids)
    source = worker.sources[src]
    out = worker.slots.array[slot, :n]
    if isinstance(source, _FileRows):
        # The plain copy reads the rows where they go: one copy, from the page cache into the slot.
        images = out if worker.transform is copy_rows else worker.gather[:n]
        try:
            source.read(where, images)
            if checks is not None:
                source.check(images, row_ids, *checks)
        except Exception as exc:
            raise TaskFailed("read", exc) from None
    else:
        # One contiguous run the submitter keeps untouched until the result is taken: no copy.
        images = source[where:where + n]
        if checks is not None:  # an encoded store's rows (read/encoded.py): decoded here, the plain copy into out
            from h5stream.augment.decode_crop import crops_while_decoding, decode_augment
            from h5stream.errors import ImageDecodeError
            from h5stream.store.jpeg import decode_slot_rows

            if crops_while_decoding(worker.transform):  # each row decoded at the scale its crop needs
                try:
                    decode_augment(worker.transform, images, checks, row_ids, seed, epoch, out)
                except ImageDecodeError as exc:
                    raise TaskFailed("read", exc) from None
                return
            try:
                images = decode_slot_rows(images, checks, row_ids, out if worker.transform is copy_rows else None)
            except Exception as exc:
                raise TaskFailed("read", exc) from None
    if images is out:
        return
    result = worker.transform(images, seed=seed, epoch=epoch, row_ids=row_ids, out=out)
    if result is not None and result is not out:
        result = np.asarray(result)
        if result.shape != out.shape:
            raise ValueError(f"transform returned shape {result.shape}, the pool expects {out.shape}")
        out[...] = result
