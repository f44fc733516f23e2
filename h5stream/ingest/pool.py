"""Ingest's decode processes: chunks of files in, decoded rows in shared memory out, in submission order.

:class:`DecodePool` is the ingest front end of the process-pool core
(:mod:`h5stream.concurrency.procpool`): ``workers`` spawned processes, each serving
tasks ``(root, relpaths, spec, slot, digest_rows)``: the worker decodes the
files straight into result slot ``slot`` (one shared-memory segment the pool
owns) and answers with the files' skip reasons and the xxh3-64 digest of
every whole group of ``digest_rows`` decoded rows (the store's block
checksum of those pixels, see :mod:`h5stream.store.checksum`: hashed where
the rows are made, not in the one process that writes); pixels are never
pickled or piped (a copy through each process that would cost CPU next to
the decode).  Tasks go
to the worker with the fewest in flight, at most one per free result slot but
one, and results come back in submission order.

The parent waits on the pipes and the workers' process sentinels together (in
the caller's thread), so a worker that dies is noticed at once: the files it
was decoding are decoded alone (:func:`~h5stream.ingest.crashes.find_culprits`);
each one that kills a decoder on its own is skipped with how it died, and a new
worker decodes the rest of those tasks again.  A death no file causes (SIGKILL
from outside, out of memory) is reported as :class:`WorkerError`.  A worker
whose parent dies exits once it is between tasks.  The worker side (set-up and task) is here too:
:mod:`h5stream.ingest.decode` only decodes.
"""

from __future__ import annotations

import errno
import functools
import os
import weakref
from collections import deque

import numpy as np
import xxhash

from h5stream import _deps
from h5stream.concurrency.fork import OwnerOnly
from h5stream.concurrency.procpool import DONE, ERROR, EXITED, FATAL, InOrder, Workers, pick_worker
from h5stream.concurrency.spawn import keep_freed_heap
from h5stream.errors import BudgetError, ResourceLimitError, WorkerError
from h5stream.ingest.spec import FD_LIMIT_ERRNOS

#: Files per decode task: at most this many (fewer towards the end, see :func:`~h5stream.ingest.write.task_sizes`).
#: Tasks of ~64 photos keep each message's cost small next to the work it carries.
MAX_FILES_PER_TASK = 64
#: Result slots never hold fewer rows than this: below it, too little /dev/shm is refused (see DecodePool).
MIN_SLOT_ROWS = 16
#: How long :meth:`DecodePool.close` lets workers exit on their own before killing them.
CLOSE_TIMEOUT_S = 10.0
#: What every decode error ends with: the store keeps what was committed.
_CONTINUE = "committed rows are kept, rerun with --append to continue"


# -- worker side (runs in each decode process: imports numpy, Pillow and OpenCV, never h5py) ------------------------


def _setup(results_spec):
    """A decode worker's set-up: one core's worth of OpenCV, glibc's heap kept between photos, the result slots
    (a :class:`~h5stream.memory.shm.SharedSpec` shaped (slots, rows, H, W, C), owned and unlinked by the parent)."""
    from h5stream.ingest.decode import cv2
    from h5stream.memory.shm import SharedArray

    cv2.setNumThreads(1)  # one decode process = one core
    keep_freed_heap()  # no page faults for the same few hundred KiB image after image
    return SharedArray.attach(results_spec)


def _decode(results, task) -> tuple[list[str | None], list[int]]:
    """One decode task: ``relpaths`` under ``root`` into result slot ``slot``; only the skip reasons and the
    digests of the decoded rows' whole groups of ``digest_rows`` (see :func:`group_digests`) travel back."""
    from h5stream.ingest.decode import decode_each

    root, relpaths, spec, slot, digest_rows = task
    out = results.array[slot]
    if len(relpaths) > out.shape[0] or out.shape[1:] != spec.shape:
        raise ValueError(f"a slot holds {out.shape[0]} rows of {out.shape[1:]}, "
                         f"the task has {len(relpaths)} of {spec.shape}")
    reasons = decode_each(root, relpaths, spec, out)
    if spec.encoding != "raw":  # an encoded store: the encoded rows travel back (a fraction of the pixels)
        return reasons, [], encoded_result(out[:reasons.count(None)], spec)
    return reasons, group_digests(out[:reasons.count(None)], digest_rows)


def encoded_result(images: np.ndarray, spec):
    """What a task of an encoded store (or ``auto``'s probe) sends back instead of the slot's pixels."""
    from h5stream.ingest import encode

    if spec.encoding == encode.ENCODING_PROBE:
        return encode.probe(images, spec.quality)
    return encode.packed(encode.encode_rows(images, spec.quality))


