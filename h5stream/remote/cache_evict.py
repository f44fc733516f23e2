"""Keeping a disk cache folder (:mod:`h5stream.remote.cache`) within its limit: the least recently used pieces
go first, and ``.tmp`` files no process is filling (a fill killed midway) go with them.  Runs in whichever
process's fill passed the limit, under ``flock`` on ``CACHE_DIR/evict.lock``; a process that finds it held leaves
the eviction to its holder.

The cache opens no file of its folder through a symbolic link (``O_NOFOLLOW``): a link planted where one of its
files goes (pointing at a file of the user's, say) is never written through; a lock file that is a link is removed
and made anew (:func:`open_lock`), a piece or temporary file that is one is replaced."""

from __future__ import annotations

import errno
import fcntl
import os


def evict(cache_dir: str, limit: int) -> int | None:
    """Remove the least recently used pieces under ``cache_dir`` until at most 7/8 of ``limit`` bytes remain,
    and leftover ``.tmp`` files no process is filling; the bytes that remain (None when another process is
    evicting now: it will)."""
    try:
        lock_fd = open_lock(os.path.join(cache_dir, "evict.lock"))
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
                if not _remove_if_idle(os.path.join(folder, name), os.path.join(folder, name[:-4] + ".lock")):
                    total += st.st_size
        if total <= limit:
            return total
        pieces.sort()
        target = limit - limit // 8
        for _, path, size in pieces:
            if total <= target:
                break
            if unlink(path):
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


def _remove_if_idle(tmp_path: str, lock_path: str) -> bool:
    """Remove the leftover ``tmp_path`` if no process holds its piece's lock file ``lock_path`` (a held lock is
    a fill in progress), holding that lock while it removes it, so that no fill can start between the two and
    lose its new file; whether it was removed."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    try:
        return unlink(tmp_path)
    finally:
        os.close(fd)  # releases the lock


def open_lock(path: str) -> int:
    """A descriptor of the lock file at ``path`` (created if missing), never opened through a symbolic link: a
    link there (none of the cache's own) is removed and the file made anew.  Raises ``OSError``."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
    unlink(path)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)


def unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False
