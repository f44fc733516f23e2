"""Whole blocks of pixels written straight to the disk, at the file offsets HDF5 allocated for them.

A new store's ``/images`` has its chunks allocated as soon as the array grows
(see :mod:`h5stream.store.layout`), so the writer learns a block's offset
(``chunk_info``) before a byte of it is written and can write the block
there itself.  :class:`RawChunks` does so with ``O_DIRECT``: the bytes go from
the caller's memory (a decode slot) to the disk, with no copy into the page
cache, which was the largest part of the ingest process's CPU (a copy of every
pixel, then the write-back).  HDF5 never reads or writes those bytes: the
chunk's index entry is HDF5's, its content ours.

Direct writes need the memory, the offset and the length on a multiple of the
disk's block; :meth:`RawChunks.write` answers False for a block that is not
(then HDF5 writes it as before), and from then on when the disk refuses a
first write as misaligned (a block larger than :data:`ALIGN_BYTES`).  A file system that refuses ``O_DIRECT``
(tmpfs, some network file systems) gives no :class:`RawChunks` at all
(:meth:`RawChunks.open` returns None).

The writes run in a thread of their own, in order, one at a time: the
writing process goes on (taking the workers' next rows, the labels, the
checksums) while the disk writes a block, instead of waiting out every
block's write; so the disk's time and the process's CPU overlap rather than
add up.  The first write of a descriptor is made at once (a disk that wants
another alignment says so there).  The caller keeps a block's memory
unchanged until :meth:`RawChunks.wait` says its write is done: every write
submitted so far, or the first ``upto`` of them.

Durability is unchanged: :meth:`RawChunks.wait` returns once the writes are
on the disk (though perhaps in its volatile cache), and the writer waits for
them, then calls ``fsync`` (which flushes that cache too), before it raises
``committed_rows``.  The writes land in file space the
writer allocated first (:class:`~h5stream.store.space.SpaceGuard`), so a full
disk or a file size limit cannot fail them half-way; an I/O error is raised
as OSError by the next :meth:`RawChunks.write` or :meth:`RawChunks.wait`
(the writes after it are not made), which the writer turns into a failed
write.

One owner: the :class:`~h5stream.store.writer.StoreWriter` of the file, from
its one thread, which calls every public method; the I/O thread runs
:meth:`RawChunks._run` alone.  :meth:`RawChunks.close` is idempotent and
returns once no write is under way.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import deque

import numpy as np

from h5stream.concurrency.wait import wait_until

#: Memory, offsets and lengths of a direct write are multiples of this (the largest logical block in use).
ALIGN_BYTES = 4096


def aligned(address: int, offset: int, nbytes: int, align: int = ALIGN_BYTES) -> bool:
    """Whether a write of ``nbytes`` from memory ``address`` to file ``offset`` can go direct (pure)."""
    return nbytes > 0 and address % align == 0 and offset % align == 0 and nbytes % align == 0


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


class RawChunks:
    """An ``O_DIRECT`` descriptor of one store file, for whole chunks at the offsets HDF5 gives, written in order
    by a thread of its own (see the module doc)."""

    def __init__(self, fd: int):
        self._fd: int | None = fd
        self._cond = threading.Condition()
        self._jobs: deque[tuple[memoryview, int, int]] = deque()  # not yet written: (bytes, address, file offset)
        self._submitted = 0  # writes submitted (the first, made at once, included)
        self._done = 0  # writes finished, or dropped after an error or by close
        self._error: OSError | None = None  # the first failed write's: raised by the next write or wait
        self._stopping = False
        self._thread: threading.Thread | None = None

    @classmethod
    def open(cls, path: str, same_as: int | None = None) -> RawChunks | None:
        """A direct descriptor of ``path``, or None where the file system refuses ``O_DIRECT`` (or has none), or
        where the file opened is not the one open at descriptor ``same_as`` (HDF5's: a name replaced since HDF5
        opened it gets no direct write).  It stays valid when the file is renamed."""
        flag = getattr(os, "O_DIRECT", 0)
        if not flag:
            return None
        try:
            fd = os.open(path, os.O_WRONLY | flag | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            ours = same_as is None or _identity(fd) == _identity(same_as)
        except OSError:
            ours = False
        if not ours:
            os.close(fd)
            return None
        return cls(fd)

    @property
    def submitted(self) -> int:
        """How many writes were submitted so far: :meth:`wait` with this count waits for all of them."""
        return self._submitted

    def write(self, chunk: np.ndarray, offset: int) -> bool:
        """Submit the C-contiguous ``chunk`` for writing at file ``offset`` (space already allocated); False, with
        nothing written, when it cannot go direct (see :func:`aligned`).  ``chunk`` must stay unchanged until
        :meth:`wait` says this write is done.  Raises OSError when an earlier write failed, or this one when it
        is the descriptor's first.  Owner's thread."""
        if self._fd is None:
            return False
        view = memoryview(chunk).cast("B")
        if not aligned(chunk.ctypes.data, offset, view.nbytes):
            return False
        self._raise_error()
        if self._submitted == 0:  # the first, at once: a disk that wants another alignment refuses it here
            try:
                self._write_all(view, chunk.ctypes.data, offset)
            except OSError as exc:
                if exc.errno == errno.EINVAL and getattr(exc, "nothing_written", False):
                    self.close()  # HDF5 writes this block and the next ones
                    return False
                raise
            self._submitted = self._done = 1
            return True
        with self._cond:
            self._jobs.append((view, chunk.ctypes.data, offset))
            self._submitted += 1
            self._cond.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="h5stream-direct-writes", daemon=True)
            self._thread.start()
        return True

    def wait(self, upto: int | None = None) -> None:
        """Return once the first ``upto`` writes submitted (default: all of them) are done; raise the OSError of
        a write that failed.  A Ctrl-C ends the wait (the writes go on: :meth:`close` waits for them).  Owner's
        thread."""
        want = self._submitted if upto is None else min(upto, self._submitted)
        with self._cond:
            wait_until(self._cond, lambda: self._done >= want)
        self._raise_error()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        """The I/O thread: the submitted writes in order, until :meth:`close`; after a failure the rest are
        dropped (counted done, nothing written)."""
        while True:
            with self._cond:
                while not self._jobs and not self._stopping:
                    self._cond.wait()
                if not self._jobs:
                    return
                view, address, offset = self._jobs[0]
                skip = self._stopping or self._error is not None
            if not skip:
                try:
                    self._write_all(view, address, offset)
                except OSError as exc:
                    self._error = exc
                except BaseException as exc:  # noqa: BLE001 - reported to the owner, never lost in this thread
                    self._error = OSError(errno.EIO, f"a direct write failed: {exc!r}")
            with self._cond:
                self._jobs.popleft()
                self._done += 1
                self._cond.notify_all()

    def _write_all(self, view: memoryview, address: int, offset: int) -> None:
        """``view`` (at memory ``address``) at file ``offset``, in as many ``pwrite`` calls as it takes (each
        continuing aligned).  Any thread, one at a time."""
        done = 0
        while done < view.nbytes:
            try:
                n = os.pwrite(self._fd, view[done:], offset + done)
            except OSError as exc:
                exc.nothing_written = done == 0
                raise
            if n <= 0 or (done + n < view.nbytes and not aligned(address + done + n, offset + done + n,
                                                                 view.nbytes - done - n)):
                raise OSError(errno.EIO, f"a direct write stopped after {done + n} of {view.nbytes} bytes")
            done += n

    def close(self) -> None:
        """Drop the writes not yet under way, wait for the one that is, close the descriptor (idempotent).
        Owner's thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def writes_whole_chunks(arr) -> bool:
    """Whether whole blocks of the PyTables array ``arr`` may be written as raw chunks: no filter changes their
    bytes, and a chunk holds whole rows (pure over the array's layout)."""
    f = arr.filters
    return not f.complevel and not f.fletcher32 and tuple(arr.chunkshape[1:]) == tuple(arr.shape[1:])
