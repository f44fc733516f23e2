"""Lifecycle of the worker pool: close, GC, dead workers, Ctrl-C, a killed parent.

Processes are real; waiting for a process to end uses pidfds (no sleeps), and
timeouts are safety nets only, never the assertion.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from h5stream.augment.pool import WorkerPool
from h5stream.memory.shm import SharedArray, new_prefix, segment_names
from h5stream.errors import StreamClosedError, WorkerError
from conftest import collect

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds")

MY_SEGMENTS = f"h5s_{os.getpid()}_"  # other sessions on this machine create h5s_* too
PLAIN, HANG, EXIT3, SAY_AND_HANG = 0, 1, 2, 3  # seed values selecting Behave's behaviour


pytestmark = pytest.mark.usefixtures("no_leaks")


def still_running(pids, timeout_s=60.0):
    """The pids that have not exited within timeout_s (a safety net), waiting on pidfds."""
    deadline = time.monotonic() + timeout_s
    running = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                running.append(pid)
        finally:
            os.close(fd)
    return running


class Behave:
    """Picklable transform: PLAIN copies, HANG never returns, EXIT3 ends the worker with code 3, SAY_AND_HANG
    prints ``hanging PID`` on stdout, then never returns."""

    def __call__(self, images, *, seed, epoch, row_ids, out=None):
        if seed == SAY_AND_HANG:
            print("hanging", os.getpid(), flush=True)
            seed = HANG
        if seed == HANG:
            while True:
                signal.pause()
        if seed == EXIT3:
            os._exit(3)
        out[...] = images


@pytest.fixture
def source():
    with SharedArray.create((16, 4, 4, 3), np.uint8, new_prefix()) as src:
        src.array[:] = np.arange(src.array.size, dtype=np.int64).reshape(src.array.shape) % 251
        yield src


def _new_segments(before):
    return set(segment_names(MY_SEGMENTS)) - before


def test_close_twice_context_manager_and_use_after_close(source):
    before = set(segment_names(MY_SEGMENTS))
    with WorkerPool(Behave(), [source.spec], workers=1, batch_rows=4, n_slots=2) as pool:
        assert len(_new_segments(before)) == 1
        pool.submit(0, [0, 1], [0, 1], epoch=0, seed=PLAIN, timeout_s=60, in_place=True)
        batch = pool.get(60)
        kept = pool.slot_view(batch.slot)[: batch.rows]
        pids = pool.pids
    assert pool.closed and still_running(pids) == [] and _new_segments(before) == set()
    pool.close()
    pool.close()
    assert np.array_equal(kept, source.array[:2])  # a view taken before close stays readable
    with pytest.raises(StreamClosedError):
        pool.submit(0, [0], [0], epoch=0, seed=PLAIN, timeout_s=1, in_place=True)
    with pytest.raises(StreamClosedError):
        pool.get(1)
    with pytest.raises(StreamClosedError):
        pool.slot_view(0)


def test_close_wakes_a_producer_blocked_in_submit(source):
    pool = WorkerPool(Behave(), [source.spec], workers=1, batch_rows=4, n_slots=1)
    pool.submit(0, [0], [0], epoch=0, seed=PLAIN, timeout_s=60, in_place=True)
    pool.get(60)  # hold the only slot, so the next submit must wait
    outcome = []

    def producer():
        try:
            pool.submit(0, [1], [1], epoch=0, seed=PLAIN, timeout_s=600, in_place=True)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=producer)
    thread.start()
    pool.close()
    thread.join(60)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], StreamClosedError)


def test_garbage_collection_of_an_unclosed_pool_cleans_up(source):
    before = set(segment_names(MY_SEGMENTS))
    pool = WorkerPool(Behave(), [source.spec], workers=1, batch_rows=4, n_slots=2)
    pool.submit(0, [0], [0], epoch=0, seed=PLAIN, timeout_s=60, in_place=True)  # leave a batch undelivered
    pids = pool.pids
    assert len(_new_segments(before)) == 1
    del pool
    collect(lambda: still_running(pids) == [])
    assert still_running(pids) == []
    assert _new_segments(before) == set()


def test_worker_killed_by_sigkill_mid_task_raises_worker_error(source):
    with WorkerPool(Behave(), [source.spec], workers=1, batch_rows=4, n_slots=2) as pool:
        pool.submit(0, [0, 1], [0, 1], epoch=0, seed=HANG, timeout_s=60, in_place=True)
        os.kill(pool.pids[0], signal.SIGKILL)
        with pytest.raises(WorkerError, match=r"worker 0 \(pid \d+\) was killed by SIGKILL"):
            pool.get(60)  # 60 s is only a safety net: the collector sees the sentinel at once
        with pytest.raises(WorkerError, match="SIGKILL"):
            pool.submit(0, [0], [0], epoch=0, seed=PLAIN, timeout_s=60, in_place=True)


def test_worker_exiting_raises_worker_error_with_exit_code(source):
    with WorkerPool(Behave(), [source.spec], workers=1, batch_rows=4, n_slots=2) as pool:
        pool.submit(0, [0], [0], epoch=0, seed=EXIT3, timeout_s=60, in_place=True)
        with pytest.raises(WorkerError, match="exited with code 3"):
            pool.get(60)


# A user script: the transform lives in the main module, as in a training script.
SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from h5stream.augment.pool import WorkerPool
    from h5stream.memory.shm import SharedArray, new_prefix


    def copy(images, *, seed, epoch, row_ids, out=None):
        out[...] = images


    if __name__ == "__main__":
        from multiprocessing import resource_tracker
        prefix = new_prefix()
        with SharedArray.create((16, 4, 4, 3), np.uint8, prefix) as src, WorkerPool(
            copy, [src.spec], workers=2, batch_rows=4, n_slots=2, prefix=prefix
        ) as pool:
            pool.submit(0, [0, 1], [0, 1], epoch=0, seed=0, timeout_s=60, in_place=True)
            pool.release(pool.get(60).slot)
            print(prefix, resource_tracker._resource_tracker._pid, *pool.pids, flush=True)
            while True:  # iterate until interrupted
                pool.submit(0, [0, 1], [0, 1], epoch=0, seed=0, timeout_s=60, in_place=True)
                pool.release(pool.get(60).slot)
    """
)


