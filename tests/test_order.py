"""Properties of the pure epoch-order functions, over many (rows, blocks, buffer, shard, seed, epoch)."""

import itertools

import numpy as np
import pytest

from h5stream.errors import ConfigError
from h5stream.order import batch_sizes, epoch_layout, fill_schedule, shard_segments

CASES = [
    # rows, block_rows, rows_per_fill, batch_size
    (1, 1, 1, 1),
    (7, 4, 4, 3),
    (100, 8, 24, 10),
    (1000, 64, 256, 32),
    (1037, 16, 160, 32),
    (513, 32, 512, 7),
]


@pytest.mark.parametrize("rows,block,fill,bs", CASES)
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_row_exactly_once_per_epoch(rows, block, fill, bs, shuffle):
    for seed, epoch in itertools.product([0, 1, 12345], [0, 1, 5]):
        layout = epoch_layout(rows, block, fill, bs, seed, epoch, shuffle=shuffle)
        order = layout.order()
        assert np.array_equal(np.sort(order), np.arange(rows))
        assert layout.batch_sizes.sum() == rows
        assert all(r <= fill for r in layout.fill_rows)
        if not shuffle:
            assert np.array_equal(order, np.arange(rows))


@pytest.mark.parametrize("rows,block,fill,bs", CASES[2:])
@pytest.mark.parametrize("count", [2, 3, 4])
@pytest.mark.parametrize("drop", [False, True])
def test_shards_disjoint_cover_and_same_batch_count(rows, block, fill, bs, count, drop):
    for seed, epoch in itertools.product([0, 7], [0, 3]):
        layouts = [epoch_layout(rows, block, fill, bs, seed, epoch, shard=(i, count), drop_remainder=drop)
                   for i in range(count)]
        orders = [lay.order() for lay in layouts]
        union = np.concatenate(orders)
        assert len(np.unique(union)) == len(union), "shards overlap"
        if not drop:
            assert np.array_equal(np.sort(union), np.arange(rows)), "shards do not cover every row"
        else:
            assert all((lay.batch_sizes == bs).all() for lay in layouts)
            assert len(union) == (rows // (count * bs)) * count * bs
        assert len({lay.n_batches for lay in layouts}) == 1
        for lay in layouts:
            assert (lay.batch_sizes >= 1).all() and (lay.batch_sizes <= bs).all()


def test_same_seed_same_order_and_every_epoch_different():
    a = epoch_layout(5000, 64, 640, 32, seed=3, epoch=0).order()
    b = epoch_layout(5000, 64, 640, 32, seed=3, epoch=0).order()
    c = epoch_layout(5000, 64, 640, 32, seed=3, epoch=1).order()
    d = epoch_layout(5000, 64, 640, 32, seed=4, epoch=0).order()
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert not np.array_equal(a, d)


def test_fills_are_stratified_over_file_position():
    # 100 blocks, 10 per fill: each fill takes one block from each tenth of the file.
    fills = fill_schedule(100, 10, seed=0, epoch=0)
    assert len(fills) == 10
    for f in fills:
        assert sorted(f // 10) == list(range(10))
    flat = np.sort(np.concatenate(fills))
    assert np.array_equal(flat, np.arange(100))


def test_stratified_fills_mix_a_class_sorted_file():
    # 10 classes stored sorted; every fill of a buffer of ~1/8 of the file holds every class in proportion.
    rows, block = 6400, 32
    labels = np.arange(rows) * 10 // rows
    layout = epoch_layout(rows, block, rows // 8, 32, seed=0, epoch=0)
    for f in range(len(layout.fills)):
        counts = np.bincount(labels[layout.fill_row_ids(f)], minlength=10)
        assert counts.min() > 0.6 * counts.mean()


def test_shard_segments_lie_within_blocks():
    seg = shard_segments(1037, 16, seed=1, epoch=2, shard=(1, 3))
    assert (seg[:, 1] > seg[:, 0]).all()
    assert ((seg[:, 0] // 16) == ((seg[:, 1] - 1) // 16)).all()
    assert (np.diff(seg[:, 0]) > 0).all()


def test_batch_sizes_rules():
    assert list(batch_sizes(100, 100, 32)) == [32, 32, 32, 4]
    assert list(batch_sizes(100, 100, 32, drop_remainder=True)) == [32, 32, 32]
    # 65 rows over 2 shards of batch 32: both shards give 2 batches.
    assert list(batch_sizes(32, 65, 32, count=2)) == [31, 1]
    assert list(batch_sizes(33, 65, 32, count=2)) == [32, 1]
    with pytest.raises(ConfigError, match="drop_remainder"):
        batch_sizes(0, 1, 4, count=2)
    with pytest.raises(ConfigError, match="batch_size"):
        batch_sizes(10, 10, 0)


@pytest.mark.parametrize("shard", [(2, 2), (-1, 2), (0, 0), "ab", (1,)])
def test_bad_shard(shard):
    with pytest.raises(ConfigError, match="shard"):
        epoch_layout(100, 8, 16, 4, 0, 0, shard=shard)


@pytest.mark.parametrize("rows,block,unit", [(1000, 64, 16), (1037, 16, 4), (513, 32, 1), (100, 8, 8)])
@pytest.mark.parametrize("count", [1, 3])
def test_units_split_blocks_and_keep_every_property(rows, block, unit, count):
    layouts = [epoch_layout(rows, block, 4 * block, 10, seed=2, epoch=1, shard=(i, count), unit_rows=unit)
               for i in range(count)]
    union = np.concatenate([lay.order() for lay in layouts])
    assert np.array_equal(np.sort(union), np.arange(rows))
    for lay in layouts:
        seg = lay.segments
        assert ((seg[:, 0] // unit) == ((seg[:, 1] - 1) // unit)).all()
        assert all(r <= 4 * block for r in lay.fill_rows)


def test_units_must_divide_the_block():
    with pytest.raises(ConfigError, match="divide"):
        epoch_layout(100, 8, 16, 4, 0, 0, unit_rows=3)