def delivered(images: np.ndarray, result: tuple, spec):
    """The rows a task delivers: the decoded ``images`` (its slot), or what :func:`encoded_result` sent."""
    from h5stream.ingest import encode

    if len(result) < 3:
        return images
    return result[2] if spec.encoding == encode.ENCODING_PROBE else encode.unpacked(result[2])


def group_digests(images: np.ndarray, rows: int) -> list[int]:
    """xxh3-64 of each whole group of ``rows`` rows of C-contiguous uint8 ``images``, from row 0 (none when
    ``rows`` is 0): for a group that is a whole block of the store, its image checksum
    (:func:`h5stream.store.checksum.digest` of the same bytes).  Pure."""
    if rows <= 0:
        return []
    return [xxhash.xxh3_64_intdigest(images[i:i + rows]) for i in range(0, len(images) - len(images) % rows, rows)]


# -- parent side ------------------------------------------------------------------------------------------------------


class _Run:
    """One :meth:`DecodePool.imap`'s tasks in flight and the files a decoder died on (see ``_recover``)."""

    def __init__(self, root: str, spec, digest_rows: int):
        self.root, self.spec, self.digest_rows = root, spec, digest_rows
        self.tasks: dict[int, tuple[int, list[str], int]] = {}  # seq -> (worker, files, slot)
        self.crashed: dict[str, str] = {}  # relpath -> why the decoder died on it

    def result(self, seq: int, result: tuple) -> tuple:
        """Task ``seq``'s ``result`` as the caller gets it: a task sent again without the files a decoder died
        on gets their reasons back in their places (the rows it decoded are the others, in order)."""
        chunk = self.tasks.pop(seq)[1]
        if not self.crashed or not any(rel in self.crashed for rel in chunk):
            return result
        got = iter(result[0])
        reasons = [self.crashed[rel] if rel in self.crashed else next(got) for rel in chunk]
        return (reasons, *result[1:])



class _State:
    """The workers and slots of a pool; kept apart from it so ``weakref.finalize`` can stop them."""

    def __init__(self):
        self.workers = Workers("decode worker")
        self.slots = None


def _stop(state: _State, timeout_s: float) -> None:
    """Stop every worker (waiting up to ``timeout_s``, then killing), unlink the slots.  Idempotent."""
    state.workers.stop(timeout_s)
    if state.slots is not None:
        slots, state.slots = state.slots, None
        slots.close()  # unlinks; a view the caller kept stays readable


