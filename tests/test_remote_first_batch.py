"""A URL stream's first batch, through the disk cache, goes out once the pieces holding its rows have landed, not
once every piece of its first fill has (h5stream/read/arrive.py): against the tests' HTTP server, with a piece
the first batch does not need held back by the server; the batches stay the local file's."""

from __future__ import annotations

import threading
import time

import h5py
import numpy as np
import pytest

import h5stream
from h5stream.read.runs import placement, plan_runs

pytestmark = pytest.mark.usefixtures("no_leaks")

PIECE = 256 << 10
OPTS = dict(batch_size=4, seed=3, read_unit="12KiB")  # 3 KiB rows: units of 4 rows, a batch of 4 rows


def _first_batch_spans(local: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[tuple[int, int]]]:
    """``(spans of the rows of batch 0, spans of the first fill's other rows, image chunk spans)`` in bytes, from
    the reader's plan of the fill (its runs, each row's batch)."""
    with h5py.File(local, "r") as f:
        images = f["images"]
        infos = [images.id.get_chunk_info(i) for i in range(images.id.get_num_chunks())]
        block_rows, row_bytes = images.chunks[0], int(np.prod(images.shape[1:]))
    offsets = np.array([i.byte_offset for i in infos], np.int64)
    with h5stream.open(local, **OPTS) as plain:
        layout = plain.config.layout(0)
        assert len(layout.fills) > 0
        runs = plan_runs(layout.fill_segments(0), offsets, block_rows, row_bytes)
        bounds = np.concatenate([[0], np.cumsum(layout.batch_sizes)])
        batch, _ = placement(layout.fill_permutation(0), 0, bounds, 0, int(layout.fill_rows[0]))
    head, tail = [], []
    for run in runs:
        for i in range(run.rows):
            span = (run.offset + i * row_bytes, run.offset + (i + 1) * row_bytes)
            (head if batch[run.dest + i] == 0 else tail).append(span)
    return head, tail, [(i.byte_offset, i.byte_offset + i.size) for i in infos]


def _held_back(head, tail, chunks) -> tuple[int, int]:
    """A cache piece inside the image chunks that the first fill's other rows touch and no row of batch 0 does."""
    def pieces(spans):
        return {p for a, b in spans for p in range(a // PIECE, (b - 1) // PIECE + 1)}

    inside = {p for a, b in chunks for p in range(-(-a // PIECE), b // PIECE)}  # whole pieces of image bytes
    free = sorted((pieces(tail) & inside) - pieces(head))
    assert free, "every piece of the first fill holds a row of batch 0: no range to hold back"
    return free[len(free) // 2] * PIECE, (free[len(free) // 2] + 1) * PIECE


def test_the_first_batch_goes_out_while_a_piece_only_later_batches_need_is_held_back(range_server, tmp_path):
    local = str(range_server.root / "store.h5")
    with h5stream.open(local, **OPTS) as plain:
        want = [(x.copy(), y.copy()) for x, y in plain]
    start, stop = _held_back(*_first_batch_spans(local))
    range_server.stall_bytes(start, stop)  # never answered while the test runs
    # timeout_s: the old reader, waiting for the whole fill, failed the stream after it; the new one never waits
    # for the range held back.
    stream = h5stream.open(range_server.url + "store.h5", **OPTS, timeout_s=60, cache_dir=tmp_path,
                           remote={"timeout_s": 120, "cache_piece": PIECE})
    try:
        x, y = next(iter(stream))
        np.testing.assert_array_equal(x, want[0][0])
        np.testing.assert_array_equal(y, want[0][1])
        assert range_server.stalled.wait(60)  # the fill's other rows asked for the piece: it never came
        assert not list(tmp_path.glob(f"objects/*/{start // PIECE}.piece"))
    finally:
        stream.close()
        range_server.stop()  # lets the held-back request go (it fails): the threads waiting on it end
        # ... once its retries of the stopped server give up: within 30% of timeout_s, plus one attempt and the
        # last backoff (remote/config.py client_settings), about 110 s at most here
        deadline = time.monotonic() + 180
        for t in threading.enumerate():
            if t.name.startswith("h5stream"):
                t.join(max(0.0, deadline - time.monotonic()))
        assert [t.name for t in threading.enumerate() if t.name.startswith("h5stream")] == []


def test_a_cached_url_stream_reading_its_first_batch_first_gives_the_local_file_s_batches(range_server, tmp_path):
    local = str(range_server.root / "store.h5")
    head, tail, _ = _first_batch_spans(local)
    assert head and tail  # the first batch's rows are read ahead of the others
    with h5stream.open(local, **OPTS) as plain, h5stream.open(
            range_server.url + "store.h5", **OPTS, cache_dir=tmp_path,
            remote={"timeout_s": 30, "cache_piece": PIECE}) as remote:
        for _ in range(2):
            got = [(x.copy(), y.copy()) for x, y in remote]
            assert len(got) == len(plain)
            for (xa, ya), (xb, yb) in zip(got, plain):
                np.testing.assert_array_equal(xa, xb)
                np.testing.assert_array_equal(ya, yb)


def test_cutting_runs_around_the_first_batch_s_rows_keeps_every_row_once_in_its_place():
    from h5stream.read.arrive import head_first
    from h5stream.read.runs import Run

    rng = np.random.default_rng(0)
    for _ in range(50):
        n, row_bytes = int(rng.integers(1, 60)), 3
        batch = rng.integers(-1, 4, n)
        cuts = sorted({0, n, *rng.integers(0, n, 5).tolist()})
        runs = [Run(a, 100 + a, b - a, 1000 + a * row_bytes) for a, b in zip(cuts[:-1], cuts[1:])]
        head, tail = head_first(batch, 2, runs, row_bytes)
        for part in (head, tail):  # in the runs' order, each run consistent with where its rows lie
            assert [r.dest for r in part] == sorted(r.dest for r in part)
            assert all(r.src == 100 + r.dest and r.offset == 1000 + r.dest * row_bytes and r.rows > 0 for r in part)
        rows = {d: "head" for r in head for d in range(r.dest, r.dest + r.rows)}
        rows.update({d: "tail" for r in tail for d in range(r.dest, r.dest + r.rows)})
        assert sum(r.rows for r in head + tail) == n == len(rows)  # every row once
        assert [d for d, where in sorted(rows.items()) if where == "head"] == np.flatnonzero(batch == 2).tolist()
        assert all(r in tail for r in runs if not (batch[r.dest:r.dest + r.rows] == 2).any())  # untouched: as is
