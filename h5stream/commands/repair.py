"""`h5stream repair FILE.h5`: rebuild a store whose writer was stopped while HDF5 rewrote it in place.

A writer killed half-way through a flush (SIGKILL, the OOM killer) can leave
the file's HDF5 structure torn; the marker beside it (``FILE.h5.flushing``)
says so, and readers refuse the file until it is rebuilt.  This copies the
committed rows, checked against their block checksums, into a fresh file that
takes the store's name (:func:`h5stream.store.rebuild.rebuild`); `h5stream
ingest SRC FILE.h5 --append` does the same before it adds to the store.
Exit codes: 0 rebuilt, or nothing to do; 1 the store cannot be rebuilt or
written (the message says why; the file is left as it was).
"""

from __future__ import annotations


def run(args) -> int:
    import os

    from h5stream.errors import StoreNotFoundError
    from h5stream.store.lock import StoreLock
    from h5stream.store.rebuild import needs_rebuild, rebuild

    path = args.path
    if not os.path.exists(path):
        raise StoreNotFoundError(f"{path}: no such file")
    with StoreLock.acquire(path) as lock:  # a writer at work holds it: refused, one line
        if not needs_rebuild(path):
            print(f"{path}: nothing to repair (no writer was stopped while it rewrote the file)")
            return 0
        rows = rebuild(path, lock)
    print(f"{path}: rebuilt from its {rows} committed rows")
    return 0
