"""One writer per store: an exclusive lock on the sidecar file ``OUT.lock``, which names its holder.

Why a sidecar and not the store itself: HDF5 ``flock()``s the .h5 while it has it open, PyTables opens and
closes the .h5 several times during one ingest, and ``--overwrite`` replaces the .h5 by a new file; a lock
on the .h5 would clash with HDF5's own, or be held on the wrong file.  The sidecar's path never changes,
readers never touch it (a writer never blocks them), and the kernel drops the lock when its holder dies, so
a killed writer blocks nobody: its leftover sidecar is taken over, and removed by the next writer.

The lock is ``flock(LOCK_EX | LOCK_NB)``: it belongs to one open file description, so a second writer in the
same process is refused as well.  The holder writes its pid into the sidecar for the refusal message.

The sidecar is opened without following a link and checked to be a regular file of ours before its holder
writes to it (:mod:`h5stream.store.sidecar`); it is created with ``O_CREAT | O_NOFOLLOW`` and not ``O_EXCL``
because a stale one is shared on purpose (its holder may be alive).  Once held, the other files a writer makes
beside the store are checked (:func:`~h5stream.store.sidecar.check_beside`), so a writer refuses anything
planted there before it writes a byte.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import time
import weakref

from h5stream.concurrency.fork import OwnerOnly
from h5stream.errors import StoreBusyError, StoreExistsError, StoreWriteError
from h5stream.store import sidecar as sidecars

LOCK_SUFFIX = ".lock"
#: A refused writer reads the holder's pid; a holder between taking the lock and writing its pid (or one
#: releasing it) is retried for up to this long before the message says the pid is unknown.
PID_WAIT_S = 1.0


def lock_path(store_path: str | os.PathLike) -> str:
    """The sidecar that guards ``store_path``: next to the file it names, symlinks resolved (two spellings of
    one store share one lock)."""
    return os.path.realpath(os.fspath(store_path)) + LOCK_SUFFIX


def _holder_pid(fd: int) -> int | None:
    """The pid the sidecar names, if it is a live process (None while the holder has not written it yet)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        pid = int(text)
    except (OSError, ValueError):
        return None
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # a dead writer's stale pid: the live holder has not written its own yet
    except PermissionError:
        pass  # alive, owned by another user
    return pid


def _release(fd: int, sidecar: str) -> None:
    """Remove the sidecar while still holding it (so nobody can take a file about to vanish), then unlock."""
    try:
        if os.fstat(fd).st_ino == os.lstat(sidecar).st_ino:
            os.unlink(sidecar)
    except OSError:
        pass  # already gone, or its folder is read-only now: a stale sidecar is harmless
    os.close(fd)


PROC_LOCKS = "/proc/locks"


def lock_holders(path: str | os.PathLike) -> list[int] | None:
    """Processes holding a write lock on the file at ``path`` (flock, POSIX or OFD: HDF5 writers lock the whole
    file, a writer of ours its sidecar), this one included.  Read from ``/proc/locks`` (Linux), which takes no
    lock itself, so asking never turns a writer away.  [] where the file is not there, None where
    ``/proc/locks`` cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    try:
        with open(PROC_LOCKS, encoding="ascii", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    pids = []
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 8786 fe:00:2154971 0 EOF"; waiters carry a "->" and hold nothing.
        if len(fields) < 6 or fields[1] == "->" or fields[3] != "WRITE":
            continue
        try:
            pid = int(fields[4])
            major, minor, inode = fields[5].split(":")
            dev = os.makedev(int(major, 16), int(minor, 16))
        except ValueError:
            continue
        if int(inode) == st.st_ino and dev == st.st_dev and pid not in pids:
            pids.append(pid)
    return pids


def is_held(store_path: str | os.PathLike) -> bool | None:
    """Whether some process (this one included) holds the writer's lock on ``store_path`` (see
    :func:`lock_holders`); None where that cannot be told."""
    holders = lock_holders(lock_path(store_path))  # every holder keeps the sidecar until it releases it
    return None if holders is None else bool(holders)


class StoreLock:
    """Held: only its owner writes ``store_path``.  Not thread-safe; :meth:`release` is idempotent.

    Use :meth:`acquire`; a lock that is never released is released when the object is collected, and by
    the kernel when the process ends however it ends.  A process forked while it is held releases nothing
    (``release()`` there is a no-op): the lock stays the parent's.
    """

    def __init__(self, store_path: str, fd: int, sidecar: str):
        self.store_path = store_path
        self.sidecar = sidecar
        # Not in a forked child: removing the sidecar there would let a second writer in beside this one.
        self._finalizer = weakref.finalize(self, OwnerOnly(functools.partial(_release, fd, sidecar)))

    @classmethod
    def acquire(cls, store_path: str | os.PathLike) -> StoreLock:
        """Take the lock or raise :class:`StoreBusyError` at once, naming the process that holds it.

        Raises :class:`StoreWriteError` when the sidecar cannot be created (read-only folder), and
        :class:`~h5stream.errors.StoreExistsError` (one line naming it) when something h5stream did not make
        lies at its name or at another name a writer uses beside the store (a symbolic link, a folder, a
        FIFO, another user's file): nothing is written then.
        """
        store_path = os.fspath(store_path)
        sidecar = lock_path(store_path)
        deadline = time.monotonic() + PID_WAIT_S
        while True:
            try:
                # Anyone's regular file: a live holder may be another user; its owner is checked once held.
                fd = sidecars.open_fd(sidecar, os.O_RDWR | os.O_CREAT, owner=False)
            except StoreExistsError:
                raise
            except OSError as exc:
                denied = exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
                fix = ("h5stream needs write access to the store's folder" if denied
                       else "its folder does not exist (a symbolic link to a missing place?)"
                       if exc.errno == errno.ENOENT else "free some space, then run again")
                raise StoreWriteError(f"{store_path}: cannot create the lock file {sidecar} ({exc.strerror}); {fix}",
                                      errno=exc.errno, strerror=exc.strerror) from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = _holder_pid(fd)
                os.close(fd)
                if pid is None and time.monotonic() < deadline:
                    time.sleep(0.001)  # the holder is between taking the lock and writing its pid
                    continue
                who = "another process" if pid is None else (
                    f"this process (pid {pid})" if pid == os.getpid() else f"another process (pid {pid})")
                raise StoreBusyError(
                    f"{store_path}: {who} is writing it; wait for it to finish or stop it, then run again",
                    pid=pid,
                ) from None
            try:
                same = os.fstat(fd).st_ino == os.lstat(sidecar).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the previous holder removed this sidecar after we opened it: take the new one
                os.close(fd)
                continue
            why = sidecars.refusal(os.fstat(fd))
            if why is not None:  # held, yet not ours: never written, never removed
                os.close(fd)
                raise sidecars.refused(sidecar, why)
            try:
                sidecars.check_beside(store_path)
            except BaseException:
                _release(fd, sidecar)
                raise
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError:
                pass  # the lock holds without the note; a refused writer then says "another process"
            return cls(store_path, fd, sidecar)

    @property
    def held(self) -> bool:
        return self._finalizer.alive

    def release(self) -> None:
        """Unlock and remove the sidecar."""
        self._finalizer()

    def __enter__(self) -> StoreLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()
