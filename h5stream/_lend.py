"""Fixed memory lent out as arrays, and which parts are free again: by weak reference, not reference counts.

The zero-copy paths (a pool's output slots, the reader's batch buffers) hand the
caller arrays on memory they reuse.  The rule users read (README): *a batch is
yours; its arrays are never written again while anything refers to them*.
:class:`Lender` is how that rule is kept:

* Each part of the memory has one long-lived *anchor*, an array of a private
  ndarray subclass made on it (what the owner keeps, and what page-locking
  registers once: the outermost array of every batch on that part).
* Part ``k`` is lent as a **fresh** plain array made on its anchor.  numpy
  collapses a view's base chain only through arrays of the view's own type,
  so the anchor's other type stops it there: the fresh array is the base of
  every view of it.  A slice, a reshape, a ``torch.from_numpy`` tensor or a
  memoryview of the batch all keep that one array alive, and nothing else
  does.
* The lender keeps only a :class:`weakref.ref` to it: the part is in use
  exactly while the reference is alive, whatever the caller made of the batch,
  on any Python with weak references (no count of CPython's own references).

A reference cycle that holds a batch keeps its part until the garbage collector
breaks it, as it keeps any object.  Raw addresses (``arr.ctypes.data``) are
not references and are not seen; nothing in numpy, torch, TensorFlow or JAX
holds one past the call that took it.
"""

from __future__ import annotations

import weakref

import numpy as np


class _Anchor(np.ndarray):
    """The type of a part's anchor: not a plain ndarray, so numpy's base collapse stops below it."""


class Lender:
    """Parts ``0 .. count-1`` of shape ``shape[1:]`` laid end to end on ``buffer`` (an ``mmap``, or any writable
    buffer), lent as arrays.

    One owner (a pool, a feed, an arena) uses it from one thread: the one that
    lends its batches (its docstring says which).
    """

    def __init__(self, buffer, shape, dtype):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        part_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        if self.shape[0] * part_bytes > memoryview(buffer).nbytes:
            raise ValueError(f"{self.shape} of {self.dtype} needs {self.shape[0] * part_bytes} bytes, "
                             f"the buffer has {memoryview(buffer).nbytes}")
        self._anchors = [_Anchor(self.shape[1:], self.dtype, buffer=buffer, offset=k * part_bytes)
                         for k in range(self.shape[0])]
        self._lent: list[weakref.ref | None] = [None] * self.shape[0]

    def __len__(self) -> int:
        return self.shape[0]

    def part(self, k: int) -> np.ndarray:
        """Part ``k`` as an array for the owner's own reads and writes (a copy out of it); not lent, so holding
        it does not keep the part in use: drop it before the part may be written again."""
        return np.ndarray(self.shape[1:], self.dtype, buffer=self._anchors[k])

    def lend(self, k: int) -> np.ndarray:
        """Part ``k`` as a fresh array, in use (:meth:`in_use`) until nothing refers to it or to any view of it."""
        arr = self.part(k)
        self._lent[k] = weakref.ref(arr)
        return arr

    def in_use(self, k: int) -> bool:
        """Whether anything still refers to the array part ``k`` was last lent as (or to a view of it)."""
        ref = self._lent[k]
        if ref is None:
            return False
        if ref() is None:
            self._lent[k] = None
            return False
        return True
