"""A local disk cache for URL stores: what a stream fetched once is read from local disk afterwards.

:class:`CachedSource` wraps a :class:`~h5stream.remote.source.RemoteSource` with the same byte-source contract.
The object is cut into pieces of ``piece_bytes`` (8 MiB by default: S3's guidance for ranged GETs) at fixed
offsets; a read takes each piece it touches from the cache folder, fetching a missing piece whole, in one request,
into a file of its own first.  Later reads of it (later epochs, other processes on the node, the next run) are
local reads through the page cache.

Layout: ``CACHE_DIR/objects/KEY/N.piece`` for piece ``N`` of the object whose identity (URL, ETag, size,
modification time as of open) and piece size hash to ``KEY``: a changed object has another key and never serves
old bytes (an object with neither ETag nor modification time is not cached: one warning line), and sources
cutting one object into pieces of different sizes keep apart (piece ``N`` is other bytes for each).  A piece file
holds the piece's bytes and a trailer of :data:`TRAILER_BYTES` (magic, xxh3-64 digest of the bytes, their
count), written at fill.

Guarantees:

* A piece is filled as ``N.tmp`` (space reserved with ``posix_fallocate`` first, the response written part by
  part as it arrives, :mod:`h5stream.remote.piecefile`) and renamed to ``N.piece`` once whole: a process killed
  mid-fill leaves at most a ``.tmp``, never a piece.  Each source checks a piece's trailer (size, magic and digest
  of its bytes) the first time it reads it, unless it filled the piece itself; one that fails is removed and
  fetched again.  No ``fsync``: a process killed after the rename leaves its written pages in the page cache,
  whole; a machine that crashes before writing them back may leave a piece of zeros or stale blocks, which fails
  the trailer check of the next source that reads it (every source after a reboot is a new one) and is fetched
  again.  The ``fsync`` of the piece and of its folder cost 0.1 CPU-s per GB and held each prefetch thread
  while the disk wrote (docs/performance.md, "The default cached stream").
* The pieces the reader says it will read (``advise_willneed``) are fetched ahead by :mod:`h5stream.remote.prefetch`
  threads, ``max_in_flight`` GETs in flight.
* Processes sharing a cache folder fetch a piece once: the filler holds ``flock`` on ``N.lock``, and a process
  that needs the piece meanwhile waits for that lock, then reads the finished piece.  Threads of one process wait
  on a lock of their own per piece first.
* The folder holds at most about ``limit`` bytes: when a process's count of them passes the limit it rescans the
  folder and removes the pieces least recently used (their file's modification time, touched on use at most once
  a minute per source) until 7/8 of the limit remain.  Another process's fills since its last scan are not in its
  count, so several processes filling at once may pass the limit by about 1/8 of it each.  A removed piece still
  open elsewhere stays readable there (its bytes never change).
* A stream reading through the cache checks the rows against the store's block checksums as for a local file
  (``verify_reads="once"``: each block on its first read), not on every read as over the network.
* A local write that fails (disk full ``ENOSPC``, quota ``EDQUOT``, file size limit ``EFBIG``, a read-only or
  forbidden folder, a file where the folder should be) warns once, in one line, and the stream goes on uncached,
  reading every byte from the server.
* ``close`` lets go of what the source holds in the folder at once, however long a fetch hangs on a stalled
  server: the fills in flight give up their locks and half-written files (:mod:`h5stream.remote.cache_fill`), so
  another process waiting for such a piece fetches it now; the stalled fetch, answered later, writes nothing.

Thread-safety: ``readinto`` from any number of threads at once; ``close`` from any thread, even while reads are
in flight (they raise), idempotent.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Sequence

from h5stream.memory.rawio import preadv_all
from h5stream.remote.cache_evict import evict
from h5stream.remote.cache_fill import MAGIC, TRAILER, TRAILER_BYTES, Filler, closed_error
from h5stream.remote.piecefile import piece_digest
from h5stream.remote.prefetch import Prefetcher
from h5stream.remote.config import (  # noqa: F401 - DEFAULT_LIMIT, default_cache_dir, index_memory_bytes re-exported
    DEFAULT_LIMIT,
    PIECE_BYTES,
    default_cache_dir,
    index_memory_bytes,
)

TOUCH_EVERY_S = 60.0
"""A piece read again is marked used (its modification time) at most this often per source."""

OPEN_PIECES = 32
"""Pieces a source keeps open between reads (a descriptor each), so a read of a cached piece is one ``preadv``."""

CACHED_READS_IN_FLIGHT = 2
"""Reads the reader keeps going at once through a caching source: they copy pieces out of the page cache, as a
local file's do (:class:`~h5stream.read.source.LocalFile`), while the prefetch threads keep the server's
``max_in_flight`` GETs going.  More reader threads only woke and switched more on a machine's few cores (a first
epoch over 8 of them: 1.1x the CPU per GB, 0.9x the rate; docs/performance.md, "The default cached stream")."""

PREFETCH_AHEAD_MOST = 4096
"""Pieces prefetched and not yet read at most (also at most half the cache's limit): on disk, not in memory."""

GIVE_UP_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM,
                            errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTDIR, errno.EEXIST})
