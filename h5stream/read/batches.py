"""The batches a reader is assembling, and the order they go out in.

:class:`Batches` belongs to the reader thread (:class:`~h5stream.read.reader.Reader`): it allocates each batch
on first use, keeps every epoch's batch boundaries while its batches are being filled, and says which complete
batches can go out next, strictly in ``(epoch, batch)`` order.  What lands in a batch, and when it counts as
complete, is the fill's business (:mod:`h5stream.read.fill`, :mod:`h5stream.read.arrive`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from h5stream.read.fill import Batch, Pending


class Batches:
    """Batches being assembled and handed out, in order.  Reader thread (every method).

    ``allocate(n, images)`` returns ``(images, labels, slot)`` for an ``n``-row batch (``images`` None when
    asked for none) and may block (raising :class:`~h5stream.concurrency.wait.Stopped` once the reader stops).
    ``encoded``: the store's rows are encoded, so each batch carries its rows' encoded lengths.
    """

    def __init__(self, allocate: Callable, encoded: bool):
        self._allocate = allocate
        self._encoded = bool(encoded)
        self._pending: dict[tuple[int, int], Pending] = {}
        self._bounds: dict[int, np.ndarray] = {}  # epoch -> its batch boundaries
        self._next: tuple[int, int] | None = None  # the next batch to hand out

    def start_at(self, epoch: int, batch: int) -> None:
        """The first batch to hand out is ``(epoch, batch)``."""
        self._next = (int(epoch), int(batch))

    def add_epoch(self, epoch: int, bounds: np.ndarray) -> None:
        """Epoch ``epoch``'s batch boundaries (``bounds[j]..bounds[j + 1]`` are batch ``j``'s positions)."""
        self._bounds[epoch] = bounds

    def planned(self, epoch: int) -> None:
        """Every fill of ``epoch`` is planned: the boundaries of the epoch two before are dropped (the reader
        plans at most two fills ahead of the batches it hands out, so none of that epoch's is still here)."""
        self._bounds.pop(epoch - 2, None)

    def get(self, epoch: int, j: int, images: bool, check) -> Pending:
        """The batch ``(epoch, j)`` being assembled, allocated on first use (with or without images).  ``check``
        (a :class:`~h5stream.read.verify.BlockCheck` or None): a batch without images whose receivers check its
        rows gets room for their digests."""
        key = (epoch, j)
        p = self._pending.get(key)
        if p is None:
            bounds = self._bounds[epoch]
            n = int(bounds[j + 1] - bounds[j])
            x, y, slot = self._allocate(n, images)
            offsets = None if images else np.empty(n, np.int64)
            checks = None
            if not images and check is not None and (check.every_read or check.by_row):
                checks = (np.zeros(n, np.uint64), np.zeros(n, bool))
            p = self._pending[key] = Pending(Batch(epoch, j, x, y, np.empty(n, np.int64), slot, offsets, checks), n)
            if self._encoded:
                p.batch.encoded_lengths = np.empty(n, np.int64)
        return p

    def ready(self) -> list[tuple[int, int]]:
        """Complete batches that can go out now, in order (stops at the first incomplete one)."""
        out = []
        epoch, j = self._next
        while True:
            bounds = self._bounds.get(epoch)
            if bounds is not None and j >= len(bounds) - 1:
                epoch, j = epoch + 1, 0
                continue
            p = self._pending.get((epoch, j))
            if p is None or p.missing:
                break
            out.append((epoch, j))
            j += 1
        self._next = (epoch, j)
        return out

    def take(self, key: tuple[int, int]) -> Batch:
        """Batch ``key`` (one :meth:`ready` gave), no longer assembled here."""
        return self._pending.pop(key).batch
