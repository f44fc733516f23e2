"""The files a writer keeps beside a store, opened so that nothing is ever written through a link.

Beside ``OUT.h5`` a writer makes ``OUT.h5.lock`` (:mod:`h5stream.store.lock`), ``OUT.h5.creating`` (a new
store, or a rebuilt one, before it takes its name), ``OUT.h5.flushing`` (while HDF5 rewrites the store in place)
and ``OUT.h5.skipped.csv`` (the skip report).  Whoever can write the folder can put something else at those
names first: a symbolic link to another file (a plain ``open`` would truncate or append to that file), a
folder, a FIFO (an ``open`` would hang), another user's file, or a hard link to a file elsewhere.  So:

* every such file is opened with ``O_NOFOLLOW`` (a link is refused, never followed) and ``O_NONBLOCK`` (a FIFO
  fails at once), and what was opened is checked with ``fstat`` to be ours (:func:`refusal`) before a byte
  is written: a regular file, of this user, with no other hard link;
* a file is created with ``O_CREAT | O_NOFOLLOW`` (``O_EXCL`` where it must be new), which makes it at the
  name itself, never at the end of a link;
* a stale one left by a killed run is replaced only when it is ours; anything else is refused with
  one line naming it (:class:`~h5stream.errors.StoreExistsError`), before anything is written.

:func:`check_beside` is what the writer's lock runs once it holds the store, so a refusal comes first, with
nothing written.  Pure checks over ``stat`` results plus small helpers over paths and descriptors; no HDF5.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from h5stream.errors import StoreExistsError
from h5stream.store import schema


def sidecar_paths(store_path: str | os.PathLike) -> list[str]:
    """Every file a writer makes beside ``store_path`` other than its lock (which is beside the resolved path)."""
    store_path = os.fspath(store_path)
    return [store_path + schema.CREATING_SUFFIX, schema.flushing_path(store_path), store_path + schema.DECODING_SUFFIX,
            schema.skipped_report_path(store_path),
            schema.skipped_report_path(store_path) + schema.REPORT_REWRITE_SUFFIX,
            schema.skipped_report_path(store_path) + schema.REPORT_REPLACING_SUFFIX]


def refusal(st: os.stat_result, *, owner: bool = True) -> str | None:
    """Why a file with status ``st`` (from ``lstat`` or ``fstat``) is not one h5stream made, or None when it is
    ours: a regular file with no other name (hard link), owned by this user (``owner=False``: by anyone).
    Pure."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        return "is a symbolic link"
    if stat.S_ISDIR(mode):
        return "is a folder"
    if not stat.S_ISREG(mode):
        return "is a FIFO, socket or device, not a regular file"
    if st.st_nlink > 1:  # (0: opened, then removed by whoever made it: no other name reaches it)
        return f"is a file with {st.st_nlink} hard links (writing it would change the file it is linked to)"
    if owner and st.st_uid != os.geteuid():
        return f"belongs to user {st.st_uid}, not to this one (uid {os.geteuid()})"
    return None


def refused(path: str, why: str) -> StoreExistsError:
    """The one-line refusal of the file at ``path`` (``why``: from :func:`refusal`)."""
    if why == "is a symbolic link":
        try:
            why = f"is a symbolic link (to {os.readlink(path)})"
        except OSError:
            pass
    return StoreExistsError(f"{path}: {why}; h5stream writes beside a store only to files it made there, never "
                            "through a link: remove it, then run again")


def check(path: str) -> bool:
    """Whether a file of ours lies at ``path`` (False: nothing there).  Raises StoreExistsError, naming it,
    for anything else there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    why = refusal(st)
    if why is not None:
        raise refused(path, why)
    return True


def check_beside(store_path: str | os.PathLike) -> None:
    """Refuse (StoreExistsError, one line) when anything but a file of ours lies at one of the names a writer
    makes beside ``store_path`` (:func:`sidecar_paths`)."""
    for path in sidecar_paths(store_path):
        check(path)


def refuse_link(store_path: str) -> None:
    """Refuse (StoreExistsError) to make a new store at ``store_path`` where a symbolic link lies: the new file
    would take the link's place (a rename never follows one), so what the user meant by that name, the file
    the link names, would not be the store.  Give that file's path, or remove the link."""
    if os.path.islink(store_path):
        raise StoreExistsError(f"{store_path}: is a symbolic link (to {os.readlink(store_path)}), which a new store "
                               "would replace; remove it, or give the path of the file it names, then run again")


def clear(path: str) -> None:
    """Remove a stale file of ours at ``path`` (a killed run's); refuse anything else (StoreExistsError)."""
    if check(path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def open_fd(path: str, flags: int, mode: int = 0o644, *, owner: bool = True) -> int:
    """``os.open(path, flags)`` without following a link at ``path`` and without hanging on a FIFO; the file
    opened is checked to be ours (``owner=False``: a regular file with no other hard link, anyone's).  Returns a
    blocking, close-on-exec descriptor.  Raises StoreExistsError for anything else at ``path``, OSError for
    the system's other refusals."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        # ELOOP: a link; ENXIO: a FIFO nobody reads; EISDIR: a folder; EEXIST (O_EXCL): anything there.
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EEXIST, errno.EOPNOTSUPP):
            try:
                why = refusal(os.lstat(path), owner=owner)
            except OSError:
                why = None
            if why is not None:
                raise refused(path, why) from None
        raise
    try:
        why = refusal(os.fstat(fd), owner=owner)
        if why is not None:
            raise refused(path, why)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def identity(fd: int) -> tuple[int, int]:
    """(device, inode) of the file open at ``fd``."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def fd_path(fd: int, path: str) -> str:
    """A name that opens the very file open at ``fd`` (Linux: ``/proc/self/fd/N``, a link the kernel resolves to
    the open file, not to whatever lies at ``path`` now), for a library that opens by name (HDF5); ``path``
    where the system has no such name.  Valid while ``fd`` is open."""
    name = f"/proc/self/fd/{fd}"
    try:
        return name if identity(fd) == _identity_of(name) else path
    except OSError:
        return path


def _identity_of(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def check_is(path: str, made: tuple[int, int]) -> None:
    """Refuse (StoreExistsError) unless the file at ``path`` (not followed) is the one ``made`` names."""
    st = os.lstat(path)
    if (st.st_dev, st.st_ino) != made:
        raise refused(path, refusal(st) or "is not the file h5stream made there: something replaced it meanwhile")


def check_same(path: str, fd: int | None, expected: tuple[int, int] | None = None) -> None:
    """Refuse (StoreExistsError) unless ``path`` (not followed) is the file open at ``fd`` and, where given,
    the file ``expected`` names: someone replaced the file at that name since it was made.  Nothing to check
    where ``fd`` is None (not a plain file)."""
    if fd is None:
        return
    st = os.lstat(path)
    held = identity(fd)
    if (st.st_dev, st.st_ino) != held or (expected is not None and held != expected):
        why = refusal(st) or "is not the file h5stream made there: something replaced it meanwhile"
        raise refused(path, why)
