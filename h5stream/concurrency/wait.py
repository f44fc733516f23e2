"""Stoppable blocking waits: the one way h5stream's threads block on each other.

Every wait in h5stream -- a batch queue's put or get, a condition's
predicate, I/O futures -- goes through :func:`wait_until` (or the
:class:`Channel` built on it); one that sleeps in ``select`` on pipes instead
(the augment pool's consumer reading its workers) runs :func:`check_stops`
between sleeps of at most :data:`POLL_S`.  It sleeps on a condition variable, so it wakes
at once when the other side acts, and otherwise every :data:`POLL_S` to:

* run the caller's ``check`` (a stop flag, a dead thread, a failure: it raises
  to end the wait),
* honour the *stop scopes* of the calling thread (:func:`stop_when`): a stop
  flag that ends every wait of this thread, including waits inside code that
  takes no flag of its own (the worker pool's ``submit``), by raising
  :class:`Stopped`,
* run a Ctrl-C held back by :mod:`h5stream.concurrency.interrupt` (main thread), so it
  is raised within :data:`POLL_S`.

Nothing is raised while waiting but to end the wait: a deadline passing gives
one ``False`` (or one :class:`TimeoutError` from :class:`Channel`), not an
exception per poll.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

from h5stream.concurrency import interrupt

__all__ = ["POLL_S", "Channel", "Stopped", "check_stops", "stop_when", "wait_futures", "wait_until"]

POLL_S = 0.1
"""Longest a wait goes without looking at its stop flags and a held-back Ctrl-C."""


class Stopped(Exception):
    """Raised inside a thread whose stop flag is set; ends that thread's work quietly."""


_scopes = threading.local()


@contextlib.contextmanager
def stop_when(flag: threading.Event) -> Iterator[None]:
    """Within the block, every :func:`wait_until` of the calling thread raises :class:`Stopped` once ``flag`` is
    set (within :data:`POLL_S`)."""
    flags = getattr(_scopes, "flags", None)
    if flags is None:
        flags = _scopes.flags = []
    flags.append(flag)
    try:
        yield
    finally:
        flags.pop()


def check_stops() -> None:
    """What a wait that sleeps on something else than a condition (a ``select`` on pipes) runs at least every
    :data:`POLL_S`: raise :class:`Stopped` once a stop scope of the calling thread is set, and a held-back
    Ctrl-C.  Any thread."""
    for flag in getattr(_scopes, "flags", None) or ():
        if flag.is_set():
            raise Stopped
    interrupt.raise_pending()


def wait_until(cond: threading.Condition, ready: Callable[[], bool], *, deadline: float | None = None,
               check: Callable[[], None] | None = None) -> bool:
    """With ``cond`` held, wait until ``ready()`` holds (True), or ``deadline`` (``time.monotonic()``) passes
    (False).  ``check()`` runs before each look at ``ready`` and ends the wait by raising; so do the thread's
    stop scopes (:class:`Stopped`) and a held-back Ctrl-C.  Whoever makes ``ready`` true notifies ``cond``;
    otherwise it is seen within :data:`POLL_S`.  Any thread."""
    flags = getattr(_scopes, "flags", None)  # only this thread changes its scopes, and not while it waits
    while True:
        if check is not None:
            check()
        if ready():
            return True
        if flags:
            for flag in flags:
                if flag.is_set():
                    raise Stopped
        interrupt.raise_pending()
        timeout = POLL_S
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
            if timeout <= 0:
                return False
        cond.wait(timeout)


