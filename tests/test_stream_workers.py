"""The stream with augmentation: inline and in worker processes, end to end on real files."""


import threading

import numpy as np
import psutil
import pytest

import h5stream
from h5stream.streaming.budget import KEPT_SLOTS
from h5stream.streaming.planning import plan_stream
from h5stream.errors import ConfigError, WorkerError
from h5stream.store.meta import read_meta
from h5stream.store.writer import write_arrays
from conftest import pinned_in_page_cache

ROWS = 700


pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 255, (ROWS, 24, 24, 3), dtype=np.uint8)
    labels = np.arange(ROWS) % 5
    path = tmp_path_factory.mktemp("workers") / "w.h5"
    write_arrays(path, images, labels, block_rows=16)
    return path


def _epochs(store, n_epochs=2, **kw):
    with h5stream.open(store, batch_size=32, memory_budget="300MiB", seed=11, **kw) as s:
        return [(x.copy(), y.copy()) for _ in range(n_epochs) for x, y in s]


def test_same_seed_same_augmented_batches_with_0_1_2_workers(store):
    aug = h5stream.Augment.preset("standard", rescale=1 / 255)
    runs = {w: _epochs(store, augment=aug, workers=w) for w in (0, 1, 2)}
    assert runs[0][0][0].dtype == np.float32
    for w in (1, 2):
        assert len(runs[w]) == len(runs[0])
        for (x0, y0), (xw, yw) in zip(runs[0], runs[w]):
            assert np.array_equal(x0, xw) and np.array_equal(y0, yw)
    plain = _epochs(store, n_epochs=1)
    assert not np.allclose(runs[0][0][0], plain[0][0] / 255)  # augmentation really changed pixels
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(runs[0], plain))  # and labels are untouched


def test_pinned_rows_per_fill_gives_the_same_batches_when_the_workers_shrink_the_fill(store):
    aug = h5stream.Augment(horizontal_flip=True, rotation_range=10)
    meta = read_meta(store)
    tight = plan_stream(meta, 1 << 40, 32, augment=aug, workers=2).min_budget_bytes + (1 << 20)
    pooled_fill = plan_stream(meta, tight, 32, augment=aug, workers=2).rows_per_fill
    assert pooled_fill < ROWS <= plan_stream(meta, tight, 32, augment=aug, workers=0).rows_per_fill
    runs = {}
    for w in (0, 2):
        with h5stream.open(store, batch_size=32, memory_budget=tight, seed=11, augment=aug, workers=w,
                           rows_per_fill=pooled_fill) as s:
            assert s.plan.rows_per_fill == pooled_fill
            runs[w] = [(x.copy(), y.copy()) for x, y in s]
    assert len(runs[0]) == len(runs[2])
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(runs[0], runs[2]))


def test_resume_with_workers_equals_not_stopping(store):
    aug = h5stream.Augment(horizontal_flip=True, rotation_range=10)
    kw = dict(batch_size=64, memory_budget="300MiB", seed=4, augment=aug, workers=1)
    with h5stream.open(store, **kw) as s:
        it = iter(s)
        next(it), next(it), next(it)
        state = s.state()
        rest = [x.copy() for x, _ in it]
    with h5stream.open(store, resume=state, **kw) as r:
        again = [x.copy() for x, _ in r]
    assert len(rest) == len(again) and all(np.array_equal(a, b) for a, b in zip(rest, again))


def _explode(batch):
    raise ValueError("boom from the transform")


def test_transform_exception_reaches_the_consumer_with_traceback(store):
    aug = h5stream.Augment(preprocessing_function=_explode)
    with h5stream.open(store, batch_size=32, memory_budget="300MiB", augment=aug, workers=1) as s:
        with pytest.raises(WorkerError, match="boom from the transform") as info:
            next(iter(s))
    assert "_explode" in str(info.value) or "_explode" in str(info.value.__cause__)
    with h5stream.open(store, batch_size=32, memory_budget="300MiB", augment=aug, workers=0) as s:
        with pytest.raises(ValueError, match="boom"):
            next(iter(s))


