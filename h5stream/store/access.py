"""Opening a store's file for reading: the one way every reader in h5stream opens it.

:func:`open_h5_readonly` hands h5py a Python file object (``io.FileIO``,
HDF5's "fileobj" driver) instead of a path.  Such a handle takes no HDF5 file
lock and is never matched with another handle on the same file, so:

* it opens while an ingest (PyTables, which locks the file) writes the store;
* a user's plain ``h5py.File(path)`` or ``tables.open_file(path)``, with their
  default arguments, opens and stays usable in the same process, before or
  after, whatever locking flags it was given (HDF5 refuses a second open of one
  file through the default driver with different flags).

Reading a file that another process is writing is safe for committed rows
only where their bytes never move (uncompressed chunks, labels); the HDF5
metadata that locates them is rewritten by the writer at every commit and may
be caught half-written.  :func:`read_consistent` therefore reads such
metadata with a fresh handle and tries again while a writer holds the file,
and says so in one line (:class:`StoreBusyError`) if it never settles.  The
readers read pixels and labels by byte offset after that (see
:mod:`h5stream.read.reader`), so only compressed stores, whose chunks only
HDF5 can decode, need the metadata while streaming.

A URL (``s3://``, ``http(s)://``, see :mod:`h5stream.remote`) opens through
:func:`h5stream.remote.fileobj.open_h5_remote` instead, with the ``remote``
options; nobody writes a remote object in place, so its metadata is read once.

Errors are h5stream's: :class:`StoreNotFoundError`,
:class:`StorePermissionError`, :class:`StoreFormatError`,
:class:`StoreBusyError`, and :class:`StoreReadError` when the operating system
fails a read (EIO and the like, :data:`IO_ERRNOS`): HDF5 reports such a read
as its own error, so the handle given to h5py remembers the errno and byte
offset, and a failing disk is never called a damaged file.  Every function
here is safe to call from any thread.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import h5py

from h5stream.concurrency.gcpause import collection_paused
from h5stream.errors import (
    RemoteError,
    StoreBusyError,
    StoreChangedError,
    StoreFormatError,
    StoreNotFoundError,
    StorePermissionError,
    StoreReadError,
    descriptor_limit,
)
from h5stream.remote.config import is_url, other_scheme, unsupported_scheme
from h5stream.store.lock import lock_holders, lock_path

T = TypeVar("T")

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
"""The superblock signature, at byte 0 or 512, 1024, 2048... of an HDF5 file."""

SETTLE_S = 5.0
"""How long :func:`read_consistent` keeps trying while another process writes the file."""


STOP_POLL_S = 0.1
"""How often a :class:`StoppableFile` read in progress looks at its stop flag."""

IO_ERRNOS = frozenset(getattr(errno, name) for name in ("EIO", "ENXIO", "ENODEV", "ESTALE", "EREMOTEIO", "ENOLINK",
                                                        "ETIMEDOUT", "EHOSTDOWN", "ECOMM")
                      if hasattr(errno, name))
"""Errors of the storage or the network beneath a file rather than of its bytes: the file may be perfectly
good, so they are reported as what they are (:class:`StoreReadError`), never as damage."""


def io_error(path: str, exc: OSError, offset: int | None = None) -> StoreReadError:
    """The one-line error for an operating-system I/O error ``exc`` while reading ``path`` (at ``offset``)."""
    code = exc.errno
    name = errno.errorcode.get(code, str(code))
    where = f" at byte {offset}" if offset is not None else ""
    return StoreReadError(
        f"{path}: I/O error reading the file{where} ({exc.strerror or exc}, {name}); the file may be intact: check "
        "the disk or the network file system beneath it (dmesg, smartctl) and try again, or read a copy",
        errno=code, filename=path,
    )


class _RecordingFile(io.FileIO):
    """A read-only ``io.FileIO`` that remembers the first I/O error (:data:`IO_ERRNOS`) of its reads.

    HDF5 reports a failed read of its "fileobj" driver as its own error, without the errno; this is how
    :func:`open_h5_readonly` tells a failing disk from a damaged file.  Used by one thread at a time, as
    the h5py handle over it is."""

    io_failure: tuple[OSError, int] | None = None

    def record(self, exc: OSError, offset: int | None) -> None:
        """Keep ``exc`` (at ``offset``) if it is the first I/O error of this file's reads."""
        if exc.errno in IO_ERRNOS and self.io_failure is None:
            self.io_failure = (exc, offset)

    def readinto(self, buffer):
        try:
            return super().readinto(buffer)
        except OSError as exc:
            try:
                offset = self.tell()
            except OSError:
                offset = None
            self.record(exc, offset)
            raise