def _start_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, like a terminal job
    )
    ready = select.select([proc.stdout], [], [], 120)[0]  # safety net
    if not ready:
        proc.kill()
        proc.communicate()
        pytest.fail("the script did not start its pool")
    line = proc.stdout.readline().split()
    if not line:
        _, err = proc.communicate(timeout=60)
        pytest.fail(f"the script failed: {err}")
    prefix, tracker_pid, *worker_pids = line
    return proc, prefix, int(tracker_pid), [int(p) for p in worker_pids]


def test_ctrl_c_raises_keyboard_interrupt_and_leaves_nothing(tmp_path):
    proc, prefix, tracker_pid, worker_pids = _start_script(tmp_path)
    assert len(worker_pids) == 2 and segment_names(prefix)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group, workers included
    _, err = proc.communicate(timeout=120)  # EOF on stderr: the script, its workers and tracker all exited
    assert "KeyboardInterrupt" in err
    assert proc.returncode != 0
    assert "leaked" not in err, err  # nothing left for the resource tracker to clean
    assert err.count("Traceback") == 1 and "h5stream-augment" not in err, err  # workers ignored SIGINT
    assert still_running(worker_pids + [tracker_pid]) == []
    assert segment_names(prefix) == []


def test_killed_parent_workers_exit_and_segments_are_unlinked(tmp_path):
    proc, prefix, tracker_pid, worker_pids = _start_script(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)  # no close(), no atexit: only the safety nets remain
    proc.communicate(timeout=120)
    assert still_running(worker_pids + [tracker_pid]) == []  # workers noticed, then the tracker cleaned up
    assert segment_names(prefix) == []


