"""Byte sources: where the reader thread gets a store's bytes, by offset.

The reader reads an uncompressed store's pixels and labels by byte offset
(:mod:`h5stream.read.locate` finds them once).  A :class:`ByteSource` serves
those reads; the reader keeps ``max_in_flight`` of them in flight.  Optional
extras, looked up with ``getattr``: ``cached(offset, length)`` (page-cache
residency) and ``advise_willneed(offset, length)`` (read-ahead advice).

Three sources; :func:`open_source` picks one:

* :class:`LocalFile` reads with ``preadv`` through the page cache, which
  keeps what it reads for the next epoch.
* :class:`DirectFile` reads with ``O_DIRECT``, past the page cache, for a
  store the page cache cannot keep (larger than the memory it may use): there
  the cache only costs -- a kernel copy of every byte, read-ahead, and
  reclaiming pages to make room, which evicts pages read ahead but not yet
  used so that they are read twice.  ``O_DIRECT`` needs the file offset, the
  length and the memory address aligned to the device's block.  Rows of a
  store made with page-aligned chunks (every new store) whose size is a
  multiple of the block are read in place, straight into the batches; other
  reads take the aligned span around the wanted bytes into a page-aligned
  bounce buffer and copy them out.
* :class:`h5stream.remote.source.RemoteSource` reads a URL (ranged
  requests, several in flight), through the local disk cache of
  :mod:`h5stream.remote.cache` where the options name a cache folder.

:func:`use_direct_io` decides between the two local ones
(``direct_io="auto"``: the store is larger than the memory the page cache
could use for it).
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
import weakref
from collections.abc import Sequence
from typing import Protocol

from h5stream.memory.rawio import can_preadv_rows, preadv_all, preadv_rows
from h5stream.errors import ConfigError
from h5stream.read.bounce import BOUNCE_BUFFERS, BOUNCE_BYTES, BouncePool
from h5stream.read.pagecache import Residency
from h5stream.read.runs import aligned_span, inner_ends

_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", None)  # Linux: a read that fails instead of waiting for the disk


_O_DIRECT = getattr(os, "O_DIRECT", None)

DIRECT_ALIGN = 4096
"""Alignment of direct reads (offset, length, memory): a multiple of every common device block size."""

IN_PLACE_ALIGN = 512
"""Alignment a read must have (offset, every buffer's length) to be tried in place: the smallest device block.
A device that needs more refuses the read (``EINVAL``, before any I/O) and the bounce buffer takes it."""

IN_PLACE_REFUSALS = 4
"""Refused in-place reads after which a :class:`DirectFile` stops trying them."""

DIRECT_MIN_BYTES = 64 << 10
"""Smaller reads (labels, a few rows) go through the page cache: not worth a bounce buffer."""

DIRECT_IO_SETTINGS = ("auto", True, False)

DIRECT_IN_FLIGHT = 8
"""Direct reads in flight: there is no kernel read-ahead to keep the device's queue filled.  Reads that land
in place need no memory of their own, so more of them can be in flight than there are bounce buffers."""

DIRECT_IO_BYTES = BOUNCE_BUFFERS * BOUNCE_BYTES
"""Memory a :class:`DirectFile` holds at most: its bounce buffers."""


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
        """Idempotent.  Called once the reads have ended, unless the source says ``close_while_reading = True``
        (then from any thread, while reads are in flight: what the source holds is let go at once, and the reads
        still in flight, or made later, raise)."""


def close_while_reading(source) -> None:
    """Close ``source`` now if it may be closed while its reads are in flight (``close_while_reading``, see
    :class:`ByteSource`); else leave it to its owner, once its reads end.  Any thread."""
    if source is not None and getattr(source, "close_while_reading", False):
        source.close()


def open_source(path: str, *, direct_io: bool = False, remote=None, bounces: BouncePool | None = None
                ) -> ByteSource:
    """The byte source for ``path``: for a URL a remote source with the ``remote`` options (see
    :class:`h5stream.remote.RemoteOptions`); else :class:`DirectFile` when ``direct_io`` (its bounce buffers
    taken from ``bounces`` when given), :class:`LocalFile` when not."""
    from h5stream.remote.config import is_url, remote_options

    if is_url(path):
        from h5stream.remote.cache import open_url

        return open_url(path, remote_options(remote))
    return DirectFile(path, bounces) if direct_io else LocalFile(path)


class LocalFile:
    """A local file read through the page cache.  ``readinto`` from any thread; ``cached`` and
    ``advise_willneed`` from one thread at a time."""

    max_in_flight = 2
    direct = False

    def __init__(self, path: str):
        self.name = path
        fd = os.open(path, os.O_RDONLY)
        try:
            self.size = os.fstat(fd).st_size
            self._residency = Residency(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._probe = bytearray(1)  # destination of the one-byte page-cache probes
        self._finalizer = weakref.finalize(self, _release, fd, self._residency)

    def readinto(self, offset: int, buffers: Sequence[memoryview]) -> None:
        preadv_all(self._fd, buffers, offset, self.name)

    def readinto_rows(self, offset: int, iovecs, first: int, count: int, row_bytes: int, address: int) -> None:
        """:meth:`readinto` of ``count`` rows into the memory entries ``first, ...`` of an array of ``struct
        iovec`` name (see :func:`~h5stream.memory.rawio.preadv_rows`); the caller keeps it alive."""
        preadv_rows(self._fd, iovecs, first, count, row_bytes, offset, self.name, address)

    @property
    def reads_rows(self) -> bool:
        """Whether :meth:`readinto_rows` can run here."""
        return can_preadv_rows()

    def cached(self, offset: int, length: int) -> bool:
        """Whether ``[offset, offset + length)`` is in the page cache: every page of it where
        ``cachestat`` / ``mincore`` can tell, else one byte of its first and of its last page that it does not
        share with a neighbour (:func:`~h5stream.read.runs.inner_ends`)."""
        if self._residency.method is not None:
            return self._residency.cached(offset, length)
        first, last = inner_ends(offset, length, mmap.PAGESIZE)
        return self._byte_cached(first) and self._byte_cached(last)

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


class DirectFile:
    """A local file read with ``O_DIRECT`` (past the page cache): in place where the read is aligned, else
    through page-aligned bounce buffers; reads under :data:`DIRECT_MIN_BYTES` go through the page cache.
    ``readinto`` from any thread (a read that bounces holds one of at most :data:`BOUNCE_BUFFERS` buffers
    while it runs).  Raises OSError where the file system refuses ``O_DIRECT``."""

    max_in_flight = DIRECT_IN_FLIGHT
    direct = True

    def __init__(self, path: str, bounces: BouncePool | None = None):
        if _O_DIRECT is None:
            raise OSError(errno.EINVAL, "O_DIRECT is not available on this platform", path)
        self.name = path
        fd = os.open(path, os.O_RDONLY)
        try:
            dfd = os.open(path, os.O_RDONLY | _O_DIRECT)
        except BaseException:
            os.close(fd)
            raise
        self.size = os.fstat(fd).st_size
        self._fd, self._dfd = fd, dfd
        # The bounce buffers: this file's own, or a pool the parts of a set share (closed by its owner).
        self._bounces = BouncePool() if bounces is None else bounces
        self._lock = threading.Lock()
        self.in_place_bytes = 0  # bytes read straight into the callers' buffers
        self._refusals = 0  # in-place reads the device refused
        self._finalizer = weakref.finalize(self, _release_direct, fd, dfd, self._bounces if bounces is None else None)

    def readinto(self, offset: int, buffers: Sequence[memoryview]) -> None:
        total = sum(len(b) for b in buffers)
        if total < DIRECT_MIN_BYTES:
            preadv_all(self._fd, buffers, offset, self.name)
            return
        if self._refusals < IN_PLACE_REFUSALS and offset + total <= self.size and _aligned(offset, buffers):
            if not self._finalizer.alive:
                raise ValueError(f"{self.name}: read from a closed source")
            try:
                preadv_all(self._dfd, buffers, offset, self.name)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                with self._lock:  # a buffer's address (or this device's block) does not suit: bounce
                    self._refusals += 1
            else:
                with self._lock:
                    self.in_place_bytes += total
                return
        bounce = self._bounces.take(lambda: self._finalizer.alive, self.name)
        try:
            self._read_through(bounce, offset, total, buffers)
        finally:
            self._bounces.give(bounce)

    def _read_through(self, bounce: mmap.mmap, offset: int, total: int, buffers: Sequence[memoryview]) -> None:
        """Read ``[offset, offset + total)`` aligned span by aligned span into ``bounce`` and copy the wanted
        bytes into ``buffers`` in order."""
        view = memoryview(bounce)
        try:
            end = offset + total
            pos, i, within = offset, 0, 0  # next byte wanted; buffer being filled and bytes of it filled
            while pos < end:
                start, stop = aligned_span(pos, end - pos, DIRECT_ALIGN)
                stop = min(stop, start + BOUNCE_BYTES)
                got = self._read_aligned(view, start, stop - start)
                have = min(start + got, end)
                if have <= pos:
                    raise OSError(f"{self.name}: unexpected end of file at byte {pos} (file truncated?)")
                k, src = pos - start, have - start
                while k < src:
                    b = buffers[i]
                    m = min(len(b) - within, src - k)
                    b[within:within + m] = view[k:k + m]
                    k, within = k + m, within + m
                    if within == len(b):
                        i, within = i + 1, 0
                pos = have
        finally:
            view.release()

    def _read_aligned(self, view: memoryview, start: int, length: int) -> int:
        """Bytes read into ``view[:length]`` from ``start`` with ``O_DIRECT`` (fewer only at the end of the file)."""
        done = 0
        while done < length:
            got = os.preadv(self._dfd, [view[done:length]], start + done)
            done += got
            if got == 0 or done % DIRECT_ALIGN:
                break  # the end of the file: nothing more, or a tail that ends off the alignment
        return done

    def close(self) -> None:
        self._finalizer()
        self._bounces.wake()  # a read waiting for a bounce buffer fails instead of waiting



def _aligned(offset: int, buffers: Sequence[memoryview]) -> bool:
    """Whether a read at ``offset`` into ``buffers`` has the offset and lengths an in-place direct read needs
    (the addresses are the device's to judge)."""
    return offset % IN_PLACE_ALIGN == 0 and all(len(b) % IN_PLACE_ALIGN == 0 for b in buffers)


def use_direct_io(setting, file_bytes: int, cacheable_bytes: int | None) -> bool:
    """Whether to read a store of ``file_bytes`` with ``O_DIRECT``: ``setting`` True or False as given;
    ``"auto"`` when the store is larger than ``cacheable_bytes``, the memory the page cache could keep of it
    (None: unknown, so no)."""
    if setting == "auto":
        return cacheable_bytes is not None and file_bytes > cacheable_bytes
    return bool(setting)


def cacheable_bytes() -> int | None:
    """How much the page cache could hold now: the memory available to new pages (``MemAvailable``, which
    counts cached files as reclaimable), capped by this cgroup's memory limit less its anonymous memory.
    None where that cannot be read (not Linux)."""
    available = _meminfo_bytes("MemAvailable")
    if available is None:
        return None
    room = _cgroup_room()
    return available if room is None else min(available, room)


def check_direct_io(setting) -> object:
    """``setting`` if it is one of :data:`DIRECT_IO_SETTINGS`, else :class:`ConfigError`."""
    if not any(setting is s or (isinstance(setting, str) and setting == s) for s in DIRECT_IO_SETTINGS):
        raise ConfigError(f"direct_io must be 'auto', True or False, got {setting!r}")
    return setting


def resolve_direct_io(path: str, setting) -> bool:
    """Whether a stream of the store at ``path`` reads it with ``O_DIRECT`` (see :func:`use_direct_io`).

    ``True`` on a file system that refuses ``O_DIRECT`` raises :class:`ConfigError` (``"auto"`` falls
    back to the page cache there).
    """
    setting = check_direct_io(setting)
    if setting is False:
        return False
    if setting == "auto" and not use_direct_io("auto", os.path.getsize(path), cacheable_bytes()):
        return False
    refused = _direct_refused(path)
    if refused is None:
        return True
    if setting is True:
        raise ConfigError(f"{path}: direct_io=True, but this file system refuses O_DIRECT reads ({refused}); "
                          "use direct_io='auto' or False")
    return False


def resolve_direct_io_parts(paths, setting) -> tuple[bool, ...]:
    """Whether a stream of a set of parts reads each part with ``O_DIRECT``; ``paths[k]``: part ``k``'s local
    path, None for a part at a URL (never direct).

    The set is one store of its parts' rows, so ``"auto"`` decides as for one store of them (see
    :func:`use_direct_io`): past the page cache when the local parts together are larger than the page cache
    could keep; then each local part whose file system takes ``O_DIRECT`` is read so, the others through the
    page cache.  ``True`` reads every local part so, and raises :class:`ConfigError` naming a part whose file
    system refuses it, or a set with no local part.
    """
    setting = check_direct_io(setting)
    local = [p for p in paths if p is not None]
    if setting is True and not local:
        raise ConfigError(f"{paths[0]}: direct_io=True is for local stores, and every part of this set is at a "
                          "URL; leave direct_io at 'auto'")
    if setting is False or not local:
        return tuple(False for _ in paths)
    if setting == "auto" and not use_direct_io("auto", sum(os.path.getsize(p) for p in local), cacheable_bytes()):
        return tuple(False for _ in paths)
    out = []
    for path in paths:
        refused = None if path is None else _direct_refused(path)
        if refused is not None and setting is True:
            raise ConfigError(f"{path}: direct_io=True, but the file system of this part refuses O_DIRECT reads "
                              f"({refused}); use direct_io='auto' or False")
        out.append(path is not None and refused is None)
    return tuple(out)


def _direct_refused(path: str) -> str | None:
    """Why the file at ``path`` cannot be read with ``O_DIRECT``, or None when it can."""
    if _O_DIRECT is None:
        return "not available on this platform"
    try:
        fd = os.open(path, os.O_RDONLY | _O_DIRECT)
    except OSError as exc:
        return exc.strerror or str(exc)
    try:
        buf = mmap.mmap(-1, DIRECT_ALIGN)
        try:
            os.preadv(fd, [buf], 0)
        finally:
            buf.close()
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        os.close(fd)
    return None


def _meminfo_bytes(key: str) -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                if name == key:
                    return int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_room() -> int | None:
    """Bytes of this process's cgroup memory limit (v2 ``memory.max``, or v1's effective limit, its ancestors'
    included) not taken by anonymous memory, or None without a limit."""
    try:
        with open("/proc/self/cgroup") as fh:
            v2, v1 = cgroup_paths(fh.read())
        if v2 is not None and os.path.exists(os.path.join("/sys/fs/cgroup", v2.lstrip("/"), "memory.max")):
            base = os.path.join("/sys/fs/cgroup", v2.lstrip("/"))
            with open(os.path.join(base, "memory.max")) as fh:
                limit = fh.read().strip()
            if limit == "max":
                return None
            with open(os.path.join(base, "memory.stat")) as fh:
                anon = next(int(line.split()[1]) for line in fh if line.startswith("anon "))
            return max(0, int(limit) - anon)
        if v1 is not None:
            with open(os.path.join("/sys/fs/cgroup/memory", v1.lstrip("/"), "memory.stat")) as fh:
                return v1_room(fh.read())
    except (OSError, ValueError, StopIteration, IndexError):
        return None
    return None


def cgroup_paths(proc_cgroup: str) -> tuple[str | None, str | None]:
    """``(v2 path, v1 memory path)`` of a process from its ``/proc/PID/cgroup`` text (pure); None where absent."""
    v2 = v1 = None
    for line in proc_cgroup.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    return v2, v1


V1_NO_LIMIT = 1 << 62
"""cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit value: anything this large is none."""


def v1_room(memory_stat: str) -> int | None:
    """Bytes a cgroup v1 memory limit leaves to the page cache, from its ``memory.stat`` text (pure): the
    effective limit (``hierarchical_memory_limit``, the smallest of the cgroup's and its ancestors') less the
    anonymous memory charged to it (``total_rss``); None without a limit."""
    stat = {}
    for line in memory_stat.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            stat[key] = int(value)
    limit = stat.get("hierarchical_memory_limit")
    if limit is None or limit >= V1_NO_LIMIT:
        return None
    return max(0, limit - stat.get("total_rss", stat.get("rss", 0)))


def _release(fd: int, residency: Residency) -> None:
    try:
        residency.close()
    finally:
        os.close(fd)


def _release_direct(fd: int, dfd: int, bounces: BouncePool | None) -> None:
    try:
        if bounces is not None:
            bounces.close()
    finally:
        os.close(dfd)
        os.close(fd)