class StoppableFile(_RecordingFile):
    """A file read through HDF5 whose reads give up once ``stop`` is set, even a read that never returns.

    h5py holds its global lock through every HDF5 call, and the interpreter
    takes that lock again when it exits (to free h5py's objects).  A thread
    left inside HDF5 on a read that hangs (a hung disk or network file
    system) would so keep the process from ever exiting.  Here each read runs
    on a helper thread while the caller waits, looking at ``stop`` every
    :data:`STOP_POLL_S`: once it is set the read fails (``ECANCELED``), HDF5
    returns, and only the helper, a daemon holding no lock, stays behind on
    the read.  The helper reads into a buffer of its own, copied into HDF5's
    when the read is done, so an abandoned read writes into nobody's memory.
    No cyclic collection runs while a read waits for the helper
    (:mod:`h5stream.concurrency.gcpause`): HDF5 holds h5py's lock meanwhile.
    Read from one thread; ``stop`` may be set from any.
    """

    def __init__(self, path: str, stop: threading.Event):
        super().__init__(path, "rb")
        self.stop = stop
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._helper: threading.Thread | None = None

    def _cancelled(self) -> OSError:
        return OSError(errno.ECANCELED, f"{self.name}: read cancelled, the reader is stopping")

    def readinto(self, buffer) -> int:
        if self.stop.is_set():
            raise self._cancelled()
        out = memoryview(buffer).cast("B")
        if not len(out):
            return 0
        position, own, done, result = self.tell(), bytearray(len(out)), threading.Event(), []
        # HDF5 called this holding h5py's lock: the helper must not free h5py objects meanwhile (see gcpause).
        with collection_paused():
            if self._helper is None:
                self._helper = threading.Thread(target=self._serve, args=(self.fileno(), self._calls),
                                                name="h5stream-hdf5-read", daemon=True)
                self._helper.start()
            self._calls.put((position, own, done, result))
            while not done.wait(STOP_POLL_S):
                if self.stop.is_set():
                    raise self._cancelled()
        if isinstance(result[0], BaseException):
            if isinstance(result[0], OSError):
                self.record(result[0], position)
            raise result[0]
        n = result[0]
        out[:n] = own[:n]
        self.seek(position + n)
        return n

    @staticmethod
    def _serve(fd: int, calls: queue.SimpleQueue) -> None:
        """The helper thread: pread each call's bytes into its own buffer until told to stop (None)."""
        while (call := calls.get()) is not None:
            position, own, done, result = call
            try:
                result.append(os.preadv(fd, [own], position))
            except BaseException as exc:  # handed to the waiting reader
                result.append(exc)
            done.set()

    def close(self) -> None:
        if self._helper is not None:
            self._calls.put(None)  # a helper stuck on a read ends when the read returns
            self._helper = None
        super().close()


def open_readable(path: str | os.PathLike, stop: threading.Event | None = None) -> io.FileIO:
    """``path`` opened for reading (unbuffered), or the h5stream error saying why it cannot be; with ``stop``,
    a :class:`StoppableFile`."""
    path = os.fspath(path)
    try:
        return _RecordingFile(path, "rb") if stop is None else StoppableFile(path, stop)
    except FileNotFoundError:
        if other_scheme(path):  # gs://bucket/key read as a local path
            raise unsupported_scheme(path) from None
        raise StoreNotFoundError(f"{path}: no such file; make one with `h5stream ingest SRC {path}`") from None
    except IsADirectoryError:
        raise StoreFormatError(f"{path}: is a directory, not an HDF5 file; to read the stores in it as one set of "
                               f"parts, pass a glob ({os.path.join(path, '*.h5')!r}, its matches sorted by name) or "
                               "a manifest (docs/parts.md)") from None
    except PermissionError:
        raise StorePermissionError(
            f"{path}: permission denied; this user ({_user()}) needs read access to the file and its folders "
            f"(e.g. chmod a+r {path})"
        ) from None
    except OSError as exc:
        if exc.errno in IO_ERRNOS:
            raise io_error(path, exc) from None
        raise


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError, AttributeError):
        return "this user"


