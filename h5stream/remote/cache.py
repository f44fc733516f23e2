"""A local disk cache for URL stores: what a stream fetched once is read from local disk afterwards.

:class:`CachedSource` wraps a :class:`~h5stream.remote.source.RemoteSource` with the same byte-source contract.
The object is cut into pieces of ``piece_bytes`` (8 MiB by default: S3's guidance for ranged GETs) at fixed
offsets; a read takes each piece it touches from the cache folder, fetching a missing piece whole, in one request,
into a file of its own first.  Later reads of it (later epochs, other processes on the node, the next run) are
local reads through the page cache.

Layout: ``CACHE_DIR/objects/KEY/N.piece`` for piece ``N`` of the object whose identity (URL, ETag, size,
modification time as of open) hashes to ``KEY``: a changed object has another key and never serves old bytes
(an object with neither ETag nor modification time is not cached).  A piece file holds the piece's bytes and a
trailer of :data:`TRAILER_BYTES` (magic, CRC-32 of the bytes, their count), written at fill.

Guarantees:

* A piece is filled as ``N.tmp`` (space reserved with ``posix_fallocate`` first, then ``fsync``) and renamed to
  ``N.piece``: a process killed mid-fill leaves at most a ``.tmp``, never a piece.  Each source checks a piece's
  trailer (size and CRC-32 of its bytes) the first time it reads it; one that fails is removed and fetched again.
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
  forbidden folder) warns once, in one line, and the stream goes on uncached, reading every byte from the server.

Thread-safety: ``readinto`` from any number of threads at once; ``close`` is idempotent.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import mmap
import os
import struct
import threading
import time
import warnings
import zlib
from collections.abc import Mapping, Sequence

from h5stream.errors import StoreFormatError
from h5stream.memory.rawio import preadv_all

PIECE_BYTES = 8 << 20
"""Default piece: the request size S3's guidance gives for ranged GETs, large enough that a request's latency
costs little, small enough that one fetch is not a long stall."""

MIN_PIECE_BYTES = 64 << 10

DEFAULT_LIMIT = 100 * 10**9
"""Default ``cache_limit``, 100 GB: LitData's default ``max_cache_size``; a disk that fills first is handled
(see the module's docstring)."""

TRAILER = struct.Struct("<8sIQ")
TRAILER_BYTES = TRAILER.size
MAGIC = b"h5spiece"

TOUCH_EVERY_S = 60.0
"""A piece read again is marked used (its modification time) at most this often per source."""

INDEX_BASE_BYTES = 64 << 10
INDEX_BYTES_PER_PIECE = 160
"""What a source's in-memory index holds: a dictionary entry (piece -> last touch) per piece it used, and a lock
per piece being filled; counted in the stream's memory budget (:func:`index_memory_bytes`)."""

GIVE_UP_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM})
"""Local failures after which a source stops caching (one warning) instead of failing the stream."""


def default_cache_dir(env: Mapping[str, str] | None = None) -> str:
    """``$XDG_CACHE_HOME/h5stream`` where that is an absolute path, else ``~/.cache/h5stream`` (pure apart from
    the home folder)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "h5stream")


def object_key(url: str, etag: str | None, size: int, last_modified) -> str | None:
    """The folder name of one version of an object: a hash of its URL, ETag, size and modification time; None
    when it has neither ETag nor modification time (a new version could not be told from the old)."""
    if not etag and last_modified is None:
        return None
    ident = "\0".join((url, etag or "", str(int(size)), str(last_modified or "")))
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
    """Whether a piece file's bytes (piece and trailer) are whole: right size, magic and CRC-32 (pure)."""
    if len(piece) != expected + TRAILER_BYTES:
        return False
    magic, crc, count = TRAILER.unpack(piece[expected:])
    return magic == MAGIC and count == expected and zlib.crc32(piece[:expected]) == crc


