"""The feeder's protocol: the messages between the training process and its feeder process, as bytes.

Pure data over one duplex pipe (see :mod:`h5stream.streaming.process_feed` for who sends what when): the two
messages of every batch, ``NEXT`` and ``BATCH``, packed by hand; every other one a pickle; an error raised in the
feeder travels as a payload the training process rebuilds into the same exception type and message.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import pickle
import struct
import threading
import traceback

import numpy as np

from h5stream import errors
from h5stream.errors import H5StreamError, ReaderError, descriptor_limit

START, NEXT, STATS, STOP = "start", "next", "stats", "stop"
READY, FATAL, STARTED, BATCH, ERROR = "ready", "fatal", "started", "batch", "error"


# -- the messages, as bytes ------------------------------------------------------------------------------------------

_NEXT_HEAD = struct.Struct("<cq")  # b"N", generation; then the freed slots as int32
_BATCH_HEAD = struct.Struct("<cqqqqq")  # b"B", generation, epoch, index, slot, rows; then the labels' bytes


def pack(msg: tuple, label_dtype: np.dtype, label_shape: tuple) -> bytes:
    """One message as bytes (pure).  The two of every batch, ``NEXT`` and a ``BATCH`` whose labels have the
    store's dtype and shape, are packed by hand (a few microseconds less than a pickle on each side, in the
    training process); every other message is a pickle (whose first byte is neither ``N`` nor ``B``)."""
    kind = msg[0]
    if kind == NEXT:
        return _NEXT_HEAD.pack(b"N", msg[1]) + np.asarray(msg[2], np.int32).tobytes()
    if kind == BATCH and msg[4] >= 0:
        labels = msg[6]
        if (isinstance(labels, np.ndarray) and labels.dtype == label_dtype
                and labels.shape == (msg[5], *label_shape)):
            return _BATCH_HEAD.pack(b"B", *msg[1:6]) + np.ascontiguousarray(labels).tobytes()
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


def unpack(data: bytes, label_dtype: np.dtype, label_shape: tuple) -> tuple:
    """The message :func:`pack` made (pure); a batch's labels are a writable array of their own."""
    head = data[:1]
    if head == b"N":
        _, gen = _NEXT_HEAD.unpack_from(data)
        return NEXT, gen, np.frombuffer(data, np.int32, offset=_NEXT_HEAD.size).tolist()
    if head == b"B":
        _, gen, epoch, index, slot, rows = _BATCH_HEAD.unpack_from(data)
        labels = np.frombuffer(data, label_dtype, offset=_BATCH_HEAD.size).reshape(rows, *label_shape).copy()
        return BATCH, gen, epoch, index, slot, rows, labels
    return pickle.loads(data)


# -- the error that crosses the pipe ---------------------------------------------------------------------------------


def error_payload(exc: BaseException) -> tuple:
    """``(pickled exception or None, type name, message, traceback text)`` of ``exc`` (feeder side)."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)  # an exception whose constructor takes other arguments does not come back
    except Exception:
        data = None
    return data, type(exc).__name__, str(exc), tb


def rebuild_error(payload: tuple, where: str) -> BaseException:
    """The exception of :func:`error_payload` again (trainer side): the same type and message, the feeder's
    traceback as its cause.  One not of h5stream's is a :class:`ReaderError` naming it, but for running out of
    file descriptors: that ``OSError`` is kept, so the stream names the limit as without the feeder."""
    data, name, message, tb = payload
    exc = None
    if data is not None:
        try:
            exc = pickle.loads(data)
        except Exception:
            exc = None
    if exc is None:
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, H5StreamError):
            try:
                exc = cls(message)
            except Exception:
                exc = None
    if not isinstance(exc, H5StreamError) and not (isinstance(exc, OSError) and descriptor_limit(exc.errno)):
        exc = ReaderError(f"{where}: the feeder process raised {name}: {message}")
    exc.__cause__ = _FeederTraceback(tb)
    return exc


class _FeederTraceback(Exception):
    """The feeder's traceback of an error re-raised in the training process (its ``__cause__``)."""

    def __str__(self) -> str:
        return f"\n\nin the feeder process:\n{self.args[0]}"


def send(conn, msg, labels_as=(None, ())) -> bool:
    """Send ``msg`` packed (:func:`pack`); False when the other end is gone."""
    try:
        conn.send_bytes(pack(msg, *labels_as))
        return True
    except (EOFError, OSError):
        return False


# -- the feeder's progress, beside the pipe --------------------------------------------------------------------------


def progress_word():
    """A counter in shared memory that the feeder raises whenever its reader has done something (a read, a fill)
    since it last looked (:class:`ProgressBeacon`), and the training process reads while it waits for an answer:
    so its wait follows the rule of ``timeout_s`` (no read for ``timeout_s``), not a fixed time.  Given to the
    feeder as it is spawned (multiprocessing's shared memory, unlinked as it is made: nothing is left behind)."""
    return mp.get_context("spawn").RawValue(ctypes.c_uint64, 0)


class ProgressBeacon:
    """The feeder's thread that looks at its feed's reader every ``every_s`` and raises ``word`` when the reader's
    progress (:attr:`h5stream.read.reader.Reader.progress`, or another reader after a restart) changed.  Reads
    the reader's counters only (a snapshot, from this thread); :meth:`close` ends the thread.  Owned by the
    feeder's main thread."""

    def __init__(self, feed, word, every_s: float):
        self._feed, self._word, self._every_s = feed, word, float(every_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="h5stream-feeder-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = None
        while not self._stop.wait(self._every_s):
            reader = self._feed.reader
            now = None if reader is None else (id(reader), reader.progress)
            if now != last:
                last = now
                self._word.value += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