def test_gc_of_an_unclosed_stream_stops_workers_and_frees_shared_memory(store):
    s = h5stream.open(store, batch_size=32, memory_budget="300MiB", augment=h5stream.Augment(vertical_flip=True),
                      workers=2)
    pids = s.stats()["worker_pids"]
    next(iter(s))
    assert all(psutil.pid_exists(p) for p in pids)
    del s  # the no_leaks fixture checks children and /dev/shm after gc


def test_budget_counts_the_workers(store):
    aug = h5stream.Augment(horizontal_flip=True)
    with h5stream.open(store, batch_size=32, memory_budget="300MiB", augment=aug) as inline:
        inline_fill = inline.plan.rows_per_fill
        # The feed allocates the counts the plan's bytes are counted for.
        assert inline._feed._images.max_sets == inline.plan.reader_batches
        assert inline._feed._out.max_sets == inline.plan.consumer_sets
    with h5stream.open(store, batch_size=32, memory_budget="300MiB", augment=aug, workers=2) as pooled:
        feed, plan = pooled._feed, pooled.plan
        assert feed._inputs.array.shape[0] == plan.input_slots * 32 and feed._pool.n_slots == plan.out_slots
        assert feed._lender.copies.max_sets == plan.consumer_sets
        assert pooled.plan.pool_bytes > 2 * (24 << 20)
        assert pooled.plan.total_bytes <= 300 << 20
        assert pooled.plan.rows_per_fill <= inline_fill
    with pytest.raises(h5stream.BudgetError, match="2 workers"):
        h5stream.open(store, batch_size=32, memory_budget="64MiB", augment=aug, workers=2)


def test_an_augment_must_be_an_augment(store):
    with pytest.raises(ConfigError, match="Augment"):
        h5stream.open(store, augment=lambda x: x, workers=2)


def test_plain_workers_give_exactly_the_batches_of_workers_0_and_resume_exactly(store):
    """workers without an augment read the rows into their output slots themselves (the reader copies no
    pixel): the same uint8 batches as workers=0 over two epochs, lent as views of the slots, and a stream
    resumed mid-epoch from state() gives exactly the rest."""
    plain = _epochs(store)
    n = len(plain) // 2
    kw = dict(batch_size=32, memory_budget="300MiB", seed=11, workers=2)
    with pinned_in_page_cache(store), h5stream.open(store, **kw) as s:
        assert s._feed.direct and s.image_dtype == np.uint8
        pooled, lent = [], []
        for _ in range(2):
            for x, y in s:
                lent.append(_lent(s, x))
                pooled.append((x.copy(), y.copy()))
        del x
        stats = s.stats()
        it = iter(s)  # the third epoch, stopped mid-way
        for _ in range(5):
            next(it)
        state = s.state()
        rest = [(x.copy(), y.copy()) for x, y in it]
    assert all(lent) and stats["read_bytes"] == 0 and stats["deferred_bytes"] >= 2 * ROWS * 24 * 24 * 3
    assert len(pooled) == len(plain) and pooled[0][0].dtype == np.uint8
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(plain, pooled))
    with h5stream.open(store, resume=state, **kw) as r:
        again = [(x.copy(), y.copy()) for x, y in r]
    with h5stream.open(store, batch_size=32, memory_budget="300MiB", seed=11, resume=state) as r:
        inline = [(x.copy(), y.copy()) for x, y in r]
    assert len(rest) == len(again) == len(inline) == n - 5
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[0], c[0]) and np.array_equal(a[1], b[1])
               for a, b, c in zip(rest, again, inline))