"""Local failures after which a source stops caching (one warning) instead of failing the stream."""


def object_key(url: str, etag: str | None, size: int, last_modified, piece_bytes: int) -> str | None:
    """The folder name of one version of an object cut into pieces of ``piece_bytes``: a hash of its URL, ETag,
    size, modification time and the piece size; None when it has neither ETag nor modification time (a new
    version could not be told from the old)."""
    if not etag and last_modified is None:
        return None
    ident = "\0".join((url, etag or "", str(int(size)), str(last_modified or ""), str(int(piece_bytes))))
    return hashlib.sha256(ident.encode()).hexdigest()[:40]


def piece_spans(offset: int, length: int, piece_bytes: int) -> list[tuple[int, int, int]]:
    """``(piece, offset within it, bytes)`` of each piece that ``[offset, offset + length)`` touches (pure)."""
    spans = []
    pos, end = offset, offset + length
    while pos < end:
        index, within = divmod(pos, piece_bytes)
        n = min(end - pos, piece_bytes - within)
        spans.append((index, within, n))
        pos += n
    return spans


def slice_views(views: Sequence[memoryview], skip: int, n: int) -> list[memoryview]:
    """The views covering bytes ``[skip, skip + n)`` of ``views`` laid end to end (views of them, no copy)."""
    out = []
    for v in views:
        if n <= 0:
            break
        if skip >= len(v):
            skip -= len(v)
            continue
        k = min(len(v) - skip, n)
        out.append(v[skip:skip + k])
        n -= k
        skip = 0
    return out


def trailer_ok(piece: memoryview, expected: int) -> bool:
    """Whether a piece file's bytes (piece and trailer) are whole: right size, magic and digest (pure)."""
    if len(piece) != expected + TRAILER_BYTES:
        return False
    magic, digest, count = TRAILER.unpack(piece[expected:])
    return magic == MAGIC and count == expected and piece_digest(piece[:expected]) == digest


def open_url(url: str, options):
    """The byte source of a stream over ``url`` with ``options`` (a
    :class:`~h5stream.remote.config.RemoteOptions`): a :class:`CachedSource` where ``options.cache_dir`` names a
    folder, else the plain :class:`~h5stream.remote.source.RemoteSource`."""
    from h5stream.remote.source import RemoteSource

    remote = RemoteSource(url, options)
    if options.cache_dir is None:
        return remote
    try:
        return CachedSource(remote, options.cache_dir, options.cache_limit, options.cache_piece)
    except BaseException:
        remote.close()
        raise


