"""The process-pool core both pools stand on: the serve loop in real spawned workers, in-order delivery, the one
death report, stop.  The front ends' own behaviour is in test_pool.py (augment) and test_ingest*.py (decode)."""

from __future__ import annotations

import os
import signal

import numpy as np
import psutil
import pytest
from conftest import finishes_within

from h5stream.concurrency.procpool import (
    DONE,
    ERROR,
    EXITED,
    FATAL,
    READY,
    InOrder,
    TaskFailed,
    Workers,
    death_report,
    frames,
    pick_worker,
)

pytestmark = pytest.mark.usefixtures("no_leaks")


# -- what the workers run (module level: spawn pickles them by name) --------------------------------------------------


def _setup(offset):
    if offset < 0:
        raise ValueError("no negative offsets")
    return offset


def _handle(offset, body):
    if isinstance(body, memoryview):  # a task sent as bytes (Workers.send_raw)
        return ("bytes", bytes(body))
    what, value = body
    if what == "add":
        return value + offset
    if what == "read":
        try:
            open(value, "rb")
        except OSError as exc:
            raise TaskFailed("read", exc) from None
    if what == "raise":
        raise KeyError(value)
    if what == "exit":
        raise SystemExit(value)  # reported, the worker goes on
    if what == "die":
        os._exit(value)
    return None


def _wait_for(workers, want, timeout_s=60):
    """Events from ``workers.wait`` until one of kind ``want`` came; all of them, in order."""
    seen = []
    while not any(msg[0] == want for _, msg in seen):
        events = workers.wait(timeout_s)
        assert events, f"nothing within {timeout_s} s; saw {seen}"
        seen += events
    return seen


@pytest.fixture
def two():
    workers = Workers("test worker")
    workers.start(_setup, _handle, "task", [(10,), (20,)], name="h5stream-test")
    try:
        yield workers
    finally:
        workers.stop(10)


def test_workers_serve_tasks_and_report_failures_with_their_stage(two, tmp_path):
    assert two.send(0, 7, ("add", 1)) and two.send(1, 8, ("add", 1))
    assert two.send(0, 9, ("raise", "gone")) and two.send(1, 10, ("read", str(tmp_path / "missing")))
    assert two.send(0, 11, ("exit", 3)) and two.send(0, 12, ("add", 2))
    replies = {}
    while len(replies) < 6:
        for w, msg in two.wait(60):
            if msg[0] == READY:
                assert msg[1] == two.pids[w]
            else:
                replies[msg[1]] = (w, msg)
    assert replies[7] == (0, (DONE, 7, 11)) and replies[8] == (1, (DONE, 8, 21)) and replies[12] == (0, (DONE, 12, 12))
    _, (kind, _, fail) = replies[9]
    assert kind == ERROR and fail.summary == "KeyError: 'gone'" and fail.stage == "task" and "_handle" in fail.traceback
    _, (kind, _, fail) = replies[10]
    assert kind == ERROR and fail.stage == "read" and fail.summary.startswith("FileNotFoundError: ")
    assert fail.errno == 2 and "open(value" in fail.traceback
    _, (kind, _, fail) = replies[11]
    assert kind == ERROR and fail.summary == "SystemExit: 3"
    assert two.started == {0, 1}


def test_a_task_sent_as_bytes_reaches_the_handler_as_those_bytes_in_order_with_pickled_ones(two):
    assert two.send_raw(0, 5, b"\x00raw\x80task") and two.send(0, 6, ("add", 1)) and two.send_raw(1, 7, b"")
    done = {}
    while len(done) < 3:
        for w, msg in two.wait(60):
            if msg[0] == DONE:
                done[msg[1]] = (w, msg[2])
    assert done == {5: (0, ("bytes", b"\x00raw\x80task")), 6: (0, 11), 7: (1, ("bytes", b""))}


def test_a_killed_worker_is_reported_once_after_its_messages_then_its_pipe_refuses(two):
    while two.started != {0, 1}:
        assert two.wait(60)
    assert two.send(1, 0, ("add", 5))
    assert _wait_for(two, DONE) == [(1, (DONE, 0, 25))]
    os.kill(two.pids[1], signal.SIGKILL)
    events = _wait_for(two, EXITED)
    assert events[-1] == (1, (EXITED, -signal.SIGKILL))
    report = two.death(1, oom_fix="use fewer workers")
    assert report == (f"test worker died: worker 1 (pid {two.pids[1]}) was killed by SIGKILL; SIGKILL often means "
                      "the out-of-memory killer: use fewer workers")
    assert not two.send(1, 1, ("add", 1))
    assert two.send(0, 2, ("add", 1))  # the other one serves on
    assert (0, (DONE, 2, 11)) in _wait_for(two, DONE)


def test_frames_give_back_every_whole_message_wherever_the_bytes_are_cut():
    """What one read of a pipe returns may end inside a message (a long traceback): the whole ones come out, the
    rest waits for the next read, for any cut, in multiprocessing's own framing."""
    import pickle
    import struct

    messages = [(DONE, 1, None), (ERROR, 2, "x" * 5000), b"", (READY, 77)]
    payloads = [pickle.dumps(m) for m in messages]
    data = b"".join(struct.pack("!i", len(p)) + p for p in payloads)
    data += struct.pack("!i", -1) + struct.pack("!Q", len(payloads[0])) + payloads[0]  # the long-length head
    want = [*payloads, payloads[0]]
    for cut in range(len(data) + 1):
        first, used = frames(data[:cut])
        rest = data[used:cut] + data[cut:]
        second, used2 = frames(rest)
        assert [bytes(m) for m in first + second] == want and used2 == len(rest)
        assert used <= cut and (cut == len(data)) == (len(first) == len(want))


