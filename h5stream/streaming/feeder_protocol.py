"""The feeder's protocol: the messages between the training process and its feeder process, as bytes.

Pure data over one duplex pipe (see :mod:`h5stream.streaming.process_feed` for who sends what when): the two
messages of every batch, ``NEXT`` and ``BATCH``, packed by hand; every other one a pickle; an error raised in the
feeder travels as a payload the training process rebuilds into the same exception type and message.
"""

from __future__ import annotations

import pickle
import struct
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
