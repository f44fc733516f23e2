"""Ingest's decode processes: chunks of files in, decoded rows in shared memory out, in submission order.

:class:`DecodePool` runs ``workers`` spawned processes (started by
:func:`h5stream._spawn.spawn_workers`), each with one duplex pipe.  A task is
``(seq, root, relpaths, spec, slot)``: the worker decodes the files straight
into result slot ``slot`` (one shared-memory segment the pool owns) and answers
``("done", seq, reasons)``; pixels are never pickled or piped (a copy through
each process that would cost CPU next to the decode).  Tasks go to the worker with the fewest in flight, at most one per
free result slot but one, and results come back in submission order.

Nothing here uses a ``multiprocessing`` queue or lock, so a process group
killed by SIGKILL leaves no named semaphore behind; a worker whose parent dies
exits at once (:func:`~h5stream.ingest.decode.init_worker`).  The parent waits
on the pipes and the workers' process sentinels together, so a worker that
dies (SIGKILL, out of memory) is reported at once as :class:`WorkerError`.
"""

from __future__ import annotations

import multiprocessing.connection
import traceback
import weakref
from collections import deque

import numpy as np

from h5stream._spawn import reap_workers, spawn_workers, worker_signals
from h5stream.errors import BudgetError, WorkerError
from h5stream.ingest.decode import FD_LIMIT_ERRNOS

#: Files per decode task: at most this many (fewer towards the end, see :func:`~h5stream.ingest.pack.task_sizes`).
#: Tasks of ~64 photos keep each message's cost small next to the work it carries.
MAX_FILES_PER_TASK = 64
#: Result slots never hold fewer rows than this: below it, too little /dev/shm is refused (see DecodePool).
MIN_SLOT_ROWS = 16
#: How long :meth:`DecodePool.close` lets workers exit on their own before killing them.
CLOSE_TIMEOUT_S = 10.0


# -- worker side ------------------------------------------------------------------------


def _decode_worker(conn, results_spec) -> None:
    """Entry point of a decode process: serve tasks until told to stop or the parent goes away."""
    worker_signals()
    from h5stream.ingest.decode import decode_into_slot, init_worker

    try:
        init_worker(results_spec)
    except OSError as exc:
        conn.send(_os_failure("fatal", None, exc))
        return
    except BaseException:
        conn.send(("fatal", None, traceback.format_exc()))
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # the parent went away
        if msg is None:
            return
        seq, root, relpaths, spec, slot = msg
        try:
            reasons = decode_into_slot(root, relpaths, spec, slot)
        except OSError as exc:  # decode_file skips what is the file's fault: this is the process's
            reply = _os_failure("error", seq, exc)
        except Exception:
            reply = ("error", seq, traceback.format_exc())
        else:
            reply = ("done", seq, reasons)
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return


def _os_failure(kind: str, seq, exc: OSError) -> tuple:
    """A worker's reply for an OSError: its errno travels, so the parent can name a process limit."""
    return ("oserror", seq, (exc.errno, exc.strerror or str(exc), kind))


# -- parent side ------------------------------------------------------------------------


def _worker_died(how: str = "") -> WorkerError:
    return WorkerError(
        f"a decode worker died{how} (killed, out of memory?); committed rows are kept, rerun with --append to continue"
    )


class _State:
    """The processes, pipes and slots of a pool; kept apart from it so ``weakref.finalize`` can stop them."""

    def __init__(self):
        self.procs: list = []
        self.conns: list = []
        self.slots = None


def _stop(state: _State, timeout_s: float) -> None:
    """Tell every worker to stop, wait up to ``timeout_s`` for them, kill the rest, unlink the slots.  Idempotent."""
    for conn in state.conns:
        try:
            conn.send(None)
        except (OSError, ValueError):
            pass  # dead, or its pipe already closed
    reap_workers(state.procs, timeout_s)
    for conn in state.conns:
        conn.close()
    state.procs, state.conns = [], []
    if state.slots is not None:
        slots, state.slots = state.slots, None
        slots.close()  # unlinks; a view the caller kept stays readable


