"""Page-locked host memory for the torch device adapter: the stream's own batch memory, registered in place.

:class:`HostPins` registers each allocation a batch lies in with
``cudaHostRegister`` once, so a host-to-device copy from it is a real
asynchronous DMA and nothing is allocated or copied per batch (see
:mod:`h5stream.adapters.torch_device`).
"""

from __future__ import annotations

import functools
import threading
import weakref

import numpy as np

from h5stream import _deps
from h5stream.concurrency.fork import OwnerOnly

torch = _deps.torch()


def owner_array(a: np.ndarray) -> np.ndarray:
    """The outermost ndarray ``a``'s memory belongs to: follow ``.base`` while it is an ndarray.  Its data is
    the allocation (numpy's own, or the mapping of a shared-memory segment) that ``a`` views."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class HostPins:
    """Registers the stream's batch memory with ``cudaHostRegister``, once per allocation.

    ``register`` / ``unregister`` are ``(ptr, nbytes) -> None`` and
    ``ptr -> None`` (``cudaHostRegister`` / ``cudaHostUnregister`` by
    default; tests pass recorders).  An allocation is registered the first
    time a batch lies in it and unregistered just before it is freed (a
    ``weakref.finalize`` on its owning array, which numpy runs before it
    frees the memory; the uploader holds a batch until its copy finished, so
    no copy reads freed memory), or at :meth:`close`.  Used by the uploader;
    ``close`` by whoever closes the adapter, after the pass ended.  A failed registration is not retried: that
    allocation is copied from pageable memory (correct, only slower), and
    ``failures`` counts it.
    """

    def __init__(self, register=None, unregister=None):
        if register is None:
            register, unregister = _cuda_register, _cuda_unregister
        self._register, self._unregister = register, unregister
        self._lock = threading.Lock()
        self._pins: dict[int, tuple[int, weakref.finalize | None]] = {}  # ptr -> (nbytes, finalizer)
        self.failures = 0

    def pin(self, a: np.ndarray) -> bool:
        """Make sure the allocation ``a`` lies in is registered; whether it is page-locked now."""
        owner = owner_array(a)
        ptr, nbytes = owner.ctypes.data, owner.nbytes
        if nbytes == 0:
            return False
        with self._lock:
            known = self._pins.get(ptr)
            if known is not None and known[0] >= nbytes:
                return known[1] is not None
        try:
            self._register(ptr, nbytes)
        except Exception:
            with self._lock:
                self._pins[ptr] = (nbytes, None)
                self.failures += 1
            return False
        # Not in a forked child: the registration, and the lock an upload may have held, are the parent's.
        fin = weakref.finalize(owner, OwnerOnly(functools.partial(self._forget, ptr)))
        fin.atexit = False  # at exit the process's mappings go with it
        with self._lock:
            self._pins[ptr] = (nbytes, fin)
        return True

    def _forget(self, ptr: int) -> None:
        with self._lock:
            entry = self._pins.pop(ptr, None)
        if entry is not None and entry[1] is not None:
            try:
                self._unregister(ptr)
            except Exception:  # noqa: S110 - a context already torn down at exit has nothing left to unregister
                pass

    @property
    def pinned(self) -> dict[int, int]:
        """``ptr -> nbytes`` of the allocations registered now."""
        with self._lock:
            return {p: n for p, (n, fin) in self._pins.items() if fin is not None}

    def close(self) -> None:
        """Unregister everything (idempotent)."""
        with self._lock:
            entries = list(self._pins.items())
            self._pins.clear()
        for ptr, (_, fin) in entries:
            if fin is not None:
                fin.detach()
                try:
                    self._unregister(ptr)
                except Exception:  # noqa: S110 - see _forget
                    pass


def _cuda_register(ptr: int, nbytes: int) -> None:
    # cudaHostRegisterDefault (0): page-locked, usable by every context of this process.
    torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0))


def _cuda_unregister(ptr: int) -> None:
    torch.cuda.check_error(torch.cuda.cudart().cudaHostUnregister(ptr))
