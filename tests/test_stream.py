"""The stream end to end on real HDF5 files: order, budget, resume, errors, lifecycle."""

import threading

import h5py
import numpy as np
import pytest

import h5stream
from h5stream.errors import BudgetError, ConfigError, ReaderError, StoreFormatError, StoreNotFoundError
from h5stream.store.writer import StoreWriter, write_arrays
from conftest import collect, pinned_in_page_cache

ROWS = 3000


def _ids(x):
    """Row id encoded in the first two pixels by ``make_store``."""
    return x[:, 0, 0, 0].astype(np.int64) + 256 * x[:, 0, 0, 1].astype(np.int64)


def make_store(path, rows=ROWS, block_rows=32, classes=10, **kw):
    images = np.random.default_rng(0).integers(0, 255, (rows, 8, 8, 3), dtype=np.uint8)
    images[:, 0, 0, 0] = np.arange(rows) % 256
    images[:, 0, 0, 1] = np.arange(rows) // 256
    labels = np.arange(rows) * classes // rows  # class-sorted
    write_arrays(path, images, labels, block_rows=block_rows, **kw)
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("stream") / "s.h5")


def reader_threads():
    return [t for t in threading.enumerate() if t.name.startswith("h5stream-reader") and t.is_alive()]


@pytest.fixture(autouse=True)
def no_thread_left():
    yield
    collect(lambda: reader_threads() == [])
    assert reader_threads() == []


