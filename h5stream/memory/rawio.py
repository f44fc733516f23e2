"""Reading byte ranges of a file: the one ``preadv`` loop the reader thread and the augment workers share,
and the one check of rows read against their digests (:func:`first_mismatch`).

Low-level: imports nothing from h5stream.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os

import numpy as np
import xxhash


IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") and "SC_IOV_MAX" in os.sysconf_names else 1024
"""The most buffers one ``preadv`` call takes."""


def preadv_all(fd: int, views: list, offset: int, path: str) -> None:
    """``preadv`` from ``offset`` until every view is full (short reads are legal, and any number of views:
    at most :data:`IOV_MAX` go to each call); end of file first is an error."""
    views = list(views)
    while views:
        got = os.preadv(fd, views[:IOV_MAX], offset)
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


IOVEC = np.dtype([("base", np.uintp), ("len", np.uintp)])
"""``struct iovec`` as a numpy record: an array of them is what :func:`preadv_rows` reads into."""

_preadv = None


def libc(*, keep_gil: bool = False):
    """The C library this interpreter runs on, through ``ctypes`` (``keep_gil``: ``PyDLL``, whose calls keep the
    GIL), or None where it cannot be loaded.  Its symbols are the process's own (``dlopen(NULL)``): no search for
    the library's file, which ``ctypes.util.find_library`` makes by running ``ldconfig`` in a child process (a
    copy of the training process mid-epoch, and a process more where a job may start none)."""
    try:
        return (ctypes.PyDLL if keep_gil else ctypes.CDLL)(None, use_errno=True)
    except OSError:
        return None


def _libc_preadv():
    """libc's ``preadv`` through ``ctypes.CDLL`` (the GIL is released for the call), or None where there is none."""
    global _preadv
    if _preadv is None:
        fn = getattr(libc(), "preadv", None)
        if fn is not None:
            fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong]
            fn.restype = ctypes.c_ssize_t
        _preadv = fn or False
    return _preadv or None


def can_preadv_rows() -> bool:
    """Whether :func:`preadv_rows` can run here (a C library with ``preadv``)."""
    return _libc_preadv() is not None


def preadv_rows(fd: int, iovecs: np.ndarray, first: int, count: int, row_bytes: int, offset: int, path: str,
                address: int | None = None) -> None:
    """:func:`preadv_all` of ``count`` rows of ``row_bytes`` bytes from ``offset`` on into the memory entries
    ``first, first + 1, ...`` of ``iovecs`` name (a C-contiguous array of :data:`IOVEC`, each ``row_bytes``
    long; ``address``: its ``.ctypes.data``, given by a caller that keeps it): one ``preadv`` call for up to
    :data:`IOV_MAX` rows, no Python object per row, the GIL released meanwhile.  The caller keeps that memory
    alive and writable for the call.  A short read goes on where it stopped; end of file first is an error, as
    is any failure (``OSError`` with the call's errno)."""
    fn = _libc_preadv()
    address = iovecs.ctypes.data if address is None else int(address)
    i, end = int(first), int(first) + int(count)
    while i < end:
        k = min(end - i, IOV_MAX)
        got = _call(fn, fd, address + i * IOVEC.itemsize, k, offset, path)
        offset += got
        full, done = divmod(got, row_bytes)
        i += full
        if done:  # a short read that stopped inside row i: the rest of it, then on from row i + 1
            rest = np.empty(1, IOVEC)
            rest["base"], rest["len"] = int(iovecs["base"][i]) + done, row_bytes - done
            while rest["len"][0]:
                got = _call(fn, fd, rest.ctypes.data, 1, offset, path)
                offset += got
                rest["base"] += got
                rest["len"] -= got
            i += 1


def _call(fn, fd: int, address: int, k: int, offset: int, path: str) -> int:
    """``preadv(fd, address, k, offset)``: the bytes read, at least one; ``OSError`` on failure or at end of
    file.  Interrupted by a signal before reading anything (``EINTR``), it is called again, as ``os.preadv`` is."""
    got = fn(fd, address, k, offset)
    while got < 0 and ctypes.get_errno() == errno.EINTR:
        got = fn(fd, address, k, offset)
    if got < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    if got == 0:
        raise OSError(f"{path}: unexpected end of file at byte {offset} (file truncated?)")
    return got


_PRIVATE = getattr(mmap, "MAP_PRIVATE", None)
_ANONYMOUS = getattr(mmap, "MAP_ANONYMOUS", None)


def aligned_empty(shape, dtype=np.uint8) -> np.ndarray:
    """An uninitialised array on fresh anonymous memory (:func:`private_memory`): it starts on a page boundary,
    as direct (``O_DIRECT``) reads into it require, and (its memory being no other array's) every view of it has
    it as ``.base``."""
    dtype = np.dtype(dtype)
    shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(d) for d in shape)
    return np.ndarray(shape, dtype, buffer=private_memory(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize))


def private_memory(nbytes: int) -> mmap.mmap:
    """``nbytes`` (at least 1) of fresh anonymous memory, starting on a page boundary.

    Private memory: Python's default mapping is shared memory, whose every page costs a fault through the
    shared-memory file system on first touch.  Not huge pages: on first touch they cost more where the kernel must
    find the memory.  (The figures: docs/performance.md, "Design figures".)"""
    nbytes = max(int(nbytes), 1)
    if _PRIVATE is None or _ANONYMOUS is None:  # not POSIX: the platform's own anonymous memory
        return mmap.mmap(-1, nbytes)
    return mmap.mmap(-1, nbytes, flags=_PRIVATE | _ANONYMOUS)


_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)


HUGE_PAGE_BYTES = 2 << 20
"""A transparent huge page on x86-64 and most arm64 kernels: advice on less memory than this cannot be taken."""


def advise_huge_pages(memory: mmap.mmap, start: int = 0, length: int | None = None) -> bool:
    """Ask for transparent huge pages on ``memory`` (``MADV_HUGEPAGE``), once its pages exist: the kernel's
    ``khugepaged`` then moves them onto huge pages in the background (a few seconds per 16 MiB by its default
    pace), and copies into them cost less (fewer TLB misses).  Memory advised before its first touch would fault
    huge pages in instead, which costs the first write more (the figures: docs/performance.md, "The loader
    alone").  ``start``/``length``: a part of ``memory`` only (the whole pages inside it; a part holding no huge
    page's worth is left as it is).  Whether the advice was taken: False where the platform or kernel has no huge
    pages."""
    if _MADV_HUGEPAGE is None:
        return False
    end = len(memory) if length is None else int(start) + int(length)
    first = -(-int(start) // mmap.PAGESIZE) * mmap.PAGESIZE
    last = end // mmap.PAGESIZE * mmap.PAGESIZE
    if last - first < HUGE_PAGE_BYTES:
        return False
    try:
        memory.madvise(_MADV_HUGEPAGE, first, last - first)
    except OSError:  # EINVAL: a kernel without transparent huge pages
        return False
    return True


def first_mismatch(rows, digests: np.ndarray, checked: np.ndarray | None = None) -> int:
    """Index of the first row (a buffer of its bytes) whose xxh3-64 differs from ``digests[i]``, among those
    with ``checked[i]`` (all when None); -1 when every one matches."""
    want = digests.tolist()
    check = [True] * len(want) if checked is None else checked.tolist()
    for i, (row, expected, on) in enumerate(zip(rows, want, check)):
        if on and xxhash.xxh3_64_intdigest(row) != expected:
            return i
    return -1
