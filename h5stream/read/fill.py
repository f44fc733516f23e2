"""What the reader thread works with: a batch as it is handed on, one fill being read, and the I/O threads.

A fill (see :mod:`h5stream.order.epoch`) is read into the batches it lands in; :class:`FillJob` records, for
every buffer position, which batch and row it lands at, and :class:`Pending` a batch being assembled.  The
reader thread (:class:`h5stream.read.reader.Reader`) owns all of them; :class:`IOThreads` runs the reads it
hands out.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from dataclasses import dataclass

import numpy as np

from h5stream.errors import (ChecksumError, H5StreamError, ImageDecodeError, ReaderError, StoreBusyError,
                             descriptor_limit)
from h5stream.read.runs import Run
from h5stream.read.source import close_while_reading


@dataclass
class Batch:
    """A batch as the reader hands it on.  ``images``/``labels``/``row_ids`` belong to the receiver.

    ``slot`` is whatever the allocator attached (e.g. a shared-memory slot index), else None.
    A batch without images carries ``file_offsets`` (every row's byte offset) and, where the reads are
    checked, ``checks``: ``(digests, checked)``, every row's xxh3-64 and whether it is to be checked (see
    :meth:`h5stream.read.verify.BlockCheck.expected`), for the receiver that reads the rows.
    """

    epoch: int
    index: int
    images: np.ndarray
    labels: np.ndarray
    row_ids: np.ndarray
    slot: object = None
    file_offsets: np.ndarray | None = None
    checks: tuple[np.ndarray, np.ndarray] | None = None
    encoded_lengths: np.ndarray | None = None
    """An encoded store's batch: each row's JPEG length at the start of its place, -1 for pixels (see
    :mod:`h5stream.read.encoded`); the receiver decodes them (:func:`h5stream.store.jpeg.decode_slot_rows`)."""


@dataclass(frozen=True)
class Failure:
    exc: BaseException


def consumer_error(exc: BaseException, path: str, open_files_hint: str = "") -> BaseException:
    """The error the consumer gets for the reader thread's failure ``exc`` while reading ``path`` (pure): a busy
    store, a checksum mismatch and a row that does not decode as they are (one line already saying what to do),
    running out of file descriptors named as that limit (with ``open_files_hint``), another h5stream error's line
    and anything else's repr in a ReaderError naming the file once."""
    if isinstance(exc, StoreBusyError):
        return StoreBusyError(str(exc))
    if isinstance(exc, ChecksumError):
        return ChecksumError(str(exc))
    if isinstance(exc, ImageDecodeError):  # a JPEG row the reader thread decoded
        return ImageDecodeError(str(exc))
    limit = descriptor_limit(getattr(exc, "errno", None))
    if limit is not None:
        return ReaderError(f"{path}: reading failed: {limit[0]}; {limit[1]}{open_files_hint}")
    if isinstance(exc, H5StreamError):  # one line that says what to do: the file named once
        return ReaderError(f"{path}: reading failed: {str(exc).removeprefix(f'{path}: ')}")
    return ReaderError(f"{path}: reading failed: {exc!r}")


class Pending:
    """A batch being assembled: arrays, a byte view of its images, and how many rows are still missing."""

    __slots__ = ("batch", "missing", "rows")

    def __init__(self, batch: Batch, missing: int):
        self.batch = batch
        self.missing = missing
        images = batch.images
        self.rows = memoryview(images.reshape(-1)).cast("B") if images is not None and images.size else None


class FillJob:
    """One fill being read: its runs and, for every buffer position, the batch and row it lands at.

    Pixels go straight into the batches; labels and row ids are gathered into small per-fill arrays and
    scattered when the fill is complete, which is also when its batches count the rows as arrived.
    """

    def __init__(self, epoch: int, batch: np.ndarray, offset: np.ndarray, row_ids: np.ndarray,
                 labels: np.ndarray | None, runs: list[Run], yielded: np.ndarray):
        self.epoch = epoch
        self.batch = batch  # buffer position -> batch index, -1: read but not used
        self.offset = offset  # buffer position -> row in its batch
        # The buffer positions that go to a batch, in the order they are yielded: by batch, and within a batch
        # row after row (see placement), so each batch's rows are one slice of it.
        used = batch[yielded] >= 0
        self.yielded = yielded if used.all() else yielded[used]
        self.first_batch = int(batch[self.yielded[0]]) if len(self.yielded) else 0
        self.n_batches = int(batch[self.yielded[-1]]) + 1 - self.first_batch if len(self.yielded) else 0
        self.row_ids = row_ids
        self.labels = labels  # None: read with the runs when the fill completes
        self.runs = runs
        self.to_read = runs  # the runs read into batches (deferred batches' rows are read by their receivers)
        self.done = 0  # runs of to_read read or handed to the I/O threads
        self.targets: dict[int, Pending] = {}
        self.placement = None  # where small rows land (read/scatter.py), set by RowReader.prepare
        self.iovecs = None  # where every row lands, as addresses (read/iovec.py), set by RowReader.prepare
        self.futures: list = []
        self.head: list = []  # the futures of the first batch's runs, read first (h5stream.read.arrive)
        self.arrived = self.first_batch  # batches before this one counted as arrived (h5stream.read.arrive)
        self.batch_ends: np.ndarray | None = None  # where each batch ends in yielded, once asked for


class IOThreads:
    """A fixed set of daemon threads running submitted calls: ``concurrent.futures.ThreadPoolExecutor`` without
    its join at interpreter exit, which would wait for good on a read that hangs.  Created, used and shut down
    by the reader thread; ``source`` is the byte source the calls read."""

    def __init__(self, n: int, name: str, source=None):
        self._source = source
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._name = name
        self._threads: list[threading.Thread] = []
        self.grow(n)

    def grow(self, n) -> int:
        """Have at least ``n`` threads (at least one), starting more where there are fewer (a source whose reads
        in flight grow: a URL's once it stops caching); the count now.  The owner's thread."""
        while len(self._threads) < max(1, int(n)):
            t = threading.Thread(target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True)
            self._threads.append(t)
            t.start()
        return len(self._threads)

    def submit(self, fn, *args) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((future, fn, args))
        return future

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn, args = call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # Stopped included: the waiter re-raises it
                future.set_exception(exc)
            else:
                future.set_result(result)

    def shutdown(self) -> None:
        """Cancel the calls not started, let the running ones finish, end the threads.  A source that may be
        closed while its reads are in flight is closed first (see :func:`~h5stream.read.source.close_while_reading`),
        so a read that hangs holds nothing of it (a URL's disk cache: locks other processes wait for) meanwhile."""
        close_while_reading(self._source)
        while True:
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                break
            if call is not None:
                call[0].cancel()
        for _ in self._threads:
            self._calls.put(None)
        for t in self._threads:
            t.join()
