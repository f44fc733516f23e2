"""Filling the pieces of a disk cache (:mod:`h5stream.remote.cache`), and letting go of the fills in flight when
their source closes.

A fill of piece ``N`` holds what others wait for: the source's claim on the piece (its other threads wait for it),
``flock`` on ``N.lock`` (other processes on the node wait for it) and ``N.tmp``, open for writing.  Its fetch may
hang on a stalled server until the remote source's ``timeout_s`` (30 s by default).  :meth:`Filler.close` does not
wait for it: it removes ``N.tmp`` (the lock still held, so that file is this fill's), closes the fill's
descriptors (releasing the lock) and wakes the threads waiting for a piece, which raise.  The fetch, still in the
client, finds its fill given up at its next write and stops there: it writes nothing more, closes no descriptor
(their numbers may be another file's by then), renames nothing, so it never publishes a piece.  Every use of a
fill's descriptors is made under the fill's own lock (:meth:`Fill.held`), which :meth:`Filler.close` takes to let
them go.  A thread waiting for another process's fill of a piece (blocked in ``flock``) holds nothing: it finds
the source closed when that fill ends, and lets its descriptor go itself.

Thread-safety: :meth:`Filler.fill` from any number of threads (I/O and prefetch threads); :meth:`Filler.close`
from any thread, idempotent, and when it returns (in every thread that called it) the fills are let go.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import threading
from collections.abc import Callable

from h5stream.errors import H5StreamError, RemoteError
from h5stream.remote.cache_evict import open_lock, unlink
from h5stream.remote.calls import on_main_thread
from h5stream.remote.piecefile import PieceWriter, WriteFailed

TRAILER = struct.Struct("<8sQQ")
TRAILER_BYTES = TRAILER.size
MAGIC = b"h5spcxx3"
"""A piece's trailer: this magic, :func:`~h5stream.remote.piecefile.piece_digest` of its bytes, their count.  (The
earlier trailer's magic, ``h5spiece`` with a CRC-32, fails the check: such a piece is fetched again.)"""


def closed_error(name: str) -> RemoteError:
    """What a read of a closed source raises (as :class:`~h5stream.remote.source.RemoteSource` does)."""
    return RemoteError(f"{name}: read after close()")


class Fill:
    """One piece being filled: its lock file's and temporary file's descriptors, used under :meth:`held`.
    ``state``: ``"live"`` while the filling thread owns them, ``"let go"`` once :meth:`Filler.close` closed them,
    ``"ended"`` once the filling thread did."""

    __slots__ = ("name", "guard", "lock_fd", "tmp_fd", "tmp", "state")

    def __init__(self, name: str, lock_fd: int, tmp: str):
        self.name = name
        self.guard = threading.Lock()
        self.lock_fd = lock_fd
        self.tmp_fd: int | None = None
        self.tmp = tmp
        self.state = "live"

    @contextlib.contextmanager
    def held(self):
        """The fill's descriptors, not to be let go meanwhile; raises :func:`closed_error` once they are."""
        with self.guard:
            if self.state != "live":
                raise closed_error(self.name)
            yield self

    def end(self, let_go: bool) -> None:
        """Close the descriptors, unless another thread has: the filling thread's (``let_go`` False: the fill
        ended) or :meth:`Filler.close`'s (``let_go``: the half-written ``N.tmp`` removed first).  Any thread."""
        with self.guard:
            if self.state != "live":
                return
            self.state = "let go" if let_go else "ended"
            if self.tmp_fd is not None:
                if let_go:
                    unlink(self.tmp)  # under the piece's lock still: the file is this fill's
                os.close(self.tmp_fd)
                self.tmp_fd = None
            os.close(self.lock_fd)  # releases the flock


