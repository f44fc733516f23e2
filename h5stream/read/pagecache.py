"""The page cache: which pages of a file it holds (``mincore``), and reading byte ranges out of it.

:class:`Residency` maps a file once (a private mapping that is never touched,
so it costs no memory) and tells which pages of a byte range are cached.  The
reader uses it to decide, fill by fill, whether worker processes may read
rows straight from the page cache or whether the reader should read them
itself; :mod:`h5stream.measure` uses it to watch a file go cold.  Where
``mincore`` is missing or refuses, nothing counts as cached: the safe answer,
costing speed, never correctness.  :func:`preadv_all` is the one read loop the
reader thread and the workers share.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os

import numpy as np

_libc = None


def mincore_function():
    """libc's ``mincore`` with its argument types set, or None where there is none (loaded once)."""
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        lib = ctypes.CDLL(name, use_errno=True) if name else None
        if lib is not None and hasattr(lib, "mincore"):
            lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
            lib.mincore.restype = ctypes.c_int
        _libc = lib if lib is not None and hasattr(lib, "mincore") else False
    return _libc.mincore if _libc else None


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

    @property
    def available(self) -> bool:
        return self._base is not None

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


def preadv_all(fd: int, views: list, offset: int, path: str) -> None:
    """``preadv`` from ``offset`` until every view is full (short reads are legal); end of file first is an error."""
    while views:
        got = os.preadv(fd, views, offset)
        if got == 0:
            raise OSError(f"{path}: unexpected end of file at byte {offset} (file truncated?)")
        offset += got
        rest = []
        for v in views:
            if got >= len(v):
                got -= len(v)
            else:
                rest.append(v[got:] if got else v)
                got = 0
        views = rest
