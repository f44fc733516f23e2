"""Byte sources: where the reader thread gets a store's bytes, by offset.

The reader reads an uncompressed store's pixels and labels by byte offset
(:mod:`h5stream.read.locate` finds them once).  A :class:`ByteSource` serves
those reads; the reader keeps ``max_in_flight`` of them in flight.  Optional
extras, looked up with ``getattr``: ``cached(offset, length)`` (page-cache
residency) and ``advise_willneed(offset, length)`` (read-ahead advice).

:class:`LocalFile` is a file on this machine, read with ``preadv`` through
the page cache.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from typing import Protocol

from h5stream.read.pagecache import Residency, preadv_all

_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", None)  # Linux: a read that fails instead of waiting for the disk

IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") and "SC_IOV_MAX" in os.sysconf_names else 1024


class ByteSource(Protocol):
    """Random-access, read-only bytes of one store file.  Reads may be called from several threads at once."""

    name: str  # the path or URL, for messages
    size: int  # bytes in the file (as of open)
    max_in_flight: int  # how many reads the reader should keep in flight at once

    def readinto(self, offset: int, buffers: Sequence[memoryview]) -> None:
        """Fill ``buffers`` completely, in order, with the bytes at ``offset`` onward (one contiguous range of
        sum(len(b)) bytes: preadv semantics).  Raises OSError (an h5stream error subclassing it where the cause
        is known) on a short read or failure; never returns partially filled buffers."""

    def close(self) -> None:
        """Idempotent."""


class LocalFile:
    """A local file read through the page cache.  ``readinto`` from any thread; ``cached`` and
    ``advise_willneed`` from one thread at a time.

    ``exact_residency``: :meth:`cached` looks at every page of a range (``cachestat`` / ``mincore``, see
    :class:`~h5stream.read.pagecache.Residency`) instead of its two end bytes.
    """

    max_in_flight = 2

    def __init__(self, path: str, *, exact_residency: bool = False):
        self.name = path
        fd = os.open(path, os.O_RDONLY)
        try:
            self.size = os.fstat(fd).st_size
            self._residency = Residency(fd) if exact_residency else None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._probe = bytearray(1)  # destination of the one-byte page-cache probes
        self._finalizer = weakref.finalize(self, _release, fd, self._residency)

    def readinto(self, offset: int, buffers: Sequence[memoryview]) -> None:
        buffers = list(buffers)
        for i in range(0, len(buffers), IOV_MAX):
            part = buffers[i:i + IOV_MAX]
            preadv_all(self._fd, part, offset, self.name)
            offset += sum(len(b) for b in part)

    def cached(self, offset: int, length: int) -> bool:
        """Whether ``[offset, offset + length)`` is in the page cache: every page of it where
        ``cachestat`` / ``mincore`` can tell (``exact_residency``), else its two end bytes."""
        if self._residency is not None and self._residency.method is not None:
            return self._residency.cached(offset, length)
        return self._byte_cached(offset) and self._byte_cached(offset + length - 1)

    def _byte_cached(self, offset: int) -> bool:
        """Whether the byte at ``offset`` is in the page cache (a read that must not wait); False when unknown."""
        if _RWF_NOWAIT is None:
            return False
        try:
            return os.preadv(self._fd, [self._probe], offset, _RWF_NOWAIT) == 1
        except OSError:  # EAGAIN: not cached; EOPNOTSUPP and the like: cannot tell
            return False

    def advise_willneed(self, offset: int, length: int) -> None:
        """Ask the kernel to start reading ``[offset, offset + length)`` into the page cache."""
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._fd, offset, length, os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        self._finalizer()


def _release(fd: int, residency: Residency | None) -> None:
    try:
        if residency is not None:
            residency.close()
    finally:
        os.close(fd)
