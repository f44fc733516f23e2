"""Memory budget -> plan arithmetic: every part counted, the total within the budget."""

import pytest

from h5stream.streaming.budget import (
    BATCH_INDEX_ROW_BYTES,
    CONSUMER_SETS,
    DEFAULT_BUDGET_BYTES,
    FILL_INDEX_ROW_BYTES,
    FILLS,
    HANDED_OUT,
    LENT_SLOTS,
    out_slots,
    plan_memory,
    reader_batches,
)
from h5stream.errors import BudgetError, ConfigError
from h5stream.read.plan import parse_bytes


@pytest.mark.parametrize("text,expected", [
    (1024, 1024), ("1024", 1024), ("512MB", 512 * 10**6), ("1.5GiB", int(1.5 * 2**30)), ("256 MiB", 256 << 20),
    ("2k", 2000), ("3KiB", 3072), ("1e3", 1000), ("1 TB", 10**12),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "12 parsecs", "-5MB", 0, -1, None, True, "1.2.3GB", "1e400", "1e300TB",
                                 float("inf"), float("nan"), -float("inf")])
def test_parse_bytes_rejects(bad):
    with pytest.raises(ConfigError):
        parse_bytes(bad)


ROW = 128 * 128 * 3
KW = dict(rows=100_000, row_bytes=ROW, label_row_bytes=8, block_rows=64)


@pytest.mark.parametrize("budget_mib", [16, 64, 256, 1024])
@pytest.mark.parametrize("batch", [1, 32, 256])
@pytest.mark.parametrize("workers,augment", [(0, False), (0, True), (2, True)])
def test_plan_stays_within_budget(budget_mib, batch, workers, augment):
    budget = budget_mib << 20
    kw = dict(KW, batch_size=batch, workers=workers, augment=augment, out_row_bytes=4 * ROW if augment else None)
    try:
        plan = plan_memory(budget, **kw)
    except BudgetError:
        assert budget < plan_memory(None, **kw).min_budget_bytes
        return
    assert plan.total_bytes <= budget
    assert plan.rows_per_fill % 64 == 0 and plan.rows_per_fill >= max(64, batch)
    assert 2 <= plan.queue_depth <= 16


