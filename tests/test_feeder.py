"""The feeder process (``open(..., workers=N, feeder=True)``): the same batches, resume, kept batches, errors,
deaths and Ctrl-C as the pooled feed in the training process, on real files and real processes.

Processes report where they are through stdout lines; timeouts are safety nets, never the assertion.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import textwrap

import numpy as np
import psutil
import pytest

import h5stream
from h5stream.streaming.planning import plan_stream
from h5stream.errors import ConfigError, ReaderError, WorkerError
from h5stream.memory.shm import segment_names
from h5stream.store.meta import read_meta
from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")

ROWS = 700
SAFETY_S = 120.0
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 255, (ROWS, 24, 24, 3), dtype=np.uint8)
    labels = np.arange(ROWS) % 5
    path = tmp_path_factory.mktemp("feeder") / "f.h5"
    write_arrays(path, images, labels, block_rows=16)
    return str(path)


AUG = h5stream.Augment.preset("standard", rescale=1 / 255)


def _batches(path, n_epochs=2, **kw):
    with h5stream.open(path, batch_size=32, memory_budget="300MiB", seed=11, augment=AUG, **kw) as s:
        return [(x.copy(), y.copy()) for _ in range(n_epochs) for x, y in s]


def _same(a, b) -> bool:
    return len(a) == len(b) > 0 and all(np.array_equal(xa, xb) and np.array_equal(ya, yb)
                                        for (xa, ya), (xb, yb) in zip(a, b))


@pytest.mark.parametrize("workers", [1, 2])
def test_the_feeder_gives_the_same_batches_as_the_pooled_feed(store, workers):
    pooled = _batches(store, workers=workers)
    fed = _batches(store, workers=workers, feeder=True)
    assert pooled[0][0].dtype == np.float32
    assert _same(pooled, fed)


def test_the_feeder_gives_the_same_batches_for_a_shard_and_after_restore_and_resume(store):
    kw = dict(batch_size=32, memory_budget="300MiB", seed=4, augment=AUG, workers=2, shard=(1, 2))
    with h5stream.open(store, **kw) as s:
        whole = [(x.copy(), y.copy()) for _ in range(2) for x, y in s]
    with h5stream.open(store, feeder=True, **kw) as s:
        it = iter(s)
        head = [(x.copy(), y.copy()) for x, y in (next(it), next(it), next(it))]
        state = s.state()
        peek = next(it)[0].copy()  # read beyond the state: restore must drop it and what the feeder made ahead
        s.restore(state)
        restored = head + [(x.copy(), y.copy()) for x, y in s] + [(x.copy(), y.copy()) for x, y in s]
    assert np.array_equal(peek, whole[3][0])
    assert _same(whole, restored)
    with h5stream.open(store, feeder=True, resume=state, **kw) as r:
        resumed = head + [(x.copy(), y.copy()) for x, y in r] + [(x.copy(), y.copy()) for x, y in r]
    assert _same(whole, resumed)


def test_the_feeder_without_an_augment_gives_the_batches_of_workers_0_and_resumes_exactly(store):
    """``workers=N, feeder=True`` and no augment: reading leaves the training process (its workers read the rows
    into the output slots); the same uint8 batches as workers=0 over two epochs, restored and resumed exactly."""
    kw = dict(batch_size=32, memory_budget="300MiB", seed=4)
    with h5stream.open(store, **kw) as s:
        whole = [(x.copy(), y.copy()) for _ in range(2) for x, y in s]
    with h5stream.open(store, workers=2, feeder=True, **kw) as s:
        assert s.image_dtype == np.uint8 and s.stats()["feeder_pid"] not in (None, os.getpid())
        fed = [(x.copy(), y.copy()) for _ in range(2) for x, y in s]
        it = iter(s)  # the third epoch: left after 3 batches and one more read beyond the state
        head = [(x.copy(), y.copy()) for x, y in (next(it), next(it), next(it))]
        state = s.state()
        next(it)
        s.restore(state)
        restored = head + [(x.copy(), y.copy()) for x, y in s]
    assert fed[0][0].dtype == np.uint8 and _same(whole, fed)
    with h5stream.open(store, workers=2, feeder=True, resume=state, **kw) as r:
        resumed = head + [(x.copy(), y.copy()) for x, y in r]
    with h5stream.open(store, resume=state, **kw) as r:
        inline = head + [(x.copy(), y.copy()) for x, y in r]
    assert len(inline) == len(whole) // 2 and _same(inline, restored) and _same(inline, resumed)


def test_the_feeder_streams_a_url_store_as_its_local_file(range_server):
    local = str(range_server.root / "store.h5")
    url = range_server.url + "store.h5"
    kw = dict(batch_size=64, seed=3, augment=h5stream.Augment(horizontal_flip=True), workers=1)
    with h5stream.open(local, **kw) as s:
        expected = [(x.copy(), y.copy()) for x, y in s]
    with h5stream.open(url, feeder=True, remote={"timeout_s": 10}, **kw) as s:
        got = [(x.copy(), y.copy()) for x, y in s]
    assert _same(expected, got)


def test_batches_kept_by_the_caller_are_never_overwritten(store):
    with h5stream.open(store, batch_size=32, memory_budget="300MiB", seed=2, augment=AUG, workers=2,
                       feeder=True) as s:
        it = iter(s)
        kept = [next(it) for _ in range(5)]  # the arrays themselves: lent views, then copies
        copies = [(x.copy(), y.copy()) for x, y in kept]
        assert sum(x.base is not None and not x.flags.owndata for x, _ in kept) >= 1  # some are lent, zero-copy
        rest = sum(1 for _ in it)
        next(iter(s))  # and into the next epoch: every slot has been reused by now
    assert rest == len(s) - 5
    assert all(np.array_equal(x, cx) and np.array_equal(y, cy) for (x, y), (cx, cy) in zip(kept, copies))


def test_one_batch_kept_for_good_makes_no_later_batch_a_copy_with_the_feeder(store):
    """``x, y = next(iter(stream))`` kept for its shapes, then two epochs of the usual loop: the pooled feed's
    lending rule on the training-process side too, so every batch is lent without a copy and the kept one stays
    intact."""
    expected = _batches(store, n_epochs=3, workers=2)
    with h5stream.open(store, batch_size=32, memory_budget="300MiB", seed=11, augment=AUG, workers=2,
                       feeder=True) as s:
        mapped = s._feed._lender.slots  # the output slots as the training process maps them
        slots = [mapped.part(k) for k in range(len(mapped))]

        def lent(x) -> bool:
            return any(np.shares_memory(x, slot) for slot in slots)

        it = iter(s)
        first = next(it)
        got, views = [(first[0].copy(), first[1].copy())], [lent(first[0])]
        for _ in range(3):
            for x, y in it:
                got.append((x.copy(), y.copy()))
                views.append(lent(x))
            it = iter(s)
        assert all(views) and s.stats()["copied_batches"] == 0
        assert np.array_equal(first[0], expected[0][0]) and np.array_equal(first[1], expected[0][1])
    assert _same(expected, got)


def test_feeder_needs_workers():
    with pytest.raises(ConfigError, match="feeder=True .* needs workers > 0"):
        h5stream.open("unused.h5", feeder=True)


@pytest.mark.parametrize("augment", [AUG, None], ids=["augment", "plain"])
def test_the_plan_counts_the_feeder(store, augment):
    from h5stream.streaming.budget import FEEDER_IN_FLIGHT, FEEDER_OVERHEAD_BYTES

    meta = read_meta(store)
    pooled = plan_stream(meta, None, 32, augment=augment, workers=2)
    fed = plan_stream(meta, None, 32, augment=augment, workers=2, feeder=True)
    assert fed.feeder and not pooled.feeder
    assert fed.out_slots == pooled.out_slots + FEEDER_IN_FLIGHT
    assert fed.input_slots == pooled.input_slots + FEEDER_IN_FLIGHT
    assert fed.pool_bytes > pooled.pool_bytes + FEEDER_OVERHEAD_BYTES
    assert fed.rows_per_fill == pooled.rows_per_fill  # the default budget adds the feeder's share on top
    assert fed.total_bytes <= fed.budget_bytes
    if augment is None:  # what the stream runs by is this plan
        with h5stream.open(store, batch_size=32, workers=2, feeder=True, verify_reads=False) as s:
            assert s.plan == fed and s._feed._lender.copies.max_sets == fed.consumer_sets


def _gone(pids) -> bool:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=SAFETY_S)
    return alive == []


def test_a_sigkilled_feeder_is_a_reader_error_naming_it_and_leaves_nothing(store):
    s = h5stream.open(store, batch_size=32, memory_budget="300MiB", augment=AUG, workers=2, feeder=True)
    try:
        it = iter(s)
        next(it)
        stats = s.stats()
        feeder, workers = stats["feeder_pid"], stats["worker_pids"]
        os.kill(feeder, signal.SIGKILL)
        with pytest.raises(ReaderError, match=rf"feeder process died: pid {feeder} was killed by SIGKILL") as info:
            for _ in range(len(s)):
                next(it)
        assert "worker 0" not in str(info.value)  # the feeder is no pool's worker
        with pytest.raises(ReaderError, match="feeder process died"):  # the feed stays failed
            next(it)
    finally:
        s.close()
    assert _gone([feeder, *workers])  # the workers saw their parent die
    assert segment_names(f"h5s_{feeder}_") == []  # close() swept what the feeder could not unlink


def _explode(batch):
    raise ValueError("boom from the transform")


def _first_error(store, feeder, kill_worker):
    aug = h5stream.Augment(preprocessing_function=_explode) if not kill_worker else AUG
    with h5stream.open(store, batch_size=32, memory_budget="300MiB", augment=aug, workers=2, feeder=feeder) as s:
        it = iter(s)
        if kill_worker:
            next(it)
            worker = s.stats()["worker_pids"][0]
            os.kill(worker, signal.SIGKILL)
        with pytest.raises(WorkerError) as info:
            for _ in range(len(s)):
                next(it)
        return info.value


@pytest.mark.parametrize("fault", ["sigkill", "raise"])
def test_a_failing_augment_worker_is_the_same_worker_error_as_without_the_feeder(store, fault):
    kill = fault == "sigkill"
    errors = [_first_error(store, feeder, kill) for feeder in (False, True)]
    texts = [re.sub(r"pid \d+", "pid N", str(e)) for e in errors]
    assert texts[0] == texts[1]
    assert ("killed by SIGKILL" if kill else "boom from the transform") in texts[1]
    if not kill:
        assert "_explode" in str(errors[1].__cause__)  # the worker's traceback travels too


OPENED = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[2])
    import h5stream

    if __name__ == "__main__":
        s = h5stream.open(sys.argv[1], batch_size=8, augment=h5stream.Augment(horizontal_flip=True), workers=2,
                          feeder=True)
        next(iter(s))
        st = s.stats()
        print("streaming", st["feeder_pid"], *st["worker_pids"], flush=True)
    """
)
"""A script's opening: a feeder stream with 2 workers, and a line naming the feeder and the workers."""

