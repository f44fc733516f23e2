"""Writing one piece of the disk cache (:mod:`h5stream.remote.cache`) as its response arrives.

:class:`PieceWriter` is the sink a :class:`~h5stream.remote.source.RemoteSource` streams a piece's body into
(:meth:`~h5stream.remote.source.RemoteSource.stream_range`): each part of the body, as the client hands it over, is
written with ``pwrite`` at its place in the piece file and added to the piece's CRC-32 while it is still in the
CPU's cache.  Against a memory map of the file, this spares a page fault per 4 KiB written and a second pass over
the piece for its CRC; against a buffer of the piece's size, the memory (a part of the body at a time).  A local
write that fails raises :class:`WriteFailed`, which the client passes on as it is (an h5stream error), so a full
disk is never taken for a server's failure.
"""

from __future__ import annotations

import os
import zlib

from h5stream.errors import H5StreamError


class WriteFailed(H5StreamError):
    """A piece file could not be written; ``error`` is the ``OSError``."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


class PieceWriter:
    """Writes the ``expected`` bytes of a piece, in order, into the open file ``fd`` from offset 0, keeping their
    CRC-32 (``crc``) and count (``filled``).  One thread."""

    def __init__(self, fd: int, expected: int):
        self.fd = fd
        self.expected = int(expected)
        self.filled = 0
        self.crc = 0

    def write(self, part: memoryview) -> None:
        """Append ``part`` (raises :class:`OverflowError` past ``expected``, :class:`WriteFailed` when the file
        cannot be written)."""
        n = len(part)
        if self.filled + n > self.expected:
            raise OverflowError(f"{self.filled + n} bytes for a piece of {self.expected}")
        pos = 0
        try:
            while pos < n:
                pos += os.pwrite(self.fd, part[pos:], self.filled + pos)
        except OSError as exc:
            raise WriteFailed(exc) from None
        self.crc = zlib.crc32(part, self.crc)
        self.filled += n
