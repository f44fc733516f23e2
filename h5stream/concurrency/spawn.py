"""Spawned worker processes that talk to their parent over pipes, started lean: without re-running the
parent's main script, one working thread each (ingest and augment; another only waits for the parent's end);
glibc's heap kept between images in decode workers.

:func:`spawn_workers` is the start-up of the process-pool core
(:mod:`h5stream.concurrency.procpool`) that both worker pools stand on: one ``spawn``
process and one duplex pipe per worker, SIGINT blocked while they start and
ignored in them from birth (the parent alone handles Ctrl-C and stops them).
Pipes rather than ``multiprocessing`` queues: a queue's named POSIX semaphores
(``/dev/shm/sem.mp-*``) outlive a process group killed by SIGKILL, a pipe
leaves nothing behind.  :func:`worker_signals` is the matching first line of
a worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import select
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Sequence

from h5stream.concurrency.fork import disown_in_forks, release_in_forks

#: Thread-pool sizes a spawned worker inherits through its environment unless the user set them.
#: A worker is one core's worth of work; numpy's OpenBLAS otherwise starts a thread per core at import,
#: threads that only compete.
SINGLE_THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@contextlib.contextmanager
def main_module_hidden(hide: bool = True):
    """While starting workers, hide ``__main__`` from spawn's preparation data and pin their thread pools.

    spawn re-runs the parent's main script in every child so that objects
    defined there can be unpickled.  A training script that imports
    tensorflow at top level would then load it in every worker, for nothing
    when the transform does not live in ``__main__`` (``hide`` is computed
    from its pickle).  The stub is in place only for
    the few milliseconds of ``Process.start()``, and so are the
    :data:`SINGLE_THREAD_ENV` variables the child inherits (those the user
    set are left alone).  Used by the augment pool and by ingest's decode
    pool, whose workers only ever need package code.
    """
    added = {k: v for k, v in SINGLE_THREAD_ENV.items() if k not in os.environ}
    os.environ.update(added)
    real_main = sys.modules["__main__"]
    if hide:
        sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = real_main
        for k in added:
            os.environ.pop(k, None)


#: glibc's ``mallopt`` parameters (``<malloc.h>``).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: What :func:`keep_freed_heap` pins: glibc's own ceiling for its dynamic mmap threshold (32 MiB on 64-bit)
#: and twice that for trimming, the pair glibc itself would reach after freeing one large block.
HEAP_MMAP_THRESHOLD_BYTES = 32 << 20
HEAP_TRIM_THRESHOLD_BYTES = 64 << 20


def keep_freed_heap() -> bool:
    """Stop glibc from handing freed heap back to the kernel after every image (decode workers).

    Decoding one photo allocates a few hundred KiB and frees it again.  With
    glibc's default, dynamic thresholds (128 KiB to map, 256 KiB to trim, raised
    only when a mapped block is freed), a fresh decode worker trims its heap
    after every photo and faults the same pages back in for the next, in
    kernel time the decode pays per image.  Pinning the thresholds where glibc's
    dynamic rule tops out keeps up to :data:`HEAP_TRIM_THRESHOLD_BYTES` of
    freed heap for reuse; blocks of :data:`HEAP_MMAP_THRESHOLD_BYTES` or more
    are still mapped and unmapped on their own.  Returns False where there is
    no glibc ``mallopt`` (musl, macOS), which changes nothing.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this interpreter runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD_BYTES))