VICTIM = OPENED + "    while True:  # in the opening's main block\n        for _ in s:\n            pass\n"


def _start(tmp_path, script_text, store):
    script = tmp_path / "script.py"
    script.write_text(script_text)
    return subprocess.Popen([sys.executable, str(script), store, REPO], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _line(proc, word: str) -> list[str]:
    """The words after ``word`` on the next line that has it: at the line's start, or right after a print that a
    Ctrl-C cut short before its newline (``batch 31interrupted 1``)."""
    while True:
        line = proc.stdout.readline()
        assert line, f"the script ended before {word!r}: {proc.communicate(timeout=SAFETY_S)[1]}"
        head, found, rest = line.rpartition(word)
        if found and (not head or not head[-1].isspace()):
            return rest.split()


@pytest.mark.parametrize("victim", ["trainer", "group"])
def test_a_sigkilled_trainer_leaves_no_process_and_no_segment_once_the_next_stream_opens(tmp_path, store, victim):
    proc = _start(tmp_path, VICTIM, store)
    try:
        pids = [int(p) for p in _line(proc, "streaming")]
        if victim == "trainer":
            proc.kill()  # the feeder sees its parent die and closes its pool
        else:
            os.killpg(proc.pid, signal.SIGKILL)  # nobody unlinks anything: the next open sweeps
        proc.communicate(timeout=SAFETY_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert _gone(pids)
    with h5stream.open(store, batch_size=8):
        pass
    assert segment_names(f"h5s_{pids[0]}_") == [] and segment_names(f"h5s_{proc.pid}_") == []


LOOP = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[2])
    import threading
    import h5stream

    if __name__ == "__main__":
        try:
            with h5stream.open(sys.argv[1], batch_size=8, augment=h5stream.Augment(horizontal_flip=True), workers=2,
                               feeder=True) as s:
                st = s.stats()
                print("opened", st["feeder_pid"], *st["worker_pids"], flush=True)
                n = 0
                while True:
                    for _ in s:
                        n += 1
                        print("batch", n, flush=True)
        except KeyboardInterrupt:
            print("interrupted", threading.active_count(), flush=True)
            sys.stdin.readline()
    """
)


def test_ctrl_c_in_the_trainer_raises_keyboard_interrupt_and_leaves_nothing(tmp_path, store):
    proc = _start(tmp_path, LOOP, store)
    try:
        pids = [int(p) for p in _line(proc, "opened")]
        while int(_line(proc, "batch")[0]) < 30:
            pass
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group, feeder and workers included
        threads = int(_line(proc, "interrupted")[0])
        children = [p for p in psutil.Process(proc.pid).children(recursive=True)
                    if not any("resource_tracker" in part for part in p.cmdline())
                    and p.status() != psutil.STATUS_ZOMBIE]
        segments = segment_names(f"h5s_{pids[0]}_") + segment_names(f"h5s_{proc.pid}_")
        proc.stdin.write("done\n")
        proc.stdin.flush()
        _, err = proc.communicate(timeout=SAFETY_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert threads == 1 and children == [] and segments == [], (threads, children, segments)
    assert all(not psutil.pid_exists(p) for p in pids)
    assert proc.returncode == 0 and "leaked" not in err, err


def test_gc_of_an_unclosed_feeder_stream_stops_the_feeder_and_its_workers(store):
    s = h5stream.open(store, batch_size=32, memory_budget="300MiB", augment=AUG, workers=2, feeder=True)
    next(iter(s))
    stats = s.stats()
    pids = [stats["feeder_pid"], *stats["worker_pids"]]
    assert all(psutil.pid_exists(p) for p in pids)
    del s  # no close(): the finalizer stops the feeder, which closes its pool (no_leaks checks the rest)
    from conftest import collect

    assert collect(lambda: all(not psutil.pid_exists(p) for p in pids))
    assert segment_names(f"h5s_{pids[0]}_") == []


UNCLOSED = OPENED + "    # the script ends without close(): interpreter exit must stop the feeder, not wait for it\n"


def test_a_script_that_never_closes_its_feeder_stream_exits_and_leaves_nothing(tmp_path, store):
    proc = _start(tmp_path, UNCLOSED, store)
    try:
        pids = [int(p) for p in _line(proc, "streaming")]
        _, err = proc.communicate(timeout=SAFETY_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and "leaked" not in err, err
    assert _gone(pids)
    assert segment_names(f"h5s_{pids[0]}_") == [] and segment_names(f"h5s_{proc.pid}_") == []


def test_a_stopped_feeder_is_a_reader_error_naming_it_and_close_still_ends_it(store):
    s = h5stream.open(store, batch_size=32, memory_budget="300MiB", augment=AUG, workers=1, feeder=True,
                      timeout_s=1.0)
    try:
        it = iter(s)
        next(it)
        feeder = s.stats()["feeder_pid"]
        os.kill(feeder, signal.SIGSTOP)
        named = rf"feeder process \(pid {feeder}\) is stopped .*kill -CONT {feeder}"
        with pytest.raises(ReaderError, match=named) as info:
            for _ in range(len(s)):
                next(it)
        assert "has not sent a batch in 1 s;" in str(info.value)  # named after timeout_s, as promised
    finally:
        s.close()  # kills the stopped feeder (it obeys nothing else); no_leaks checks nothing is left
    assert not psutil.pid_exists(feeder)
    assert segment_names(f"h5s_{feeder}_") == []


def test_ctrl_c_anywhere_in_a_feeder_epoch_loop_raises_keyboard_interrupt_and_leaves_nothing(tmp_path, store):
    from test_faults_runtime import LOOP as POOLED_LOOP, ctrl_c_everywhere

    # The runtime faults' loop (open, epochs, close, again after each Ctrl-C), with the feeder.
    loop = POOLED_LOOP.replace("workers=workers)", "workers=workers, feeder=True)").replace(
        'say("opened")', 'say("opened", s.stats()["feeder_pid"])')
    assert "feeder=True" in loop and "feeder_pid" in loop
    script = tmp_path / "loop.py"
    script.write_text(loop)
    proc = subprocess.Popen([sys.executable, str(script), store, "2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": REPO})
    err, feeders = ctrl_c_everywhere(proc)  # Ctrl-C to the whole foreground group, feeder and workers included
    assert feeders and proc.returncode != 0 and err.rstrip().endswith("KeyboardInterrupt"), err
    assert "leaked" not in err and "h5stream-feeder" not in err and "h5stream-augment" not in err, err


@pytest.mark.parametrize("feeder", [False, True], ids=["pooled", "feeder"])
def test_after_a_restore_that_a_dead_worker_failed_next_raises_that_error_at_once(store, feeder):
    """A worker SIGKILLed, then ``restore()``: the restore raises WorkerError, and so does every later ``next``,
    at once, with the feeder as without it.  Before, without the feeder ``next`` read from the reader the failed
    restore had closed (no batch was in the pool yet: ``StreamClosedError: the stream is closed``); with it, the
    trainer waited for an answer to a request it had not sent (the failed start asked for no batch) and raised,
    ``timeout_s`` later, that the feeder had not sent a batch."""
    if not hasattr(os, "pidfd_open"):
        pytest.skip("needs Linux pidfds")
    with h5stream.open(store, batch_size=32, memory_budget="300MiB", augment=AUG, workers=2, feeder=feeder,
                       timeout_s=30) as s:
        state = s.state()
        worker = s.stats()["worker_pids"][0]
        pidfd = os.pidfd_open(worker)  # readable once it has ended; unlike a wait, it leaves it to its parent
        try:
            os.kill(worker, signal.SIGKILL)
            assert select.select([pidfd], [], [], SAFETY_S)[0]
        finally:
            os.close(pidfd)
        with pytest.raises(WorkerError, match=rf"worker 0 \(pid {worker}\) was killed by SIGKILL") as first:
            s.restore(state)
        for _ in range(2):
            with pytest.raises(WorkerError) as again:
                next(iter(s))
            assert str(again.value) == str(first.value)