class DecodePool:
    """``workers`` spawned decode processes (0: decode in the calling thread), their pipes and the shared-memory
    result slots.

    Start it early (:meth:`start`) so the workers boot while the caller
    validates and creates the store; :meth:`imap` yields ``(images, reasons,
    digests)`` per chunk in submission order with one chunk in flight per result slot but
    one.  The images yielded are a view of the slot, valid until the next item
    is asked for: copy what you keep.  :meth:`finish` lets the workers exit
    once every result is in; :meth:`close` is idempotent, stops the workers and
    unlinks the slots (also run at garbage collection).

    Threads: one, the caller's (ingest's main thread), runs every method; it
    also reads the workers' messages while it waits for a result.
    """

    #: How long a worker may answer nothing before the pool gives up on it.
    DEFAULT_TIMEOUT_S = 600.0

    def __init__(self, workers: int, row_shape: tuple[int, ...], rows_per_task: int = MAX_FILES_PER_TASK,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        from h5stream.memory.shm import sweep_stale_segments

        if workers > 0:
            _deps.cv2_present()  # the workers import it; this process never does
        sweep_stale_segments()  # every ingest builds a pool first: clear what killed process groups left in /dev/shm
        self.workers = workers
        self.timeout_s = timeout_s
        self.rows_per_task = rows_per_task  # the most files one task may carry (fewer where /dev/shm is short)
        self._state = _State()
        # Not in a forked child: the workers, their pipes and the slots are this process's.
        self._finalizer = weakref.finalize(self, OwnerOnly(functools.partial(_stop, self._state, CLOSE_TIMEOUT_S)))
        self._finished = False
        self._started = False
        self._run: _Run | None = None
        if workers > 0:
            from h5stream.memory.shm import SharedArray, new_prefix, segment_limit_bytes, shm_free_bytes

            row_bytes = int(np.prod(row_shape, dtype=np.int64))
            max_segment = segment_limit_bytes()
            n_slots, rows = decode_layout(workers, row_bytes, shm_free_bytes(), rows_per_task,
                                          max_segment=max_segment)
            if n_slots >= workers + 1:
                try:
                    self._state.slots = SharedArray.create((n_slots, rows, *row_shape), np.uint8,
                                                           new_prefix() + "decode_")
                    self.rows_per_task = rows
                except BudgetError:
                    pass  # /dev/shm filled up since it was measured: the same advice as below
            if self._state.slots is None:  # `rows`: the slot size decode_layout settled on (its floor when short)
                need = (workers + 1) * rows * row_bytes * 2
                if max_segment is not None and need // 2 > max_segment:
                    raise ResourceLimitError(
                        f"--workers {workers} needs a shared-memory segment of {need / 2 / 2**20:.1f} MiB for "
                        f"decoded rows ({workers + 1} slots of {rows} rows), over this process's file size limit "
                        f"(ulimit -f: {max_segment / 2**20:.1f} MiB), which binds /dev/shm too; raise it "
                        "(ulimit -f unlimited), pass fewer --workers, or --workers 0 (decode in this process)",
                        errno=errno.EFBIG)
                raise BudgetError(
                    f"--workers {workers} needs at least {need / 2**20:.0f} MiB of shared memory free in /dev/shm "
                    f"for decoded rows ({workers + 1} slots of {rows} rows, using at most half of it); pass "
                    "fewer --workers, --workers 0 (decode in this process), or free /dev/shm (Docker: --shm-size)"
                )

    def start(self) -> None:
        """Boot every worker now, without waiting for them (idempotent; caller's thread).  They start with
        SIGINT ignored and run package code only: the caller's main script (which may import tensorflow) is
        not re-run in them."""
        state = self._state
        if self.workers == 0 or self._started or self._finished or state.slots is None:
            return
        self._started = True
        state.workers.start(_setup, _decode, "decode", [(state.slots.spec,)] * self.workers,
                            name="h5stream-decode")

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers (for monitoring and tests)."""
        return self._state.workers.pids

    def imap(self, root: str, chunks, spec, digest_rows: int = 0, hold: int = 0):
        """Decode ``chunks`` (lists of paths relative to ``root``; any iterable, read one chunk at a time as a
        slot frees, so a generator may size the next chunk from what was yielded so far) with ``spec``; yield
        ``(images, reasons, digests)`` per chunk in order, ``images`` holding the files whose reason is None,
        ``digests`` :func:`group_digests` of them (by ``digest_rows``).  ``images`` stays unchanged until the
        caller asks for the ``hold + 1``-th chunk after it (with ``hold`` 0: the next one).  Raises
        :class:`WorkerError` when a worker dies, raises in a task, or answers nothing for ``timeout_s``; OSError
        for a process limit (too many open files).  Caller's thread."""
        if self.workers == 0:
            from h5stream.ingest.decode import decode_task

            for chunk in chunks:
                images, reasons = decode_task(root, chunk, spec)
                if spec.encoding != "raw":
                    yield delivered(images, (reasons, [], encoded_result(images, spec)), spec), reasons, []
                    continue
                yield images, reasons, group_digests(images, digest_rows)
            return
        self.start()
        workers = self._state.workers
        slots = self._state.slots.array
        free = list(range(slots.shape[0]))[::-1]
        held: deque[int] = deque()  # the slots of the chunks yielded last, the caller's until it asks further
        order = InOrder()
        in_flight = [0] * self.workers
        slot_of: dict[int, int] = {}
        # Each task in flight: (worker, files, slot), so the files a dead worker was decoding are known.
        self._run = _Run(root, spec, digest_rows)
        tasks = self._run.tasks
        it = iter(chunks)

        def submit() -> bool:
            chunk = next(it, None)
            if chunk is None:
                return False
            slot = free.pop()
            w = pick_worker(in_flight, range(self.workers), len(slots))
            seq = order.submitted()
            while not workers.send(w, seq, (root, chunk, spec, slot, digest_rows)):
                # Its pipe is gone: its end is on the way, and raises, or a new worker takes its place.
                self._receive(order, in_flight, slot_of)
            in_flight[w] += 1
            slot_of[seq] = slot
            tasks[seq] = (w, chunk, slot)
            return True

        # Tasks in flight: every slot but the ones for the results being written out (hold + 1), and never none
        # while a slot is free.
        target = max(1, len(slots) - 1 - hold)

        def top_up() -> None:
            while free and order.next_submit - order.next_deliver < target and submit():
                pass

        top_up()
        while order.next_deliver < order.next_submit:
            while not order.ready():
                self._receive(order, in_flight, slot_of)
            seq, result = order.pop()
            reasons, digests = result[0], result[1]
            slot = slot_of.pop(seq)
            yield delivered(slots[slot, :reasons.count(None)], result, spec), reasons, digests
            held.append(slot)  # the caller has asked for the next item: done with the slot held longest
            if len(held) > hold:
                free.append(held.popleft())
            top_up()

    def _receive(self, order: InOrder, in_flight: list[int], slot_of: dict[int, int]) -> None:
        """Wait for the workers' next messages and file them; raise if a worker died, failed or went quiet."""
        workers = self._state.workers
        events = workers.wait(self.timeout_s)
        if not events:
            raise WorkerError(f"a decode worker produced nothing for {self.timeout_s:.0f} s; rerun with --append")
        for w, msg in events:
            kind = msg[0]
            if kind == DONE:
                order.finish(msg[1], self._run.result(msg[1], msg[2]))
                in_flight[w] -= 1
            elif kind in (ERROR, FATAL):
                fail = msg[-1]
                if fail.errno in FD_LIMIT_ERRNOS:
                    raise OSError(fail.errno, os.strerror(fail.errno))  # the caller names the limit
                what = "failed to start" if kind == FATAL else "failed"
                raise WorkerError(f"a decode worker {what}: {fail.summary}; {_CONTINUE}")
            elif kind == EXITED:
                self._recover(w, order)

    def _recover(self, w: int, order: InOrder) -> None:
        """Worker ``w`` ended: find the files it was decoding that kill a decoder on their own
        (:func:`~h5stream.ingest.crashes.find_culprits`), then put a new worker in its place and give it those
        tasks again without them (their results list them as skipped, with how the decoder died).  Raises
        :class:`WorkerError` when it died starting, with no task, or on none of its files alone (not a file's
        doing: out of memory, killed from outside)."""
        from h5stream.ingest.crashes import find_culprits

        workers, run = self._state.workers, self._run
        mine = sorted(seq for seq, (owner, _, _) in run.tasks.items() if owner == w)
        death = f"{workers.death(w, oom_fix='pass fewer --workers')}; {_CONTINUE}"
        if w not in workers.started or not mine or self._finished:
            raise WorkerError(death)
        files = [rel for seq in mine for rel in run.tasks[seq][1] if rel not in run.crashed]
        culprits = find_culprits(run.root, files, run.spec, self.timeout_s)
        if not culprits:
            raise WorkerError(death)
        run.crashed.update(culprits)
        workers.replace(w, _setup, _decode, "decode", (self._state.slots.spec,), name="h5stream-decode")
        for seq in mine:
            _, chunk, slot = run.tasks[seq]
            kept = [rel for rel in chunk if rel not in run.crashed]
            if not kept:  # nothing left to decode: its result is its skip reasons
                order.finish(seq, run.result(seq, ([], [])))
                continue
            if not workers.send(w, seq, (run.root, kept, run.spec, slot, run.digest_rows)):
                raise WorkerError(death)  # the new worker is gone already

    def finish(self) -> None:
        """Let the workers exit without waiting for them, once every result is in: the caller's last writes
        overlap their interpreter shutdown, and :meth:`close` joins them.  Caller's thread."""
        if self.workers and not self._finished:
            self._finished = True
            self._state.workers.tell_stop()

    def close(self) -> None:
        """Stop the workers and unlink the slots.  Idempotent; caller's thread (or the garbage collector)."""
        self._finished = True
        self._finalizer()


def decode_slots(workers: int, slot_bytes: int, shm_free: int | None, max_segment: int | None = None) -> int:
    """Result slots for ``workers`` decode processes (pure): ``4 * workers + 1`` (four tasks in flight per
    worker, one being written out), fewer where that would take more than half of ``shm_free`` (bytes free
    in /dev/shm, None when unknown; Docker's default is 64 MiB) or more than ``max_segment`` (the largest
    segment the process may create, its file size limit; None: unlimited), and never fewer than
    ``workers + 1``: below that the workers would wait on the writer, and the caller should refuse."""
    wanted = 4 * workers + 1
    if slot_bytes <= 0:
        return wanted
    room = [b for b in (None if shm_free is None else shm_free // 2, max_segment) if b is not None]
    return min([wanted] + [max(0, b // slot_bytes) for b in room])


def decode_layout(workers: int, row_bytes: int, shm_free: int | None, max_rows: int = MAX_FILES_PER_TASK,
                  min_rows: int = MIN_SLOT_ROWS, max_segment: int | None = None) -> tuple[int, int]:
    """(result slots, rows per slot) for ``workers`` decode processes (pure): slots of ``max_rows`` rows,
    halved while :func:`decode_slots` (given ``shm_free`` and ``max_segment``) cannot give every worker a
    slot and two more (the writer's: the one it takes and the one the disk is writing), but not below
    ``min_rows`` (nor ``max_rows`` when that is smaller); slots < ``workers + 1`` means refuse (with
    ``workers + 1``, one worker waits at a time)."""
    rows = max(1, max_rows)
    floor = min(rows, max(1, min_rows))
    while True:
        slots = decode_slots(workers, rows * row_bytes, shm_free, max_segment)
        if slots >= workers + 2 or rows <= floor:
            return slots, rows
        rows = max(floor, rows // 2)
