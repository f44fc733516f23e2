"""Small rows read a piece of a run at a time and placed in their batches by numpy: every row lands exactly where
reading it in place puts it, the batches of a fill lie in a few mappings, and streams give the same batches
either way (with checks, workers and a feeder's shared slots)."""

from __future__ import annotations

import numpy as np
import pytest

import h5stream
from h5stream.memory.lend import ArrayArena
from h5stream.read import rows as rows_module
from h5stream.read.fill import Batch, Pending
from h5stream.read.scatter import place, placement
from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")

ROW = (2, 3, 3)
ROW_BYTES = int(np.prod(ROW))


def _pending(images) -> Pending:
    n = 0 if images is None else len(images)
    return Pending(Batch(0, 0, images, np.empty(n, np.int64), np.empty(n, np.int64)), n)


def test_every_row_lands_where_reading_it_in_place_puts_it():
    rng = np.random.default_rng(4)
    batch_rows, n_batches, first = 8, 40, 3
    arena = ArrayArena(batch_rows, ROW, np.uint8, max_sets=30)  # 30 in the arena's mapping, the rest one-off
    targets = {first + j: _pending(arena(batch_rows if j < n_batches - 1 else 5)) for j in range(n_batches)}
    targets[first + 7] = _pending(None)  # a batch without images: its rows are read by its receiver
    # A fill of buffer positions: each placed batch row once, in a random order, and some rows read past (-1)
    slots = [(b, k) for b, t in targets.items() if t.batch.images is not None for k in range(len(t.batch.images))]
    slots += [(first + 7, k) for k in range(batch_rows)] + [(-1, 0)] * 25
    order = rng.permutation(len(slots))
    batch = np.array([slots[i][0] for i in order], np.int64)
    offset = np.array([slots[i][1] for i in order], np.int64)
    source = rng.integers(0, 256, (len(batch), *ROW), dtype=np.uint8)
    where = placement(batch, offset, targets, first, ROW_BYTES)
    assert where is not None and len(where.buffers) == 1 + 10  # one mapping, and each one-off batch its own
    rows = np.ascontiguousarray(source).reshape(len(source), -1).view(np.dtype((np.void, ROW_BYTES)))[:, 0]
    cut = np.sort(rng.choice(np.arange(1, len(batch)), 12, replace=False))
    for a, b in zip([0, *cut], [*cut, len(batch)]):  # pieces of any length
        place(where, int(a), rows[a:b])
    for p, (b, k) in enumerate(zip(batch.tolist(), offset.tolist())):
        if b >= 0 and targets[b].batch.images is not None:
            np.testing.assert_array_equal(targets[b].batch.images[k], source[p])


def test_the_batches_of_a_fill_lie_in_one_mapping():
    arena = ArrayArena(256, (4, 4, 3), np.uint8, max_sets=4000)
    targets = {j: _pending(arena(256)) for j in range(4000)}
    batch = np.repeat(np.arange(4000), 256)
    where = placement(batch, np.tile(np.arange(256), 4000), targets, 0, 48)
    assert where is not None and len(where.buffers) == 1  # one numpy assignment a piece, not one a batch


def test_rows_that_are_not_whole_rows_of_a_writable_buffer_are_read_in_place():
    images = np.zeros((8, *ROW), np.uint8)
    images.flags.writeable = False
    assert placement(np.zeros(8, np.int64), np.arange(8), {0: _pending(images)}, 0, ROW_BYTES) is None


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    rng = np.random.default_rng(2)
    path = tmp_path_factory.mktemp("scatter") / "s.h5"
    write_arrays(path, rng.integers(0, 256, (3000, 4, 4, 3), dtype=np.uint8), np.arange(3000) % 7, block_rows=64)
    return str(path)


@pytest.mark.parametrize("kw", [dict(verify_reads=False), dict(verify_reads="once"), dict(verify_reads=True),
                                dict(workers=2, verify_reads="once"), dict(shard=(1, 3), memory_budget="8MiB")])
def test_a_stream_gives_the_same_batches_as_reading_each_row_in_place(small_store, monkeypatch, kw):
    def epochs():
        with h5stream.open(small_store, batch_size=32, seed=9, read_unit="1KiB", **kw) as s:
            return [(x.copy(), y.copy()) for _ in range(2) for x, y in s]

    placed = epochs()
    monkeypatch.setattr(rows_module, "SMALL_ROW_BYTES", 0)  # every row read in place, as before
    in_place = epochs()
    assert len(placed) == len(in_place) > 0
    for (xa, ya), (xb, yb) in zip(placed, in_place):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