def test_the_counts_the_feed_allocates_are_the_ones_the_bytes_are_counted_for():
    inline = plan_memory(256 << 20, **KW, batch_size=32, augment=True, out_row_bytes=4 * ROW)
    assert inline.reader_batches == reader_batches(inline.rows_per_fill, 32, inline.queue_depth)
    assert inline.reader_batches == FILLS * (-(-inline.rows_per_fill // 32) + 1) + inline.queue_depth + HANDED_OUT
    assert inline.batches_bytes == inline.reader_batches * 32 * (ROW + 8 + BATCH_INDEX_ROW_BYTES)
    assert inline.output_bytes == CONSUMER_SETS * 32 * 4 * ROW and inline.consumer_sets == CONSUMER_SETS
    assert (inline.input_slots, inline.out_slots, inline.lent_slots, inline.pool_bytes) == (0, 0, 0, 0)
    assert inline.transform_bytes > 0
    pooled = plan_memory(512 << 20, **KW, batch_size=32, workers=3, augment=True, out_row_bytes=4 * ROW)
    assert pooled.out_slots == out_slots(3) == 2 * 3 + 2 + LENT_SLOTS and pooled.lent_slots == LENT_SLOTS
    assert pooled.input_slots == pooled.reader_batches + pooled.out_slots
    assert pooled.transform_bytes == 0 and pooled.pool_bytes > pooled.out_slots * 32 * (ROW + 4 * ROW)
    plain = plan_memory(256 << 20, **KW, batch_size=32)
    assert (plain.consumer_sets, plain.output_bytes, plain.transform_bytes) == (0, 0, 0)
    assert sum(plain.allocations().values()) == plain.total_bytes


def test_small_file_is_one_fill():
    plan = plan_memory(1 << 30, rows=1000, row_bytes=ROW, label_row_bytes=8, block_rows=64, batch_size=32)
    assert plan.rows_per_fill == 1024 and plan.total_bytes <= 1 << 30


def test_budget_too_small_names_the_minimum():
    kw = dict(rows=10_000, row_bytes=ROW, label_row_bytes=8, block_rows=64, batch_size=32)
    with pytest.raises(BudgetError, match=r"minimum .*MiB \(\d+ bytes\)") as info:
        plan_memory(1 << 20, **kw)
    minimum = int(str(info.value).split("(")[1].split(" ")[0])
    plan = plan_memory(minimum, **kw)
    assert plan.total_bytes <= minimum
    with pytest.raises(BudgetError):
        plan_memory(minimum - 1, **kw)
    suggested = str(info.value).split("raise memory_budget to '")[1].split("'")[0]
    assert 0 <= parse_bytes(suggested) - minimum < 1 << 20


def test_the_fill_is_the_largest_that_fits():
    plan = plan_memory(64 << 20, **KW, batch_size=32)
    batch_bytes = 32 * (ROW + 8 + BATCH_INDEX_ROW_BYTES)
    more_batches = reader_batches(plan.rows_per_fill + 64, 32, plan.queue_depth) - plan.reader_batches
    one_block_more = more_batches * batch_bytes + FILLS * 64 * (8 + FILL_INDEX_ROW_BYTES)
    assert plan.total_bytes <= plan.budget_bytes < plan.total_bytes + one_block_more


def test_no_budget_is_the_default_for_reading_plus_the_augmentations_share():
    kw = dict(KW, batch_size=32, augment=True, out_row_bytes=ROW)
    inline = plan_memory(None, **kw)
    pooled = plan_memory(None, **kw, workers=2)
    plain = plan_memory(None, **dict(KW, batch_size=32))
    assert plain.default_budget and plain.budget_bytes == DEFAULT_BUDGET_BYTES
    for plan in (inline, pooled):
        assert plan.default_budget and plan.budget_bytes == DEFAULT_BUDGET_BYTES + plan.augment_bytes
        assert plan.total_bytes <= plan.budget_bytes
    assert (pooled.rows_per_fill, pooled.queue_depth) == (inline.rows_per_fill, inline.queue_depth)
    assert "default: 256.0 MiB for reading + " in pooled.describe() and "for 2 workers" in pooled.describe()
    # A batch that needs more than the default gets its minimum, not an error.
    big = plan_memory(None, rows=1000, row_bytes=4 << 20, label_row_bytes=8, block_rows=1, batch_size=64)
    assert big.budget_bytes == big.min_budget_bytes > DEFAULT_BUDGET_BYTES and big.total_bytes <= big.budget_bytes


def test_workers_and_float_output_take_their_share():
    base = plan_memory(256 << 20, **KW, batch_size=32)
    pooled = plan_memory(256 << 20, **KW, batch_size=32, out_row_bytes=4 * ROW, workers=2, augment=True)
    assert pooled.rows_per_fill < base.rows_per_fill
    assert pooled.total_bytes <= 256 << 20


def test_fixed_rows_per_fill_is_kept_whatever_the_workers():
    kw = dict(KW, batch_size=32, out_row_bytes=ROW, augment=True)
    pooled = plan_memory(256 << 20, **kw, workers=2)
    inline = plan_memory(256 << 20, **kw)
    assert pooled.rows_per_fill < inline.rows_per_fill  # by default the workers' share shrinks the fill
    for workers in (0, 2):
        plan = plan_memory(256 << 20, **kw, workers=workers, rows_per_fill=pooled.rows_per_fill + 10)  # whole blocks
        assert plan.rows_per_fill == pooled.rows_per_fill
        assert plan.total_bytes <= 256 << 20


def test_fixed_rows_per_fill_that_does_not_fit_names_the_limit():
    kw = dict(KW, batch_size=32, out_row_bytes=ROW, augment=True)
    inline = plan_memory(256 << 20, **kw)
    with pytest.raises(BudgetError, match=r"holds at most \d+ rows per fill") as info:
        plan_memory(256 << 20, **kw, workers=2, rows_per_fill=inline.rows_per_fill)
    most = int(str(info.value).split("holds at most ")[1].split(" ")[0])
    plan = plan_memory(256 << 20, **kw, workers=2, rows_per_fill=most)
    assert plan.rows_per_fill == most and plan.total_bytes <= 256 << 20
    with pytest.raises(BudgetError):
        plan_memory(256 << 20, **kw, workers=2, rows_per_fill=most + 64)
    with pytest.raises(ConfigError, match="rows_per_fill"):
        plan_memory(256 << 20, **KW, batch_size=32, rows_per_fill=0)


def test_the_default_unit_is_the_smaller_share_of_the_fill_and_the_epoch_between_1_and_4_mib():
    """1/32 of the fill (the mix inside a batch) and 1/1152 of the epoch (two epochs' orders unrelated: a random
    order of n units has Kendall tau spreading by about 2 / (3 sqrt(n)), within 0.02 from 1,112 units on)."""
    import math

    from h5stream.read.plan import UNITS_PER_EPOCH, default_unit_bytes

    mib = 1 << 20
    assert 2 / (3 * math.sqrt(UNITS_PER_EPOCH)) <= 0.02
    assert default_unit_bytes(256 * mib) == 4 * mib  # no epoch given: the fill alone
    assert default_unit_bytes(256 * mib, 10 << 30) == 4 * mib  # a large store: the largest unit
    assert default_unit_bytes(64 * mib, 10 << 30) == 2 * mib  # a small fill: its 1/32
    assert default_unit_bytes(256 * mib, 3 << 30) == (3 << 30) // UNITS_PER_EPOCH  # a few GB: the epoch's share
    assert default_unit_bytes(256 * mib, 1 << 30) == mib  # 1 GB: the smallest unit, as before
    assert default_unit_bytes(mib, 1 << 40) == mib
