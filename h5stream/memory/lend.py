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
from collections import deque
from collections.abc import Callable

import numpy as np

from h5stream.memory.rawio import advise_huge_pages, aligned_empty, private_memory


class _Anchor(np.ndarray):
    """The type of a part's anchor: not a plain ndarray, so numpy's base collapse stops below it."""


class _LentRef(weakref.ref):
    """The weak reference to a lent array, carrying the ``tag`` its ``on_free`` callback reads off it: so the
    callback can be a C function (a ``deque``'s ``append``), which runs no Python code.  Python code there
    would be where a signal handler runs when the caller drops a batch, and an exception it raises (Ctrl-C's
    ``KeyboardInterrupt``, a SIGTERM handler's) is lost inside a weak reference callback, printed as "Exception
    ignored"."""

    __slots__ = ("tag",)


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

    def lend(self, k: int, on_free: Callable[[weakref.ref], None] | None = None, tag=None) -> np.ndarray:
        """Part ``k`` as a fresh array, in use (:meth:`in_use`) until nothing refers to it or to any view of it.
        ``on_free`` is called with the array's weak reference, whose ``tag`` is ``tag`` (a weak reference
        callback, in whichever thread dropped the last reference) once that happens, unless the part was lent
        again before; make it a C function (``deque.append``), so that no Python code runs where the caller
        drops a batch (see :class:`_LentRef`)."""
        arr = self.part(k)
        ref = _LentRef(arr, on_free)
        ref.tag = tag
        self._lent[k] = ref
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


SLAB_BYTES = 64 << 20
"""An arena maps its buffers this many bytes at a time (at least one buffer; the pages are taken on first touch),
so the batches of a fill lie in a few mappings: the reader places small rows in them with one numpy assignment
per mapping (:mod:`h5stream.read.scatter`) instead of one read per row."""


