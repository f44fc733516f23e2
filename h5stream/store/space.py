"""The disk-space guard of a store being written: file space allocated before HDF5 writes, checked after.

HDF5 reports failed writes late or not at all (PyTables ignores what
``H5Fflush`` and ``H5Fclose`` return), so a write must not be able to fail
half-way for want of space.  Before HDF5 writes, :meth:`SpaceGuard.reserve`
allocates (``posix_fallocate``) the file space the write can take, as
:func:`space_for` counts it; a full disk or a file size limit fails there,
with HDF5 untouched.  After it, :meth:`SpaceGuard.check_within` makes sure
every byte HDF5 wrote lies in that space.  On a file system that cannot
allocate ahead, the file's size is checked after the fact instead.

:class:`SpaceGuard` owns the reservation of one open file (how far it is
allocated, its size at the last good flush), not the file: the
:class:`~h5stream.store.writer.StoreWriter` that owns the handle calls it,
from its one thread.
"""

from __future__ import annotations

import errno
import math
import os


from h5stream.store import layout

#: Space reserved past the end of HDF5's file at every flush, for the headers it may add.
RESERVE_SLACK_BYTES = 64 << 10
#: Per new chunk: index (B-tree) growth, a few times what HDF5 adds, and the padding up to a page boundary.
RESERVE_PER_CHUNK_BYTES = 256 + layout.PAGE_BYTES
#: HDF5 hands out metadata space from blocks just below its end of file: those are allocated too.
RESERVE_BACK_BYTES = 64 << 10
#: Space allocated past what a write needs, so the next writes find it there (one ``posix_fallocate`` per
#: this much rather than per write); where it does not fit, only what is needed is allocated.
RESERVE_AHEAD_BYTES = 16 << 20


def space_for(arrays, rows: int) -> int:
    """Most file space HDF5 can take for ``rows`` more rows of ``arrays`` (PyTables leaves): every chunk they
    start (plus the partly filled one a compressed array rewrites elsewhere), with room for compression overhead
    and index (pure over the arrays' shapes)."""
    total = 0
    for arr in arrays:
        per_chunk = int(arr.chunkshape[0])
        chunk_bytes = math.prod(int(d) for d in arr.chunkshape) * int(arr.atom.itemsize)
        before, after = arr.nrows, arr.nrows + rows
        new = -(-after // per_chunk) - -(-before // per_chunk)
        filtered = bool(arr.filters.complevel)
        if filtered and before % per_chunk:
            new += 1
        overhead = chunk_bytes // 64 + 4096 if filtered else 0
        # Index nodes: the first of an empty index, one per split (at most one per INDEX_K new chunks when
        # appending), and the root's when it splits.
        nodes = new // layout.INDEX_K + 2 if new else 0
        total += new * (chunk_bytes + overhead + RESERVE_PER_CHUNK_BYTES)
        total += nodes * layout.index_node_bytes(arr.ndim)
    return total


class SpaceGuard:
    """The reservation of one file HDF5 writes: ``fd`` (None when the file is not a plain POSIX file: then
    nothing can be reserved or checked) and ``end_of_file``, a function giving HDF5's end of file (its
    ``get_filesize``).  Not thread-safe: called by the file's one writer thread."""

    def __init__(self, fd: int | None, end_of_file, size: int):
        self.fd = fd
        self._end_of_file = end_of_file
        self.can_reserve = fd is not None
        self.reserved_end = 0  # file offset below which posix_fallocate has allocated every block
        self.good_size = size  # the file's size at the last good flush

    def reserve(self, extra: int) -> None:
        """Allocate the file up to HDF5's end + ``extra`` + slack, so HDF5's writes there cannot fail for space
        (and, where it fits, :data:`RESERVE_AHEAD_BYTES` more for the writes to come).  Raises OSError (ENOSPC,
        EFBIG, ...) with nothing written."""
        if not self.can_reserve:
            return
        end_now = self._end_of_file()
        end = end_now + extra + RESERVE_SLACK_BYTES
        if end <= self.reserved_end:
            return
        start = max(0, end_now - RESERVE_BACK_BYTES)
        for want in (end + RESERVE_AHEAD_BYTES, end) if extra else (end,):
            try:
                os.posix_fallocate(self.fd, start, want - start)
            except OSError as exc:
                if exc.errno in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    self.can_reserve = False  # this file system cannot allocate ahead: check sizes after the fact
                    return
                if want == end:
                    raise
                continue  # no room for more than this write needs: allocate only that
            self.reserved_end = want
            return

    def check_within(self) -> None:
        """Raise OSError unless every byte HDF5 has written lies in space allocated before it wrote."""
        end = self._end_of_file()
        if self.can_reserve:
            if end > self.reserved_end:
                raise OSError(f"HDF5 wrote {end - self.reserved_end} bytes past the space reserved for it")
        elif self.fd is not None and os.fstat(self.fd).st_size < end:
            raise OSError(errno.EIO, "some writes did not reach the file (it is shorter than HDF5 wrote)")

    def flushed(self) -> None:
        """Record a good flush: its size is what a failure cuts the file back to.  A flush shrinks the file to
        HDF5's end, freeing what was reserved past it."""
        self.good_size = self._end_of_file()
        if self.fd is not None:
            self.reserved_end = min(self.reserved_end, os.fstat(self.fd).st_size)

    def trim(self) -> None:
        """Give back what was reserved past HDF5's end (before closing after a commit)."""
        end = self._end_of_file()
        if self.fd is not None and os.fstat(self.fd).st_size > end:
            os.ftruncate(self.fd, end)
