"""The stream's iteration contract on real files and threads: one consumer thread at a time, every ``iter`` a
full epoch (except the first one after a resume), no quiet end after ``close``, and a stream handed to an
adapter freed with its last reference."""

from __future__ import annotations

import gc
import os
import threading
import weakref

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np
import psutil
import pytest

import h5stream
from h5stream.errors import StreamClosedError, StreamIterationError
from h5stream.store.writer import write_arrays
from conftest import _my_segments, collect, new_children

pytestmark = pytest.mark.usefixtures("no_leaks")

ROWS, BATCH = 1000, 32


def _ids(x):
    """Row id encoded in the first two pixels of channel 0 and 1 (exact in float32 too)."""
    x = np.asarray(x)
    return np.rint(x[:, 0, 0, 0]).astype(np.int64) + 256 * np.rint(x[:, 0, 0, 1]).astype(np.int64)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """1000 rows of 8x8x3 whose first pixel spells the row id; several fills under the budgets used here."""
    path = str(tmp_path_factory.mktemp("contract") / "ids.h5")
    images = np.random.default_rng(0).integers(0, 255, (ROWS, 8, 8, 3), dtype=np.uint8)
    images[:, 0, 0, 0] = np.arange(ROWS) % 256
    images[:, 0, 0, 1] = np.arange(ROWS) // 256
    write_arrays(path, images, np.arange(ROWS) % 7, block_rows=16)
    return path


def _open(store, **kw):
    return h5stream.open(store, batch_size=BATCH, seed=11, rows_per_fill=256, **kw)


def _position(s):
    return s.state()["epoch"], s.state()["batch"]


# -- one consumer thread at a time ------------------------------------------------------------------------------

def test_a_second_thread_inside_the_stream_meanwhile_is_refused(store):
    """While one thread waits inside ``next()``, another thread's ``next()``, ``iter()`` and ``restore()`` raise at
    once; the first thread still gets its batch, and the stream goes on serving it the exact epoch."""
    entered, go = threading.Event(), threading.Event()
    armed = []

    def gate(image):  # runs in the consumer's thread (workers=0): holds that thread inside next()
        if armed:
            armed.clear()
            entered.set()
            go.wait(60)
        return image

    with _open(store, augment=h5stream.Augment(preprocessing_function=gate)) as s:
        it = iter(s)
        first = [_ids(next(it)[0])]
        state = s.state()
        armed.append(True)
        got = []
        consumer = threading.Thread(target=lambda: got.append(next(it)))
        consumer.start()
        try:
            assert entered.wait(60)
            with pytest.raises(StreamIterationError, match="one thread at a time"):
                next(it)
            with pytest.raises(StreamIterationError, match="one thread at a time"):
                iter(s)
            with pytest.raises(StreamIterationError, match="one thread at a time"):
                s.restore(state)
        finally:
            go.set()
            consumer.join(60)
        assert not consumer.is_alive() and len(got) == 1
        rows = np.concatenate(first + [_ids(got[0][0])] + [_ids(x) for x, _ in it])
        np.testing.assert_array_equal(rows, s.epoch_order(0))


def _iterate_one_epoch(s, ready, errors, epochs):
    """A consumer thread: ``iter(s)``, wait for the other thread to have done the same, then ``for x, y in it``."""
    it = None
    try:
        it = iter(s)
    except StreamIterationError as exc:
        errors.append(exc)
    finally:
        ready.wait(60)  # both iterators exist before either serves a batch
    if it is None:
        return
    try:
        epochs.append(np.concatenate([_ids(x) for x, _ in it]))
    except StreamIterationError as exc:
        errors.append(exc)