def has_hdf5_signature(raw: io.RawIOBase) -> bool:
    """Whether an HDF5 superblock signature is where the format allows one (byte 0, 512, 1024, ...)."""
    size = os.fstat(raw.fileno()).st_size
    offset = 0
    while offset + len(HDF5_SIGNATURE) <= size:
        if os.pread(raw.fileno(), len(HDF5_SIGNATURE), offset) == HDF5_SIGNATURE:
            return True
        offset = 512 if offset == 0 else 2 * offset
    return False


@contextlib.contextmanager
def open_h5_readonly(path: str | os.PathLike, *, native_driver: bool = False, remote=None,
                     stop: threading.Event | None = None, **h5py_kwargs):
    """An ``h5py.File`` on ``path``, read-only, taking no HDF5 file lock and sharing nothing with other handles.

    A URL opens remotely (:func:`~h5stream.remote.fileobj.open_h5_remote`, with ``remote``: None, a
    :class:`~h5stream.remote.RemoteOptions` or a dict of its fields); ``native_driver`` is then ignored.

    ``h5py_kwargs`` go to ``h5py.File`` (e.g. ``rdcc_nbytes=0``).  Closes the
    file and its descriptor on exit.  Raises :class:`StoreNotFoundError`,
    :class:`StorePermissionError`, or :class:`StoreFormatError` when the file is
    not HDF5, and :class:`StoreReadError` for an operating-system I/O error
    reading it (opening, or inside the ``with`` block); another HDF5 error
    opening a file that is HDF5 propagates (an ``OSError``) for
    :func:`read_consistent` to judge (for a URL, a :class:`StoreFormatError` or
    the remote error that caused it).

    ``native_driver=True`` opens the path with HDF5's own POSIX driver instead
    (``locking=False``): no Python call per HDF5 read (a few microseconds each),
    which is what the benchmark baselines measure, "plain h5py"; such a handle
    does clash with another handle of this process opened with locking.

    ``stop`` (a local file through the file-object driver): once set, every
    read fails, so an HDF5 call in progress ends (see :class:`StoppableFile`).
    """
    if is_url(path):
        from h5stream.remote.config import remote_options
        from h5stream.remote.fileobj import open_h5_remote

        with open_h5_remote(path, remote_options(remote), **h5py_kwargs) as f:
            yield f
        return
    path = os.fspath(path)
    raw = open_readable(path, stop)
    try:
        try:
            if native_driver:
                f = h5py.File(path, "r", locking=False, **h5py_kwargs)
            else:
                f = h5py.File(raw, "r", **h5py_kwargs)
        except OSError as exc:
            # h5py's frames in the traceback hold the file-access property list of our file object; kept alive
            # (by a caller keeping the error, or sys.last_value) it is freed by HDF5's exit handler after the
            # interpreter is gone, whose callback into Python then crashes the process.  The message is enough.
            exc.__traceback__ = None
            _raise_io_failure(path, raw, exc)
            try:
                signature = has_hdf5_signature(raw)
            except OSError as probe:
                _raise_io_failure(path, raw, probe)
                raise
            if not signature:
                raise StoreFormatError(
                    f"{path}: not an HDF5 file; make one with `h5stream ingest SRC {path}`") from None
            raise
        with f:
            try:
                yield f
            except (OSError, RuntimeError, KeyError) as exc:  # HDF5's errors for a read the disk failed
                _raise_io_failure(path, raw, exc)
                raise
    finally:
        raw.close()


