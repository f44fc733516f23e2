"""Starting spawn workers without re-running the parent's main script (shared by ingest and augment)."""

from __future__ import annotations

import contextlib
import sys
import types


@contextlib.contextmanager
def main_module_hidden(hide: bool = True):
    """While starting workers, hide ``__main__`` from spawn's preparation data.

    spawn re-runs the parent's main script in every child so that objects
    defined there can be unpickled.  A training script that imports
    tensorflow at top level then costs ~400 MiB and seconds per worker
    (measured), for nothing when the transform does not live in ``__main__``
    (``hide`` is computed from its pickle).  The stub is in place only for
    the few milliseconds of ``Process.start()``.  Used by the augment pool
    and by ingest's decode pool, whose workers only ever need package code.
    """
    if not hide:
        yield
        return
    real_main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = real_main
