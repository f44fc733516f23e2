"""Bounce buffers of reads past the page cache (``O_DIRECT``): page-aligned memory a direct read lands in when
the caller's buffers do not suit the device (see :class:`h5stream.read.source.DirectFile`).

A :class:`BouncePool` holds at most :data:`BOUNCE_BUFFERS` of them, made as reads need them: one direct file's
own, or one pool the direct files of a set of parts share, so a set holds what one store holds.
"""

from __future__ import annotations

import mmap
import threading

BOUNCE_BYTES = 1 << 20
"""One direct read's bounce buffer: a run of the reader (1 to 4 MiB) in a few reads."""

BOUNCE_BUFFERS = 4
"""Bounce buffers a pool holds at most; a read that needs one while all are in use waits."""


class BouncePool:
    """At most ``limit`` page-aligned bounce buffers of :data:`BOUNCE_BYTES`, made as reads need them: one
    direct file's own, or shared by the direct files of a set of parts (so a set holds what one store holds,
    :data:`~h5stream.read.source.DIRECT_IO_BYTES`).  ``take`` / ``give`` from any thread; ``close`` by the owner,
    once no read runs (idempotent)."""

    def __init__(self, limit: int = BOUNCE_BUFFERS):
        self._limit = int(limit)
        self._free: list[mmap.mmap] = []  # bounce buffers not in use
        self._all: list[mmap.mmap] = []
        self._lock = threading.Lock()
        self._returned = threading.Condition(self._lock)  # a bounce buffer came back (or a reader closed)
        self._closed = False

    def take(self, alive, name: str) -> mmap.mmap:
        """A bounce buffer: a free one, a new one while fewer than ``limit`` exist, else the next one another
        read gives back.  Raises ValueError once the pool is closed or ``alive()`` (the reading file's) is
        False."""
        with self._lock:
            while True:
                if self._closed or not alive():
                    raise ValueError(f"{name}: read from a closed source")
                if self._free:
                    return self._free.pop()
                if len(self._all) < self._limit:
                    bounce = mmap.mmap(-1, BOUNCE_BYTES)  # anonymous, so page-aligned
                    self._all.append(bounce)
                    return bounce
                self._returned.wait()

    def give(self, bounce: mmap.mmap) -> None:
        """Return a buffer :meth:`take` gave."""
        with self._lock:
            self._free.append(bounce)
            self._returned.notify()

    def wake(self) -> None:
        """Wake every read waiting for a buffer (a file closed: its reads fail instead of waiting)."""
        with self._lock:
            self._returned.notify_all()

    def close(self) -> None:
        """Unmap the buffers; later reads fail.  Idempotent."""
        with self._lock:
            self._closed = True
            self._returned.notify_all()
            for b in self._all:
                b.close()
            self._all.clear()
            self._free.clear()