def test_frames_parse_what_multiprocessing_connection_itself_sends():
    """The framing is CPython's (private to ``multiprocessing.connection``): pin it against what a real
    ``Connection.send_bytes`` writes, so a Python that changes it fails here first.  The messages are sent from a
    thread while this one reads: together they are larger than a pipe holds."""
    import multiprocessing
    import os
    import threading

    reader, writer = multiprocessing.Pipe(duplex=False)
    sent = [b"", b"x", bytes(range(256)) * 300, b"tail"]

    def send_all():
        for payload in sent:
            writer.send_bytes(payload)
        writer.close()

    sender = threading.Thread(target=send_all)
    sender.start()
    try:
        data = b""
        while chunk := os.read(reader.fileno(), 1 << 16):
            data += chunk
        messages, used = frames(data)
        assert [bytes(m) for m in messages] == sent and used == len(data)
    finally:
        sender.join()
        reader.close()


def test_a_wait_sleeping_on_one_worker_reads_the_others_answers_when_it_ends_and_wakes_when_that_one_dies(two):
    """``sleep_on`` names the worker whose answer is awaited: another worker's answer does not end the sleep but
    is read when it ends (at the timeout here), and the awaited worker's death ends it (its process sentinel)."""
    while two.started != {0, 1}:
        assert two.wait(60)
    os.kill(two.pids[0], signal.SIGSTOP)  # it will never answer
    os.waitpid(two.pids[0], os.WUNTRACED)
    assert two.send(0, 1, ("add", 1)) and two.send(1, 2, ("add", 3))
    assert two.conns[1].poll(60)  # worker 1's answer is in its pipe
    assert finishes_within(lambda: two.wait(0.5, sleep_on=0), 30) == [(1, (DONE, 2, 23))]
    assert two.wait(0) == []
    os.kill(two.pids[0], signal.SIGKILL)
    assert finishes_within(lambda: two.wait(60, sleep_on=0), 30) == [(0, (EXITED, -signal.SIGKILL))]


def test_a_worker_whose_setup_raises_says_so_then_exits():
    workers = Workers("test worker")
    try:
        workers.start(_setup, _handle, "task", [(-1,)], name="h5stream-test")
        events = _wait_for(workers, EXITED)
        assert [msg[0] for _, msg in events] == [FATAL, EXITED]
        fail = events[0][1][1]
        assert fail.summary == "ValueError: no negative offsets" and fail.stage == "start"
        assert "_setup" in fail.traceback
        assert events[1][1] == (EXITED, 0)
        assert workers.started == set()
        assert "died during start-up: worker 0" in workers.death(0, oom_fix="x")
    finally:
        workers.stop(10)


def test_stop_kills_a_stopped_worker_at_once_rather_than_waiting_out_its_timeout():
    workers = Workers("test worker")
    try:
        workers.start(_setup, _handle, "task", [(0,), (0,)], name="h5stream-test")
        while workers.started != {0, 1}:
            assert workers.wait(60)
        pids = workers.pids
        os.kill(pids[0], signal.SIGSTOP)  # reads no stop message, obeys no signal but SIGKILL
        os.waitpid(pids[0], os.WUNTRACED)  # returns once it is stopped (a child of ours; not reaped)
        finishes_within(lambda: workers.stop(600), 120)
    finally:
        workers.stop(10)
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    workers.stop(10)  # idempotent


@pytest.mark.parametrize("exitcode, started, want", [
    (-signal.SIGKILL, True, "decode worker died: worker 2 (pid 77) was killed by SIGKILL; SIGKILL often means the "
                            "out-of-memory killer: pass fewer --workers"),
    (-signal.SIGTERM, True, "decode worker died: worker 2 (pid 77) was killed by SIGTERM"),
    (3, True, "decode worker died: worker 2 (pid 77) exited with code 3; see its output above"),
    (1, False, "decode worker died during start-up: worker 2 (pid 77) exited with code 1; see its output above; "
               "its traceback, if any, is on stderr above (hint)"),
])
def test_death_report_names_who_how_and_what_to_do(exitcode, started, want):
    assert death_report("decode worker", 2, 77, exitcode, started, "pass fewer --workers", " (hint)") == want


def test_in_order_hands_over_every_result_once_in_submission_order_whatever_the_completion_order():
    for seed in range(20):
        rng = np.random.default_rng(seed)
        order, got = InOrder(), []
        pending = [order.submitted() for _ in range(int(rng.integers(1, 30)))]
        rng.shuffle(pending)
        for seq in pending:
            order.finish(seq, seq * 10)
            while order.ready():
                got.append(order.pop())
        assert got == [(s, s * 10) for s in range(len(pending))]
        assert not order.ready()
    order = InOrder()
    order.submitted()
    second = order.submitted()
    order.finish(second, "b")
    assert not order.ready() and order.drop() == ["b"]
    assert order.next_deliver == order.next_submit == 2 and order.submitted() == 2


def test_pick_worker_takes_the_least_busy_eligible_worker_below_the_cap():
    assert pick_worker([2, 0, 1], range(3), cap=4) == 1
    assert pick_worker([2, 0, 1], {0, 2}, cap=4) == 2
    assert pick_worker([1, 1, 1], range(3), cap=4) == 0
    assert pick_worker([4, 4], range(2), cap=4) is None
