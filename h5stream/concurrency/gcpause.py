"""No cyclic garbage collection on a thread that a thread inside h5py is waiting for.

h5py holds one process-wide lock through every HDF5 call, and freeing an h5py
object (a ``Dataset``, a ``File``) takes that lock.  Python's cyclic garbage
collector runs on whichever thread happens to allocate when a threshold is
crossed, and frees every unreachable cycle it finds, h5py objects left in a
cycle by anybody's code (an exception's traceback is the common one) included.
So a thread that is inside an HDF5 call (holding the lock) and waits for
another thread (h5stream does so where HDF5 reads through a Python file object:
the read runs on a helper thread that may be abandoned, see
:class:`h5stream.store.access.StoppableFile` and
:func:`h5stream.remote.calls.interruptible`) deadlocks if that other thread
starts a collection that frees an h5py object: it waits for the lock, the lock's
holder waits for it.

:func:`collection_paused` turns automatic collection off for the time of such a
wait, process-wide (the helper is not the only thread that could be chosen),
counted so that overlapping waits on several threads share one pause, and
restores the user's setting when the last one ends.  Collection is deferred,
never lost: on entry the waiting thread first runs the young generations'
collection that is due (in the waiting thread, which may hold h5py's lock: it is
re-entrant), so that back-to-back waits on many threads cannot put collection
off for good.  Safe to call from any thread.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["collection_paused"]

_lock = threading.Lock()
_holders = 0
_restore = False  # whether the last holder turns collection back on (it was on when the first began)


def _collect_due() -> None:
    """Run the collection of generation 1 or 0 that the interpreter would run now, if one is due."""
    counts, limits = gc.get_count(), gc.get_threshold()
    for generation in (1, 0):
        if limits[generation] and counts[generation] > limits[generation]:
            gc.collect(generation)
            return


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """No automatic cyclic collection on any thread while the ``with`` body runs (see the module)."""
    global _holders, _restore
    if (_restore if _holders else gc.isenabled()):  # collection is on, or on but for our pause
        _collect_due()
    with _lock:
        if _holders == 0:
            _restore = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _restore:
                gc.enable()