@pytest.mark.parametrize("budget", ["6.2MiB", "8MiB", "1GiB"])
@pytest.mark.parametrize("batch_size", [1, 32, 100])
def test_each_epoch_yields_every_row_once_with_its_label(store, budget, batch_size):
    if budget == "6.2MiB" and batch_size == 100:
        pytest.skip("below the minimum budget; covered by test_budget_too_small")
    with h5stream.open(store, batch_size=batch_size, memory_budget=budget, seed=5) as s:
        assert len(s) == -(-ROWS // batch_size)
        previous = None
        for epoch in range(2):
            ids, n = [], 0
            for x, y in s:
                assert x.dtype == np.uint8 and x.shape[1:] == (8, 8, 3)
                assert np.array_equal(y, _ids(x) * 10 // ROWS)
                ids.append(_ids(x))
                n += 1
            ids = np.concatenate(ids)
            assert n == len(s)
            assert np.array_equal(np.sort(ids), np.arange(ROWS))
            assert np.array_equal(ids, s.epoch_order(epoch))
            assert previous is None or not np.array_equal(ids, previous)
            previous = ids
        assert s.epoch == 2


def test_same_seed_same_batches_and_no_shuffle_is_file_order(store):
    def first_epoch(**kw):
        with h5stream.open(store, batch_size=64, memory_budget="8MiB", **kw) as s:
            return np.concatenate([_ids(x) for x, _ in s])

    assert np.array_equal(first_epoch(seed=1), first_epoch(seed=1))
    assert not np.array_equal(first_epoch(seed=1), first_epoch(seed=2))
    assert np.array_equal(first_epoch(shuffle=False), np.arange(ROWS))


def test_plan_fits_budget_and_is_exposed(store):
    with h5stream.open(store, batch_size=32, memory_budget="6.5MiB") as s:
        assert s.plan.total_bytes <= 6.5 * 2**20
        assert 32 <= s.plan.rows_per_fill < ROWS
    with h5stream.open(store, batch_size=32, memory_budget="64MiB") as s:  # the whole file fits: one fill an epoch
        assert s.plan.rows_per_fill >= ROWS


def test_budget_too_small(store):
    with pytest.raises(BudgetError, match="minimum"):
        h5stream.open(store, batch_size=32, memory_budget="1MiB")


@pytest.mark.parametrize("drop", [False, True])
def test_shards_partition_each_epoch(store, drop):
    streams = [h5stream.open(store, batch_size=64, memory_budget="6.5MiB", shard=(i, 3), drop_remainder=drop, seed=9)
               for i in range(3)]
    try:
        assert len({len(s) for s in streams}) == 1
        for _epoch in range(2):
            seen = [np.concatenate([_ids(x) for x, _ in s]) for s in streams]
            union = np.concatenate(seen)
            assert len(np.unique(union)) == len(union)
            if not drop:
                assert np.array_equal(np.sort(union), np.arange(ROWS))
    finally:
        for s in streams:
            s.close()


@pytest.mark.parametrize("budget", ["6.5MiB", "1GiB"])
def test_resume_equals_not_stopping_at_every_step(store, budget):
    kw = dict(batch_size=200, memory_budget=budget, seed=3)
    with h5stream.open(store, **kw) as s:
        reference = [_ids(x) for _ in range(2) for x, _ in s]  # two epochs
    per_epoch = len(reference) // 2
    for k in range(0, len(reference) - 1):
        with h5stream.open(store, **kw) as s:
            it = iter(s)
            for _ in range(k if k < per_epoch else per_epoch):
                next(it)
            if k >= per_epoch:
                it = iter(s)
                for _ in range(k - per_epoch):
                    next(it)
            state = s.state()
        assert state["epoch"] * per_epoch + state["batch"] == k
        with h5stream.open(store, resume=state, **kw) as r:
            rest = [_ids(x) for x, _ in r]
        expected = reference[k:per_epoch] if k < per_epoch else reference[k:]
        assert len(rest) == len(expected)
        assert all(np.array_equal(a, b) for a, b in zip(rest, expected))


def test_fixed_rows_per_fill_gives_the_same_order_on_any_budget_and_resume_keeps_it(store):
    with h5stream.open(store, batch_size=64, memory_budget="6.5MiB", seed=2) as small:
        fill = small.plan.rows_per_fill
        assert fill < ROWS  # this budget cannot hold the file: the order depends on the fill
        order = small.epoch_order(1)
        it = iter(small)
        next(it)
        state = small.state()
        rest = [_ids(x) for x, _ in it]
    with h5stream.open(store, batch_size=64, memory_budget="1GiB", seed=2) as big:
        assert big.plan.rows_per_fill > fill and not np.array_equal(big.epoch_order(1), order)
    with h5stream.open(store, batch_size=64, memory_budget="1GiB", seed=2, rows_per_fill=fill) as pinned:
        assert pinned.plan.rows_per_fill == fill and np.array_equal(pinned.epoch_order(1), order)
    with h5stream.open(store, batch_size=64, memory_budget="1GiB", seed=2, resume=state) as resumed:
        assert resumed.plan.rows_per_fill == fill  # taken from the state
        got = [_ids(x) for x, _ in resumed]
    assert len(got) == len(rest) and all(np.array_equal(a, b) for a, b in zip(rest, got))
    with h5stream.open(store, batch_size=64, memory_budget="1GiB", seed=2) as other:
        with pytest.raises(ConfigError, match="resume=state"):
            other.restore(state)
    with pytest.raises(BudgetError, match="rows_per_fill"):
        h5stream.open(store, batch_size=64, memory_budget="6.5MiB", seed=2, rows_per_fill=ROWS)


def test_restore_in_place_and_mismatched_state(store):
    with h5stream.open(store, batch_size=100, memory_budget="6.5MiB", seed=3) as s:
        it = iter(s)
        next(it), next(it)
        state = s.state()
        after = _ids(next(it)[0])
        s.restore(state)
        assert np.array_equal(_ids(next(iter(s))[0]), after)
    with h5stream.open(store, batch_size=50, memory_budget="6.5MiB", seed=3) as other:
        with pytest.raises(ConfigError, match="batch_size"):
            other.restore(state)
        with pytest.raises(ConfigError, match="not an h5stream state"):
            other.restore({"epoch": 0})


def test_breaking_out_of_an_epoch_leaves_it_and_the_next_loop_is_a_whole_epoch(store):
    with h5stream.open(store, batch_size=500, memory_budget="8MiB", seed=0) as s:
        first = [_ids(x) for _, (x, _) in zip(range(2), s)]
        assert np.array_equal(np.concatenate(first), s.epoch_order(0)[:1000])
        assert (s.epoch, s.state()["batch"]) == (0, 2)
        rest = [_ids(x) for x, _ in s]
        assert np.array_equal(np.concatenate(rest), s.epoch_order(1))
        assert s.epoch == 2


def test_only_committed_rows_are_read(tmp_path):
    path = make_store(tmp_path / "c.h5", rows=200)
    with StoreWriter.open_append(path) as w:
        w.append(np.zeros((50, 8, 8, 3), np.uint8), np.zeros(50, np.int64), ["x"] * 50)
        w.images.flush()
        w._f.close()  # simulate a crash: rows appended, count never raised
    with h5py.File(path, "r") as f:
        assert f["images"].shape[0] == 250 and f.attrs["committed_rows"] == 200
    with h5stream.open(path, batch_size=64, memory_budget="6.5MiB") as s:
        ids = np.concatenate([_ids(x) for x, _ in s])
    assert np.array_equal(np.sort(ids), np.arange(200))


def test_compressed_store_reads_through_hdf5(tmp_path):
    path = make_store(tmp_path / "z.h5", rows=500, compression="zlib")
    with h5stream.open(path, batch_size=64, memory_budget="6.5MiB", seed=2) as s:
        for x, y in s:
            assert np.array_equal(y, _ids(x) * 10 // 500)


def test_reader_error_reaches_the_consumer(tmp_path):
    path = make_store(tmp_path / "t.h5", rows=3000)
    s = h5stream.open(path, batch_size=32, memory_budget="6.2MiB", seed=0)
    with open(path, "r+b") as f:  # cut the file: later chunks are gone
        f.truncate(200_000)
    with pytest.raises(ReaderError, match="reading failed") as info:
        for _ in range(3):
            for _batch in s:
                pass
    assert info.value.__cause__ is not None
    s.close()


def test_close_is_idempotent_and_gc_stops_the_thread(store):
    s = h5stream.open(store, batch_size=32, memory_budget="6.5MiB")
    next(iter(s))
    s.close()
    s.close()
    assert reader_threads() == []
    with pytest.raises(h5stream.StreamClosedError):
        iter(s)
    s = h5stream.open(store, batch_size=32, memory_budget="6.5MiB")
    next(iter(s))
    assert reader_threads()
    del s
    collect(lambda: reader_threads() == [])
    assert reader_threads() == []


def test_bad_inputs(tmp_path, store):
    with pytest.raises(StoreNotFoundError):
        h5stream.open(tmp_path / "missing.h5")
    text = tmp_path / "text.h5"
    text.write_text("hello")
    with pytest.raises(StoreFormatError, match="not an HDF5 file"):
        h5stream.open(text)
    with h5py.File(tmp_path / "noimg.h5", "w") as f:
        f["labels"] = np.zeros(3)
    with pytest.raises(StoreFormatError, match="/images"):
        h5stream.open(tmp_path / "noimg.h5")
    with h5py.File(tmp_path / "short.h5", "w") as f:
        f["images"] = np.zeros((5, 4, 4, 3), np.uint8)
        f["labels"] = np.zeros(3, np.int64)
    with pytest.raises(StoreFormatError, match="every image needs a label"):
        h5stream.open(tmp_path / "short.h5")
    with h5py.File(tmp_path / "empty.h5", "w") as f:
        f["images"] = np.zeros((0, 4, 4, 3), np.uint8)
        f["labels"] = np.zeros(0, np.int64)
    with pytest.raises(ConfigError, match="no committed rows"):
        h5stream.open(tmp_path / "empty.h5")
    for kwargs, match in [
        (dict(batch_size=0), "batch_size"),
        (dict(shard=(3, 2)), "shard"),
        (dict(memory_budget="lots"), "cannot parse memory budget"),
        (dict(workers=-1), "workers"),
        (dict(batch_size=5000, drop_remainder=True, memory_budget="1GiB"), "no full batch"),
    ]:
        with pytest.raises(ConfigError, match=match):
            h5stream.open(store, **kwargs)
    # Every error is also the builtin it resembles.
    assert issubclass(StoreNotFoundError, FileNotFoundError) and issubclass(ConfigError, ValueError)


def test_read_ahead_advice_skips_cached_runs_and_asks_for_evicted_ones(tmp_path):
    from h5stream.measure import cached_fraction, evict_from_page_cache

    path = tmp_path / "advice.h5"  # 12 MiB: more than the kernel reads ahead when the file is opened
    images = np.random.default_rng(0).integers(0, 255, (4096, 32, 32, 3), dtype=np.uint8)
    write_arrays(path, images, np.zeros(4096, np.int64), block_rows=64)
    with pinned_in_page_cache(path), h5stream.open(path, batch_size=32, memory_budget="8MiB", seed=1) as s:
        rows_warm = sum(len(x) for x, _ in s)  # every page cached
        assert s.stats()["advised_bytes"] == 0  # nothing to fetch: no WILLNEED walk over cached pages
    assert evict_from_page_cache(path) and cached_fraction(path) < 0.5
    with h5stream.open(path, batch_size=32, memory_budget="8MiB", seed=1) as s:
        rows_cold = sum(len(x) for x, _ in s)
        assert s.stats()["advised_bytes"] > 0  # the evicted runs were asked for ahead
    assert rows_warm == rows_cold == 4096
