"""Starting spawn workers lean: without re-running the parent's main script, one thread each (ingest and augment);
glibc's heap kept between images in decode workers."""

from __future__ import annotations

import contextlib
import ctypes
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


#: glibc's ``mallopt`` parameters (``<malloc.h>``).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: What :func:`keep_freed_heap` pins: glibc's own ceiling for its dynamic mmap threshold (32 MiB on 64-bit)
#: and twice that for trimming, the pair glibc itself would reach after freeing one large block.
HEAP_MMAP_THRESHOLD_BYTES = 32 << 20
HEAP_TRIM_THRESHOLD_BYTES = 64 << 20


def keep_freed_heap() -> bool:
    """Stop glibc from handing freed heap back to the kernel after every image (decode workers).

    Decoding one photo allocates a few hundred KiB and frees it again.  With
    glibc's default, dynamic thresholds (128 KiB to map, 256 KiB to trim, raised
    only when a mapped block is freed), a fresh decode worker trims its heap
    after every photo and faults the same pages back in for the next: ~80
    minor page faults and ~0.15 ms of kernel time per 500x375 JPEG, measured,
    a sixth of the decode.  Pinning the thresholds where glibc's
    dynamic rule tops out keeps up to :data:`HEAP_TRIM_THRESHOLD_BYTES` of
    freed heap for reuse; blocks of :data:`HEAP_MMAP_THRESHOLD_BYTES` or more
    are still mapped and unmapped on their own.  Returns False where there is
    no glibc ``mallopt`` (musl, macOS), which changes nothing.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this interpreter runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD_BYTES))
