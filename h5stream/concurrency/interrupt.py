"""Ctrl-C at safe points: a SIGINT that reaches the main thread while it is inside h5stream waits for a safe point.

Python raises ``KeyboardInterrupt`` between any two bytecodes, including the
instant after a ``threading.Condition`` (or ``queue.Queue``) has taken its lock
and before the ``with`` block that releases it has begun.  The lock then stays
taken by the main thread for good, the reader thread or a worker pool's waiter
blocks on it forever, and closing the stream waits out its timeouts with the
interrupt in hand.

So :func:`install` (called when a stream opens) puts a handler in front of
SIGINT's that passes every signal straight on, except while the main thread is
between :func:`hold` and :func:`release` (waiting for a batch, opening,
closing): then the signal is only recorded, and the real handler runs at
:func:`raise_pending`, which the waits call between their polls (where no lock
is half taken), or at :func:`release` at the latest.  Every wait is one of :mod:`h5stream.concurrency.wait`'s, which
look every :data:`~h5stream.concurrency.wait.POLL_S`, so the interrupt is still raised within a
fraction of a second; outside h5stream nothing changes.  ``hold`` / ``release``
are a counter, cheap enough for every batch.

Main thread only (the only thread Python runs signal handlers in); a handler of
the user's (IPython's, say) is run the same way as the default one.  Where the
handler is not a Python function (ignored, default action) nothing is installed.
"""

from __future__ import annotations

import os
import signal
import threading

_main = threading.main_thread().ident
_depth = 0  # > 0 while the main thread is inside h5stream
_owed: list = []  # frames of the SIGINTs held back meanwhile
_next_handler = None  # the handler ours passes signals on to


def _handler(signum, frame) -> None:
    if _depth:
        _owed.append(frame)
    elif _next_handler is not None:
        _next_handler(signum, frame)
    else:  # cannot happen: installed only over a callable handler
        raise KeyboardInterrupt


def install() -> None:
    """Put the holding handler in front of SIGINT's current Python handler (main thread; idempotent)."""
    global _next_handler
    if threading.get_ident() != _main:
        return
    current = signal.getsignal(signal.SIGINT)
    if current is _handler or not callable(current):
        return
    try:
        signal.signal(signal.SIGINT, _handler)
    except ValueError:  # not the main interpreter
        return
    _next_handler = current


def hold() -> None:
    """Enter h5stream: from now on a SIGINT waits for :func:`raise_pending` or :func:`release`."""
    global _depth
    if threading.get_ident() == _main:
        _depth += 1


def release() -> None:
    """Leave h5stream (pair of :func:`hold`, in a ``finally``); run a SIGINT that arrived meanwhile."""
    global _depth
    if threading.get_ident() == _main:
        _depth -= 1
        if not _depth:
            raise_pending()


def _after_fork_in_child() -> None:
    """In a child forked by a thread other than the main one: that thread is the child's main thread, and it is
    inside no h5stream call (whatever the parent's main thread was in), so a Ctrl-C there is not held back."""
    global _main, _depth
    me = threading.get_ident()
    if me != _main:
        _main, _depth = me, 0
        _owed.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def raise_pending() -> None:
    """Run SIGINT's handler now if a SIGINT was held back (raising ``KeyboardInterrupt``); call only where no
    lock is being taken or released."""
    if _owed and threading.get_ident() == _main:
        frame = _owed[-1]
        _owed.clear()
        if _next_handler is not None:
            _next_handler(signal.SIGINT, frame)


def _code_of(handler):
    """The code object a signal handler runs first, or None (``SIG_DFL``, ``SIG_IGN``, a C handler)."""
    for _ in range(4):  # a bound method, a functools.partial, a callable object: unwrap a few levels
        code = getattr(handler, "__code__", None)
        if code is not None:
            return code
        inner = getattr(handler, "__func__", None) or getattr(handler, "func", None)
        if inner is None and callable(handler) and not isinstance(handler, type):
            inner = type(handler).__call__
        if inner is None:
            return None
        handler = inner
    return None


def raised_by_signal_handler(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by (or under) a Python signal handler installed now: the user's graceful
    shutdown (a SIGTERM handler raising ``SystemExit`` or torch elastic's ``SignalException``), an alarm's
    timeout.  Such an exception interrupts whatever the main thread was doing and is the caller's to handle,
    never a failure of what it interrupted.  Any thread."""
    codes = set()
    for signum in signal.valid_signals():
        try:
            code = _code_of(signal.getsignal(signum))
        except (ValueError, OSError):  # pragma: no cover - a signal Python cannot look at
            continue
        if code is not None:
            codes.add(code)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False