class Channel:
    """A bounded FIFO between threads, whose blocking ``put`` / ``get`` are stoppable :func:`wait_until` waits.

    Any number of producers and consumers; ``maxsize`` > 0.  ``check`` as in :func:`wait_until` (e.g. raise
    :class:`Stopped` once a stop flag is set).  ``resume_at`` (0 <= it < ``maxsize``; default ``maxsize - 1``):
    a ``put`` that found the channel full goes on once no more than ``resume_at`` items are left, so a producer
    that runs ahead is woken once per ``maxsize - resume_at`` items taken, not once per item.
    """

    def __init__(self, maxsize: int, resume_at: int | None = None):
        self.maxsize = int(maxsize)
        self.resume_at = self.maxsize - 1 if resume_at is None else max(0, min(int(resume_at), self.maxsize - 1))
        self._items: deque = deque()
        lock = threading.Lock()
        self._not_empty = threading.Condition(lock)
        self._not_full = threading.Condition(lock)

    def put(self, item, *, check: Callable[[], None] | None = None) -> None:
        """Append ``item``, waiting while the channel is full."""
        with self._not_full:
            if check is not None:
                check()
            if len(self._items) >= self.maxsize:
                wait_until(self._not_full, self._low, check=check)
            self._items.append(item)
            self._not_empty.notify()

    def get(self, *, deadline: float | None = None, check: Callable[[], None] | None = None):
        """The oldest item, waiting while there is none; :class:`TimeoutError` once ``deadline`` passed."""
        with self._not_empty:
            if check is not None:
                check()
            if not self._items and not wait_until(self._not_empty, self._has_items, deadline=deadline, check=check):
                raise TimeoutError("nothing arrived before the deadline")
            item = self._items.popleft()
            if len(self._items) <= self.resume_at:
                self._not_full.notify()
            return item

    def poll(self, default=None):
        """The oldest item, or ``default`` at once when there is none."""
        with self._not_empty:
            if not self._items:
                return default
            item = self._items.popleft()
            if len(self._items) <= self.resume_at:
                self._not_full.notify()
            return item

    def _low(self) -> bool:
        return len(self._items) <= self.resume_at

    def _has_items(self) -> bool:
        return bool(self._items)

    def drain(self) -> list:
        """Take every item now (no wait)."""
        with self._not_empty:
            items = list(self._items)
            self._items.clear()
            self._not_full.notify_all()
            return items

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items


def get_while_moving(channel: Channel, deadline: float, quiet_s: float, progress: Callable[[], object],
                     check: Callable[[], None] | None = None):
    """``channel.get`` until ``deadline``, and past it for as long as ``progress()`` changed in the last
    ``quiet_s`` seconds (looked at every :data:`POLL_S`): a producer that is slow but moving is waited for, one
    that stopped is not.  :class:`TimeoutError` once the deadline has passed and ``progress()`` has not changed
    for ``quiet_s``.  ``check`` as in :meth:`Channel.get`.  The consumer's thread."""
    last = {"progress": progress(), "at": time.monotonic()}

    def look() -> None:
        if check is not None:
            check()
        now = progress()
        if now != last["progress"]:
            last.update(progress=now, at=time.monotonic())

    while True:
        try:
            return channel.get(deadline=deadline, check=look)
        except TimeoutError:
            look()
            deadline = last["at"] + quiet_s
            if deadline <= time.monotonic():
                raise


def wait_futures(futures, *, check: Callable[[], None] | None = None) -> None:
    """Wait until every future is done or one failed, then re-raise the first failure (in ``futures``' order of
    completion).  A :func:`wait_until` wait: ``check``, stop scopes and Ctrl-C as there."""
    futures = list(futures)
    if not futures:
        return
    cond = threading.Condition()
    state = {"left": len(futures), "failed": None}

    def done(f) -> None:
        with cond:
            state["left"] -= 1
            if state["failed"] is None and not f.cancelled() and f.exception() is not None:
                state["failed"] = f
            cond.notify()

    for f in futures:
        f.add_done_callback(done)
    with cond:
        wait_until(cond, lambda: state["left"] == 0 or state["failed"] is not None, check=check)
        failed = state["failed"]
    if failed is not None:
        failed.result()
    for f in futures:
        f.result()  # a cancelled one raises CancelledError