def test_the_plan_counts_plain_workers_as_it_runs_them(store):
    """The feed allocates what the plan counts for workers without an augment: uint8 output slots and copies,
    the input ring, and no transform library."""
    from h5stream.streaming.budget import TRANSFORM_LIBRARY_BYTES

    meta = read_meta(store)
    aug = h5stream.Augment(horizontal_flip=True)
    with h5stream.open(store, batch_size=32, memory_budget="300MiB", workers=2) as pooled:
        feed, plan = pooled._feed, pooled.plan
        assert feed._inputs.array.shape[0] == plan.input_slots * 32 and feed._pool.n_slots == plan.out_slots
        assert feed._pool.out_dtype == np.uint8 and feed._lender.copies.max_sets == plan.consumer_sets
        assert plan.pool_bytes == plan_stream(meta, 300 << 20, 32, augment=aug, workers=2).pool_bytes \
            - TRANSFORM_LIBRARY_BYTES
        assert plan.output_bytes > 0 and plan.total_bytes <= 300 << 20
    with pytest.raises(h5stream.BudgetError, match="2 workers"):
        h5stream.open(store, batch_size=32, memory_budget="24MiB", workers=2)


def _lent(stream, x) -> bool:
    pool = stream._feed._pool
    return any(np.shares_memory(x, pool.slot_view(k)) for k in range(pool.n_slots))


def test_batches_are_lent_without_copy_and_kept_ones_stay_intact(store):
    aug = h5stream.Augment(horizontal_flip=True, rotation_range=20)
    expected = _epochs(store, n_epochs=1, augment=aug, workers=0)
    with h5stream.open(store, batch_size=32, memory_budget="300MiB", seed=11, augment=aug, workers=1) as s:
        lent = []
        for x, _ in s:  # the usual loop: each batch dropped when the next arrives
            lent.append(_lent(s, x))
        assert all(lent)  # zero-copy every time
        del x  # the last batch of that epoch would still hold its slot
        kept = list(s)  # a consumer keeping every batch of the next epoch
        flags = [_lent(s, x) for x, _ in kept]
        lent_slots = s.plan.lent_slots
        # The first few are views, then one more (the first, held that long, counts as kept for good: one batch
        # may be); every other one is a copy.
        assert flags[:lent_slots + KEPT_SLOTS] == [True] * (lent_slots + KEPT_SLOTS)
        assert not any(flags[lent_slots + KEPT_SLOTS:])
        assert len(s._feed._lender.lent) == lent_slots + KEPT_SLOTS
        assert s.stats()["copied_batches"] == len(kept) - lent_slots - KEPT_SLOTS
    second = _epochs(store, n_epochs=2, augment=aug, workers=0)[len(expected):]
    assert len(kept) == len(second)
    for (x, y), (xe, ye) in zip(kept, second):  # nothing kept was overwritten by later batches
        assert np.array_equal(x, xe) and np.array_equal(y, ye)
    assert np.array_equal(kept[0][0], second[0][0])  # a lent view stays readable after close()


def test_one_batch_kept_for_good_makes_no_later_batch_a_copy(store):
    """``x, y = next(iter(stream))`` kept for its shapes, then the usual loop (which holds the previous batch
    while it asks for the next): every batch is still lent without a copy, and the kept one stays intact."""
    aug = h5stream.Augment(horizontal_flip=True, rotation_range=20)
    expected = _epochs(store, n_epochs=3, augment=aug, workers=0)
    with h5stream.open(store, batch_size=32, memory_budget="300MiB", seed=11, augment=aug, workers=1) as s:
        it = iter(s)
        first = next(it)  # kept to the end
        got, lent = [(first[0].copy(), first[1].copy())], [_lent(s, first[0])]
        for _ in range(3):
            for x, y in it:
                got.append((x.copy(), y.copy()))
                lent.append(_lent(s, x))
            it = iter(s)
        assert all(lent)  # zero-copy every time
        assert s.stats()["copied_batches"] == 0
        assert _lent(s, first[0]) and np.array_equal(first[0], expected[0][0])  # never overwritten
        assert np.array_equal(first[1], expected[0][1])
    assert len(got) == len(expected)
    for (x, y), (xe, ye) in zip(got, expected):
        assert np.array_equal(x, xe) and np.array_equal(y, ye)


