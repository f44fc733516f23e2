"""Run geometry (h5stream.read.runs): pure functions checked as properties over many layouts."""

from __future__ import annotations

import numpy as np
import pytest

from h5stream.order.epoch import epoch_layout
from h5stream.read.runs import Run, chunk_pieces, placement, plan_runs, row_offsets

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