def test_workers_skip_the_main_script_when_the_transform_lives_elsewhere(tmp_path):
    # spawn would re-run the script in each worker (a top-level `import tensorflow`
    # costs ~400 MiB per worker); the SIGINT test above covers a transform that
    # does live in __main__ and so needs it.
    script = tmp_path / "light.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            print("main script ran", file=sys.stderr, flush=True)
            if __name__ == "__main__":
                import numpy as np
                sys.path.insert(0, {os.path.dirname(__file__)!r})
                from test_lifecycle import Behave
                from h5stream.augment.pool import WorkerPool
                from h5stream.memory.shm import SharedArray, new_prefix
                with SharedArray.create((4, 2, 2, 1), np.uint8, new_prefix()) as src, WorkerPool(
                    Behave(), [src.spec], workers=1, batch_rows=2, n_slots=1
                ) as pool:
                    src.array[:] = 9
                    pool.submit(0, [0, 1], [0, 1], epoch=0, seed=0, timeout_s=60, in_place=True)
                    batch = pool.get(60)
                    print(int(pool.slot_view(batch.slot)[:batch.rows].sum()))
            """
        )
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["72"]
    assert done.stderr.count("main script ran") == 1, done.stderr


HANGING = textwrap.dedent(
    f"""
    import sys
    sys.path.insert(0, {os.path.dirname(__file__)!r})
    import numpy as np
    from test_lifecycle import SAY_AND_HANG, Behave
    from h5stream.augment.pool import WorkerPool
    from h5stream.memory.shm import SharedArray, new_prefix

    if __name__ == "__main__":
        with SharedArray.create((4, 2, 2, 1), np.uint8, new_prefix()) as src, WorkerPool(
            Behave(), [src.spec], workers=1, batch_rows=2, n_slots=1
        ) as pool:
            pool.submit(0, [0, 1], [0, 1], epoch=0, seed=SAY_AND_HANG, timeout_s=60, in_place=True)
            pool.get(3600)
    """
)


def test_a_worker_inside_a_task_that_never_returns_exits_when_its_parent_is_killed(tmp_path):
    """A worker saw its parent's end only between tasks: one inside a transform that never returns (a hang, an
    endless loop) outlived a parent killed by SIGKILL for good, its shared memory still mapped."""
    script = tmp_path / "hang.py"
    script.write_text(HANGING)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    worker = None
    try:
        if not select.select([proc.stdout], [], [], 120)[0]:  # safety net
            pytest.fail("the script's worker did not start its task")
        line = proc.stdout.readline().split()
        assert line[:1] == ["hanging"], (line, proc.stderr.read() if proc.poll() is not None else "")
        worker = int(line[1])
        os.kill(proc.pid, signal.SIGKILL)  # the worker is inside its task
        proc.wait(timeout=120)  # not communicate(): the worker holds the script's pipes until it ends
        assert still_running([worker], timeout_s=30) == []  # a safety net: it ends at once
    finally:
        if worker is not None and still_running([worker], timeout_s=0):
            os.kill(worker, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=120)


class Preempted(Exception):
    """What a training job's SIGTERM handler raises to shut down gracefully (torch elastic's SignalException is
    an Exception too)."""


def test_an_exception_of_a_signal_handler_inside_a_wait_for_a_batch_is_raised_as_it_is(source):
    """A signal handler's exception that interrupts the wait for the workers' answers reaches the caller as it is
    (so its ``except`` runs the job's shutdown); it was taken for a failure of the pipes and raised as
    ``WorkerError: reading the augment workers' pipes failed: Preempted``.  The pool is failed after it, saying
    why (an answer may have been cut short)."""
    from h5stream.concurrency.procpool import Workers

    def preempt(signum, frame):
        while frame is not None:  # only inside the wait on the pipes: elsewhere, the next tick tries again
            if frame.f_code is Workers.wait.__code__:
                signal.setitimer(signal.ITIMER_REAL, 0)
                raise Preempted("SIGTERM")
            frame = frame.f_back

    old = signal.signal(signal.SIGALRM, preempt)
    try:
        with WorkerPool(Behave(), [source.spec], workers=1, batch_rows=4, n_slots=2, close_timeout_s=1) as pool:
            pool.submit(0, [0, 1], [0, 1], epoch=0, seed=HANG, timeout_s=60, in_place=True)
            signal.setitimer(signal.ITIMER_REAL, 0.02, 0.02)
            with pytest.raises(Preempted):
                pool.get(60)  # the task never ends: the timer lands in the wait
            with pytest.raises(WorkerError, match="a signal handler's Preempted: SIGTERM interrupted the reading"):
                pool.get(60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
