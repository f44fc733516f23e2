"""Elastic resume over a set of parts: a state saved by N ranks continues the epoch on M ranks, every row once."""

from __future__ import annotations

import numpy as np
import pytest

import h5stream
from h5stream.store.writer import write_arrays

SIZES = (301, 170, 433, 96)  # four parts, none a multiple of the 32-row blocks
ROWS = sum(SIZES)
BATCH = 24


def _ids(x):
    return x[:, 0, 0, 0].astype(np.int64) + 256 * x[:, 0, 0, 1].astype(np.int64)


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    root = tmp_path_factory.mktemp("elastic_parts")
    images = np.random.default_rng(0).integers(0, 255, (ROWS, 8, 8, 3), dtype=np.uint8)
    images[:, 0, 0, 0], images[:, 0, 0, 1] = np.arange(ROWS) % 256, np.arange(ROWS) // 256
    labels = np.arange(ROWS) % 5
    paths, first = [], 0
    for k, n in enumerate(SIZES):
        path = root / f"part-{k}.h5"
        write_arrays(path, images[first:first + n], labels[first:first + n], block_rows=32,
                     class_names=[str(c) for c in range(5)])
        paths.append(str(path))
        first += n
    return paths


@pytest.mark.parametrize("n,m", [(4, 3), (2, 5)])
@pytest.mark.parametrize("drop", [False, True])
def test_n_ranks_save_m_ranks_finish_every_row_once(parts, n, m, drop):
    kw = dict(batch_size=BATCH, rows_per_fill=160, seed=23, drop_remainder=drop)
    served, states, b = [], [], 4
    for i in range(n):
        with h5stream.open(parts, shard=(i, n), **kw) as s:
            it = iter(s)
            served += [_ids(next(it)[0]) for _ in range(b)]
            states.append(s.state())
    assert states[0]["rows_consumed"] == n * b * BATCH
    resumed = [h5stream.open(parts, shard=(j, m), resume=states[-1], **kw) for j in range(m)]
    try:
        rest = [[_ids(x) for x, _ in r] for r in resumed]
        assert len({len(r) for r in rest}) == 1  # the ranks stay in step
        union = np.concatenate(served + [x for r in rest for x in r])
        assert len(np.unique(union)) == len(union)  # no row twice
        if drop:
            assert ROWS - len(union) < m * BATCH
        else:
            assert np.array_equal(np.sort(union), np.arange(ROWS))  # no row lost
        assert all(r.epoch == 1 for r in resumed)
    finally:
        for s in resumed:
            s.close()
