"""A real file system whose reads fail with EIO: a minimal FUSE server (kernel protocol 7.x) in a thread.

:func:`failing_mount` serves one read-only file, the bytes of a real file, except that a read touching a
byte range in ``bad`` fails with ``EIO``, as a disk with unreadable sectors answers.  The kernel hands that
error to the reader's ``read``/``pread`` as it would a disk's.  Needs ``/dev/fuse`` and the right to mount
(root); :func:`fuse_available` says whether both are there.  Reads bypass the page cache (``FOPEN_DIRECT_IO``),
so every read reaches the server and sees the fault.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
import struct
import threading

_IN = struct.Struct("<IIQQIIIHH")  # fuse_in_header
_OUT = struct.Struct("<IiQ")  # fuse_out_header
_ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr
_READ_IN = struct.Struct("<QQIIQII")  # fuse_read_in
LOOKUP, FORGET, GETATTR, OPEN, READ, RELEASE, FLUSH, INIT, OPENDIR, RELEASEDIR, INTERRUPT, DESTROY, BATCH_FORGET = (
    1, 2, 3, 14, 15, 18, 25, 26, 27, 29, 36, 38, 42)
ROOT, FILE = 1, 2
FOPEN_DIRECT_IO = 1
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)


def fuse_available() -> bool:
    return os.geteuid() == 0 and os.path.exists("/dev/fuse")


class _Server:
    def __init__(self, fd: int, source: str, name: str, bad: list[tuple[int, int]]):
        self.fd, self.name, self.bad = fd, name.encode(), bad
        self.data = open(source, "rb").read()
        self.thread = threading.Thread(target=self.serve, name="faulty-fs", daemon=True)

    def attr(self, node: int) -> bytes:
        if node == ROOT:
            mode, size, nlink = stat.S_IFDIR | 0o755, 0, 2
        else:
            mode, size, nlink = stat.S_IFREG | 0o444, len(self.data), 1
        return _ATTR.pack(node, size, (size + 511) // 512, 0, 0, 0, 0, 0, 0, mode, nlink, 0, 0, 0, 4096, 0)

    def reply(self, unique: int, payload: bytes = b"", error: int = 0) -> None:
        try:
            os.write(self.fd, _OUT.pack(_OUT.size + len(payload), -error, unique) + payload)
        except OSError:
            pass  # the request was interrupted or the file system unmounted meanwhile

    def serve(self) -> None:
        while True:
            try:
                request = os.read(self.fd, (1 << 20) + 4096)
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                return  # ENODEV: unmounted
            if not request:
                return
            _len, opcode, unique, node, *_ = _IN.unpack_from(request)
            body = request[_IN.size:]
            if opcode in (FORGET, BATCH_FORGET, INTERRUPT):
                continue  # no reply expected
            if opcode == INIT:
                major, minor, readahead, _flags = struct.unpack_from("<IIII", body)
                self.reply(unique, struct.pack("<IIIIHHIIHHI7I", 7, min(minor, 31), readahead, 0, 16, 12, 1 << 16,
                                               1, 16, 0, 0, *([0] * 7)))
            elif opcode == LOOKUP:
                if node == ROOT and body.rstrip(b"\0") == self.name:
                    self.reply(unique, struct.pack("<QQQQII", FILE, 0, 0, 0, 0, 0) + self.attr(FILE))
                else:
                    self.reply(unique, error=errno.ENOENT)
            elif opcode == GETATTR:
                self.reply(unique, struct.pack("<QII", 0, 0, 0) + self.attr(node))
            elif opcode in (OPEN, OPENDIR):
                self.reply(unique, struct.pack("<QII", 0, FOPEN_DIRECT_IO if opcode == OPEN else 0, 0))
            elif opcode == READ:
                _fh, offset, size, *_ = _READ_IN.unpack_from(body)
                if any(offset < b and a < offset + size for a, b in self.bad):
                    self.reply(unique, error=errno.EIO)
                else:
                    self.reply(unique, self.data[offset:offset + size])
            elif opcode in (RELEASE, RELEASEDIR, FLUSH, DESTROY):
                self.reply(unique)
            else:
                self.reply(unique, error=errno.ENOSYS)


@contextlib.contextmanager
def failing_mount(mountpoint, source, bad: list[tuple[int, int]], name: str = "store.h5"):
    """Mount at ``mountpoint`` a file system holding ``name``: ``source``'s bytes, with reads touching any
    ``[a, b)`` of ``bad`` failing with EIO.  Yields the file's path; unmounts on exit."""
    mountpoint = os.fspath(mountpoint)
    os.makedirs(mountpoint, exist_ok=True)
    fd = os.open("/dev/fuse", os.O_RDWR)
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
    if _libc.mount(b"h5stream-faulty", mountpoint.encode(), b"fuse", 6, options) != 0:  # MS_NOSUID | MS_NODEV
        code = ctypes.get_errno()
        os.close(fd)
        raise OSError(code, f"mount fuse at {mountpoint}: {os.strerror(code)}")
    server = _Server(fd, os.fspath(source), name, bad)
    server.thread.start()
    try:
        yield os.path.join(mountpoint, name)
    finally:
        _libc.umount2(mountpoint.encode(), MNT_DETACH)
        os.close(fd)  # ends the server's read with an error
        server.thread.join(timeout=30)