def test_batches_kept_beyond_the_kept_slot_are_copies_and_all_stay_intact(store):
    """Two batches kept for good: the second is beyond the one kept slot, so the loop after them gets copies
    (never a slot it holds), and every batch is right."""
    aug = h5stream.Augment(horizontal_flip=True, rotation_range=20)
    expected = _epochs(store, n_epochs=2, augment=aug, workers=1)
    with h5stream.open(store, batch_size=32, memory_budget="300MiB", seed=11, augment=aug, workers=1) as s:
        it = iter(s)
        first, second = next(it), next(it)
        got = [(x.copy(), y.copy()) for _ in range(2) for x, y in (it if _ == 0 else s)]
        copied = s.stats()["copied_batches"]
        assert 0 < copied < len(got)
        for kept, (xe, ye) in zip((first, second), expected):
            assert np.array_equal(kept[0], xe) and np.array_equal(kept[1], ye)
    for (x, y), (xe, ye) in zip(got, expected[2:]):
        assert np.array_equal(x, xe) and np.array_equal(y, ye)


def _segments():
    from h5stream.memory.shm import segment_names

    return set(segment_names(f"h5s_{__import__('os').getpid()}_"))


def test_workers_read_a_cached_store_themselves(store):
    """A fill already in the page cache goes out as byte offsets: the workers read the rows, the reader copies none."""
    aug = h5stream.Augment(horizontal_flip=True)
    with pinned_in_page_cache(store), \
            h5stream.open(store, batch_size=32, memory_budget="300MiB", seed=3, augment=aug, workers=2) as s:
        assert s._feed.direct  # every page cached
        pooled = [(x.copy(), y.copy()) for x, y in s]
        stats = s.stats()
    assert stats["read_bytes"] == 0 and stats["deferred_bytes"] >= ROWS * 24 * 24 * 3
    with h5stream.open(store, batch_size=32, memory_budget="300MiB", seed=3, augment=aug) as s:
        inline = [(x.copy(), y.copy()) for x, y in s]
    assert len(pooled) == len(inline)
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(pooled, inline))


@pytest.mark.parametrize("augmented", [True, False], ids=["augment", "plain"])
def test_compressed_store_goes_through_shared_input_slots(tmp_path, augmented):
    rng = np.random.default_rng(5)
    images = rng.integers(0, 255, (300, 16, 16, 3), dtype=np.uint8)
    path = tmp_path / "z.h5"
    write_arrays(path, images, np.arange(300) % 3, block_rows=16, compression="zlib")
    aug = h5stream.Augment(vertical_flip=True, rotation_range=5) if augmented else None
    runs = {}
    for w in (0, 1):
        before = _segments()
        with h5stream.open(path, batch_size=32, memory_budget="300MiB", seed=8, augment=aug, workers=w) as s:
            runs[w] = [(x.copy(), y.copy()) for x, y in s]
            if w:
                assert not s._feed.direct and [n for n in _segments() - before if "in_" in n]
    assert len(runs[0]) == len(runs[1])
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(runs[0], runs[1]))


@pytest.mark.parametrize("augmented", [True, False], ids=["augment", "plain"])
def test_a_truncated_file_read_by_the_workers_is_a_reader_error(tmp_path, augmented):
    rng = np.random.default_rng(2)
    path = tmp_path / "t.h5"
    write_arrays(path, rng.integers(0, 255, (3000, 24, 24, 3), dtype=np.uint8), np.arange(3000) % 5, block_rows=16)
    # Cached fills go to the workers as byte offsets; a fill the page cache does not hold, the reader reads ahead
    # itself (all of them, under this budget).  Pinned in the cache, the fills are the workers' to read.
    with pinned_in_page_cache(path):
        s = h5stream.open(path, batch_size=32, memory_budget="300MiB", seed=0,
                          augment=h5stream.Augment(horizontal_flip=True) if augmented else None, workers=1)
        batches = iter(s)
        next(batches)  # the reader has the chunk index by now; only the workers touch the pixels from here on
        assert s.stats()["deferred_bytes"] > 0
        with open(path, "r+b") as f:  # cut the file: later chunks are gone
            f.truncate(200_000)
        with pytest.raises(h5stream.ReaderError, match="unexpected end of file") as info:
            for _batch in batches:
                pass
    assert isinstance(info.value.__cause__, WorkerError) and info.value.__cause__.stage == "read"
    s.close()


