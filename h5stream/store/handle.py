"""The file-level steps of writing a store: opening it for writing, cutting HDF5 off it, naming a new one.

Pure helpers over paths and open PyTables handles; the
:class:`~h5stream.store.writer.StoreWriter` that owns a handle calls them from
its one thread.

A new store is written under a temporary name, ``OUT`` + :data:`CREATING_SUFFIX`
(:func:`creating_path`), and takes its name with a rename followed by a sync of
the folder (:func:`fsync_folder`).  After a failed write, :func:`cut_off` points
HDF5's file descriptor at /dev/null, so nothing HDF5 still buffers reaches the
file when the handle is closed.  While HDF5 rewrites a published store in place,
a marker lies beside it (:func:`~h5stream.store.schema.flushing_path`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re

import tables

from h5stream.errors import StoreBusyError, StoreWriteError
from h5stream.store import sidecar
from h5stream.store.schema import CREATING_SUFFIX, flushing_path


def creating_path(path: str | os.PathLike) -> str:
    """Where a new store at ``path`` is written before it takes its name."""
    return os.fspath(path) + CREATING_SUFFIX


def mark_flushing(path: str) -> None:
    """Put the marker beside ``path`` (an empty file; a process kill cannot undo it once this returns).
    Raises OSError when it cannot be made, StoreExistsError when something else than a marker of ours is in
    its place (never followed: see :mod:`h5stream.store.sidecar`)."""
    os.close(sidecar.open_fd(flushing_path(path), os.O_WRONLY | os.O_CREAT))


def describe(exc: BaseException) -> tuple[int | None, str]:
    """(errno, the system's words) of a failed write, from an OSError or HDF5's error text."""
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno, exc.strerror or os.strerror(exc.errno)
    text = str(exc).strip()
    found = re.search(r"errno = (\d+)", text)
    if found and int(found.group(1)):
        code = int(found.group(1))
        return code, os.strerror(code)
    return None, (text.splitlines()[0][:200] if text else type(exc).__name__)


#: HDF5's metadata cache of a writer: HDF5's largest default, so that what one commit changes (a few index nodes
#: and headers) stays in memory until the flush, which is when the flushing marker is there to cover its writes.
WRITER_METADATA_CACHE_BYTES = 32 << 20


def _held_elsewhere(path: str) -> StoreBusyError:
    return StoreBusyError(f"{path}: another program has it open (HDF5's file lock); close it there, then run again")


def open_for_writing(path: str, made: tuple[int, int] | None = None) -> tables.File:
    """PyTables handle with the chunk cache off (every chunk write happens, and is checked, where it is asked
    for) and a metadata cache of :data:`WRITER_METADATA_CACHE_BYTES`, whose HDF5 file lock lets readers in
    (:func:`share_with_readers`).  Raises StoreBusyError when HDF5's own lock is held elsewhere, StoreWriteError
    otherwise.

    ``made``: the (device, inode) of the file created at ``path`` (:func:`~h5stream.store.create.write_empty`).
    HDF5 opens by name and follows a link, so ``path`` is checked to be that file (not a link put there since)
    before HDF5 opens it, and the file HDF5 opened to be that one after, before anything is written through
    the handle (StoreExistsError).  Between the two checks only someone who may rename files in the folder
    could swap it; in a sticky folder such as /tmp, nobody but its owner may."""
    if made is not None:
        sidecar.check_is(path, made)
    try:
        f = tables.open_file(path, mode="a", chunk_cache_size=0, metadata_cache_size=WRITER_METADATA_CACHE_BYTES)
    except (tables.HDF5ExtError, OSError) as exc:
        if "unable to lock file" in str(exc):
            raise _held_elsewhere(path) from exc
        code, reason = describe(exc)
        raise StoreWriteError(f"{path}: cannot open it for writing ({reason})", errno=code, strerror=reason) from exc
    try:
        if made is not None:
            sidecar.check_same(path, file_descriptor(f) if f.isopen else None, made)
        share_with_readers(f)
    except BaseException:
        close_cut_off(f)  # nothing was written through it, nor reaches a file that is not ours
        raise
    return f


def share_with_readers(f: tables.File) -> None:
    """Turn the exclusive lock HDF5 takes on a file it opens for writing into a shared one.

    HDF5 ``flock()``s a file it opens for writing with ``LOCK_EX`` and for reading with ``LOCK_SH``, so while the
    writer holds it a plain ``h5py.File(path)`` or ``tables.open_file(path)`` is turned away ("unable to lock
    file").  h5stream's writer keeps other writers out with its own lock (:mod:`h5stream.store.lock`) and
    publishes rows through ``committed_rows``, so readers may come in: with the lock shared, default readers
    open the store, and any other program opening it for writing (``LOCK_EX``) is still refused.  The kernel
    changes a lock's kind by dropping it and taking the new one; a program that took the file in between makes
    this raise StoreBusyError.  A file system without ``flock`` (HDF5 then took no lock) is left as it is."""
    fd = file_descriptor(f)
    if fd is None:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        raise _held_elsewhere(f.filename) from exc
    except OSError as exc:
        if exc.errno not in (errno.ENOLCK, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            code, reason = describe(exc)
            raise StoreWriteError(f"{f.filename}: cannot lock it for writing ({reason})", errno=code,
                                  strerror=reason) from exc


def file_descriptor(f: tables.File) -> int | None:
    """``f``'s POSIX file descriptor, None when it is not a plain file (writes then checked after the fact)."""
    try:
        return f.fileno()
    except (tables.HDF5ExtError, OSError, ValueError):
        return None


def cut_off(f: tables.File) -> bool:
    """Point ``f``'s file descriptor at /dev/null, so nothing HDF5 still buffers reaches the file; True if done."""
    try:
        fd = f.fileno()
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, tables.HDF5ExtError, ValueError):
        return False
    try:
        os.dup2(null, fd, inheritable=False)
        return True
    except OSError:
        return False
    finally:
        os.close(null)


def close_cut_off(f: tables.File) -> bool:
    """Close ``f`` without letting anything it still buffers reach the file; True if it was cut off first."""
    cut = cut_off(f)
    try:
        f.close()
    except Exception:
        pass  # the descriptor is /dev/null: HDF5 failing to write its buffers is the point
    return cut


def remove(path: str) -> None:
    """Remove ``path`` if it is there (a temporary file of ours)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def fsync_folder(path: str) -> None:
    """Make a rename in ``path``'s folder durable (some file systems cannot: then nothing to do)."""
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
