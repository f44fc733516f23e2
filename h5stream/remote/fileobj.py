"""A read-only file object over a remote store, for h5py: HDF5's many small reads become a few block requests.

HDF5 reads its metadata (superblock, object headers, attributes, chunk B-trees) a few hundred bytes at a
time.  Over the network each read would be a round trip, so :class:`RemoteFile` fetches aligned blocks of
``block_bytes`` and keeps the last ``max_blocks`` of them (least recently used first out): metadata written
together is read together.  Opening a store and describing it takes 3 requests (the ``HEAD`` included);
its chunk offsets one more per node of its chunk index (2,048 chunks in a store laid out by
:mod:`h5stream.store.layout`, 64 in HDF5's default layout).  A read of several missing blocks is one request;
a read of at least ``2 * block_bytes`` (pixels through h5py) bypasses the cache and lands straight in the
caller's buffer.

:func:`open_h5_remote` is the remote counterpart of :func:`h5stream.store.access.open_h5_readonly`: an
``h5py.File`` on a URL, read-only, through HDF5's file-object driver.  An error the source raised inside
h5py's read (not found, access denied, changed, unreachable) reaches the caller as that h5stream error rather
than as HDF5's generic "file read failed".

A failed read is final (the source's retries and ``timeout_s`` are spent): every later read of the same
:class:`RemoteFile` raises the same error at once, without a request, so a caller that catches HDF5's error and
reads on (``h5stream verify`` marking blocks unreadable one by one) cannot turn one failure of ``timeout_s``
into one per read; and the ``with`` block of :func:`open_h5_remote` raises it on exit even when the caller
swallowed HDF5's error.
"""

from __future__ import annotations

import contextlib
import io
import threading
from collections import OrderedDict

import h5py

from h5stream.errors import H5StreamError, StoreFormatError
from h5stream.remote.config import RemoteOptions
from h5stream.remote.source import RemoteSource, byte_views

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
"""The superblock signature, at byte 0 or 512, 1024, 2048... of an HDF5 file (as in :mod:`h5stream.store.access`,
which sits above this package)."""

BLOCK_BYTES = 128 << 10
"""Cache block.  A store's header metadata comes in one; the chunk index's nodes lie far apart (between the
chunks they index), so a larger block would bring more bytes, not fewer requests."""

MAX_BLOCKS = 64
"""Blocks kept; 8 MiB with the default block size."""


