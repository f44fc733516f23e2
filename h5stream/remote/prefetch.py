"""Fetching a disk cache's pieces ahead of the reads, several at once, in the order the reads will want them.

The reader knows each fill's runs before it reads them (the epoch's order is a pure function of seed, epoch and
options) and advises them to its byte source (:meth:`~h5stream.remote.cache.CachedSource.advise_willneed`).  A
cached source hands the pieces those runs touch, in first-touch order, to a :class:`Prefetcher`, whose threads
fill them into the cache with up to ``threads`` GETs in flight -- as the server's aligned plain-GET limit does --
while the reader's I/O threads serve units from the pieces present.  Without it, the I/O threads fetch a missing
piece themselves, and the threads whose runs fall in the same piece wait for that one fetch: in a fill's file
order a piece holds several runs, so fewer pieces than threads are in flight.

What it keeps:

* Each piece is fetched once: the prefetcher fills through the source's own fill (the per-piece thread lock and
  ``flock``), skipping a piece another thread or process is filling; a read that wants a piece being prefetched
  waits for that fetch instead of sending its own.
* At most ``ahead`` pieces are prefetched and not yet read (they are on disk, not in memory; ``ahead`` keeps them
  well within the cache's limit, so none is evicted before it is read).
* A failed prefetch stops the prefetcher (nothing more is queued); the source keeps the error for the piece, and
  the read that wants the piece raises it instead of waiting out a second timeout, so a server gone mid-epoch
  fails the stream as a read of its own would.
* :meth:`Prefetcher.close` stops the threads: queued pieces are dropped, a fetch in flight ends with its request
  (within the remote source's ``timeout_s``; its source has let go of the piece before, see
  :mod:`h5stream.remote.cache_fill`); the threads are daemons and never keep the process alive.

Thread-safety: :meth:`want` from the reader thread; :meth:`used` from any thread (I/O threads);
:meth:`close` from any thread, idempotent.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

CLOSE_JOIN_S = 1.0
"""Longest :meth:`Prefetcher.close` waits for its threads (fetches in flight); daemons, they end with their fetch."""


class Prefetcher:
    """Pieces fetched ahead by ``threads`` daemon threads calling ``fill(index)`` (which fetches piece ``index``
    into the cache unless present or being filled elsewhere, and raises what the fetch raises); at most ``ahead``
    pieces prefetched and not yet read.  Threads start on the first :meth:`want`."""

    def __init__(self, fill: Callable[[int], None], threads: int, ahead: int, name: str = "h5stream-prefetch"):
        self._fill = fill
        self._ahead = max(1, int(ahead))
        self._n_threads = max(1, min(int(threads), self._ahead))
        self._in_flight = 0
        self._name = name
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # the prefetch threads wait on it for a piece and room ahead
        self._idle = threading.Condition(lock)  # wait_idle waits on it for the fetches in flight to end
        self._queue: deque[int] = deque()
        self._queued: set[int] = set()  # in the queue or being fetched
        self._unread: set[int] = set()  # prefetched (or being), not read yet
        self._read: set[int] = set()  # read before their prefetch began: not to be fetched ahead any more
        self._threads: list[threading.Thread] = []
        self._stopped = False
        self.prefetched = 0  # pieces whose fill a prefetch thread ran (present ones return at once)

    def want(self, pieces: Iterable[int]) -> None:
        """Queue ``pieces`` (in the order given, those not queued or unread already).  Reader thread."""
        with self._cond:
            if self._stopped:
                return
            added = False
            for index in pieces:
                self._read.discard(index)  # wanted again (the caller found it missing: evicted)
                if index in self._queued or index in self._unread:
                    continue
                self._queue.append(index)
                self._queued.add(index)
                added = True
            if not added:
                return
            while len(self._threads) < self._n_threads:
                t = threading.Thread(target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()
            self._cond.notify_all()

    def used(self, index: int) -> None:
        """A read took piece ``index``: one more piece may be prefetched.  Any thread."""
        with self._cond:
            if index in self._unread:
                self._unread.discard(index)
                self._cond.notify()  # room for one more: one thread (waking all only woke them to wait again)
            elif index in self._queued:
                self._read.add(index)

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no fetch is in flight and none can start (nothing queued, or ``ahead`` pieces unread);
        whether that came within ``timeout_s``.  Any thread."""
        with self._idle:
            return self._idle.wait_for(
                lambda: self._in_flight == 0 and (self._stopped or not self._queue
                                                   or len(self._unread) >= self._ahead), timeout_s)

    def close(self) -> None:
        """Drop the queue and stop the threads (waited for up to :data:`CLOSE_JOIN_S` in all).  Any thread;
        idempotent."""
        with self._cond:
            self._stopped = True
            self._queue.clear()
            self._cond.notify_all()
            self._idle.notify_all()
            threads, self._threads = self._threads, []
        deadline = time.monotonic() + CLOSE_JOIN_S
        for t in threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))

    def _next(self) -> int | None:
        """The next piece to prefetch, waiting for one (and for room ahead); None once stopped.  A prefetch
        thread."""
        with self._cond:
            while True:
                while not self._stopped and (not self._queue or len(self._unread) >= self._ahead):
                    self._cond.wait()
                if self._stopped:
                    return None
                index = self._queue.popleft()
                if index in self._read:  # a read fetched it first
                    self._read.discard(index)
                    self._queued.discard(index)
                    self._idle.notify_all()  # the queue may be empty now
                    continue
                self._unread.add(index)
                self._in_flight += 1
                return index

    def _run(self) -> None:
        """A prefetch thread: fill queued pieces until stopped; the first failure stops every thread."""
        while True:
            index = self._next()
            if index is None:
                return
            try:
                self._fill(index)
            except BaseException:  # the fill kept it for the read that wants this piece; prefetching ends here
                with self._cond:
                    self._in_flight -= 1
                    self._unread.discard(index)
                    self._queued.discard(index)
                    self._stopped = True
                    self._queue.clear()
                    self._cond.notify_all()
                    self._idle.notify_all()
                return
            with self._cond:
                self._in_flight -= 1
                self._queued.discard(index)
                self.prefetched += 1
                self._idle.notify_all()  # the prefetch threads wait for room ahead, which a fetch's end does not make