class ArrayArena:
    """Recycles batch-sized arrays so writers fill memory that is already mapped.

    Fresh multi-megabyte arrays cost a page fault per 4 KiB on first touch, which
    makes writing into them several times slower than the copy itself.  The arena
    keeps up to ``max_sets`` page-aligned buffers of ``batch_rows`` rows (mapped :data:`SLAB_BYTES` at a
    time, end to end) and hands out arrays on them (lent: see :class:`~h5stream.memory.lend.Lender`).  A buffer
    is reused only once nothing refers to the array last made on it, nor to any
    view of that array, so a caller may keep a batch as long as it likes: it is
    never overwritten.  Used from one thread (its owner's); a buffer's array dropped in another thread puts
    the buffer on the free list there (a weak reference callback, ``deque.append`` itself: atomic, and no Python
    code runs where the caller drops a batch), so taking a
    free buffer costs the same however many are lent (a fill lends thousands of small batches at once).

    A buffer taken again is advised onto transparent huge pages (:func:`~h5stream.memory.rawio.advise_huge_pages`,
    its own pages only), once: its first write faulted in ordinary pages, the cheaper first touch, and the kernel
    moves it onto huge pages in the background, where the copies of later epochs cost less.
    """

    def __init__(self, batch_rows: int, row_shape, dtype, max_sets: int):
        self.batch_rows = int(batch_rows)
        self.row_shape = tuple(row_shape)
        self.dtype = np.dtype(dtype)
        self.max_sets = int(max_sets)
        self._sets: list[tuple[Lender, int]] = []  # buffer -> (the lender of its mapping, its part there)
        # Buffers never lent (their numbers) or whose last array was dropped (its weak reference, tagged with the
        # buffer's number: appended by the reference's callback, C code); checked when taken.
        self._free: deque[int | _LentRef] = deque()
        # buffer -> (its mapping, first byte, bytes) until it is taken again and advised onto huge pages (then None)
        self._unadvised: list[tuple[object, int, int] | None] = []
        self._lent_once: list[bool] = []

    def _map(self) -> None:
        """Map the next buffers (up to :data:`SLAB_BYTES` of them, within ``max_sets``) and put them on the free
        list, in order."""
        shape = (self.batch_rows, *self.row_shape)
        part_bytes = int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize
        count = len(self._sets)
        parts = max(1, min(self.max_sets - count, SLAB_BYTES // max(1, part_bytes)))
        memory = private_memory(parts * part_bytes)
        lender = Lender(memory, (parts, *shape), self.dtype)
        self._sets.extend((lender, k) for k in range(parts))
        self._unadvised.extend((memory, k * part_bytes, part_bytes) for k in range(parts))
        self._lent_once.extend([False] * parts)
        self._free.extend(range(count, count + parts))

    def __call__(self, n: int) -> np.ndarray:
        if n > self.batch_rows:
            return aligned_empty((n, *self.row_shape), self.dtype)
        if not self._free and len(self._sets) < self.max_sets:
            self._map()
        while self._free:
            k = self._free.popleft()
            if not isinstance(k, int):
                k = k.tag
            lender, part = self._sets[k]
            if not lender.in_use(part):
                if self._lent_once[k] and self._unadvised[k] is not None:  # written once: its pages exist
                    advise_huge_pages(*self._unadvised[k])
                    self._unadvised[k] = None
                self._lent_once[k] = True
                return lender.lend(part, self._free.append, k)[:n]
            if not self._free and len(self._sets) < self.max_sets:
                self._map()
        shape = (1, self.batch_rows, *self.row_shape)
        lender = Lender(private_memory(int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize), shape, self.dtype)
        return lender.lend(0)[:n]  # direct reads can land in it: a buffer starts on a page boundary


def may_lend(lent: int, held_since, taken: int, lent_slots: int, kept_slots: int) -> bool:
    """Whether batch number ``taken`` (1, 2, ... in hand-over order) may be lent as a view of its slot, with
    ``lent`` slots lent and still held, lent at batch numbers ``held_since`` (needed only when ``lent >=
    lent_slots``).  Pure; the rule of :class:`SlotLender`.

    Up to ``lent_slots`` views may be held (the usual loop holds the previous batch while it takes the
    next); a view still held ``lent_slots`` batches after it was lent is *kept* (a batch kept for good, such as
    the first one looked at for its shapes), and up to ``kept_slots`` kept ones
    (:data:`~h5stream.streaming.budget.KEPT_SLOTS`) do not count, so keeping one batch does not make every later
    batch a copy.
    """
    if lent >= lent_slots:
        old = taken - lent_slots  # lent this batch or before: held that long, it is kept
        lent -= min(sum(1 for t in held_since if t <= old), kept_slots)
    return lent < lent_slots


class SlotLender:
    """Hands finished output slots to the consumer: each lent as a view while few are held, else copied.

    The one lend-or-copy rule of the pooled feed (slots of its worker pool) and of the feeder's training-process
    side (slots of the feeder's pool, mapped here).  ``lender``: the slots' :class:`Lender`; ``release(slot)``
    gives a slot back to whoever refills it (the pool's ring, or the feeder's next message); ``copies``: the
    :class:`ArrayArena` copies land in.  Up to ``lent_slots`` views may be held, and ``kept_slots`` views kept
    for good do not count (:func:`may_lend`); beyond that a batch is a copy and its slot goes back at once.  No
    array the consumer holds is ever written to.

    Owns the list of lent slots; used from one thread, the consumer's (the one inside the stream).
    """

    def __init__(self, lender: Lender, release: Callable[[int], None], copies: ArrayArena, *, lent_slots: int,
                 kept_slots: int):
        self.slots, self._release, self.copies = lender, release, copies
        self.lent_slots, self.kept_slots = int(lent_slots), int(kept_slots)
        self._lent: list[int] = []  # slots lent and maybe still held, oldest first
        self._lent_at: dict[int, int] = {}  # lent slot -> the hand-over number it was lent at
        self.taken = 0  # batches handed over (lent or copied)
        self.copied = 0  # batches handed over as copies (the consumer kept too many)

    @property
    def lent(self) -> tuple[int, ...]:
        """The slots lent and not reclaimed yet, oldest first."""
        return tuple(self._lent)

    def reclaim(self) -> int:
        """Release every lent slot nothing refers to any more (see :class:`Lender`); how many stay lent."""
        still = []
        for slot in self._lent:
            if self.slots.in_use(slot):
                still.append(slot)
            else:
                self._release(slot)
        self._lent = still
        return len(still)

    def hand_over(self, slot: int, rows: int) -> np.ndarray:
        """The first ``rows`` rows of finished slot ``slot`` for the consumer: a view lent from it, or a copy
        (after which the slot is released).  Reclaims first, so slots the consumer dropped do not count."""
        self.taken += 1
        lent = self.reclaim()
        held = [self._lent_at[s] for s in self._lent] if lent >= self.lent_slots else ()
        if may_lend(lent, held, self.taken, self.lent_slots, self.kept_slots):
            x = self.slots.lend(slot)[:rows]
            self._lent.append(slot)
            self._lent_at[slot] = self.taken
            return x
        self.copied += 1
        x = self.copies(rows)
        try:
            x[...] = self.slots.part(slot)[:rows]
        finally:
            self._release(slot)
        return x