def test_fills_not_in_the_page_cache_are_read_by_the_reader(tmp_path):
    """Cold fills go through the input slots, cached ones as byte offsets; batches that span both come out right."""
    from h5stream.measure import cached_fraction, evict_from_page_cache

    path = tmp_path / "cold.h5"  # 12 MiB: more than the kernel reads ahead when the file is opened
    images = np.random.default_rng(0).integers(0, 255, (4096, 32, 32, 3), dtype=np.uint8)
    write_arrays(path, images, np.arange(4096) % 7, block_rows=64)
    aug = h5stream.Augment(horizontal_flip=True)
    kw = dict(batch_size=24, memory_budget="300MiB", seed=1, augment=aug, rows_per_fill=256)  # 16 fills
    with h5stream.open(path, **kw) as s:
        inline = [(x.copy(), y.copy()) for x, y in s]
    assert evict_from_page_cache(path) and cached_fraction(path) < 0.5
    with h5stream.open(path, workers=1, **kw) as s:
        cold = [(x.copy(), y.copy()) for x, y in s]
        assert s.stats()["read_bytes"] > 0  # the first fill at least started cold (later ones may be read ahead)
    # Warm, then evicted after a few batches: the fills read ahead so far go as offsets, later ones are read.
    with open(path, "rb") as fh:
        fh.read()
    with h5stream.open(path, workers=1, **kw) as s:
        mixed = []
        for x, y in s:
            mixed.append((x.copy(), y.copy()))
            if len(mixed) == 3:
                evict_from_page_cache(path)
        stats = s.stats()
    assert stats["read_bytes"] > 0 and stats["deferred_bytes"] > 0
    assert len(inline) == len(cold) == len(mixed) == 171
    for a, b, c in zip(inline, cold, mixed):
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[0], c[0]) and np.array_equal(a[1], c[1])


def test_only_the_iterating_thread_hands_tasks_to_the_workers_and_no_collector_runs(store, monkeypatch):
    """The reader thread hands over whole fills; the thread that iterates submits them as output slots come free
    and reads the workers' answers itself: no other thread of the process wakes per batch for the pool."""
    from h5stream.concurrency.procpool import Workers

    senders = set()
    for name in ("send", "send_raw"):
        original = getattr(Workers, name, None)
        if original is not None:
            def sending(self, *args, _original=original, **kwargs):
                senders.add(threading.current_thread().name)
                return _original(self, *args, **kwargs)

            monkeypatch.setattr(Workers, name, sending)
    threads, ids = set(), []
    with h5stream.open(store, batch_size=32, seed=3, workers=2, augment=h5stream.Augment(horizontal_flip=True),
                       memory_budget="300MiB") as s:
        for _epoch in range(2):
            for _x, y in s:
                ids.append(y.copy())
                threads |= {t.name for t in threading.enumerate() if t.name.startswith("h5stream")}
    assert senders == {threading.current_thread().name}
    assert threads and all(name.startswith("h5stream-reader") for name in threads), threads
    labels = np.concatenate(ids)
    assert len(labels) == 2 * ROWS and np.array_equal(np.bincount(labels), 2 * np.bincount(np.arange(ROWS) % 5))


def test_the_time_the_consumer_waited_is_counted_once(tmp_path):
    """The first batch waits on the reader, then on the pool: ``wait_s`` counts that wait once, so it is never
    more than the time the call took (counted twice, the reader's part made it more)."""
    import time

    path = tmp_path / "w.h5"
    write_arrays(str(path), np.zeros((512, 16, 16, 3), np.uint8), np.arange(512) % 3, block_rows=64)
    flip = h5stream.Augment(horizontal_flip=True)
    with h5stream.open(str(path), batch_size=32, workers=1, augment=flip, seed=0) as s:
        it = iter(s)
        t0 = time.monotonic()
        next(it)
        took = time.monotonic() - t0
        waited = s.stats()["wait_s"]
    assert 0 < waited <= took, (waited, took)
