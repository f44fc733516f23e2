"""Starting spawn workers lean: without re-running the parent's main script, one thread each (ingest and augment)."""

from __future__ import annotations

import contextlib
import os
import sys
import types

#: Thread-pool sizes a spawned worker inherits through its environment unless the user set them.
#: A worker is one core's worth of work; numpy's OpenBLAS otherwise starts a thread per core at import
#: (measured: 0.18 -> 0.09 CPU seconds to import numpy + Pillow with one), threads that only compete.
SINGLE_THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@contextlib.contextmanager
def main_module_hidden(hide: bool = True):
    """While starting workers, hide ``__main__`` from spawn's preparation data and pin their thread pools.

    spawn re-runs the parent's main script in every child so that objects
    defined there can be unpickled.  A training script that imports
    tensorflow at top level then costs ~400 MiB and seconds per worker
    (measured), for nothing when the transform does not live in ``__main__``
    (``hide`` is computed from its pickle).  The stub is in place only for
    the few milliseconds of ``Process.start()``, and so are the
    :data:`SINGLE_THREAD_ENV` variables the child inherits (those the user
    set are left alone).  Used by the augment pool and by ingest's decode
    pool, whose workers only ever need package code.
    """
    added = {k: v for k, v in SINGLE_THREAD_ENV.items() if k not in os.environ}
    os.environ.update(added)
    real_main = sys.modules["__main__"]
    if hide:
        sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = real_main
        for k in added:
            os.environ.pop(k, None)
