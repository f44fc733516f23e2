"""Keras conventions on real stores: validation_split / subset, label_mode, class_names."""

from __future__ import annotations

import numpy as np
import pytest

import h5stream
from h5stream.errors import ConfigError
from h5stream.store.writer import write_arrays

ROWS, CLASSES = 1000, 4


def _ids(x):
    """Row id encoded in the first two pixels by ``make_store``."""
    return x[:, 0, 0, 0].astype(np.int64) + 256 * x[:, 0, 0, 1].astype(np.int64)


def make_store(path, rows=ROWS, classes=CLASSES, block_rows=32, storage_order="shuffled", labels=None):
    images = np.random.default_rng(0).integers(0, 255, (rows, 6, 6, 3), dtype=np.uint8)
    images[:, 0, 0, 0] = np.arange(rows) % 256
    images[:, 0, 0, 1] = np.arange(rows) // 256
    if labels is None:
        labels = np.arange(rows) % classes
    write_arrays(path, images, labels, block_rows=block_rows, storage_order=storage_order,
                 class_names=[f"c{i}" for i in range(classes)] if labels.dtype.kind == "i" else None)
    return str(path)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("subsets") / "s.h5")


def epoch_ids(stream):
    return np.concatenate([_ids(x) for x, _ in stream])


@pytest.mark.parametrize("split", [0.1, 0.25, 0.5, 0.999])
def test_split_is_disjoint_covers_every_row_and_is_the_same_for_every_seed(store, split):
    n_val = int(split * ROWS)
    parts = {}
    for subset in ("training", "validation"):
        seen = []
        for seed in (0, 7):
            with h5stream.open(store, batch_size=32, validation_split=split, subset=subset, seed=seed) as s:
                ids = epoch_ids(s)
                assert s.rows == len(ids) and len(s) == -(-len(ids) // 32)
                assert np.array_equal(ids, s.epoch_order(0))
                seen.append(np.sort(ids))
        assert np.array_equal(seen[0], seen[1])  # the seed shuffles within a subset, never across it
        parts[subset] = seen[0]
    assert np.array_equal(parts["validation"], np.arange(ROWS - n_val, ROWS))  # Keras: the last int(f * n)
    assert np.array_equal(np.concatenate([parts["training"], parts["validation"]]), np.arange(ROWS))


def test_validation_is_unshuffled_and_unaugmented_unless_asked(store):
    with h5stream.open(store, batch_size=64, validation_split=0.2, subset="validation", seed=3) as val:
        assert not val.shuffle and val.augment is None
        ids = [epoch_ids(val) for _ in range(2)]
        assert np.array_equal(ids[0], np.arange(800, ROWS)) and np.array_equal(ids[1], ids[0])
        x, _ = next(iter(val))
        assert x.dtype == np.uint8
    with h5stream.open(store, batch_size=64, validation_split=0.2, subset="training", seed=3) as train:
        assert train.shuffle
        first, second = epoch_ids(train), epoch_ids(train)
        assert not np.array_equal(first, np.sort(first)) and not np.array_equal(first, second)
    aug = h5stream.Augment(horizontal_flip=True)
    with h5stream.open(store, batch_size=64, validation_split=0.2, subset="validation", shuffle=True,
                       augment=aug) as asked:
        assert asked.shuffle and asked.augment is not None
        order = asked.epoch_order(0)  # the flip moves the pixels that carry the row id
        assert not np.array_equal(order, np.arange(800, ROWS)) and np.array_equal(np.sort(order), np.arange(800, ROWS))
        assert np.array_equal(np.concatenate([y for _, y in asked]), order % CLASSES)


@pytest.mark.parametrize("subset", ["training", "validation"])
@pytest.mark.parametrize("drop", [False, True])
def test_shards_partition_a_subset(store, subset, drop):
    bounds = {"training": (0, 900), "validation": (900, ROWS)}[subset]
    streams = [h5stream.open(store, batch_size=16, validation_split=0.1, subset=subset, shard=(i, 3), seed=4,
                             drop_remainder=drop) for i in range(3)]
    try:
        assert len({len(s) for s in streams}) == 1
        for _epoch in range(2):
            union = np.concatenate([epoch_ids(s) for s in streams])
            assert len(np.unique(union)) == len(union)
            assert union.min() >= bounds[0] and union.max() < bounds[1]
            if not drop:
                assert np.array_equal(np.sort(union), np.arange(*bounds))
    finally:
        for s in streams:
            s.close()


def test_resume_a_subset_equals_not_stopping_and_the_other_subset_is_refused(store):
    kw = dict(batch_size=48, validation_split=0.3, subset="training", seed=5, rows_per_fill=128)
    with h5stream.open(store, **kw) as s:
        assert s.plan.rows_per_fill < s.rows  # several fills: the resume point matters
        reference = [_ids(x) for _ in range(2) for x, _ in s]
    with h5stream.open(store, **kw) as s:
        it = iter(s)
        for _ in range(5):
            next(it)
        state = s.state()
    assert state["subset"] == "training" and (state["row_start"], state["row_stop"]) == (0, 700)
    with h5stream.open(store, resume=state, **kw) as resumed:
        rest = [_ids(x) for x, _ in resumed]
    assert all(np.array_equal(a, b) for a, b in zip(rest, reference[5:len(rest) + 5]))
    assert len(rest) == len(reference) // 2 - 5
    with h5stream.open(store, batch_size=48, validation_split=0.3, subset="validation") as val:
        with pytest.raises(ConfigError, match="subset='training'"):
            val.restore(state)
    with h5stream.open(store, batch_size=48, seed=5) as whole:
        with pytest.raises(ConfigError, match="subset"):
            whole.restore(state)
    with h5stream.open(store, batch_size=48, seed=5, validation_split=0.2, subset="training") as other_split:
        with pytest.raises(ConfigError, match="row_stop"):
            other_split.restore(state)


def test_split_errors_say_what_to_do(tmp_path, store):
    sorted_store = make_store(tmp_path / "sorted.h5", rows=200, storage_order="sorted")
    with pytest.raises(ConfigError, match="shuffled order.*--order shuffled"):
        h5stream.open(sorted_store, validation_split=0.2, subset="training")
    for kwargs, match in [
        (dict(validation_split=0.2), "subset='training' or subset='validation'"),
        (dict(subset="validation"), "needs validation_split"),
        (dict(validation_split=1.0, subset="training"), "between 0 and 1"),
        (dict(validation_split=0.2, subset="test"), "subset="),
        (dict(validation_split=0.0005, subset="validation"), "= 0 rows; raise validation_split to at least 1/1000"),
        (dict(label_mode="sparse"), "label_mode must be one of"),
        (dict(shuffle="yes"), "shuffle"),
    ]:
        with pytest.raises(ConfigError, match=match):
            h5stream.open(store, **kwargs)


def test_label_modes(tmp_path, store):
    with h5stream.open(store, batch_size=50, label_mode="categorical", seed=1) as s:
        assert s.class_names == ["c0", "c1", "c2", "c3"] and s.label_shape == (4,) and s.label_dtype == np.float32
        for x, y in s:
            assert y.dtype == np.float32 and y.shape == (len(x), 4)
            assert np.array_equal(y.sum(axis=1), np.ones(len(x))) and np.array_equal(y.argmax(axis=1), _ids(x) % 4)
    with h5stream.open(store, batch_size=50) as s:
        assert s.label_mode == "int" and s.label_shape == () and s.label_dtype == np.int64
        x, y = next(iter(s))
        assert y.dtype == np.int64 and np.array_equal(y, _ids(x) % 4)
    two = make_store(tmp_path / "two.h5", rows=100, classes=2)
    with h5stream.open(two, batch_size=30, label_mode="binary", validation_split=0.2, subset="validation") as s:
        ys = [(x, y) for x, y in s]
        assert all(y.dtype == np.float32 and y.shape == (len(x), 1) for x, y in ys)
        assert np.array_equal(np.concatenate([y[:, 0] for _, y in ys]), np.arange(80, 100) % 2)
    with pytest.raises(ConfigError, match="exactly 2 classes.*4"):
        h5stream.open(store, label_mode="binary")


def test_regression_store_yields_targets_as_stored_and_refuses_class_encodings(tmp_path):
    targets = np.linspace(-1, 1, 2 * 120, dtype=np.float32).reshape(120, 2)
    path = make_store(tmp_path / "reg.h5", rows=120, labels=targets)
    with h5stream.open(path, batch_size=40, validation_split=0.25, subset="validation") as s:
        assert s.class_names is None and s.label_shape == (2,) and s.label_dtype == np.float32
        ys = np.concatenate([y for _, y in s])
        assert np.array_equal(ys, targets[90:])
    for mode in ("categorical", "binary"):
        with pytest.raises(ConfigError, match="needs class labels.*label_mode='int'"):
            h5stream.open(path, label_mode=mode)
