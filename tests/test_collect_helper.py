"""The suite's ``collect`` helper collects even while another thread's garbage collection is under way.

CPython's ``gc.collect()`` does nothing (returns 0) while another thread runs a collection, which it does for as
long as that collection's finalizers run Python code.  The leak checks (``no_leaks``, "the stream is freed") rely on
``collect`` to really collect.
"""

from __future__ import annotations

import gc
import threading
import weakref

from conftest import collect


class _SlowFinalizer:
    def __init__(self, inside: threading.Event, go: threading.Event):
        self.inside, self.go = inside, go
        self.me = self  # a cycle: only a collection frees it

    def __del__(self):
        self.inside.set()
        self.go.wait(30)


class _Node:
    def __init__(self):
        self.me = self


def test_collect_waits_for_another_threads_collection_and_then_collects():
    inside, go = threading.Event(), threading.Event()
    _SlowFinalizer(inside, go)
    other = threading.Thread(target=gc.collect)
    other.start()
    try:
        assert inside.wait(30)
        node = _Node()
        ref = weakref.ref(node)
        del node
        assert gc.collect() == 0 and ref() is not None  # CPython skipped it: the other thread is collecting
        go.set()
        assert collect(lambda: ref() is None)
    finally:
        go.set()
        other.join()