def spawn_workers(target: Callable, args: Sequence[tuple], *, name: str, hide_main: bool = True,
                  daemon: bool = True) -> tuple[list, list]:
    """Start one spawned process per entry of ``args``, running ``target(conn, *args[i])``.

    Returns ``(processes, connections)``: the parent's end of each worker's
    duplex pipe (the child's end is closed here, so a dead worker reads as EOF).
    Children inherit the signal mask: SIGINT is blocked while they start, so a
    Ctrl-C cannot kill one before :func:`worker_signals` makes it ignore the
    signal, and a Ctrl-C meant for this process stays pending until the mask is
    restored, then raises here as usual.  ``hide_main``: see
    :func:`main_module_hidden`.  If a start fails, the workers already started
    are killed and the error propagates.  ``daemon`` (default): multiprocessing
    terminates the process at this interpreter's exit, and forbids it children
    of its own; a process that starts workers (the feeder) is started with
    ``daemon=False`` and must be stopped by its owner before exit.  A process
    forked from this one leaves them alone (:func:`h5stream.concurrency.fork.disown_in_forks`).
    """
    ctx = mp.get_context("spawn")
    procs, conns, child_conns = [], [], []
    for i, extra in enumerate(args):
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        conns.append(parent_conn)
        child_conns.append(child_conn)
        procs.append(ctx.Process(target=target, args=(child_conn, *extra), name=f"{name}-{i}", daemon=daemon))
    blocking = hasattr(signal, "pthread_sigmask")
    if blocking:  # multiprocessing's resource tracker first: its own start unblocks SIGINT, undoing the mask below
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if blocking else None
    try:
        try:
            with main_module_hidden(hide_main):
                for proc in procs:
                    proc.start()
                    disown_in_forks((proc,))
        finally:
            if blocking:  # a Ctrl-C held back meanwhile raises here: still inside the try that cleans up
                signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    except BaseException:  # a failed start, or a signal handler's exception (SIGTERM's, SIGALRM's) at any line
        for proc in procs:
            if proc.pid is not None:  # started, whether or not the line after start() ran
                proc.kill()
                proc.join()
        for conn in conns + child_conns:
            conn.close()
        raise
    for conn in child_conns:
        conn.close()
    release_in_forks(conns)
    return procs, conns


def worker_signals() -> None:
    """First thing in a worker: ignore SIGINT (the parent governs shutdown), then unblock it, so a Ctrl-C that
    arrived while the interpreter started (pending, being blocked by :func:`spawn_workers`) is discarded."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def exit_with_parent(sentinel, exitcode: int = 1) -> threading.Thread:
    """In a worker: a daemon thread that ends this process (``os._exit``) as soon as ``sentinel`` (the parent's
    process sentinel) says the parent is gone, even in the middle of a task.  A worker's loop notices its
    parent's end only between tasks, so a worker inside a transform that never returns (a hang, an endless loop,
    a deadlocked library) outlived a parent killed by SIGKILL, holding its shared memory mapped.  Safe: a
    worker owns nothing that outlives it (the parent owns the segments, it only maps them).  The thread needs
    the GIL for a moment, which every wait and nearly every C call lets go.  Returns the thread."""

    def watch() -> None:
        try:
            select.select([sentinel], [], [])
        except (OSError, ValueError):  # pragma: no cover - the descriptor was closed: this process is ending
            return
        os._exit(exitcode)

    thread = threading.Thread(target=watch, name="h5stream-parent-watch", daemon=True)
    thread.start()
    return thread


def reap_workers(procs: Sequence, timeout_s: float) -> None:
    """Wait up to ``timeout_s`` in all for ``procs`` to exit, then terminate, then kill what is left.

    Call after telling the workers to stop; every process has exited when it returns (a worker stuck in
    a C call ignores SIGTERM, never SIGKILL).
    """
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        for stop in (proc.terminate, proc.kill):
            if proc.exitcode is None:
                stop()
                proc.join(1.0)


def refuse_in_a_starting_worker() -> None:
    """Raise :class:`ConfigError` if this process is a spawned worker re-running its parent's script.

    With ``workers > 0`` and an ``Augment`` that refers to a function of the
    training script itself (``preprocessing_function`` defined there), each
    worker must re-run the script's top-level code, as ``__mp_main__``, to find
    that function (spawn's rule; h5stream's workers skip the script otherwise,
    see this module).  A script without the ``__main__`` guard would
    then open the stream again in every worker, and start workers of its own;
    ``multiprocessing`` marks that phase with ``_inheriting``.
    """
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):
        from h5stream.errors import ConfigError

        raise ConfigError(
            "h5stream.open ran while an augment worker was starting: a worker re-runs the training script's "
            "top-level code to find a function defined in it (the Augment's preprocessing_function); put the "
            "script's code under `if __name__ == \"__main__\":`, or define the function in a module of its own"
        )
