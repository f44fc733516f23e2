"""The epoch order end to end on a real store, where the pure properties meet the stream: a subset (rows that do
not start at 0) saved by 3 ranks and finished by 2 with and without workers, every row once; a state taken after an
epoch's last batch; unshuffled shards in file order; the rows drop_remainder leaves out differ from epoch to
epoch."""

from __future__ import annotations

import numpy as np
import pytest

import h5stream
from conftest import stamped_rows, write_stamped_store

pytestmark = pytest.mark.usefixtures("no_leaks")


ROWS = 613  # prime: no multiple of a block, a batch or a shard count


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return write_stamped_store(tmp_path_factory.mktemp("order_audit") / "s.h5", ROWS, 5, seed=1)


KW = dict(batch_size=9, seed=3, rows_per_fill=64, validation_split=0.45, subset="validation", shuffle=True)


@pytest.mark.parametrize("drop", [False, True])
def test_a_subset_saved_by_three_ranks_is_finished_by_two_with_workers_every_row_once(store, drop):
    start = ROWS - int(0.45 * ROWS)
    served, states = [], []
    for i in range(3):
        with h5stream.open(store, shard=(i, 3), drop_remainder=drop, **KW) as s:
            assert s.config.rows == (start, ROWS)
            it = iter(s)
            served += [stamped_rows(next(it)[0]) for _ in range(4)]
            states.append(s.state())
    assert all(st["batch"] == 4 and st["shard_count"] == 3 for st in states)
    for j, workers in ((0, 2), (1, 0)):  # a rank's batches do not depend on its workers
        with h5stream.open(store, shard=(j, 2), drop_remainder=drop, workers=workers, resume=states[2 - j], **KW) as s:
            served += [stamped_rows(x) for x, _ in s]
            assert s.epoch == 1
    rows = np.concatenate(served)
    assert len(np.unique(rows)) == len(rows), "a row served twice"
    assert rows.min() >= start
    if drop:
        assert ROWS - start - len(rows) < 3 * KW["batch_size"]  # less than one global batch left out
    else:
        assert sorted(rows.tolist()) == list(range(start, ROWS))


def test_a_state_taken_after_an_epochs_last_batch_resumes_with_the_next_epoch(store):
    with h5stream.open(store, batch_size=50, seed=4) as s:
        for _ in s:
            pass
        state = s.state()
        following = [stamped_rows(x) for x, _ in s]
    assert (state["epoch"], state["batch"]) == (1, 0)
    with h5stream.open(store, batch_size=50, resume=state) as again:
        got = [stamped_rows(x) for x, _ in again]
        assert again.epoch == 2
    assert len(got) == len(following) and all(np.array_equal(a, b) for a, b in zip(got, following))


@pytest.mark.parametrize("count", [1, 3, 7])
def test_unshuffled_shards_are_contiguous_pieces_of_file_order(store, count):
    pieces = []
    for i in range(count):
        with h5stream.open(store, batch_size=10, shuffle=False, shard=(i, count)) as s:
            pieces.append(np.concatenate([stamped_rows(x) for x, _ in s]))
            assert np.array_equal(np.concatenate([stamped_rows(x) for x, _ in s]), pieces[-1])  # every epoch the same
    assert np.array_equal(np.concatenate(pieces), np.arange(ROWS))
    assert max(map(len, pieces)) - min(map(len, pieces)) <= 1


def test_the_rows_drop_remainder_leaves_out_differ_from_epoch_to_epoch(store):
    left_out = []
    with h5stream.open(store, batch_size=20, seed=6, drop_remainder=True, shard=(0, 1)) as s:
        for _ in range(4):
            rows = np.concatenate([stamped_rows(x) for x, _ in s])
            assert len(rows) == ROWS // 20 * 20 and len(np.unique(rows)) == len(rows)
            left_out.append(frozenset(range(ROWS)) - frozenset(rows.tolist()))
    assert len(set(left_out)) == 4  # not the same rows never seen, epoch after epoch


@pytest.mark.parametrize("class_units", [1, 3, 8, 13, 40])
def test_a_class_of_a_class_sorted_store_is_spread_over_the_fills_within_two_units(class_units):
    """Each stratum of ``n_fills`` consecutive units gives every fill one unit, so a class (a run of units) is in
    every fill to within two units of the same count (the strata it cuts at its ends); its units in one stratum
    are in as many fills, so a rare class (fewer units than two strata) is in at least half as many fills as it has
    units, and a class holding a whole stratum in every fill."""
    from h5stream.order import epoch_layout

    rows, block, fill = 8192, 16, 1024  # 512 units, 8 fills
    for first_unit in (0, 5, 250, 512 - class_units):
        lo, hi = first_unit * block, (first_unit + class_units) * block
        for seed, epoch in [(0, 0), (1, 1), (2, 5), (77, 2)]:
            lay = epoch_layout(rows, block, fill, 32, seed, epoch)
            units = np.array([int(((ids >= lo) & (ids < hi)).sum()) // block
                              for ids in map(lay.fill_row_ids, range(len(lay.fills)))])
            assert units.sum() == class_units and units.max() - units.min() <= 2, (first_unit, seed, epoch, units)
            reached = int((units > 0).sum())
            assert reached >= min(8, -(-class_units // 2)) and (reached == 8 or class_units < 2 * 8 - 1)