def test_two_threads_each_iterating_get_an_error_not_a_wrong_epoch(store):
    """Two threads each running ``for x, y in s``: the older iterator is superseded and raises; an epoch that does
    complete holds every row exactly once."""
    with _open(store) as s:
        for _ in range(3):
            errors, epochs, ready = [], [], threading.Barrier(2)
            threads = [threading.Thread(target=_iterate_one_epoch, args=(s, ready, errors, epochs)) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert not any(t.is_alive() for t in threads)
            assert errors, "two threads iterated one stream at once without an error"
            assert all("one thread at a time" in str(e) for e in errors)
            for rows in epochs:
                np.testing.assert_array_equal(np.sort(rows), np.arange(ROWS))


def test_a_new_iter_supersedes_the_live_iterator(store):
    with _open(store) as s:
        old = iter(s)
        next(old)
        new = iter(s)
        with pytest.raises(StreamIterationError, match="newer iter"):
            next(old)
        rows = np.concatenate([_ids(x) for x, _ in new])
        np.testing.assert_array_equal(rows, s.epoch_order(1))
        with pytest.raises(StopIteration):  # an iterator that finished its epoch stays finished
            next(new)


# -- close -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [0, 1])
def test_next_after_close_raises_instead_of_ending_the_epoch(store, workers):
    kw = dict(augment=h5stream.Augment(horizontal_flip=True), workers=1) if workers else {}
    s = _open(store, **kw)
    it = iter(s)
    next(it)
    s.close()
    with pytest.raises(StreamClosedError, match="closed"):
        next(it)
    with pytest.raises(StreamClosedError):
        for _ in it:  # a for loop does not just end mid-epoch
            pass


# -- every iter() is a full epoch ----------------------------------------------------------------------------------

def test_a_peek_then_a_for_loop_serves_a_full_epoch(store):
    with _open(store) as s:
        peeked = _ids(next(iter(s))[0])
        np.testing.assert_array_equal(peeked, s.epoch_order(0)[:BATCH])
        assert _position(s) == (0, 1)  # what was served: one batch of epoch 0
        rows = np.concatenate([_ids(x) for x, _ in s])
        np.testing.assert_array_equal(rows, s.epoch_order(1))
        assert _position(s) == (2, 0)
        rows = np.concatenate([_ids(x) for x, _ in s])
        np.testing.assert_array_equal(rows, s.epoch_order(2))


@pytest.mark.parametrize("workers", [0, 1])
def test_an_abandoned_epoch_is_left_and_state_follows_what_is_served(store, workers):
    kw = dict(augment=h5stream.Augment(dtype="uint8"), workers=1) if workers else {}
    with _open(store, **kw) as s:
        it = iter(s)
        kept = [next(it) for _ in range(5)]  # still held (with workers: views of the pool's output slots)
        del it
        assert _position(s) == (0, 5)  # the batches served so far
        it = iter(s)
        assert _position(s) == (1, 0)  # the new iteration starts epoch 1 at its first batch
        first = _ids(next(it)[0])
        assert _position(s) == (1, 1)
        rows = np.concatenate([first] + [_ids(x) for x, _ in it])
        np.testing.assert_array_equal(rows, s.epoch_order(1))
        assert _position(s) == (2, 0)
        np.testing.assert_array_equal(np.concatenate([_ids(x) for x, _ in kept]), s.epoch_order(0)[:5 * BATCH])


def test_restore_mid_epoch_then_the_first_iter_finishes_that_epoch(store):
    with _open(store) as s:
        it = iter(s)
        for _ in range(7):
            next(it)
        state = s.state()
        rest = np.concatenate([_ids(x) for x, _ in it])
        np.testing.assert_array_equal(rest, s.epoch_order(0)[7 * BATCH:])
        s.restore(state)
        assert _position(s) == (0, 7)
        np.testing.assert_array_equal(np.concatenate([_ids(x) for x, _ in s]), rest)
        np.testing.assert_array_equal(np.concatenate([_ids(x) for x, _ in s]), s.epoch_order(1))
        s.restore(state)
        next(iter(s))  # a peek at the resumed epoch: the iteration after it starts the next epoch
        np.testing.assert_array_equal(np.concatenate([_ids(x) for x, _ in s]), s.epoch_order(1))
    with _open(store, resume=state) as r:
        np.testing.assert_array_equal(np.concatenate([_ids(x) for x, _ in r]), rest)
        np.testing.assert_array_equal(np.concatenate([_ids(x) for x, _ in r]), r.epoch_order(1))


# -- a stream handed to an adapter is freed with its last reference ---------------------------------------------------

def _augmented(store, workers):
    return _open(store, augment=h5stream.Augment(horizontal_flip=True), workers=workers)


def _assert_freed(ref, children_before, segments_before):
    collect(lambda: ref() is None)
    assert ref() is None, f"the stream is still referenced by {[type(r).__name__ for r in gc.get_referrers(ref())]}"
    assert new_children(children_before) == [], "the stream's workers outlived it"
    assert _my_segments() - segments_before == set(), "the stream's shared memory outlived it"


def _handed_over(store, workers, use):
    """Open an augmented stream, give it to ``use`` (which returns the adapter object), drop both: a weakref."""
    children, segments = {p.pid for p in psutil.Process().children()}, _my_segments()
    s = _augmented(store, workers)
    pids = s.stats()["worker_pids"]
    assert len(pids) == workers and all(psutil.pid_exists(p) for p in pids)
    adapter = use(s)
    ref = weakref.ref(s)
    del s, adapter
    _assert_freed(ref, children, segments)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_stream_given_to_keras_and_dropped_is_freed(store, workers):
    pytest.importorskip("keras")

    def use(s):
        ds = s.keras()
        ds[0]  # a peek, as fit does
        ds.on_epoch_begin()
        ds[0], ds[1]
        return ds

    _handed_over(store, workers, use)


def test_a_stream_given_to_tf_data_and_dropped_is_freed(store):
    tf = pytest.importorskip("tensorflow")

    def use(s):
        ds = s.tf_dataset()
        for _ in ds.take(3):
            pass
        assert isinstance(ds, tf.data.Dataset)
        it = iter(ds.map(lambda x, y: (tf.cast(x, tf.float32), y)))
        next(it)  # a pass left mid-way: its generator suspended inside TensorFlow until the iterator goes
        return ds, it

    _handed_over(store, 1, use)


def test_a_stream_given_to_torch_and_dropped_is_freed(store):
    pytest.importorskip("torch", reason="torch is not installed; the Passes path is tested without it")

    def use(s):
        ds = s.torch()
        next(iter(ds))
        return ds

    _handed_over(store, 1, use)


def test_a_stream_served_by_passes_and_dropped_is_freed(store):
    """The pass logic every adapter (torch's included) shares, without a framework."""
    from h5stream.adapters._passes import passes_for

    def use(s):
        passes = passes_for(s)
        pass_id = passes.begin_pass()
        passes.next_batch(pass_id)
        return passes

    _handed_over(store, 2, use)
