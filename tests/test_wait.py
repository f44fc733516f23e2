"""The stoppable waits (h5stream.concurrency.wait): every thread of a stream waits without raising anything to poll."""

from __future__ import annotations

import os
import queue
import select
import signal
import sys
import threading
import time

import numpy as np
import psutil
import pytest

import h5stream
from h5stream.concurrency.wait import Channel, Stopped, stop_when, wait_until
from h5stream.errors import ReaderError
from h5stream.store.writer import write_arrays

POLL_EXCEPTIONS = (TimeoutError, queue.Empty, queue.Full)


def test_a_stop_scope_ends_a_wait_inside_code_that_takes_no_stop_flag():
    cond, flag, ended = threading.Condition(), threading.Event(), []

    def waiter():
        with stop_when(flag), cond:
            try:
                wait_until(cond, lambda: False)  # no deadline, no check of its own: only the scope ends it
            except Stopped:
                ended.append(True)

    t = threading.Thread(target=waiter)
    t.start()
    flag.set()
    t.join(10)
    assert ended == [True] and not t.is_alive()


def test_a_deadline_ends_a_wait_with_one_false_and_a_channel_get_with_one_timeout_error():
    cond = threading.Condition()
    with cond:
        assert wait_until(cond, lambda: False, deadline=time.monotonic() + 0.05) is False
    ch = Channel(1)
    with pytest.raises(TimeoutError):
        ch.get(deadline=time.monotonic() + 0.05)
    ch.put(1)
    assert ch.get() == 1 and ch.empty()


def test_a_channel_hands_items_in_order_between_threads_and_a_full_put_waits_for_a_get():
    ch, got = Channel(2), []
    t = threading.Thread(target=lambda: [ch.put(i) for i in range(50)])
    t.start()
    got = [ch.get(deadline=time.monotonic() + 30) for _ in range(50)]
    t.join(10)
    assert got == list(range(50)) and ch.qsize() == 0


def _store(path, rows=256, size=8) -> str:
    ids = np.arange(rows)
    images = np.broadcast_to((ids % 251).astype(np.uint8)[:, None, None, None], (rows, size, size, 3)).copy()
    write_arrays(str(path), images, ids % 3, block_rows=16)
    return str(path)


class _ExceptionCounter:
    """Counts the distinct exceptions of ``types`` raised in every thread started while it is installed (and this
    one), through ``sys.settrace`` / ``threading.settrace``."""

    def __init__(self, types):
        self.types = types
        self.seen: dict[int, tuple[float, str, str]] = {}  # id -> (when, type, thread)
        self._lock = threading.Lock()

    def _local(self, frame, event, arg):
        if event == "exception" and isinstance(arg[1], self.types):
            with self._lock:
                self.seen.setdefault(id(arg[1]), (time.monotonic(), type(arg[1]).__name__,
                                                  threading.current_thread().name))
        return self._local

    def _global(self, frame, event, arg):
        return self._local

    def __enter__(self):
        threading.settrace(self._global)
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)
        threading.settrace(None)


def test_waiting_for_a_stopped_worker_raises_nothing_until_the_timeout_in_any_thread(tmp_path, no_leaks):
    """The consumer waits on the pool, the reader thread for an output slot and for the queue: a wait loop that
    polled with short timeouts raised TimeoutError / queue.Empty / queue.Full ten times a second in each."""
    path = _store(tmp_path / "s.h5")
    with _ExceptionCounter(POLL_EXCEPTIONS) as counter:
        stream = h5stream.open(path, batch_size=8, timeout_s=2.0, workers=2, seed=0,
                               augment=h5stream.Augment(horizontal_flip=True))
        try:
            batches = iter(stream)
            next(batches)  # the first fill is read (and its blocks' checksums learned): from now on, waits
            worker = psutil.Process(stream.stats()["worker_pids"][1])
            os.kill(worker.pid, signal.SIGSTOP)
            deadline = time.monotonic() + 60
            while worker.status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
                select.select([], [], [], 0.01)  # a condition polled, not a guessed delay
            t_stopped = time.monotonic()
            with pytest.raises(ReaderError, match="stopped"):
                for _batch in batches:
                    pass
                for _ in range(4):
                    for _batch in stream:
                        pass
        finally:
            stream.close()
    # The consumer's wait reaching timeout_s raises one TimeoutError, which becomes the ReaderError and stops the
    # stream; before it, while every thread waited, nothing was raised (after it, shutting down may use some).
    seen = sorted(counter.seen.values())
    timed_out = [t for t, kind, thread in seen if kind == "TimeoutError" and thread == "MainThread"]
    assert len(timed_out) == 1
    assert [(kind, thread) for t, kind, thread in seen if t_stopped < t < timed_out[0]] == [], seen
