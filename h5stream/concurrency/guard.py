"""One thread at a time, never waiting: a guard that a second thread entering meanwhile gets an error from at once
(waiting would let two threads' calls interleave in an order neither chose)."""

from __future__ import annotations


class Entered:
    """``with guard:`` holds ``lock`` without waiting; a thread that finds it held gets ``error()`` raised at once,
    and holds nothing.  Several guards may share one lock (one a method, so each error names its method).  Any
    thread may enter; a class rather than a generator, as it guards calls made once a row."""

    __slots__ = ("_lock", "_error")

    def __init__(self, lock, error):
        self._lock, self._error = lock, error

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            raise self._error()

    def __exit__(self, *exc) -> None:
        self._lock.release()
