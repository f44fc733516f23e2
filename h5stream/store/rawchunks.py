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

Durability is unchanged: a direct write is on the disk (though perhaps in its
volatile cache) when it returns, and the writer's ``fsync`` before it raises
``committed_rows`` flushes that cache too.  The writes land in file space the
writer allocated first (:class:`~h5stream.store.space.SpaceGuard`), so a full
disk or a file size limit cannot fail them half-way; an I/O error raises
OSError, which the writer turns into a failed write.

One owner: the :class:`~h5stream.store.writer.StoreWriter` of the file, from
its one thread; :meth:`RawChunks.close` is idempotent.
"""

from __future__ import annotations

import errno
import os

import numpy as np

#: Memory, offsets and lengths of a direct write are multiples of this (the largest logical block in use).
ALIGN_BYTES = 4096


def aligned(address: int, offset: int, nbytes: int, align: int = ALIGN_BYTES) -> bool:
    """Whether a write of ``nbytes`` from memory ``address`` to file ``offset`` can go direct (pure)."""
    return nbytes > 0 and address % align == 0 and offset % align == 0 and nbytes % align == 0


class RawChunks:
    """An ``O_DIRECT`` descriptor of one store file, for whole chunks at the offsets HDF5 gives."""

    def __init__(self, fd: int):
        self._fd: int | None = fd

    @classmethod
    def open(cls, path: str) -> RawChunks | None:
        """A direct descriptor of ``path``, or None where the file system refuses ``O_DIRECT`` (or has none).
        It stays valid when the file is renamed."""
        flag = getattr(os, "O_DIRECT", 0)
        if not flag:
            return None
        try:
            return cls(os.open(path, os.O_WRONLY | flag | os.O_CLOEXEC))
        except OSError:
            return None

    def write(self, chunk: np.ndarray, offset: int) -> bool:
        """Write the C-contiguous ``chunk`` at file ``offset`` (space already allocated); False, with nothing
        written, when it cannot go direct (see :func:`aligned`).  Raises OSError when the write fails."""
        if self._fd is None:
            return False
        view = memoryview(chunk).cast("B")
        if not aligned(chunk.ctypes.data, offset, view.nbytes):
            return False
        done = 0
        while done < view.nbytes:
            try:
                n = os.pwrite(self._fd, view[done:], offset + done)
            except OSError as exc:
                if exc.errno == errno.EINVAL and done == 0:  # the disk wants larger alignment: nothing written
                    self.close()  # HDF5 writes this block and the next ones
                    return False
                raise
            if n <= 0 or (done + n < view.nbytes and not aligned(chunk.ctypes.data + done + n, offset + done + n,
                                                                 view.nbytes - done - n)):
                raise OSError(errno.EIO, f"a direct write stopped after {done + n} of {view.nbytes} bytes")
            done += n
        return True

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
