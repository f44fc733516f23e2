"""Run geometry (h5stream.read.runs): pure functions checked as properties over many layouts."""

from __future__ import annotations

import numpy as np
import pytest

from h5stream.order.epoch import epoch_layout
from h5stream.read.runs import Run, aligned_span, chunk_pieces, inner_ends, placement, plan_runs, row_offsets

ROW_BYTES = 48


def _chunk_offsets(n_blocks: int, block_rows: int, rng: np.random.Generator) -> np.ndarray:
    """Chunks laid out in file order, some back to back and some with a gap (metadata between them)."""
    gaps = rng.choice([0, 0, 4096, 2952], n_blocks)
    sizes = np.full(n_blocks, block_rows * ROW_BYTES)
    return 2952 + np.cumsum(gaps) + np.concatenate([[0], np.cumsum(sizes)[:-1]])


@pytest.mark.parametrize("seed", range(12))
def test_runs_cover_the_fill_row_by_row_at_the_right_byte_offsets(seed):
    rng = np.random.default_rng(seed)
    rows, block_rows, unit = int(rng.integers(50, 400)), 16, 4
    offsets = _chunk_offsets(-(-rows // block_rows), block_rows, rng)
    layout = epoch_layout(rows, block_rows, 64, 8, seed, 0, unit_rows=unit)
    for fill in range(len(layout.fills)):
        segments = layout.fill_segments(fill)
        runs = plan_runs(segments, offsets, block_rows, ROW_BYTES)
        ids = layout.fill_row_ids(fill)
        # Every buffer position is covered once, in order, by the run that holds its stored row.
        assert [r.dest for r in runs] == list(np.cumsum([0] + [r.rows for r in runs[:-1]]))
        assert sum(r.rows for r in runs) == len(ids)
        for r in runs:
            assert list(ids[r.dest:r.dest + r.rows]) == list(range(r.src, r.src + r.rows))
        expected = offsets[ids // block_rows] + (ids % block_rows) * ROW_BYTES
        assert np.array_equal(row_offsets(runs, len(ids), ROW_BYTES), expected)
        # Maximal: two neighbouring runs never continue each other in the file.
        for a, b in zip(runs, runs[1:]):
            assert not (a.src + a.rows == b.src and a.offset + a.rows * ROW_BYTES == b.offset)


def test_runs_merge_across_back_to_back_chunks_and_split_at_gaps():
    offsets = np.array([1000, 1000 + 4 * ROW_BYTES, 5000])  # chunk 1 follows chunk 0; chunk 2 after a gap
    runs = plan_runs(np.array([[2, 4], [4, 8], [8, 10], [11, 12]]), offsets, 4, ROW_BYTES)
    assert runs == [Run(0, 2, 6, 1000 + 2 * ROW_BYTES), Run(6, 8, 2, 5000), Run(8, 11, 1, 5000 + 3 * ROW_BYTES)]


def test_runs_of_a_store_read_through_hdf5_have_no_offsets_and_merge_by_rows():
    runs = plan_runs(np.array([[0, 4], [4, 6], [9, 12]]), None, 4, ROW_BYTES)
    assert runs == [Run(0, 0, 6, None), Run(6, 9, 3, None)]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("first_batch", [0, 3])
def test_placement_puts_every_row_where_the_epoch_order_says(seed, first_batch):
    rows, batch_size = 203, 10
    layout = epoch_layout(rows, 16, 48, batch_size, seed, 1, unit_rows=4, drop_remainder=seed % 2 == 1)
    bounds = np.concatenate([[0], np.cumsum(layout.batch_sizes)])
    fill_bounds = np.concatenate([[0], np.cumsum(layout.fill_rows)])
    batches = {j: np.full(int(bounds[j + 1] - bounds[j]), -1) for j in range(first_batch, layout.n_batches)}
    for fill in range(len(layout.fills)):
        batch, row = placement(layout.fill_permutation(fill), int(fill_bounds[fill]), bounds, first_batch)
        ids = layout.fill_row_ids(fill)
        assert np.array_equal(batch < 0, row < 0)
        for b, k, i in zip(batch, row, ids):
            if b >= 0:
                assert batches[b][k] == -1  # each place filled once
                batches[b][k] = i
    order = layout.order()
    for j, got in batches.items():
        assert np.array_equal(got, order[bounds[j]:bounds[j + 1]])


@pytest.mark.parametrize("src,rows,chunk_rows", [(0, 10, 4), (3, 1, 4), (3, 9, 4), (8, 8, 4), (5, 0, 3), (7, 20, 7)])
def test_chunk_pieces_cut_a_row_range_at_chunk_boundaries(src, rows, chunk_rows):
    pieces = list(chunk_pieces(src, rows, chunk_rows))
    covered = [src + first + i for first, _, _, m in pieces for i in range(m)]
    assert covered == list(range(src, src + rows))
    for first, chunk, within, m in pieces:
        assert chunk * chunk_rows + within == src + first
        assert m >= 1 and within + m <= chunk_rows


@pytest.mark.parametrize("offset", [0, 1, 2952, 4095, 4096, 8191, 123457])
@pytest.mark.parametrize("length", [1, 100, 1144, 4096, 5240, 12288, 786432])
def test_aligned_span_is_the_smallest_block_range_holding_the_bytes(offset, length):
    start, stop = aligned_span(offset, length, 4096)
    assert start % 4096 == 0 and stop % 4096 == 0
    assert start <= offset < offset + length <= stop
    assert offset - start < 4096 and stop - (offset + length) < 4096


@pytest.mark.parametrize("offset", [0, 1, 2952, 4095, 4096, 8191, 123457])
@pytest.mark.parametrize("length", [1, 100, 1144, 4096, 5240, 8192, 12288, 786432])
def test_inner_ends_lie_on_pages_the_range_does_not_share(offset, length):
    page = 4096
    first, last = inner_ends(offset, length, page)
    end = offset + length
    assert offset <= first <= last < end
    whole = [p for p in range(offset // page, (end - 1) // page + 1) if p * page >= offset and (p + 1) * page <= end]
    if whole:  # the probed pages are the first and last page wholly inside the range
        assert first // page == whole[0] and last // page == whole[-1]
    else:  # no page of its own: its two ends
        assert (first, last) == (offset, end - 1)


def test_inner_ends_of_runs_that_share_a_boundary_page():
    # Two runs back to back at the chunk offsets an HDF5 store has (2952 mod 4096): the page holding byte
    # 2952 + 786432 belongs to both, so neither run's probe may look at it.
    a, b = (2952, 786432), (2952 + 786432, 786432)
    shared = (a[0] + a[1]) // 4096
    for run in (a, b):
        first, last = inner_ends(*run, 4096)
        assert shared not in (first // 4096, last // 4096)


@pytest.mark.parametrize("seed", range(30))
def test_spans_hold_every_run_once_and_cover_only_gaps_no_wider_than_the_limit(seed):
    """Runs grouped for one page-cache question each: every run in exactly one span, which holds it; runs of a
    span no further apart than the limit; neighbouring spans further apart than it, in file order."""
    from h5stream.read.runs import spans

    rng = np.random.default_rng(seed)
    row_bytes, gap = 1000, int(rng.integers(0, 20_000))
    runs = [Run(int(rng.integers(0, 500)), 0, int(rng.integers(1, 8)), int(rng.integers(0, 200)) * 1000)
            for _ in range(int(rng.integers(0, 40)))]
    got = spans(runs, row_bytes, gap)
    assert sorted(r for _, _, members in got for r in members) == sorted(runs)
    for offset, length, members in got:
        ends = [r.offset + r.rows * row_bytes for r in members]
        assert offset == min(r.offset for r in members) and offset + length == max(ends)
        reach = members[0].offset + members[0].rows * row_bytes
        for r in members[1:]:  # in file order, each within the limit of what the span reached before it
            assert r.offset >= members[0].offset and r.offset - reach <= gap
            reach = max(reach, r.offset + r.rows * row_bytes)
    for (a, la, _), (b, _, _) in zip(got, got[1:]):
        assert b - (a + la) > gap


class _Cache:
    """A byte source whose page cache holds the bytes of ``cached`` (a set of 1000-byte pages); counts
    questions."""

    def __init__(self, cached):
        self.pages, self.questions, self.advised = set(cached), [], []

    def cached(self, offset, length):
        self.questions.append((offset, length))
        return all(p in self.pages for p in range(offset // 1000, -(-(offset + length) // 1000)))

    def advise_willneed(self, offset, length):
        self.advised.append((offset, length))


def _advise(runs, source):
    import threading
    from types import SimpleNamespace

    from h5stream.read.rows import RowReader

    rows = RowReader(SimpleNamespace(row_bytes=1000, encoded=False), source, offsets=np.zeros(1, np.int64),
                     label_offsets=None, images=None, labels=None, check=None, stop=threading.Event())  # no file
    missing = rows.advise(runs)
    assert rows.advised_bytes == sum(r.rows * 1000 for r in missing)
    return missing


@pytest.mark.parametrize("seed", range(20))
def test_a_fill_counts_as_cached_exactly_when_every_run_of_it_is(seed):
    """One question per span of nearby runs when all is cached; a span with a page missing anywhere (a run's or
    a gap's) is asked about run by run, and exactly the runs not wholly cached are missing and advised."""
    rng = np.random.default_rng(seed)
    runs = [Run(0, 0, int(rng.integers(1, 4)), int(p) * 1000) for p in rng.choice(400, 12, replace=False)]
    every = {p for r in runs for p in range(r.offset // 1000, r.offset // 1000 + r.rows)}
    whole = _Cache(range(500))
    assert _advise(runs, whole) == [] and len(whole.questions) < len(runs) and not whole.advised
    gone = set(rng.choice(sorted(every), int(rng.integers(1, 4)), replace=False).tolist())
    source = _Cache(set(range(500)) - gone)
    missing = _advise(runs, source)
    want = [r for r in runs if gone & set(range(r.offset // 1000, r.offset // 1000 + r.rows))]
    assert sorted(missing) == sorted(want) and sorted(source.advised) == sorted((r.offset, r.rows * 1000)
                                                                                 for r in want)