class DecodePool:
    """``workers`` spawned decode processes (0: decode in the calling thread), their pipes and the shared-memory
    result slots.

    Start it early (:meth:`start`) so the workers boot while the caller
    validates and creates the store; :meth:`imap` yields ``(images, reasons)``
    per chunk in submission order with one chunk in flight per result slot but
    one.  The images yielded are a view of the slot, valid until the next item
    is asked for: copy what you keep.  :meth:`finish` lets the workers exit
    once every result is in; :meth:`close` is idempotent, stops the workers and
    unlinks the slots (also run at garbage collection).  Used from one thread.
    """

    def __init__(self, workers: int, row_shape: tuple[int, ...], rows_per_task: int = MAX_FILES_PER_TASK,
                 timeout_s: float = 600.0):
        from h5stream.shm import sweep_stale_segments

        sweep_stale_segments()  # every ingest builds a pool first: clear what killed process groups left in /dev/shm
        self.workers = workers
        self.timeout_s = timeout_s
        self.rows_per_task = rows_per_task  # the most files one task may carry (fewer where /dev/shm is short)
        self._state = _State()
        self._finalizer = weakref.finalize(self, _stop, self._state, CLOSE_TIMEOUT_S)
        self._in_flight: deque = deque()  # (seq, slot) per chunk submitted and not yet yielded, oldest first
        self._finished = False
        if workers > 0:
            from h5stream.shm import SharedArray, new_prefix, shm_free_bytes

            row_bytes = int(np.prod(row_shape, dtype=np.int64))
            n_slots, rows = decode_layout(workers, row_bytes, shm_free_bytes(), rows_per_task)
            if n_slots >= workers + 1:
                try:
                    self._state.slots = SharedArray.create((n_slots, rows, *row_shape), np.uint8,
                                                           new_prefix() + "decode_")
                    self.rows_per_task = rows
                except BudgetError:
                    pass  # /dev/shm filled up since it was measured: the same advice as below
            if self._state.slots is None:  # `rows`: the slot size decode_layout settled on (its floor when short)
                need = (workers + 1) * rows * row_bytes * 2
                raise BudgetError(
                    f"--workers {workers} needs at least {need / 2**20:.0f} MiB of shared memory free in /dev/shm "
                    f"for decoded rows ({workers + 1} slots of {rows} rows, using at most half of it); pass "
                    "fewer --workers, --workers 0 (decode in this process), or free /dev/shm (Docker: --shm-size)"
                )

    def start(self) -> None:
        """Boot every worker now (idempotent).  They start with SIGINT ignored and run package code only:
        the caller's main script (which may import tensorflow) is not re-run in them."""
        state = self._state
        if self.workers == 0 or state.procs or self._finished or state.slots is None:
            return
        state.procs, state.conns = spawn_workers(
            _decode_worker, [(state.slots.spec,)] * self.workers, name="h5stream-decode")

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers (for monitoring and tests)."""
        return [p.pid for p in self._state.procs]

    def imap(self, root: str, chunks: list[list[str]], spec):
        """Decode ``chunks`` (lists of paths relative to ``root``) with ``spec``; yield ``(images, reasons)`` per
        chunk in order, ``images`` holding the files whose reason is None.  Raises :class:`WorkerError` when a
        worker dies, raises in a task, or answers nothing for ``timeout_s``."""
        if self.workers == 0:
            from h5stream.ingest.decode import decode_task

            for chunk in chunks:
                yield decode_task(root, chunk, spec)
            return
        self.start()
        state = self._state
        slots = state.slots.array
        free = deque(range(slots.shape[0]))
        pending = self._in_flight = deque()
        per_worker = [0] * self.workers
        task_worker: dict[int, int] = {}
        results: dict[int, list] = {}
        it = enumerate(chunks)

        def submit() -> bool:
            item = next(it, None)
            if item is None:
                return False
            seq, chunk = item
            slot = free.popleft()
            w = min(range(self.workers), key=per_worker.__getitem__)
            try:
                state.conns[w].send((seq, root, chunk, spec, slot))
            except (OSError, ValueError):
                raise _worker_died() from None
            per_worker[w] += 1
            task_worker[seq] = w
            pending.append((seq, slot))
            return True

        while len(free) > 1 and submit():  # the last free slot is for the result being written out
            pass
        while pending:
            seq, slot = pending[0]
            while seq not in results:
                self._receive(results, per_worker, task_worker)
            pending.popleft()
            reasons = results.pop(seq)
            yield slots[slot, :reasons.count(None)], reasons
            free.append(slot)  # the caller has asked for the next item: done with this slot
            submit()

    def _receive(self, results: dict, per_worker: list[int], task_worker: dict[int, int]) -> None:
        """Wait for the next message from any worker and file it; raise if a worker died or went quiet."""
        state = self._state
        sentinels = {p.sentinel: w for w, p in enumerate(state.procs)}
        ready = multiprocessing.connection.wait([*state.conns, *sentinels], timeout=self.timeout_s)
        if not ready:
            raise WorkerError(f"a decode worker produced nothing for {self.timeout_s:.0f} s; rerun with --append")
        for conn in [r for r in ready if r in state.conns]:  # messages first: a worker may answer, then exit
            try:
                kind, seq, payload = conn.recv()
            except (EOFError, OSError):
                continue  # its sentinel tells how it ended
            if kind == "done":
                results[seq] = payload
                per_worker[task_worker.pop(seq)] -= 1
            elif kind == "oserror":
                code, reason, stage = payload
                if code in FD_LIMIT_ERRNOS:
                    raise OSError(code, reason)  # the caller names the limit
                what = "failed to start" if stage == "fatal" else "failed"
                raise WorkerError(f"a decode worker {what}: {reason}; committed rows are kept, rerun with --append")
            else:
                last = payload.strip().splitlines()[-1]
                what = "failed to start" if kind == "fatal" else "failed"
                raise WorkerError(f"a decode worker {what}: {last}; committed rows are kept, rerun with --append")
        for fd in [r for r in ready if r in sentinels]:
            proc = state.procs[sentinels[fd]]
            proc.join(0)
            code = proc.exitcode
            raise _worker_died(f" (exit code {code})" if code is not None and code >= 0 else
                               f" (signal {-code})" if code is not None else "")

    def finish(self) -> None:
        """Let the workers exit without waiting for them, once every result is in: the caller's last writes
        overlap their interpreter shutdown, and :meth:`close` joins them."""
        if self.workers and not self._finished:
            self._finished = True
            for conn in self._state.conns:
                try:
                    conn.send(None)
                except (OSError, ValueError):
                    pass

    def close(self) -> None:
        """Stop the workers and unlink the slots.  Idempotent."""
        self._finished = True
        self._finalizer()


def decode_slots(workers: int, slot_bytes: int, shm_free: int | None) -> int:
    """Result slots for ``workers`` decode processes (pure): ``4 * workers + 1`` (four tasks in flight per
    worker, one being written out), fewer where that would take more than half of ``shm_free`` (bytes free
    in /dev/shm, None when unknown; Docker's default is 64 MiB), and never fewer than ``workers + 1``: below
    that the workers would wait on the writer, and the caller should refuse."""
    wanted = 4 * workers + 1
    if shm_free is None or slot_bytes <= 0:
        return wanted
    return min(wanted, max(0, shm_free // 2 // slot_bytes))


def decode_layout(workers: int, row_bytes: int, shm_free: int | None, max_rows: int = MAX_FILES_PER_TASK,
                  min_rows: int = MIN_SLOT_ROWS) -> tuple[int, int]:
    """(result slots, rows per slot) for ``workers`` decode processes (pure): slots of ``max_rows`` rows,
    halved while :func:`decode_slots` cannot give every worker a slot and one more, but not below
    ``min_rows`` (nor ``max_rows`` when that is smaller); slots < ``workers + 1`` means refuse."""
    rows = max(1, max_rows)
    floor = min(rows, max(1, min_rows))
    while True:
        slots = decode_slots(workers, rows * row_bytes, shm_free)
        if slots >= workers + 1 or rows <= floor:
            return slots, rows
        rows = max(floor, rows // 2)
