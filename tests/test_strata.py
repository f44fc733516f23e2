"""The one-level order's fills chained from epoch to epoch (h5stream/order/strata.py): consecutive epochs decorrelated
on every seed, with every property of the per-epoch draw kept."""

import numpy as np
import pytest

from h5stream.order import epoch_layout, fill_schedule
from h5stream.order import strata
from h5stream.order.quality import kendall_tau
from h5stream.order.strata import chained_fills, label_cross, stratum_offsets

# (rows, block_rows, rows_per_fill, unit_rows): 1,250 units over 10 fills (more strata than fills), over 125 fills
# (fewer strata than fills), and a store whose last stratum is cut short.  On each of them epochs drawn
# independently put |tau| between consecutive epochs above 0.01 on several of the seeds below.
STORES = [(20000, 64, 2048, 16), (20000, 16, 160, 16), (19003, 32, 1536, 8)]


def _tau(store, seed, a, b):
    rows, block, fill, unit = store
    orders = [epoch_layout(rows, block, fill, 32, seed, e, unit_rows=unit).order() for e in (a, b)]
    return kendall_tau(*orders)


@pytest.mark.parametrize("store", STORES)
def test_consecutive_epochs_are_decorrelated_on_every_seed(store):
    taus = [_tau(store, seed, e, e + 1) for seed in range(8) for e in (0, 1, 4)]
    assert max(abs(t) for t in taus) <= 0.01, taus


@pytest.mark.parametrize("store", STORES[:2])
def test_epochs_two_apart_stay_as_random_as_independent_orders(store):
    """Only consecutive epochs are balanced; epochs two apart must be no more alike than two independent orders
    (another seed's epoch), on average over seeds and epochs."""
    rows, block, fill, unit = store
    orders = {(seed, e): epoch_layout(rows, block, fill, 32, seed, e, unit_rows=unit).order()
              for seed in range(8) for e in range(5)}
    apart = np.mean([abs(kendall_tau(orders[s, e], orders[s, e + 2])) for s in range(8) for e in range(3)])
    independent = np.mean([abs(kendall_tau(orders[s, e], orders[(s + 1) % 8, e + 2])) for s in range(8)
                           for e in range(3)])
    assert apart < 1.5 * independent


@pytest.mark.parametrize("n,per_fill", [(0, 5), (1, 5), (7, 100), (100, 10), (1250, 125), (1250, 10), (1249, 32),
                                        (1000, 1)])
def test_every_unit_once_one_per_stratum_and_epoch_0_is_the_per_epoch_draw(n, per_fill):
    for seed in (0, 3):
        assert [f.tolist() for f in chained_fills(n, per_fill, seed, 0)] == \
            [f.tolist() for f in fill_schedule(n, per_fill, seed, 0)]
        for epoch in (1, 2, 9):
            fills = chained_fills(n, per_fill, seed, epoch)
            n_fills = len(fills)
            assert n_fills == max(1, -(-n // per_fill))
            assert np.array_equal(np.sort(np.concatenate(fills)), np.arange(n))
            for f in fills:
                assert len(f) <= per_fill and np.all(np.diff(f) > 0)
                assert len(np.unique(f // n_fills)) == len(f)  # at most one unit of each stratum


def test_a_fill_spreads_its_units_evenly_over_the_next_epochs_fills():
    n, per_fill = 1250, 125  # 10 fills of 125 units: each sends 12 or 13 to every fill of the next epoch
    for seed in range(4):
        for epoch in (0, 3):
            this, following = (chained_fills(n, per_fill, seed, e) for e in (epoch, epoch + 1))
            fill_of = np.empty(n, np.int64)
            for f, units in enumerate(following):
                fill_of[units] = f
            table = np.array([np.bincount(fill_of[units], minlength=len(following)) for units in this])
            assert table.min() >= 12 and table.max() <= 13, table


def test_the_offsets_do_not_depend_on_which_epochs_were_asked_for_before():
    """Offsets are kept to step from; resuming at an epoch must give what stepping epoch by epoch gives."""
    n, n_fills, seed = 1249, 10, 5
    strata._kept.clear()
    walked = [stratum_offsets(n, n_fills, seed, e).copy() for e in range(12)]
    for order in ([11, 3, 7, 0, 11], [5], [9, 2]):
        strata._kept.clear()
        for e in order:
            assert np.array_equal(stratum_offsets(n, n_fills, seed, e), walked[e])
    assert len({tuple(w) for w in walked}) == len(walked)


@pytest.mark.parametrize("n_fills", [1, 2, 7, 100, 1024, 3001])
def test_label_cross_is_exact_integers(n_fills):
    for epoch in (1, 4):
        before = 2 * strata.fill_order(n_fills, 2, epoch - 1) - (n_fills - 1)
        after = 2 * strata.fill_order(n_fills, 2, epoch) - (n_fills - 1)
        some = np.arange(0, n_fills, 3)
        kept = np.zeros(n_fills, np.int64)
        kept[some] = 1
        for labels, weights in ((None, before), (some, before * kept)):
            direct = np.array([int((weights * np.roll(after, -d)).sum()) for d in range(min(n_fills, 64))])
            assert np.array_equal(label_cross(n_fills, 2, epoch, labels)[:len(direct)], direct)


def test_the_shuffle_report_of_a_class_sorted_store_gives_tau_within_0_02_on_every_seed(tmp_path):
    """``h5stream info FILE --shuffle-report`` on a real class-sorted store of 1,250 units of 16 rows in fills of
    2,048 rows: epochs drawn independently put |tau| at 0.026, 0.057 and 0.026 on seeds 1 to 3; the batch label
    TVD stays that of a random permutation."""
    from h5stream.commands._common import file_shuffle_report
    from h5stream.store.writer import write_arrays

    path = str(tmp_path / "sorted.h5")
    rows = 20000
    write_arrays(path, np.zeros((rows, 4, 4, 3), np.uint8), (np.arange(rows) * 10 // rows).astype(np.int64),
                 block_rows=64, storage_order="sorted")
    for seed in range(4):
        r = file_shuffle_report(path, memory_budget="64MiB", batch_size=32, seed=seed, rows_per_fill=2048,
                                read_unit=16 * 48)
        assert abs(r["epoch_order_tau"]) <= 0.02 and r["tvd_ratio_to_random"] < 1.05, (seed, r)
