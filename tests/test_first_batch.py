"""The first batch: it goes out as soon as its fill is read, and waiting for it measures a stuck reader only.

A reader that keeps reading is slow, not stuck: ``timeout_s`` counts from its last read, not from the wait's
start, so a first batch that needs a whole fill of slow reads never trips it; a reader that stops reading does.

The storage here is really slow (every read of the byte source takes ``STALL_S``, one at a time, like a busy
disk): the first batch needs many more reads than fit in ``timeout_s``, and each read takes a fraction of it.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from h5stream.errors import ReaderError
from h5stream.read.reader import Reader
from h5stream.read.source import open_source
from h5stream.store.meta import read_meta
from h5stream.store.writer import write_arrays
from h5stream.streaming.config import layout_function
from h5stream.streaming.planning import plan_stream

pytestmark = pytest.mark.usefixtures("no_leaks")

STALL_S = 0.15
TIMEOUT_S = 5 * STALL_S


class SlowSource:
    """The store's own byte source, every read taking ``STALL_S`` more, one read at a time; ``hang`` makes
    every read from the ``hang``-th on never return (until the test ends it)."""

    def __init__(self, path: str, hang: int | None = None):
        self._inner = open_source(path)
        self.max_in_flight = self._inner.max_in_flight
        self._lock = threading.Lock()
        self._gone = threading.Event()  # set at the end of the test: a hung read returns
        self.reads, self._hang = 0, hang

    def readinto(self, offset, buffers):
        with self._lock:
            self.reads += 1
            hang = self._hang is not None and self.reads >= self._hang
            self._gone.wait(None if hang else STALL_S)  # the slow device: not a synchronisation
            self._inner.readinto(offset, buffers)

    def close(self):
        self._gone.set()
        self._inner.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("slow") / "s.h5")
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (2000, 4, 4, 3), dtype=np.uint8)
    write_arrays(path, images, np.arange(2000) % 5, block_rows=100)
    return path, images


def _reader(path, source):
    meta = read_meta(path)
    plan = plan_stream(meta, 16 << 20, 50)
    layout = layout_function(meta.rows, plan, seed=1)
    assert plan.rows_per_fill >= meta.rows  # one fill: the first batch needs every read of the store

    def allocate(n, want_images=True):
        return np.empty((n, *meta.image_shape), np.uint8), np.empty((n, *meta.label_shape), meta.label_dtype), None

    return Reader(meta, layout, queue_depth=4, allocate=allocate, timeout_s=TIMEOUT_S, source=lambda: source,
                  verify=False)


def test_a_first_batch_that_needs_more_slow_reads_than_fit_in_timeout_s_comes_without_an_error(store):
    path, images = store
    slow = SlowSource(path)
    reader = _reader(path, slow)
    try:
        batch = reader.get()  # the default deadline: timeout_s
        assert slow.reads * STALL_S > 2 * TIMEOUT_S  # it did wait for reads that took longer than timeout_s
        assert np.array_equal(batch.images, images[batch.row_ids])
        reader.get()
    finally:
        reader.close()
        slow.close()


def test_a_reader_that_stops_reading_still_fails_within_timeout_s_of_its_last_read(store):
    path, _images = store
    slow = SlowSource(path, hang=8)
    reader = _reader(path, slow)
    try:
        with pytest.raises(ReaderError, match="no read done in the last"):
            reader.get()
        assert slow.reads == 8  # seven reads went through, the eighth never returned
    finally:
        reader.close()
        slow.close()


def test_the_first_batch_goes_out_before_the_next_fill_is_planned_and_allocated(store):
    # A fill of many small rows has thousands of batches: planning and allocating the next one used to come
    # between the first fill's reads and its first batch.
    path, images = store
    meta = read_meta(path)
    plan = plan_stream(meta, 16 << 20, 50, rows_per_fill=500)
    layout = layout_function(meta.rows, plan, seed=1)
    assert plan.rows_per_fill < meta.rows  # several fills
    constructed, next_fill = threading.Event(), threading.Event()
    holder, queued = [], []

    def allocate(n, want_images=True):
        constructed.wait()
        reader = holder[0]
        if reader.stats["fills"] == 1 and not queued:  # the first batch of the second fill
            queued.append(reader.queue_fill[0])  # the consumer has taken nothing yet: what was put is queued
            next_fill.set()
        return np.empty((n, *meta.image_shape), np.uint8), np.empty((n, *meta.label_shape), meta.label_dtype), None

    holder.append(Reader(meta, layout, queue_depth=4, allocate=allocate, timeout_s=60, verify=False))
    reader = holder[0]
    constructed.set()
    try:
        assert next_fill.wait(60)  # a synchronisation on the reader's own progress, not a sleep
        assert queued == [1]
        batch = reader.get()
        assert (batch.epoch, batch.index) == (0, 0)
        assert np.array_equal(batch.images, images[batch.row_ids])
        assert np.array_equal(batch.row_ids, layout(0).order()[:len(batch.row_ids)])
    finally:
        reader.close()