class Filler:
    """Fills pieces of one object's cache folder from ``remote`` (see the module doc).

    ``path(index, kind)`` is the path of piece ``index``'s ``kind`` file (``piece``, ``tmp``, ``lock``);
    ``length(index)`` its bytes; ``piece_bytes`` where pieces start; ``caching()`` whether the source still
    caches; ``give_up(exc)`` turns caching off after a local failure (or raises ``exc``); ``filled(index)`` is
    told of each piece filled, before the threads waiting for it go on.
    """

    def __init__(self, remote, path: Callable[[int, str], str], length: Callable[[int], int], piece_bytes: int,
                 caching: Callable[[], bool], give_up: Callable[[OSError], None], filled: Callable[[int], None]):
        self.remote = remote
        self.name = remote.name
        self._path = path
        self._length = length
        self._piece_bytes = int(piece_bytes)
        self._caching = caching
        self._give_up = give_up
        self._filled = filled
        self._cond = threading.Condition()
        self._claimed: set[int] = set()  # pieces a thread of this source fills (or checks) now
        self._fills: dict[int, Fill] = {}  # the fills holding their piece's lock
        self._errors: dict[int, BaseException] = {}  # piece -> what its prefetch raised, for its read
        self._closed = False
        self._closing = threading.Lock()  # held through close(), so that a second caller returns after it

    def claim(self, index: int, wait: bool = True) -> bool:
        """Take piece ``index`` for this thread, waiting while another thread of the source has it (``wait``), or
        False at once (not ``wait``).  Raises :func:`closed_error` once the source is closed.  Give it back with
        :meth:`release`."""
        with self._cond:
            while True:
                if self._closed:
                    raise closed_error(self.name)
                if index not in self._claimed:
                    self._claimed.add(index)
                    return True
                if not wait:
                    return False
                self._cond.wait()

    def release(self, index: int) -> None:
        """Give piece ``index`` back (:meth:`claim`), waking the threads waiting for it.  The claiming thread."""
        with self._cond:
            self._claimed.discard(index)
            self._cond.notify_all()

    def fill(self, index: int, wait: bool = True) -> int:
        """Fetch piece ``index`` into the cache unless another thread or process has (or does meanwhile: with
        ``wait``, wait for it; without, leave it to them): the bytes filled (piece and trailer), 0 if none.  A
        read's fill raises what the piece's prefetch raised, if that failed, instead of fetching again."""
        if not self.claim(index, wait):
            return 0
        try:
            if wait:
                with self._cond:
                    failed = self._errors.pop(index, None)
                if failed is not None:
                    raise failed
            if not self._caching():
                return 0
            try:
                lock_fd = open_lock(self._path(index, "lock"))
            except OSError as exc:
                self._give_up(exc)
                return 0
            fill = Fill(self.name, lock_fd, self._path(index, "tmp"))
            try:
                try:  # waits while another process fills it (a prefetch leaves it to that process)
                    fcntl.flock(lock_fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return 0
                except OSError as exc:  # a file system without locks (ENOLCK): no cache rather than two fills
                    self._give_up(exc)
                    return 0
                with self._cond:
                    if self._closed:  # closed while this thread waited for another process
                        raise closed_error(self.name)
                    self._fills[index] = fill
                if os.path.exists(self._path(index, "piece")):
                    return 0
                try:
                    added = self._fetch(index, fill)
                except BaseException as exc:
                    if not wait and fill.state == "live":  # kept, under the piece's lock, for the read waiting
                        with self._cond:
                            self._errors[index] = exc
                    raise
                if added:
                    self._filled(index)
                return added
            finally:
                with self._cond:
                    if self._fills.get(index) is fill:
                        del self._fills[index]
                fill.end(let_go=False)
        finally:
            self.release(index)

    def _fetch(self, index: int, fill: Fill) -> int:
        """Fetch piece ``index`` (its lock held) into ``N.tmp``, then rename it to ``N.piece``: the bytes filled,
        or 0 when a local write failed (the cache is off from then on)."""
        n = self._length(index)
        path = self._path(index, "piece")
        try:  # a file of its own (never through a link planted there); a killed fill's left over goes first
            unlink(fill.tmp)
            fd = os.open(fill.tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            self._give_up(exc)
            return 0
        with fill.guard:
            if fill.state != "live":
                os.close(fd)
                raise closed_error(self.name)
            fill.tmp_fd = fd
        try:
            with fill.held():
                os.posix_fallocate(fd, 0, n + TRAILER_BYTES)  # a full disk fails here, not while writing
            writer = PieceWriter(fd, n, held=fill.held)
            start = index * self._piece_bytes
            if on_main_thread():  # interruptible there: into memory of its own, then written
                body = bytearray(n)
                self.remote.readinto(start, [body])
                writer.write(memoryview(body))
            else:  # each part of the body written and summed as it arrives
                self.remote.stream_range(start, start + n, writer)
            with fill.held():
                os.pwrite(fd, TRAILER.pack(MAGIC, writer.digest, n), n)
                os.rename(fill.tmp, path)  # no fsync: the trailer check stands for it (see cache.py's doc)
                fill.tmp_fd = None
                os.close(fd)
        except WriteFailed as exc:
            self._drop_tmp(fill)
            self._give_up(exc.error)
            return 0
        except OSError as exc:
            self._drop_tmp(fill)
            if isinstance(exc, H5StreamError):  # the server's failure (or the source closed), not the disk's
                raise
            self._give_up(exc)
            return 0
        except BaseException:
            self._drop_tmp(fill)
            raise
        return n + TRAILER_BYTES

    @staticmethod
    def _drop_tmp(fill: Fill) -> None:
        """Remove a failed fill's ``N.tmp``, unless :meth:`Filler.close` let it go (then it is not this fill's to
        touch)."""
        with fill.guard:
            if fill.state == "live" and fill.tmp_fd is not None:
                os.close(fill.tmp_fd)
                fill.tmp_fd = None
                unlink(fill.tmp)

    def close(self) -> None:
        """Let go of every fill in flight at once and wake the threads waiting for a piece (they raise).  Any
        thread; idempotent; returns once the fills are let go, whichever thread closed first."""
        with self._closing:
            with self._cond:
                self._closed = True
                fills, self._fills = list(self._fills.values()), {}
                self._errors.clear()
                self._cond.notify_all()
            for fill in fills:
                fill.end(let_go=True)