def _raise_io_failure(path: str, raw: io.FileIO, exc: BaseException) -> None:
    """Raise :class:`StoreReadError` if ``exc`` is, or HDF5's ``exc`` came from, an operating-system I/O error
    reading ``raw``; return otherwise."""
    failure = getattr(raw, "io_failure", None)
    if failure is not None:
        raise io_error(path, *failure) from exc
    if isinstance(exc, OSError) and exc.errno in IO_ERRNOS:
        raise io_error(path, exc) from exc


def writer_pids(path: str | os.PathLike) -> list[int]:
    """Processes other than this one writing ``path``: holding h5stream's writer lock on it (whose HDF5 lock on
    the file is shared with readers, see :func:`~h5stream.store.handle.share_with_readers`), or an exclusive
    lock on the file itself (another program's HDF5 writer).  Read without taking a lock
    (:func:`~h5stream.store.lock.lock_holders`); [] where that is unavailable or nobody writes."""
    me = os.getpid()
    pids: list[int] = []
    for locked in (lock_path(path), path):
        pids += [pid for pid in lock_holders(locked) or () if pid != me and pid not in pids]
    return pids


def busy_error(path: str, pids: list[int], what: str) -> StoreBusyError:
    """The one-line error for a read that cannot be done while ``pids`` write ``path``."""
    who = "process " + ", ".join(str(p) for p in pids) if pids else "another process"
    return StoreBusyError(
        f"{path}: {who} is writing this file and {what}; try again when it has finished (its committed rows "
        "stay readable)"
    )


def read_consistent(path: str | os.PathLike, read: Callable[[h5py.File], T], *, settle_s: float = SETTLE_S,
                    remote=None, **h5py_kwargs) -> T:
    """``read(f)`` on a fresh read-only handle (:func:`open_h5_readonly`), tried again while the file settles.

    An HDF5 error (``OSError``, ``RuntimeError``, ``KeyError``), or an h5stream
    :class:`StoreFormatError` from ``read``'s own checks, is retried with a new
    handle: once in any case (a writer may have just closed the file), then for
    up to ``settle_s`` seconds while another process holds a write lock on it.
    If it never succeeds: :class:`StoreBusyError` naming the writer, or, with
    no writer, the :class:`StoreFormatError` (an HDF5 error becomes one saying
    the file is damaged).  An operating-system I/O error is raised at once as
    :class:`StoreReadError`, never as damage.  ``read`` must not keep objects of the file: it is
    closed when ``read`` returns.  A URL is read once, with the ``remote``
    options (nobody writes a remote object in place).
    """
    if is_url(path):
        return _read_remote(path, read, remote, h5py_kwargs)
    path = os.fspath(path)
    deadline = time.monotonic() + settle_s
    delay_s, tries = 0.002, 0
    while True:
        tries += 1
        try:
            with open_h5_readonly(path, **h5py_kwargs) as f:
                return read(f)
        except (StoreNotFoundError, StorePermissionError, StoreChangedError, RemoteError, StoreReadError):
            raise
        except (OSError, RuntimeError, KeyError, StoreFormatError) as exc:
            if isinstance(exc, OSError) and descriptor_limit(exc.errno) is not None:
                raise  # out of file descriptors: a limit of this process, never damage of the file
            pids = writer_pids(path)
            if tries >= 2 and not pids:
                if isinstance(exc, StoreFormatError):
                    raise
                raise StoreFormatError(f"{path}: cannot read as HDF5 ({exc}); the file is damaged: restore it from a "
                                       "copy or re-ingest it") from exc
            if pids and time.monotonic() > deadline:
                raise busy_error(path, pids, f"its HDF5 metadata did not settle in {settle_s:g} s") from exc
        # Back off so a writer between two commits can finish flushing.
        time.sleep(delay_s)
        delay_s = min(0.1, delay_s * 2)


def _read_remote(url: str, read: Callable[[h5py.File], T], remote, h5py_kwargs) -> T:
    try:
        with open_h5_readonly(url, remote=remote, **h5py_kwargs) as f:
            return read(f)
    except (StoreNotFoundError, StorePermissionError, StoreChangedError, RemoteError, StoreFormatError,
            StoreReadError):
        raise
    except (OSError, RuntimeError, KeyError) as exc:
        raise StoreFormatError(f"{url}: cannot read as HDF5 ({exc}); the object is damaged or not a store") from exc