class CachedSource:
    """The bytes of ``remote`` (a :class:`~h5stream.remote.source.RemoteSource`, owned: closed with this) through
    the disk cache at ``cache_dir``.  ``requests`` and ``bytes_read`` are the server's (``remote``'s counters);
    ``pieces_fetched`` counts the pieces this source fetched, ``caching`` whether it still caches."""

    def __init__(self, remote, cache_dir: str, limit: int = DEFAULT_LIMIT, piece_bytes: int = PIECE_BYTES):
        self.remote = remote
        self.name = remote.name
        self.size = remote.size
        self.piece_bytes = int(piece_bytes)
        self.limit = int(limit)
        self.cache_dir = cache_dir
        self.pieces_fetched = 0
        self._lock = threading.Lock()
        self._closed = False
        self._used: dict[int, float] = {}  # pieces checked by this source -> when last marked used
        self._open: OrderedDict[int, list[int]] = OrderedDict()  # piece -> [descriptor, users], checked pieces
        self._estimate: int | None = None  # bytes in the folder as of the last scan, plus this source's fills
        self._filler = Filler(remote, self._path, self._piece_length, self.piece_bytes, lambda: self.caching,
                              self._give_up, self._filled)
        self._prefetch = Prefetcher(self._prefetch_fill, remote.max_in_flight,
                                    min(PREFETCH_AHEAD_MOST, self.limit // 2 // self.piece_bytes))
        key = object_key(remote.name, getattr(remote, "etag", None), remote.size,
                         getattr(remote, "last_modified", None), self.piece_bytes)
        self.folder = None if key is None else os.path.join(cache_dir, "objects", key)  # None: caching is off
        self._root = self.folder  # stays, for paths built while another thread turns caching off
        if key is None:
            warnings.warn(f"{self.name}: the server sends neither an ETag nor a Last-Modified for it, so a changed "
                          "object could not be told from the one cached; streaming on without the cache (every "
                          "read from the server)", stacklevel=2)
        if self.folder is not None:
            try:
                for folder in (os.path.dirname(self.folder), self.folder):  # links there are not the cache's
                    if os.path.islink(folder):
                        os.unlink(folder)
                os.makedirs(self.folder, exist_ok=True)
            except OSError as exc:
                self._give_up(exc)

    @property
    def max_in_flight(self) -> int:
        """Reads the reader should keep going now: :data:`CACHED_READS_IN_FLIGHT` while caching, the server's
        ``max_in_flight`` once not (the reader then starts more I/O threads).  Any thread."""
        server = self.remote.max_in_flight
        return min(server, CACHED_READS_IN_FLIGHT) if self.folder is not None else server

    @property
    def caching(self) -> bool:
        return self.folder is not None

    @property
    def local_copy(self) -> bool:
        """Whether reads come from the immutable, checked pieces of a local copy (so ``verify_reads="once"``
        treats the store as a local file: each block checked on its first read)."""
        return self.folder is not None

    @property
    def requests(self) -> int:
        return self.remote.requests

    @property
    def bytes_read(self) -> int:
        return self.remote.bytes_read

    @property
    def landed(self) -> int:
        """Bytes received from the server so far, pieces fetched ahead included (progress: any thread)."""
        return self.remote.landed

    close_while_reading = True
    """:meth:`close` may be called while reads are in flight, from another thread (the reader's close does,
    where a read hangs): it lets go of the cache at once, and the reads still running raise."""

    def close(self) -> None:
        """Let go of the fills in flight (:meth:`Filler.close <h5stream.remote.cache_fill.Filler.close>`: their
        locks, half-written files and descriptors, at once, however long their fetches hang), stop prefetching,
        close the pieces held open (each once no read uses it) and the remote source.  Reads still in flight, or
        made later, raise.  Any thread; idempotent."""
        self._filler.close()
        with self._lock:
            self._closed = True
            idle = [i for i, (_, users) in self._open.items() if users == 0]
            fds = [self._open.pop(i)[0] for i in idle]
        for fd in fds:
            os.close(fd)
        self._prefetch.close()
        self.remote.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def readinto(self, offset: int, buffers: Sequence) -> None:
        """Fill ``buffers`` with the bytes at ``offset`` onward (``preadv`` semantics), piece by piece from the
        cache, fetching the missing pieces.  Raises what :meth:`RemoteSource.readinto` raises."""
        from h5stream.remote.source import checked_range

        if self.folder is None:
            self.remote.readinto(offset, buffers)
            return
        views, offset, length = checked_range(self.name, self.size, offset, buffers)
        if self._closed:
            raise closed_error(self.name)
        pos = 0
        for index, within, n in piece_spans(offset, length, self.piece_bytes):
            part = slice_views(views, pos, n)
            if not self._read_piece(index, within, part):
                self.remote.readinto(offset + pos, part)
            pos += n

    def advise_willneed(self, offset: int, length: int) -> None:
        """The reader will read ``[offset, offset + length)`` soon: queue the pieces it touches that are not in
        the cache for the prefetch threads (:mod:`h5stream.remote.prefetch`), in this order.  Reader thread."""
        folder = self.folder
        if folder is None or length <= 0:
            return
        offset, length = max(0, int(offset)), min(int(length), self.size - max(0, int(offset)))
        missing = []
        for index, _, _ in piece_spans(offset, length, self.piece_bytes):
            with self._lock:
                held = index in self._open
            if not held and not os.path.exists(os.path.join(folder, f"{index}.piece")):
                missing.append(index)
        if missing:
            self._prefetch.want(missing)

    @property
    def prefetched(self) -> int:
        """Pieces the prefetch threads filled or found filled."""
        return self._prefetch.prefetched

    def _piece_length(self, index: int) -> int:
        return min(self.piece_bytes, self.size - index * self.piece_bytes)

    def _path(self, index: int, kind: str) -> str:
        return os.path.join(self._root, f"{index}.{kind}")

    def _read_piece(self, index: int, within: int, part: list[memoryview]) -> bool:
        """Read ``part`` from piece ``index`` at ``within``, filling the piece first if missing; False when
        the cache is off (the caller reads from the server)."""
        for _ in range(3):
            fd = self._take_open(index)
            if fd is None:
                if self.folder is None:
                    return False
                path = self._path(index, "piece")
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                except FileNotFoundError:
                    self._fill(index)
                    continue
                except OSError as exc:
                    if exc.errno != errno.ELOOP:
                        self._give_up(exc)
                        return False
                    self._drop_link(index, path)  # not a piece of the cache's: replaced
                    continue
                try:
                    checked = self._checked(index, fd, path)
                except BaseException:
                    os.close(fd)
                    raise
                if not checked:
                    os.close(fd)
                    continue
                fd = self._keep_open(index, fd)
            try:
                preadv_all(fd, part, within, self.name)
                self._prefetch.used(index)
                return True
            finally:
                self._put_back(index)
        return False  # removed under us again and again (a limit smaller than the reads in flight): go direct

    def _take_open(self, index: int) -> int | None:
        """The descriptor of piece ``index`` if this source holds it open (one more user; give it back with
        :meth:`_put_back`), marking the piece used at most every :data:`TOUCH_EVERY_S`; else None."""
        with self._lock:
            if self._closed:
                raise closed_error(self.name)
            entry = self._open.get(index)
            if entry is None:
                return None
            entry[1] += 1
            self._open.move_to_end(index)
            now = time.monotonic()
            touch = now - self._used.get(index, 0.0) >= TOUCH_EVERY_S
            if touch:
                self._used[index] = now
        if touch:
            try:
                os.utime(entry[0])
            except OSError:
                pass
        return entry[0]

    def _keep_open(self, index: int, fd: int) -> int:
        """Keep ``fd`` (piece ``index``, checked) open for later reads, one user taken; the descriptor to read
        (another thread's, when one kept it first).  At most :data:`OPEN_PIECES` stay open: the least recently
        used one without a user is closed."""
        with self._lock:
            entry = self._open.get(index)
            if self._closed:
                extra, fd = fd, None
            elif entry is not None:
                entry[1] += 1
                extra = fd
                fd = entry[0]
            else:
                self._open[index] = [fd, 1]
                extra = None
            while len(self._open) > OPEN_PIECES:
                idle = next((i for i, (_, users) in self._open.items() if users == 0), None)
                if idle is None:
                    break
                os.close(self._open.pop(idle)[0])
        if extra is not None:
            os.close(extra)
        if fd is None:
            raise closed_error(self.name)
        return fd

    def _put_back(self, index: int) -> None:
        with self._lock:
            entry = self._open.get(index)
            if entry is None:
                return
            entry[1] -= 1
            if not (self._closed and entry[1] == 0):
                return
            del self._open[index]  # its last read since close(): closed here
        os.close(entry[0])

    def _checked(self, index: int, fd: int, path: str) -> bool:
        """Whether the open piece ``fd`` is whole (checked once per source; a bad one is removed), and marks it
        used at most every :data:`TOUCH_EVERY_S`."""
        now = time.monotonic()
        with self._lock:
            last = self._used.get(index)
        if last is None:
            n = self._piece_length(index)
            size = os.fstat(fd).st_size
            ok = size == n + TRAILER_BYTES
            if ok:
                with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mm, memoryview(mm) as view:
                    ok = trailer_ok(view, n)
            if not ok:
                self._filler.claim(index)
                try:
                    if os.stat(path).st_ino == os.fstat(fd).st_ino:
                        os.unlink(path)
                except FileNotFoundError:
                    pass
                finally:
                    self._filler.release(index)
                return False
        if last is None or now - last >= TOUCH_EVERY_S:
            try:
                os.utime(fd)
            except OSError:
                pass  # only the eviction order suffers
            with self._lock:
                self._used[index] = now
        return True

    def _drop_link(self, index: int, path: str) -> None:
        """Remove the symbolic link at piece ``index``'s ``path`` (the cache never reads or writes through one)."""
        self._filler.claim(index)
        try:
            if os.path.islink(path):
                os.unlink(path)
        finally:
            self._filler.release(index)

    def _prefetch_fill(self, index: int) -> None:
        """Piece ``index`` filled for the prefetcher: skipped where another thread or process fills it now; what
        a failed fetch raises is kept for the read of the piece (and raised here too).  A prefetch thread."""
        self._fill(index, wait=False)

    def _fill(self, index: int, wait: bool = True) -> None:
        """Fetch piece ``index`` into the cache unless another thread or process has (or does meanwhile: with
        ``wait``, wait for it; without, leave it to them); see :meth:`Filler.fill
        <h5stream.remote.cache_fill.Filler.fill>`."""
        filled = self._filler.fill(index, wait)
        if filled:
            self._account(filled)

    def _filled(self, index: int) -> None:
        """Piece ``index`` was just filled by this source (its claim still held).  The filling thread."""
        with self._lock:
            self.pieces_fetched += 1
            self._used.setdefault(index, 0.0)  # its digest was just computed from these bytes: checked

    def _account(self, added: int) -> None:
        """Count ``added`` bytes filled; past the limit, rescan the folder and evict."""
        with self._lock:
            if self._estimate is not None:
                self._estimate += added
                if self._estimate <= self.limit:
                    return
        after = evict(self.cache_dir, self.limit)
        with self._lock:
            self._estimate = after

    def _give_up(self, exc: OSError) -> None:
        """Stop caching after a local failure: one warning for :data:`GIVE_UP_ERRNOS`, else the error."""
        if exc.errno not in GIVE_UP_ERRNOS:
            raise exc
        with self._lock:
            folder, self.folder = self.folder, None
        if folder is not None:
            why = "a file is in the way" if exc.errno in (errno.ENOTDIR, errno.EEXIST) else exc.strerror or exc
            warnings.warn(f"{self.name}: cannot write to the cache at {self.cache_dir} ({why}); streaming on "
                          "without the cache (every read from the server); pass cache_dir= a folder it may write "
                          "to, or cache_dir=None", stacklevel=2)