def block_span(offset: int, length: int, block_bytes: int) -> range:
    """Indices of the blocks holding bytes ``[offset, offset + length)`` (empty for ``length == 0``)."""
    if length <= 0:
        return range(0)
    return range(offset // block_bytes, (offset + length - 1) // block_bytes + 1)


def missing_runs(blocks: range, cached) -> list[tuple[int, int]]:
    """``(first, count)`` of each run of consecutive blocks in ``blocks`` not in ``cached``."""
    runs: list[tuple[int, int]] = []
    for b in blocks:
        if b in cached:
            continue
        if runs and runs[-1][0] + runs[-1][1] == b:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((b, 1))
    return runs


class RemoteFile(io.RawIOBase):
    """A read-only, seekable, unbuffered file over ``source`` with an LRU cache of ``max_blocks`` blocks.

    ``source`` is a :class:`RemoteSource` (or any byte source); the file does not own it unless
    ``owns_source``.  ``error`` keeps the h5stream error a read raised (see :func:`open_h5_remote`); from then
    on every read raises a copy of it (:meth:`failure`) without asking the source.  Safe to use from several
    threads (reads are serialised).
    """

    def __init__(self, source: RemoteSource, *, block_bytes: int = BLOCK_BYTES, max_blocks: int = MAX_BLOCKS,
                 owns_source: bool = False):
        super().__init__()
        if block_bytes < 512 or max_blocks < 1:
            raise ValueError(f"block_bytes must be >= 512 and max_blocks >= 1, got {block_bytes}, {max_blocks}")
        self.source = source
        self.name = source.name
        self.block_bytes = int(block_bytes)
        self.max_blocks = int(max_blocks)
        self._owns = owns_source
        self._size = int(source.size)
        self._pos = 0
        self._blocks: OrderedDict[int, bytearray] = OrderedDict()
        self._lock = threading.Lock()
        self.error: BaseException | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._size + offset
        else:
            raise ValueError(f"invalid whence {whence!r}")
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def readinto(self, buffer) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        (view,) = byte_views([buffer]) or [memoryview(bytearray())]
        with self._lock:
            failure = self.failure()
            if failure is not None:
                raise failure
            n = max(0, min(len(view), self._size - self._pos))
            if n:
                try:
                    self._read(self._pos, view[:n])
                except (H5StreamError, KeyboardInterrupt) as exc:  # retries and timeout_s spent, or Ctrl-C: final
                    # A copy: the original will pass through h5py's frames, which hold HDF5 objects.
                    self.error = type(exc)(*exc.args)
                    raise
            self._pos += n
            return n

    def failure(self) -> BaseException | None:
        """A new instance of the error that ended this file's reads (no traceback, no chain), or None."""
        return None if self.error is None else type(self.error)(*self.error.args)

    def _read(self, offset: int, out: memoryview) -> None:
        n = len(out)
        if n >= 2 * self.block_bytes:
            self.source.readinto(offset, [out])
            return
        bb = self.block_bytes
        span = block_span(offset, n, bb)
        for first, count in missing_runs(span, self._blocks):
            start = first * bb
            fresh = [bytearray(min(bb, self._size - (first + i) * bb)) for i in range(count)]
            self.source.readinto(start, fresh)
            for i, block in enumerate(fresh):
                self._blocks[first + i] = block
        pos = 0
        for b in span:
            block = self._blocks[b]
            self._blocks.move_to_end(b)
            within = offset + pos - b * bb
            k = min(n - pos, len(block) - within)
            out[pos:pos + k] = memoryview(block)[within:within + k]
            pos += k
        while len(self._blocks) > max(self.max_blocks, len(span)):
            self._blocks.popitem(last=False)

    def close(self) -> None:
        if not self.closed:
            self._blocks.clear()
            if self._owns:
                self.source.close()
        super().close()


@contextlib.contextmanager
def open_h5_remote(url: str, options: RemoteOptions | None = None, *, block_bytes: int = BLOCK_BYTES,
                   max_blocks: int = MAX_BLOCKS, **h5py_kwargs):
    """An ``h5py.File`` on the store at ``url``, read-only, through a block-cached :class:`RemoteFile`.

    ``h5py_kwargs`` go to ``h5py.File``.  Raises what :class:`RemoteSource` raises at open, the h5stream
    error a read raised inside HDF5 (in the block or, if the block swallowed it, on exit), or
    :class:`StoreFormatError` when the object is not HDF5 or HDF5 cannot open it.  Closes the file and its
    source on exit.  :func:`remote_h5` yields the :class:`RemoteFile` too.
    """
    with remote_h5(url, options, block_bytes=block_bytes, max_blocks=max_blocks, **h5py_kwargs) as (f, _):
        yield f


@contextlib.contextmanager
def remote_h5(url: str, options: RemoteOptions | None = None, *, block_bytes: int = BLOCK_BYTES,
              max_blocks: int = MAX_BLOCKS, **h5py_kwargs):
    """Like :func:`open_h5_remote`, yielding ``(h5py.File, RemoteFile)``: the second for its source's counters."""
    source = RemoteSource(url, options)
    raw = RemoteFile(source, block_bytes=block_bytes, max_blocks=max_blocks, owns_source=True)
    try:
        f = _open_h5(raw, url, h5py_kwargs)
        with f:
            try:
                yield f, raw
            except (OSError, RuntimeError, KeyError) as exc:
                failure = raw.failure()
                if failure is not None:
                    raise failure from exc
                raise
        failure = raw.failure()
        if failure is not None:  # the caller went on past HDF5's error: what it read is incomplete
            raise failure
    finally:
        raw.close()


def _open_h5(raw: RemoteFile, url: str, h5py_kwargs: dict) -> h5py.File:
    """``h5py.File`` on ``raw``, or the one-line error saying why not: the source's, "not HDF5", or HDF5's.

    The error is a new one, raised outside the ``except`` and not chained to h5py's: the frames of h5py's
    exception hold the file-access property list whose driver calls back into Python, and an exception kept
    until exit (an uncaught one stays in ``sys.last_value``) would leave HDF5 to free that list after the
    interpreter is gone, a crash (SIGSEGV) at exit.
    """
    try:
        return h5py.File(raw, "r", **h5py_kwargs)
    except (OSError, RuntimeError, KeyError) as exc:
        hdf5_error = " ".join(str(exc).split()) or type(exc).__name__
    raise raw.failure() or _not_hdf5(raw, url) or StoreFormatError(
        f"{url}: cannot read as HDF5 ({hdf5_error}); the object is damaged or not a store")


def _not_hdf5(raw: RemoteFile, url: str) -> StoreFormatError | None:
    """"Not HDF5" when no HDF5 signature is where one may be, else None."""
    offset = 0
    while offset + len(HDF5_SIGNATURE) <= raw.source.size:
        raw.seek(offset)
        if raw.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE:
            return None
        offset = 512 if offset == 0 else 2 * offset
    return StoreFormatError(f"{url}: not an HDF5 file; upload a store made with `h5stream ingest`")
