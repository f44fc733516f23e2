"""The reader thread keeps its I/O threads going from fill to fill (h5stream.read.reader): the fill after the one
being read is planned and its reads queued meanwhile, and the batches are the same as ever."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from h5stream.read.reader import Reader
from h5stream.read.source import open_source
from h5stream.store.meta import read_meta
from h5stream.store.writer import write_arrays
from h5stream.streaming.config import layout_function
from h5stream.streaming.planning import plan_stream

pytestmark = pytest.mark.usefixtures("no_leaks")

GATE_WAIT_S = 15.0
"""How long a gated read waits for the plan it needs before it fails the read (and so the test)."""


class _PlannedLayout:
    """An epoch layout that records each fill as the reader plans it (asks for its segments)."""

    def __init__(self, layout, epoch: int, planned: list, changed: threading.Condition):
        self._layout, self._epoch, self._planned, self._changed = layout, epoch, planned, changed

    def __getattr__(self, name):
        return getattr(self._layout, name)

    def fill_segments(self, fill: int) -> np.ndarray:
        with self._changed:
            self._planned.append((self._epoch, fill))
            self._changed.notify_all()
        return self._layout.fill_segments(fill)


class _GatedSource:
    """The store's byte source, whose reads made while fill 1 is the last fill planned wait until fill 2 is
    planned and its batches are allocated (``allocated[0]`` counts the batches, ``fill_2_batches`` is the count
    that includes fill 2's first)."""

    def __init__(self, source, planned: list, changed: threading.Condition, allocated: list, fill_2_batches: int):
        self._source, self._planned, self._changed = source, planned, changed
        self._allocated, self._fill_2_batches = allocated, fill_2_batches
        self.name, self.size, self.max_in_flight = source.name, source.size, 2
        self.gated = 0  # reads that waited for fill 2

    def readinto(self, offset, buffers) -> None:
        with self._changed:
            if self._planned and self._planned[-1] == (0, 1):  # only fill 1's rows can be read now
                self.gated += 1
                if not self._changed.wait_for(lambda: self._allocated[0] >= self._fill_2_batches, GATE_WAIT_S):
                    raise AssertionError("fill 2 was not started while fill 1 was read")
        self._source.readinto(offset, buffers)

    def close(self) -> None:
        self._source.close()


def test_the_next_fill_is_planned_while_the_io_threads_read_this_one_and_the_batches_stay_the_same(tmp_path):
    rng = np.random.default_rng(7)
    images = rng.integers(0, 256, (600, 8, 8, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, 600).astype(np.int64)
    path = str(tmp_path / "store.h5")
    write_arrays(path, images, labels, block_rows=20)
    meta = read_meta(path)
    plan = plan_stream(meta, 16 << 20, 25, rows_per_fill=100)
    layout = layout_function(meta.rows, plan, seed=3)
    assert len(layout(0).fills) >= 4
    planned: list = []
    changed = threading.Condition()
    allocated = [0]
    # Fills 0 and 1 touch batches 0 .. k; fill 2 starts by allocating batch k + 1.
    fill_2_batches = int(np.searchsorted(np.cumsum(layout(0).batch_sizes), layout(0).fill_used[:2].sum() - 1,
                                         side="right")) + 2
    sources = []

    def source():
        sources.append(_GatedSource(open_source(path), planned, changed, allocated, fill_2_batches))
        return sources[-1]

    def allocate(n, want_images=True):
        with changed:
            allocated[0] += 1
            changed.notify_all()
        return np.empty((n, *meta.image_shape), np.uint8), np.empty((n, *meta.label_shape), meta.label_dtype), None

    reader = Reader(meta, lambda epoch: _PlannedLayout(layout(epoch), epoch, planned, changed), queue_depth=2,
                    allocate=allocate, cache_labels=True, verify=False, source=source)
    try:
        seen = []
        for _ in range(2 * layout(0).n_batches):  # two epochs
            batch = reader.get()
            assert np.array_equal(batch.images, images[batch.row_ids])
            assert np.array_equal(batch.labels, labels[batch.row_ids])
            seen.append((batch.epoch, batch.index, batch.row_ids.copy()))
    finally:
        reader.close()
    # Fill 1's reads made before fill 2 was planned waited for it (``gated``), or the reader planned fill 2 before
    # the I/O threads got to them: either way fill 2 did not wait for fill 1's reads. A reader that planned fill 2
    # only after fill 1's reads were done would leave a gated read waiting: the read fails and so does the test.
    assert (0, 2) in planned
    for epoch in (0, 1):  # in order, every row once an epoch, in the epoch's order
        got = [(i, r) for e, i, r in seen if e == epoch]
        assert [i for i, _ in got] == list(range(layout(epoch).n_batches))
        assert np.array_equal(np.concatenate([r for _, r in got]), layout(epoch).order())
