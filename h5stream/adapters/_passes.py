"""The one place a framework pulls batches from a stream: passes of ``len(stream)`` batches.

Frameworks iterate their inputs in *passes*: Keras calls ``on_epoch_begin`` and
then asks for ``len`` batches; ``tf.data`` calls the generator function again
for every ``iter(dataset)``; torch calls ``iter(dataset)`` per epoch.  They
also pull from background threads (tf.data's prefetch), peek at batches to
learn shapes, and abandon passes (a distribution strategy pulls one batch to
build the model, then starts over).  :class:`Passes` turns all of that into
the stream's exact sequence of batches:

* a pass serves exactly ``len(stream)`` batches, continuing the stream where
  it stands; after ``restore`` to a mid-epoch state, a pass finishes that
  epoch and runs on into the next, so every pass is still one epoch long and
  the batch sequence equals that of the run that was not interrupted;
* a pass abandoned before its end does not count: the next pass replays it
  from the state it began at;
* batches pulled outside a pass (Keras peeks at one or two to learn the
  element shapes) are kept and served first by the next pass;
* for each batch of the current pass it records the stream state after that
  batch and the moment it was handed over (:meth:`Passes.record`), which is
  what :class:`h5stream.keras.ResumeCallback` saves and what
  :class:`h5stream.keras.StallMonitor` measures.

Pure Python, no framework imports.  All methods are thread-safe (one lock); the
stream itself is only ever touched under that lock, from whichever thread holds it
(the stream takes calls from any thread, one at a time).  In a process forked
from the stream's, every method raises :class:`~h5stream.ForkedStreamError`
before it takes that lock (a thread of the parent may have held it at the fork,
and none of the parent's threads runs in the child).

The stream owns its :class:`Passes` (it lives in the stream's
``_adapter_passes``, the one attribute of the stream this package touches) and
the adapters hold both: nothing global of h5stream refers to either, so a
stream handed to adapters and then dropped with them is garbage-collected (the
reference cycle stream -> Passes -> stream included), and its finalizer stops
its reader thread and workers and frees its shared memory.  (What a framework
keeps is its own: see :mod:`h5stream.adapters.tf` and
:class:`h5stream.adapters.keras.StreamBatches`.)
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

from h5stream.concurrency import fork as _fork
from h5stream.errors import ConfigError, StreamIterationError

RECORD_WINDOW = 4096
"""Batches of the current pass whose state/time are kept; the model is never this far behind the feed."""

_PASSES_LOCK = threading.Lock()


def _new_lock_in_a_forked_child() -> None:
    global _PASSES_LOCK
    _PASSES_LOCK = threading.Lock()  # the parent's may have been held, by a thread that the child does not have


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_a_forked_child)


def replaced_error(path: str, what: str, served: int, n: int) -> StreamIterationError:
    """What an iteration of an adapter (``what``: "the torch dataset", "the tf.data.Dataset") raises when it finds
    its pass ended after ``served`` of its ``n`` batches: a newer pass replaced it.  Raised, not a quiet end: a
    loop still running over the old iteration would otherwise see a short epoch.  Pure."""
    return StreamIterationError(
        f"{path}: this iteration of {what} was replaced after {served} of its {n} batches by a newer pass (a new "
        "iteration of it, two at once as in zip(ds, ds), or another adapter of the same stream); a stream serves "
        "one pass at a time: finish or drop one iteration before starting the next, or open a second stream")


def passes_for(stream) -> Passes:
    """The stream's :class:`Passes`, created on first use; every adapter of one stream shares it, and the stream
    owns it."""
    with _PASSES_LOCK:
        passes = stream._adapter_passes
        if passes is None:
            passes = stream._adapter_passes = Passes(stream)
        return passes


class Passes:
    """Serve one stream's batches to framework passes.  Owned by the stream (see :func:`passes_for`)."""

    def __init__(self, stream):
        self.stream = stream
        self.n = len(stream)
        self._pid = _fork.owner_pid()  # the stream's process (iter(stream) below raises in any other)
        self._lock = threading.Lock()
        # The stream's epoch iterator, taken now: it continues a restored (resumed) state's epoch; after an epoch
        # left mid-way by some other iterator, it starts the next epoch, and _pos_state below says so.
        self._it = iter(stream)
        self._pending: deque = deque()  # (batch, state_after) pulled outside a pass
        self._pass_id = 0
        self._active = False
        self._served = 0
        self._pos_state = stream.state()  # state before the next batch a pass would get
        self._start_state = self._pos_state
        self._records: deque = deque(maxlen=RECORD_WINDOW)  # (index in pass, state_after, t_served)

    # -- passes -------------------------------------------------------------------
    def begin_pass(self) -> int:
        """Start a pass (replaying an abandoned one); returns its id for :meth:`next_batch`."""
        self.check_process()
        with self._lock:
            if self._active and self._served < self.n:
                self._rewind(self._start_state)
            self._pass_id += 1
            self._active = True
            self._served = 0
            self._start_state = self._pos_state
            self._records.clear()
            return self._pass_id

    def end_pass(self) -> None:
        """The framework ended its pass; an incomplete pass is rewound so the next one replays it."""
        self.check_process()
        with self._lock:
            if self._active and self._served < self.n:
                self._rewind(self._start_state)
            self._active = False

    def next_batch(self, pass_id: int | None = None):
        """The next batch of the pass (``(x, y)``, or ``x`` for a stream with ``label_mode=None``), or None when
        the pass is complete or superseded.

        ``pass_id`` None: the caller cannot tell passes apart (a Keras PyDataset);
        outside a pass the batch is a peek, kept for the next pass.
        """
        self.check_process()
        with self._lock:
            if pass_id is not None and (pass_id != self._pass_id or not self._active):
                return None
            if not self._active:
                batch, state = self._pull()
                self._pending.append((batch, state))
                return batch
            if self._served >= self.n:
                return None
            batch, state = self._pending.popleft() if self._pending else self._pull()
            self._served += 1
            self._pos_state = state
            self._records.append((self._served, state, time.perf_counter()))
            if self._served == self.n:
                self._active = False
            return batch

    # -- what the model has consumed ------------------------------------------------
    def record(self, consumed: int) -> tuple[dict, float | None]:
        """``(state, t_served)`` after the first ``consumed`` batches of the current (or just finished) pass.

        ``consumed == 0`` gives the state the pass began at (and no time).  Raises
        :class:`ConfigError` if that batch is older than the kept window.
        """
        self.check_process()
        with self._lock:
            if consumed == 0:
                return dict(self._start_state), None
            for index, state, t in reversed(self._records):
                if index == consumed:
                    return dict(state), t
        raise ConfigError(
            f"no record of batch {consumed} of the current pass (served {self._served}, window {RECORD_WINDOW}); "
            "the model is further behind the feed than h5stream tracks"
        )

    def restore(self, state: dict) -> None:
        """Continue from ``state`` (a dict from ``Stream.state()``); ends any pass and drops peeked batches."""
        self.check_process()
        with self._lock:
            self._rewind(state)
            self._active = False
            self._served = 0
            self._start_state = self._pos_state
            self._records.clear()

    def check_process(self) -> None:
        """Raise :class:`~h5stream.ForkedStreamError` in a process forked from the stream's.  Any thread; takes
        no lock."""
        _fork.check_owner(self._pid, self.stream.meta.path)

    # -- internals (lock held) --------------------------------------------------------
    def _rewind(self, state: dict) -> None:
        if self._pending or state != self.stream.state():
            self._pending.clear()
            self._it = None
            self.stream.restore(state)  # restarts the reader: only when the position really moves
            self._it = iter(self.stream)  # the rest of the restored epoch, then whole epochs
        # Otherwise the current iterator stands exactly at ``state``: keep it (a new one would leave its epoch).
        self._pos_state = self.stream.state()

    def _pull(self):
        for _ in range(2):  # at most: the end of the current epoch, then the next one
            if self._it is None:
                self._it = iter(self.stream)  # the stream stands at an epoch's first batch here
            try:
                batch = next(self._it)
            except StopIteration:
                self._it = None
                continue
            return batch, self.stream.state()
        raise RuntimeError(f"{self.stream!r} yielded no batch for a new epoch")  # pragma: no cover - stream invariant
