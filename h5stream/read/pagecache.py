"""The page cache: which pages of a file it holds (``cachestat``, ``mincore``), and reading byte ranges out of it.

:class:`Residency` maps a file once (a private mapping that is never touched,
so it costs no memory) and tells which pages of a byte range are cached:
whether all are through Linux's ``cachestat`` (6.5+: one count per range,
cheaper than ``mincore``'s page by page answer where the reader spent most of
its CPU; docs/performance.md has the figures), which page each is through
``mincore``.  The
reader uses it to decide, fill by fill, whether worker processes may read
rows straight from the page cache or whether the reader should read them
itself; :mod:`h5stream.measure` uses it to watch a file go cold.  Where
``mincore`` is missing or refuses, nothing counts as cached: the safe answer,
costing speed, never correctness.  :func:`preadv_all` is the one read loop the
reader thread and the workers share.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys

import numpy as np

from h5stream.memory.rawio import libc, preadv_all  # noqa: F401 - re-exported: the reader reads through it

_libc = None
_libc_gil = None


# cachestat(2) has this number on every architecture (syscalls from Linux 5.1 on share one numbering).
_NR_CACHESTAT = 451


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64)
                for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


def _libc_handle():
    global _libc
    if _libc is None:
        _libc = libc() or False
    return _libc or None


def _libc_keeping_the_gil():
    """The C library through ``ctypes.PyDLL``: its calls keep the GIL.  For calls of a few microseconds that
    never block (``cachestat``): letting the GIL go for each hands it to another thread that waits for it, and
    taking it back then waits for that thread, a sleep and a wake-up that cost more than the call."""
    global _libc_gil
    if _libc_gil is None:
        _libc_gil = libc(keep_gil=True) or False
    return _libc_gil or None


def mincore_function():
    """libc's ``mincore`` with its argument types set, or None where there is none (loaded once)."""
    lib = _libc_handle()
    if lib is None or not hasattr(lib, "mincore"):
        return None
    fn = lib.mincore
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    fn.restype = ctypes.c_int
    return fn


class _PagesCached:
    """``cachestat`` on one file descriptor: how many pages of a byte range are cached (not thread-safe)."""

    def __init__(self, fd: int):
        lib = _libc_keeping_the_gil()
        self.fd = fd
        self._syscall = None
        if lib is None or not hasattr(lib, "syscall") or not sys.platform.startswith("linux"):
            return
        self._syscall = lib.syscall
        self._syscall.restype = ctypes.c_long
        self._range, self._stat = _CachestatRange(), _Cachestat()
        self._args = (ctypes.byref(self._range), ctypes.byref(self._stat))
        if self(0, 1) is None:  # an older kernel (ENOSYS) or a file it refuses: mincore instead
            self._syscall = None

    @property
    def available(self) -> bool:
        return self._syscall is not None

    def __call__(self, offset: int, length: int) -> int | None:
        self._range.off, self._range.len = offset, length
        if self._syscall(_NR_CACHESTAT, self.fd, *self._args, 0) != 0:
            return None
        return self._stat.nr_cache


class Residency:
    """Page-cache residency of byte ranges of one open file.  One thread at a time; :meth:`close` when done."""

    def __init__(self, fd: int):
        self._mincore = mincore_function()
        self._size = os.fstat(fd).st_size
        self._mm = self._base = None
        if self._mincore is not None and self._size > 0:
            try:
                # A private (copy-on-write) mapping is writable, so ctypes can take its address; mincore of
                # its untouched pages reports the page cache.  Nothing ever reads through it.
                self._mm = mmap.mmap(fd, self._size, access=mmap.ACCESS_COPY)
                self._buf = ctypes.c_char.from_buffer(self._mm)
                self._base = ctypes.addressof(self._buf)
            except (OSError, ValueError, TypeError):
                self._mm = self._base = None
        self._vec = (ctypes.c_ubyte * 0)()
        self._count = _PagesCached(fd)

    @property
    def available(self) -> bool:
        return self._base is not None

    @property
    def method(self) -> str | None:
        """How :meth:`cached` finds out: "cachestat", "mincore", or None (never cached)."""
        return "cachestat" if self._count.available else "mincore" if self.available else None

    def pages(self, offset: int, length: int) -> np.ndarray | None:
        """One bool per page of ``[offset, offset + length)``: in the page cache?  None when unknown."""
        if self._base is None or length <= 0 or offset < 0 or offset + length > self._size:
            return None
        start = offset - offset % mmap.PAGESIZE
        pages = (offset + length - start + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        if len(self._vec) < pages:
            self._vec = (ctypes.c_ubyte * pages)()
        if self._mincore(self._base + start, offset + length - start, self._vec) != 0:
            return None
        return (np.frombuffer(self._vec, np.uint8, pages) & 1).astype(bool)

    def cached(self, offset: int, length: int) -> bool:
        """Whether every page of ``[offset, offset + length)`` is in the page cache; False when unknown."""
        if self._count.available:
            if length <= 0 or offset < 0 or offset + length > self._size:
                return False
            first, last = offset // mmap.PAGESIZE, (offset + length - 1) // mmap.PAGESIZE
            return self._count(offset, length) == last - first + 1
        pages = self.pages(offset, length)
        return pages is not None and bool(pages.all())

    @property
    def size(self) -> int:
        return self._size

    def close(self) -> None:
        if self._mm is not None:
            self._base = None
            del self._buf
            self._mm.close()
            self._mm = None
