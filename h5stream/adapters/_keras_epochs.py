"""Whether a Keras epoch hook is a real pass boundary, or Keras carries on with the same batch iterator.

``fit(ds, steps_per_epoch=k)`` with ``k`` below ``len(ds)`` cuts the
dataset's sequence into Keras epochs of ``k`` batches: Keras' ``EpochIterator``
keeps its iterator over the ``PyDataset`` from one epoch to the next (asking
for the next indices) and only starts a fresh one once ``len(ds)`` batches were
taken from it.  It still calls the dataset's ``on_epoch_end`` /
``on_epoch_begin`` at every Keras epoch.  Taken as pass boundaries, those
calls would end the stream's pass early, and the next pass would replay it:
every Keras epoch would train on the same first ``k`` batches.

The ``EpochIterator`` calling the hook says which it is (the same test it makes
itself before asking for the next batch): it carries on iff it was given
``steps_per_epoch``, holds a current iterator, and has taken batches from it.
``reset()`` (``fit``, ``evaluate`` and ``predict`` start with it, and so does an
iterator that ran dry) drops the iterator first, so those are pass boundaries.

It is found on the call stack, as :mod:`h5stream.adapters._dataloader` finds a
``DataLoader``'s fetcher: only the frame running
``EpochIterator._enumerate_iterator`` is looked into.  A Keras without it, or a
hook called from anywhere else (a user's own loop), is a pass boundary.
"""

from __future__ import annotations

import sys

FRAMES_UP = 4
"""Frames looked at, from the hook up: the dataset's ``on_epoch_*``, Keras' adapter's, ``_enumerate_iterator``."""


def _enumerate_code():
    try:
        from keras.src.trainers.epoch_iterator import EpochIterator
    except ImportError:  # a Keras laid out otherwise: every hook is a pass boundary
        return None
    method = getattr(EpochIterator, "_enumerate_iterator", None)
    return getattr(method, "__code__", None)


def keras_carries_on() -> bool:
    """Whether the Keras ``EpochIterator`` that called this epoch hook (the dataset's ``on_epoch_begin`` /
    ``on_epoch_end``, the caller of this function) keeps its batch iterator across it.

    Returns:
        True when the next Keras epoch continues the same iterator (``steps_per_epoch`` shorter than the
        dataset): the pass goes on.  False otherwise, and whenever the caller is not Keras' epoch iterator.
    """
    code = _enumerate_code()
    if code is None:
        return False
    frame = sys._getframe(1)
    for _ in range(FRAMES_UP):
        if frame is None:
            return False
        if frame.f_code is code:
            break
        frame = frame.f_back
    else:
        return False
    it = frame.f_locals.get("self")
    return (bool(getattr(it, "steps_per_epoch", None)) and getattr(it, "_current_iterator", None) is not None
            and (getattr(it, "_steps_seen", 0) or 0) > 0)
