"""Keeping a file out of the page cache while a measurement reads it, as for a file larger than RAM.

:func:`evict_from_page_cache` / :func:`evict_pages` / :func:`cached_pages` /
:func:`cached_fraction` / :class:`PeriodicEvictor` -- drop a file (or pages of
it) from the OS page cache so reads hit the disk, and check that it worked.
Linux is the target; elsewhere they return ``False`` / ``None`` / 0 instead of
failing.
"""

from __future__ import annotations

import mmap
import os
import threading

import numpy as np

from h5stream.errors import ConfigError, StoreNotFoundError
from h5stream.read.pagecache import Residency, mincore_function

EVICTOR_THREAD = "h5stream-evictor"


def evict_from_page_cache(path: str | os.PathLike) -> bool:
    """Ask the kernel to drop ``path``'s pages from the page cache; ``True`` if the call is supported.

    Dirty pages cannot be dropped, so the file is fsync'ed first.  Pages mapped
    by a process, or on tmpfs, stay; check with :func:`cached_fraction`.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise StoreNotFoundError(f"{path}: no such file to evict from the page cache")
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            os.fsync(fd)
        except OSError:
            pass  # some filesystems refuse fsync on a read-only descriptor; clean pages still drop
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def cached_pages(path: str | os.PathLike) -> np.ndarray | None:
    """One bool per page of ``path``: is it in the page cache now (``mincore``)?  ``None`` where unsupported."""
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        residency = Residency(fd)
        try:
            if residency.size == 0:
                return np.zeros(0, dtype=bool) if mincore_function() is not None else None
            return residency.pages(0, residency.size)
        finally:
            residency.close()
    finally:
        os.close(fd)


def cached_fraction(path: str | os.PathLike) -> float | None:
    """Fraction of ``path``'s pages now in the page cache, or ``None`` where unsupported."""
    pages = cached_pages(path)
    if pages is None:
        return None
    return float(pages.mean()) if pages.size else 0.0


def evict_pages(path: str | os.PathLike, pages: np.ndarray) -> int:
    """Drop the pages of ``path`` where ``pages`` is True from the page cache; returns the ranges advised."""
    pages = np.asarray(pages, dtype=bool)
    if not pages.any() or not hasattr(os, "posix_fadvise"):
        return 0
    # int8 throughout: one byte per page, so a benchmark's own memory hardly grows with the file's size.
    padded = np.zeros(pages.size + 2, dtype=np.int8)
    padded[1:-1] = pages
    edges = np.diff(padded)
    starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        try:
            os.fsync(fd)  # dirty pages cannot be dropped
        except OSError:
            pass
        for a, b in zip(starts, stops):
            os.posix_fadvise(fd, int(a) * mmap.PAGESIZE, int(b - a) * mmap.PAGESIZE, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return len(starts)


class PeriodicEvictor:
    """Owns a thread that keeps ``path`` cold while a benchmark runs; :meth:`close` is idempotent.

    Evicts the whole file on start.  Then, every ``interval_s``, it drops the
    pages that were already cached at the previous tick: a page read (or read
    ahead on request) stays cached for one to two intervals, then goes.  That
    is how a file larger than RAM behaves under LRU -- recently read pages
    stay, old ones do not -- so re-reads and later epochs hit the disk, while
    read-ahead that a reader asked for is not thrown away before it is used.
    Where ``mincore`` is unavailable it drops the whole file every tick.
    """

    def __init__(self, path: str | os.PathLike, interval_s: float = 1.0):
        if not interval_s > 0:
            raise ConfigError(f"interval_s must be > 0, got {interval_s!r}")
        self.path = os.fspath(path)
        self.interval_s = float(interval_s)
        self.evictions = 0
        evict_from_page_cache(self.path)
        self._previous = cached_pages(self.path)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=EVICTOR_THREAD, daemon=True)
        self._thread.start()

    def tick(self) -> None:
        """One eviction round (the thread calls this every ``interval_s``)."""
        now = cached_pages(self.path)
        if now is None or self._previous is None or now.size != self._previous.size:
            evict_from_page_cache(self.path)
            now = cached_pages(self.path)
        else:
            old = now & self._previous
            evict_pages(self.path, old)
            now = now & ~old
        self._previous = now
        self.evictions += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except OSError:
                return  # the file went away: nothing left to keep cold

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> PeriodicEvictor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