def open_url(url: str, options):
    """The byte source of a stream over ``url`` with ``options`` (a
    :class:`~h5stream.remote.config.RemoteOptions`): a :class:`CachedSource` where ``options.cache_dir`` names a
    folder, else the plain :class:`~h5stream.remote.source.RemoteSource`."""
    from h5stream.remote.source import RemoteSource

    remote = RemoteSource(url, options)
    if options.cache_dir is None:
        return remote
    return CachedSource(remote, options.cache_dir, options.cache_limit, options.cache_piece)


def index_memory_bytes(file_bytes: int, piece_bytes: int = PIECE_BYTES) -> int:
    """The memory a cached source's index may hold for an object of ``file_bytes``."""
    return INDEX_BASE_BYTES + INDEX_BYTES_PER_PIECE * -(-int(file_bytes) // int(piece_bytes))


class CachedSource:
    """The bytes of ``remote`` (a :class:`~h5stream.remote.source.RemoteSource`, owned: closed with this) through
    the disk cache at ``cache_dir``.  ``requests`` and ``bytes_read`` are the server's (``remote``'s counters);
    ``pieces_fetched`` counts the pieces this source fetched, ``caching`` whether it still caches."""

    def __init__(self, remote, cache_dir: str, limit: int = DEFAULT_LIMIT, piece_bytes: int = PIECE_BYTES):
        self.remote = remote
        self.name = remote.name
        self.size = remote.size
        self.max_in_flight = remote.max_in_flight
        self.piece_bytes = int(piece_bytes)
        self.limit = int(limit)
        self.cache_dir = cache_dir
        self.pieces_fetched = 0
        self._lock = threading.Lock()
        self._filling: dict[int, threading.Lock] = {}
        self._used: dict[int, float] = {}  # pieces checked by this source -> when last marked used
        self._estimate: int | None = None  # bytes in the folder as of the last scan, plus this source's fills
        key = object_key(remote.name, getattr(remote, "etag", None), remote.size,
                         getattr(remote, "last_modified", None))
        self.folder = None if key is None else os.path.join(cache_dir, "objects", key)
        if self.folder is not None:
            try:
                os.makedirs(self.folder, exist_ok=True)
            except OSError as exc:
                self._give_up(exc)

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

    def close(self) -> None:
        self.remote.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def readinto(self, offset: int, buffers: Sequence) -> None:
        """Fill ``buffers`` with the bytes at ``offset`` onward (``preadv`` semantics), piece by piece from the
        cache, fetching the missing pieces.  Raises what :meth:`RemoteSource.readinto` raises."""
        from h5stream.remote.source import byte_views

        if self.folder is None:
            self.remote.readinto(offset, buffers)
            return
        views = byte_views(buffers)
        length = sum(len(v) for v in views)
        offset = int(offset)
        if offset < 0 or offset + length > self.size:
            raise StoreFormatError(f"{self.name}: bytes {offset}..{offset + length} lie outside the object's "
                                   f"{self.size} bytes; the store's metadata does not match its data")
        pos = 0
        for index, within, n in piece_spans(offset, length, self.piece_bytes):
            part = slice_views(views, pos, n)
            if not self._read_piece(index, within, part):
                self.remote.readinto(offset + pos, part)
            pos += n

    def _piece_length(self, index: int) -> int:
        return min(self.piece_bytes, self.size - index * self.piece_bytes)

    def _path(self, index: int, kind: str) -> str:
        return os.path.join(self.folder, f"{index}.{kind}")

    def _read_piece(self, index: int, within: int, part: list[memoryview]) -> bool:
        """Read ``part`` from piece ``index`` at ``within``, filling the piece first if missing; False when
        the cache is off (the caller reads from the server)."""
        for _ in range(3):
            folder = self.folder
            if folder is None:
                return False
            path = self._path(index, "piece")
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                self._fill(index)
                continue
            except OSError as exc:
                self._give_up(exc)
                return False
            try:
                if not self._checked(index, fd, path):
                    continue
                preadv_all(fd, part, within, path)
                return True
            finally:
                os.close(fd)
        return False  # removed under us again and again (a limit smaller than the reads in flight): go direct

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
                with self._fill_lock(index):
                    try:
                        if os.stat(path).st_ino == os.fstat(fd).st_ino:
                            os.unlink(path)
                    except FileNotFoundError:
                        pass
                return False
        if last is None or now - last >= TOUCH_EVERY_S:
            try:
                os.utime(fd)
            except OSError:
                pass  # only the eviction order suffers
            with self._lock:
                self._used[index] = now
        return True

    def _fill_lock(self, index: int) -> threading.Lock:
        with self._lock:
            return self._filling.setdefault(index, threading.Lock())

    def _fill(self, index: int) -> None:
        """Fetch piece ``index`` into the cache unless another thread or process has (or does meanwhile)."""
        with self._fill_lock(index):
            if self.folder is None:
                return
            try:
                lock_fd = os.open(self._path(index, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                self._give_up(exc)
                return
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)  # waits while another process fills it
                if os.path.exists(self._path(index, "piece")):
                    return
                filled = self._fetch(index)
            finally:
                os.close(lock_fd)  # releases the flock
        if filled:
            self._account(filled)

    def _fetch(self, index: int) -> int:
        """Fetch piece ``index`` (its lock held) into ``N.tmp``, then rename it to ``N.piece``: the bytes
        filled, or 0 when a local write failed (the cache is off from then on)."""
        n = self._piece_length(index)
        tmp, path = self._path(index, "tmp"), self._path(index, "piece")
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as exc:
            self._give_up(exc)
            return 0
        done = False
        try:
            try:
                os.posix_fallocate(fd, 0, n + TRAILER_BYTES)  # a full disk fails here, not in the mapping
                mm = mmap.mmap(fd, n + TRAILER_BYTES)
            except OSError as exc:
                self._give_up(exc)
                return 0
            with mm:
                view = memoryview(mm)
                try:
                    self.remote.readinto(index * self.piece_bytes, [view[:n]])
                    view[n:] = TRAILER.pack(MAGIC, zlib.crc32(view[:n]), n)
                finally:
                    view.release()
                mm.flush()
            try:
                os.fsync(fd)
                os.rename(tmp, path)
                done = True
                _fsync_folder(os.path.dirname(path))
            except OSError as exc:
                self._give_up(exc)
                return 0
        finally:
            os.close(fd)
            if not done:
                _unlink(tmp)
        with self._lock:
            self.pieces_fetched += 1
        return n + TRAILER_BYTES

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
            warnings.warn(f"{self.name}: cannot write to the cache at {self.cache_dir} ({exc.strerror or exc}); "
                          "streaming on without the cache (every read from the server)", stacklevel=2)


def evict(cache_dir: str, limit: int) -> int | None:
    """Remove the least recently used pieces under ``cache_dir`` until at most 7/8 of ``limit`` bytes remain,
    and leftover ``.tmp`` files no process is filling; the bytes that remain (None when another process is
    evicting now: it will)."""
    try:
        lock_fd = os.open(os.path.join(cache_dir, "evict.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        pieces, total = [], 0
        for folder, name, st in _entries(os.path.join(cache_dir, "objects")):
            if name.endswith(".piece"):
                pieces.append((st.st_mtime_ns, os.path.join(folder, name), st.st_size))
                total += st.st_size
            elif name.endswith(".tmp"):
                if _idle(os.path.join(folder, name[:-4] + ".lock")):
                    _unlink(os.path.join(folder, name))
                else:
                    total += st.st_size
        if total <= limit:
            return total
        pieces.sort()
        target = limit - limit // 8
        for _, path, size in pieces:
            if total <= target:
                break
            if _unlink(path):
                total -= size
        return total
    finally:
        os.close(lock_fd)


def _entries(root: str):
    """``(folder, name, stat)`` of every file in the object folders under ``root``."""
    try:
        objects = list(os.scandir(root))
    except OSError:
        return
    for obj in objects:
        if not obj.is_dir(follow_symlinks=False):
            continue
        try:
            with os.scandir(obj.path) as files:
                for f in files:
                    try:
                        yield obj.path, f.name, f.stat(follow_symlinks=False)
                    except OSError:
                        continue
        except OSError:
            continue


def _idle(lock_path: str) -> bool:
    """Whether no process holds the lock file at ``lock_path`` (held locks are fills in progress)."""
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def _fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
