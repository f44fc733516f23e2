"""Memory budget -> plan arithmetic."""

import pytest

from h5stream.errors import BudgetError, ConfigError
from h5stream.read.plan import DEFAULT_BUDGET_BYTES, parse_bytes, plan_read


@pytest.mark.parametrize("text,expected", [
    (1024, 1024), ("1024", 1024), ("512MB", 512 * 10**6), ("1.5GiB", int(1.5 * 2**30)), ("256 MiB", 256 << 20),
    ("2k", 2000), ("3KiB", 3072), ("1e3", 1000), ("1 TB", 10**12),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "12 parsecs", "-5MB", 0, -1, None, True, "1.2.3GB"])
def test_parse_bytes_rejects(bad):
    with pytest.raises(ConfigError):
        parse_bytes(bad)


ROW = 128 * 128 * 3


@pytest.mark.parametrize("budget_mib", [16, 64, 256, 1024])
@pytest.mark.parametrize("batch", [1, 32, 256])
def test_plan_stays_within_budget(budget_mib, batch):
    budget = budget_mib << 20
    try:
        plan = plan_read(budget, rows=100_000, row_bytes=ROW, label_row_bytes=8, block_rows=64, batch_size=batch)
    except BudgetError:
        roomy = plan_read(1 << 40, rows=100_000, row_bytes=ROW, label_row_bytes=8, block_rows=64, batch_size=batch)
        assert budget < roomy.min_budget_bytes
        return
    assert plan.total_bytes <= budget
    assert plan.rows_per_fill % 64 == 0 and plan.rows_per_fill >= max(64, batch)
    assert 2 <= plan.queue_depth <= 16
    assert plan.n_buffers == 2


def test_small_file_is_one_fill():
    plan = plan_read(1 << 30, rows=1000, row_bytes=ROW, label_row_bytes=8, block_rows=64, batch_size=32)
    assert plan.rows_per_fill >= 1000 and plan.buffer_bytes <= 2 * 1024 * (ROW + 24)
    assert plan.total_bytes <= 1 << 30


def test_budget_too_small_names_the_minimum():
    with pytest.raises(BudgetError, match=r"minimum .*MiB \(\d+ bytes\)") as info:
        plan_read(1 << 20, rows=10_000, row_bytes=ROW, label_row_bytes=8, block_rows=64, batch_size=32)
    minimum = int(str(info.value).split("(")[1].split(" ")[0])
    plan = plan_read(minimum, rows=10_000, row_bytes=ROW, label_row_bytes=8, block_rows=64, batch_size=32)
    assert plan.total_bytes <= minimum
    suggested = str(info.value).split("raise memory_budget to '")[1].split("'")[0]
    assert 0 <= parse_bytes(suggested) - minimum < 1 << 20


def test_no_budget_is_the_default_for_reading_plus_the_workers_share():
    kw = dict(rows=100_000, row_bytes=ROW, label_row_bytes=8, block_rows=64, batch_size=32, out_row_bytes=ROW)
    inline = plan_read(None, **kw)
    pooled = plan_read(None, **kw, n_out_slots=8, workers=2, worker_bytes=40 << 20)
    assert inline.default_budget and inline.budget_bytes == DEFAULT_BUDGET_BYTES
    assert pooled.budget_bytes == DEFAULT_BUDGET_BYTES + pooled.pool_bytes and pooled.total_bytes <= pooled.budget_bytes
    assert (pooled.rows_per_fill, pooled.queue_depth) == (inline.rows_per_fill, inline.queue_depth)
    assert "default: 256.0 MiB for reading + " in pooled.describe()
    # A batch that needs more than the default gets its minimum, not an error.
    big = plan_read(None, rows=1000, row_bytes=4 << 20, label_row_bytes=8, block_rows=1, batch_size=64)
    assert big.budget_bytes == big.min_budget_bytes > DEFAULT_BUDGET_BYTES and big.total_bytes <= big.budget_bytes


def test_workers_and_float_output_take_their_share():
    base = plan_read(256 << 20, rows=100_000, row_bytes=ROW, label_row_bytes=8, block_rows=64, batch_size=32)
    pooled = plan_read(256 << 20, rows=100_000, row_bytes=ROW, label_row_bytes=8, block_rows=64, batch_size=32,
                       out_row_bytes=4 * ROW, n_out_slots=8, workers=2, worker_bytes=40 << 20)
    assert pooled.pool_bytes == 2 * (40 << 20) + 8 * 32 * 4 * ROW
    assert pooled.rows_per_fill < base.rows_per_fill
    assert pooled.total_bytes <= 256 << 20


def test_fixed_rows_per_fill_is_kept_whatever_the_workers():
    kw = dict(rows=100_000, row_bytes=ROW, label_row_bytes=8, block_rows=64, batch_size=32)
    pooled = plan_read(256 << 20, **kw, out_row_bytes=ROW, n_out_slots=8, workers=2, worker_bytes=40 << 20)
    inline = plan_read(256 << 20, **kw)
    assert pooled.rows_per_fill < inline.rows_per_fill  # by default the workers' share shrinks the fill
    for workers in (0, 2):
        plan = plan_read(256 << 20, **kw, out_row_bytes=ROW, n_out_slots=8 if workers else 0, workers=workers,
                         worker_bytes=40 << 20, rows_per_fill=pooled.rows_per_fill + 10)  # rounded down to blocks
        assert plan.rows_per_fill == pooled.rows_per_fill
        assert plan.total_bytes <= 256 << 20


def test_fixed_rows_per_fill_that_does_not_fit_names_the_limit():
    kw = dict(rows=100_000, row_bytes=ROW, label_row_bytes=8, block_rows=64, batch_size=32)
    inline = plan_read(256 << 20, **kw)
    with pytest.raises(BudgetError, match=r"holds at most \d+ rows per fill") as info:
        plan_read(256 << 20, **kw, out_row_bytes=ROW, n_out_slots=8, workers=2, worker_bytes=40 << 20,
                  rows_per_fill=inline.rows_per_fill)
    most = int(str(info.value).split("holds at most ")[1].split(" ")[0])
    plan = plan_read(256 << 20, **kw, out_row_bytes=ROW, n_out_slots=8, workers=2, worker_bytes=40 << 20,
                     rows_per_fill=most)
    assert plan.rows_per_fill == most and plan.total_bytes <= 256 << 20
    with pytest.raises(ConfigError, match="rows_per_fill"):
        plan_read(256 << 20, **kw, rows_per_fill=0)
