"""The default memory budget runs any worker count with the same order; a budget too small names its fixes."""

from __future__ import annotations

import re

import numpy as np
import pytest

import h5stream
from h5stream.errors import BudgetError
from h5stream.streaming.budget import DEFAULT_BUDGET_BYTES
from h5stream.streaming.planning import plan_stream
from h5stream.read.plan import parse_bytes
from h5stream.store.meta import read_meta
from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")

ROWS = 300


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(2)
    path = tmp_path_factory.mktemp("budget") / "b.h5"
    write_arrays(path, rng.integers(0, 255, (ROWS, 24, 24, 3), dtype=np.uint8), np.arange(ROWS) % 3, block_rows=16,
                 storage_order="shuffled")
    return str(path)


def test_default_budget_gives_workers_their_share_on_top_and_keeps_the_order(store):
    aug = h5stream.Augment(rotation_range=20, horizontal_flip=True)
    with h5stream.open(store, batch_size=32, augment=aug, seed=4) as inline:
        expected = [(x.copy(), y) for x, y in inline]
        fill = inline.plan.rows_per_fill
        assert inline.plan.default_budget
        assert inline.plan.budget_bytes == DEFAULT_BUDGET_BYTES + inline.plan.augment_bytes + inline.plan.verify_bytes
    with h5stream.open(store, batch_size=32, augment=aug, seed=4, workers=2) as pooled:
        plan = pooled.plan
        assert plan.default_budget and plan.pool_bytes > 0
        assert plan.budget_bytes == DEFAULT_BUDGET_BYTES + plan.augment_bytes + plan.verify_bytes
        assert plan.total_bytes <= plan.budget_bytes and plan.rows_per_fill == fill
        assert "default: 256.0 MiB for reading + " in plan.describe() and "for 2 workers" in plan.describe()
        got = [(x.copy(), y) for x, y in pooled]
    assert len(got) == len(expected)
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(got, expected))


def _fixes(message: str) -> dict:
    found = {"budget": re.search(r"raise memory_budget to '(\d+MiB)' or more", message),
             "workers": re.search(r"use workers=(\d+)", message),
             "batch_size": re.search(r"lower batch_size to (\d+)", message)}
    return {k: m.group(1) for k, m in found.items() if m}


def test_a_budget_too_small_for_the_workers_names_a_budget_and_a_worker_count_that_fit(store):
    meta = read_meta(store)
    aug = h5stream.Augment(horizontal_flip=True)

    def minimum(workers, batch_size=32):
        return plan_stream(meta, None, batch_size, augment=aug, workers=workers).min_budget_bytes

    assert minimum(0) < minimum(1) < minimum(2)
    between = (minimum(1) + minimum(2)) // 2
    with pytest.raises(BudgetError) as info:
        h5stream.open(store, batch_size=32, memory_budget=between, augment=aug, workers=2)  # before any process
    fixes = _fixes(str(info.value))
    assert fixes["workers"] == "1"
    assert plan_stream(meta, parse_bytes(fixes["budget"]), 32, augment=aug, workers=2).total_bytes <= \
        parse_bytes(fixes["budget"])
    assert plan_stream(meta, between, 32, augment=aug, workers=1).total_bytes <= between
    with pytest.raises(BudgetError, match=r"use workers=0 \(augment in the training process\)"):
        plan_stream(meta, (minimum(0) + minimum(1)) // 2, 32, augment=aug, workers=2)


def test_a_budget_too_small_for_the_batch_names_the_largest_batch_size_that_fits(store):
    meta = read_meta(store)
    budget = plan_stream(meta, None, 64).min_budget_bytes - 1
    with pytest.raises(BudgetError) as info:
        plan_stream(meta, budget, 64)
    fixes = _fixes(str(info.value))
    assert "workers" not in fixes
    batch = int(fixes["batch_size"])
    assert 1 <= batch < 64 and plan_stream(meta, budget, batch).total_bytes <= budget
    with pytest.raises(BudgetError):
        plan_stream(meta, budget, batch + 1)
    assert plan_stream(meta, parse_bytes(fixes["budget"]), 64).total_bytes <= parse_bytes(fixes["budget"])
