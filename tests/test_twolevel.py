"""The two-level order (h5stream/order/twolevel.py): pure properties, shuffle quality on a class-sorted store,
and a URL read in pieces giving its local file's batches with one request per piece per epoch."""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest

import h5stream
from h5stream.order.epoch import epoch_layout
from h5stream.order.quality import batch_label_tvd, full_random_order, kendall_tau, single_chunk_shuffle_order
from h5stream.order.twolevel import fill_pieces, piece_rows_for, piece_sequence, straddling_pieces
from h5stream.store.writer import write_arrays

ORDER = dict(block_rows=16, rows_per_fill=256, batch_size=32, unit_rows=4, piece_rows=64)


def layout(rows, seed, epoch, shard=None, **extra):
    kw = {**ORDER, **extra}
    return epoch_layout(rows, kw.pop("block_rows"), kw.pop("rows_per_fill"), kw.pop("batch_size"), seed, epoch,
                        shard=shard, **kw)


@pytest.mark.parametrize("rows,start_row", [(5000, 0), (4999, 0), (5000, 1234), (70, 0)])
def test_every_row_exactly_once_per_epoch_and_shards_cover_the_global_order(rows, start_row):
    for seed in range(3):
        for epoch in range(3):
            whole = layout(rows, seed, epoch, start_row=start_row).order()
            assert sorted(whole.tolist()) == list(range(start_row, rows))
            for count in (2, 3):
                parts = [layout(rows, seed, epoch, (i, count), start_row=start_row).order() for i in range(count)]
                assert np.array_equal(np.concatenate(parts), whole)


def test_the_order_is_a_pure_function_of_seed_epoch_and_options():
    a, b = layout(5000, 7, 2).order(), layout(5000, 7, 2).order()
    assert np.array_equal(a, b)
    assert not np.array_equal(a, layout(5000, 7, 3).order())  # another epoch
    assert not np.array_equal(a, layout(5000, 8, 2).order())  # another seed
    assert not np.array_equal(a, layout(5000, 7, 2, piece_rows=None).order())  # the one-level order differs
    assert not np.array_equal(a, layout(5000, 7, 2, window_pieces=0).order())


def test_pieces_are_permuted_and_each_fill_reads_few_pieces_of_which_few_cross_into_the_next():
    seq = piece_sequence(100, 5, 3, 0)
    assert sorted(seq.tolist()) == list(range(100)) and not np.array_equal(seq, piece_sequence(100, 5, 3, 1))
    for window in (0, 2, 4):
        lay = layout(20000, 1, 0, window_pieces=window)
        assert all(len(f) <= ORDER["rows_per_fill"] // ORDER["unit_rows"] for f in lay.fills)
        assert straddling_pieces(lay.segments, lay.fills, ORDER["piece_rows"]) <= window + 1
        # a fill reads its rows' pieces: about rows_per_fill / piece_rows of them plus the window's spread
        most = max(len(p) for p in fill_pieces(lay.segments, lay.fills, ORDER["piece_rows"]))
        assert most <= ORDER["rows_per_fill"] // ORDER["piece_rows"] + window + 1
    one_level = layout(20000, 1, 0, piece_rows=None)
    assert max(len(p) for p in fill_pieces(one_level.segments, one_level.fills, 64)) > 20  # scattered reads


def test_on_a_class_sorted_store_every_fill_holds_every_class_and_batches_mix_far_better_than_one_chunk():
    rows, classes = 40960, 8
    labels = (np.arange(rows) * classes) // rows
    for seed in range(3):
        lay = layout(rows, seed, 0, rows_per_fill=2048, piece_rows=64, window_pieces=8)
        for f in range(len(lay.fills)):
            assert np.all(np.bincount(labels[lay.fill_row_ids(f)], minlength=classes) > 0)
        tvd = batch_label_tvd(labels[lay.order()], 32, classes)
        random = batch_label_tvd(labels[full_random_order(rows, seed)], 32, classes)
        chunk = batch_label_tvd(labels[single_chunk_shuffle_order(rows, 2048, seed)], 32, classes)
        assert tvd <= 1.15 * random < chunk, (tvd, random, chunk)


def test_two_epochs_decorrelate_like_a_random_order_of_the_pieces():
    """|tau| spreads like 2 / (3 sqrt(pieces)): 4,096 pieces keep it well within 0.05 (0.01 one sigma)."""
    rows = 4096 * 8
    for seed in range(2):
        a = layout(rows, seed, 0, block_rows=8, unit_rows=2, piece_rows=8, rows_per_fill=512).order()
        b = layout(rows, seed, 1, block_rows=8, unit_rows=2, piece_rows=8, rows_per_fill=512).order()
        assert abs(kendall_tau(a, b)) < 0.05


def test_piece_rows_are_whole_blocks_of_at_least_the_bytes_asked():
    assert piece_rows_for(64, 768, 8 << 20) == 64 * (-(-(8 << 20) // (64 * 768)))
    assert piece_rows_for(1024, 3072, 8 << 20) == 3072  # 3 blocks of 3 MiB
    assert piece_rows_for(1024, 3072, 1) == 1024


# -- over a URL ---------------------------------------------------------------------------------------------------
ROWS = 3000
OPEN = {"batch_size": 50, "memory_budget": "64MiB", "rows_per_fill": 768, "seed": 11, "piece_bytes": "192KiB"}


@pytest.fixture()
def ids_store(range_server, tmp_path):
    """3000 rows of 16x16x3 (768 bytes) whose label is the row id, chunks of 64 rows, on the HTTP server."""
    path = str(tmp_path / "ids.h5")
    ids = np.arange(ROWS)
    images = np.zeros((ROWS, 16, 16, 3), np.uint8)
    images[:, 0, 0, 0] = ids // 256
    images[:, 0, 0, 1] = ids % 256
    write_arrays(path, images, ids.astype(np.float32), block_rows=64, storage_order="sorted")
    os.link(path, range_server.root / "ids.h5")
    return path, range_server.url + "ids.h5"


@pytest.mark.usefixtures("no_leaks")
def test_a_url_in_pieces_gives_its_local_files_batches_with_one_get_per_piece_per_epoch(range_server, ids_store):
    pytest.importorskip("obstore")
    local, url = ids_store
    with h5stream.open(local, **OPEN) as s:
        assert s.plan.piece_rows == 256 and s.plan.piece_window_bytes == 0
        here = [[(x.copy(), y.copy()) for x, y in s] for _ in range(2)]
    # Without the disk cache, whose own pieces would be the GETs (see test_remote_cache.py).
    with h5stream.open(url, remote={"timeout_s": 10}, cache_dir=None, **OPEN) as s:
        assert s.plan.piece_rows == 256 and s.plan.piece_window_bytes > 0
        assert "piece window" in s.plan.describe() and "pieces of 256 rows" in s.plan.describe()
        first = len(range_server.ranges)
        there = [[(x.copy(), y.copy()) for x, y in s] for _ in range(2)]
        fetched = range_server.ranges[first:]
    for epoch_here, epoch_there in zip(here, there):
        assert len(epoch_here) == len(epoch_there)
        assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(epoch_here, epoch_there))
        ids = np.concatenate([y for _, y in epoch_there]).astype(np.int64)
        assert sorted(ids.tolist()) == list(range(ROWS))
        x = np.concatenate([x for x, _ in epoch_there])
        assert np.array_equal(x[:, 0, 0, 0].astype(np.int64) * 256 + x[:, 0, 0, 1], ids)
    # Each epoch fetches every piece once, in one GET of its whole span (12 pieces of 256 rows: the image
    # chunks lie end to end from the first one's offset); a third GET of a piece is the next epoch's read-ahead.
    # The server logs the GETs as they arrive, several in flight: an epoch's last pieces may come in after the
    # next epoch's first, so the count per piece is checked, not the position in the log.
    with h5stream.open(local, batch_size=1, shuffle=False) as s:
        from h5stream.read.locate import locate

        start = int(locate(s.meta, False).image_chunks[0])
    spans = sorted((start + p * 256 * 768, start + min(ROWS, (p + 1) * 256) * 768) for p in range(12))
    piece_gets = [r for r in fetched if r in spans]
    per_piece = Counter(piece_gets)
    assert sorted(per_piece) == spans and all(2 <= n <= 3 for n in per_piece.values()), fetched
    later = fetched[fetched.index(piece_gets[0]):]
    assert all(r in spans or r[1] <= start or r[0] >= spans[-1][1] for r in later), fetched  # no small reads
    with h5stream.open(url, remote={"timeout_s": 10}, cache_dir=None, **{**OPEN, "piece_bytes": None}) as s:
        before = range_server.requests.get("GET", 0)
        for _ in s:
            pass
        assert range_server.requests.get("GET", 0) - before > 12  # the one-level order: one GET per unit run


def test_a_state_carries_the_pieces_and_resuming_takes_them(tmp_path):
    path = str(tmp_path / "s.h5")
    write_arrays(path, np.zeros((3000, 4, 4, 3), np.uint8), np.arange(3000).astype(np.float32), block_rows=64)
    kw = {k: v for k, v in OPEN.items() if k != "piece_bytes"}
    with h5stream.open(path, **kw, piece_bytes="48KiB") as s:
        it = iter(s)
        [next(it) for _ in range(7)]
        state = s.state()
        rest = [y.copy() for _, y in it]
    assert state["piece_rows"] == 1024
    with h5stream.open(path, **kw, resume=state) as s:  # no piece_bytes given: the state's
        assert s.plan.piece_rows == 1024
        assert all(np.array_equal(a, y) for a, (_, y) in zip(rest, s))
    with h5stream.open(path, **kw) as s, pytest.raises(h5stream.ConfigError, match="piece_rows"):
        s.restore(state)


@pytest.mark.usefixtures("no_leaks")
def test_the_benchmarks_own_ranges_in_pieces_are_the_gets_a_url_stream_in_pieces_sends(range_server):
    """benchmarks.remote's limit "with the stream's own ranges" fetches, in the two-level order, each whole
    piece once: the requests the stream sent for its pixels."""
    from benchmarks.remote import stream_requests

    with h5stream.open(range_server.url + "store.h5", batch_size=50, seed=3, rows_per_fill=1024,
                       piece_bytes="3MiB", cache_dir=None) as stream:
        first = len(range_server.ranges)
        for _ in stream:
            pass
        plan, seed, meta = stream.plan, stream.seed, stream.meta
        sent = range_server.ranges[first:]
    predicted = stream_requests(str(range_server.root / "store.h5"), plan, seed)
    assert plan.piece_rows == 1024 and len(predicted) == 3  # 2500 rows of 3 KiB: pieces of one 3 MiB chunk
    assert not Counter(predicted) - Counter(sent)
    assert sum(end - start for start, end in predicted) == meta.rows * meta.row_bytes


@pytest.mark.usefixtures("no_leaks")
def test_info_shuffle_report_of_the_two_level_order_is_the_same_for_a_url_and_its_local_file(range_server, tmp_path,
                                                                                          capsys):
    """A class-sorted store of 8 classes: `h5stream info --shuffle-report --piece-bytes` reports the two-level
    order (the plan says its pieces), the same figures for the URL as for its local file, mixing batches far
    better than the file's order."""
    import json

    from h5stream.cli import main

    path = tmp_path / "sorted.h5"
    labels = np.repeat(np.arange(8), 1024)
    write_arrays(path, np.zeros((8192, 8, 8, 3), np.uint8), labels, block_rows=64, storage_order="sorted")
    os.link(path, range_server.root / "sorted.h5")

    def report(where, *extra):
        assert main(["info", where, "--shuffle-report", "--memory-budget", "64MiB", "--rows-per-fill", "1024",
                     "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)["shuffle_report"]

    here, there = report(str(path), "--piece-bytes", "48KiB"), report(range_server.url + "sorted.h5",
                                                                       "--piece-bytes", "48KiB")
    one_level = report(str(path))
    assert "pieces of 256 rows" in here["plan_text"] and "pieces" not in one_level["plan_text"]
    for key in ("batch_label_tvd", "epoch_order_tau"):
        assert here[key] == there[key]
    assert here["batch_label_tvd"] != one_level["batch_label_tvd"]
    assert here["batch_label_tvd"] < 0.5 * here["batch_label_tvd_file_order"]


# -- the window of pieces -----------------------------------------------------------------------------------------
def test_a_piece_wanted_by_many_threads_at_once_is_fetched_once_and_dropped_once_served(tmp_path):
    import threading

    from h5stream.read.source import LocalFile
    from h5stream.read.window import PieceWindow

    data = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
    path = tmp_path / "bytes"
    path.write_bytes(data.tobytes())
    spans = np.array([[0, 1 << 19], [1 << 19, 1 << 20]], np.int64)
    window = PieceWindow(LocalFile(str(path)), spans, spans[:, 1] - spans[:, 0], capacity=2)
    got = np.zeros(1 << 20, np.uint8)
    parts = [(start, start + (1 << 16)) for start in range(0, 1 << 20, 1 << 16)]
    barrier = threading.Barrier(8)

    def read(mine):
        barrier.wait()
        for a, b in mine:
            window.readinto(a, [memoryview(got[a:b])])

    threads = [threading.Thread(target=read, args=(parts[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert np.array_equal(got, data) and window.pieces_fetched == 2  # each piece once, though 8 threads wanted it
    assert not window._held  # every byte of both served: neither is held
    tail = np.zeros(100, np.uint8)
    window.readinto((1 << 19) - 50, [memoryview(tail[:30]), memoryview(tail[30:])])  # across two pieces
    assert np.array_equal(tail, data[(1 << 19) - 50:(1 << 19) + 50]) and window.pieces_fetched == 4
    window.close()


def test_a_failed_piece_fetch_fails_every_reader_of_it_and_none_waits_for_good(tmp_path):
    import threading

    from h5stream.read.source import LocalFile
    from h5stream.read.window import PieceWindow

    path = tmp_path / "short"
    path.write_bytes(bytes(1000))
    spans = np.array([[0, 5000]], np.int64)  # a piece past the end of the file: a short read
    window = PieceWindow(LocalFile(str(path)), spans, np.array([5000]), capacity=1)
    errors, barrier = [], threading.Barrier(4)

    def read():
        barrier.wait()
        try:
            window.readinto(0, [memoryview(bytearray(10))])
        except OSError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads) and len(errors) == 4
    window.close()


def test_the_window_of_pieces_is_in_a_urls_plan_on_top_of_the_default_budget_and_inside_a_given_one(tmp_path):
    import dataclasses

    from h5stream.errors import BudgetError
    from h5stream.order.twolevel import window_pieces_bytes
    from h5stream.remote import RemoteOptions
    from h5stream.store.meta import read_meta
    from h5stream.streaming.planning import plan_stream

    path = str(tmp_path / "s.h5")
    write_arrays(path, np.zeros((4096, 32, 32, 3), np.uint8), np.arange(4096).astype(np.float32), block_rows=64)
    local = read_meta(path)
    url = dataclasses.replace(local, remote=RemoteOptions())
    window = window_pieces_bytes(piece_rows_for(64, local.row_bytes, 1 << 20), local.row_bytes, 8)
    window = min(window, local.rows * local.row_bytes)  # 19 pieces' worth, but the store holds 12

    def plans(budget):
        kw = dict(piece_bytes=1 << 20, available_bytes=None)
        return plan_stream(local, budget, 32, **kw), plan_stream(url, budget, 32, **kw)

    here, there = plans(None)
    assert here.piece_window_bytes == 0 and there.piece_window_bytes == window
    assert there.rows_per_fill == here.rows_per_fill  # the same order
    assert there.budget_bytes - here.budget_bytes >= window and "piece window" in there.describe()
    here, there = plans(128 << 20)
    assert there.total_bytes <= 128 << 20 and there.piece_window_bytes == window
    assert there.rows_per_fill == here.rows_per_fill
    tight = there.min_budget_bytes + (1 << 20)  # the local file's fill is larger: no room for client and window
    with pytest.raises(BudgetError, match="rows_per_fill"):
        plans(tight)
    with pytest.raises(BudgetError, match="window of pieces"):
        plans(there.min_budget_bytes - 1)


def test_a_budget_too_small_for_the_window_of_pieces_names_the_piece_bytes_that_fits(tmp_path):
    import dataclasses
    import re

    from h5stream.errors import BudgetError
    from h5stream.remote import RemoteOptions
    from h5stream.store.meta import read_meta
    from h5stream.streaming.planning import plan_stream

    path = str(tmp_path / "s.h5")
    write_arrays(path, np.zeros((16384, 32, 32, 3), np.uint8), np.arange(16384).astype(np.float32), block_rows=64)
    url = dataclasses.replace(read_meta(path), remote=RemoteOptions())
    kw = dict(available_bytes=None, rows_per_fill=64)  # the smallest fill: the budget goes to the pieces
    needed = plan_stream(url, None, 32, piece_bytes=4 << 20, **kw).min_budget_bytes
    with pytest.raises(BudgetError, match="window of pieces") as info:
        plan_stream(url, needed - (20 << 20), 32, piece_bytes=4 << 20, **kw)
    said = re.search(r"lower piece_bytes to (\d+) \(", str(info.value))
    assert said, str(info.value)
    smaller = int(said.group(1))
    assert 0 < smaller < 4 << 20 and smaller % (64 * 32 * 32 * 3) == 0  # whole blocks
    plan = plan_stream(url, needed - (20 << 20), 32, piece_bytes=smaller, **kw)  # it fits
    assert plan.total_bytes <= needed - (20 << 20) and plan.piece_rows * 3072 == smaller


def test_a_piece_larger_than_the_store_costs_the_stores_bytes_not_a_window_of_pieces(range_server, tmp_path, capsys):
    """piece_bytes past the store's size is one piece of the whole store: the URL's plan holds at most the
    store's bytes for it (it asked for 19 pieces of 100 GiB, a BudgetError naming 1.9 TiB), and `info
    --shuffle-report` gives the local file's figures."""
    import json

    from h5stream.cli import main

    path = tmp_path / "small.h5"
    write_arrays(path, np.zeros((3001, 16, 16, 3), np.uint8), np.arange(3001) % 7, block_rows=64)
    os.link(path, range_server.root / "small.h5")
    store_bytes = 3001 * 16 * 16 * 3

    def report(where, piece):
        code = main(["info", where, "--shuffle-report", "--piece-bytes", piece, "--json"])
        out, err = capsys.readouterr()
        assert code == 0, err
        return json.loads(out)["shuffle_report"]

    for piece in ("8MiB", "100GiB"):
        here, there = report(str(path), piece), report(range_server.url + "small.h5", piece)
        assert 0 < there["plan"]["piece_window_bytes"] <= store_bytes
        for key in ("batch_label_tvd", "epoch_order_tau"):
            assert here[key] == there[key]
    kw = {"batch_size": 50, "seed": 3, "piece_bytes": "100GiB"}
    with h5stream.open(str(path), **kw) as s:
        want = [y.copy() for _, y in s]
    with h5stream.open(range_server.url + "small.h5", cache_dir=None, remote={"timeout_s": 10}, **kw) as s:
        assert s.plan.piece_window_bytes <= store_bytes
        got = [y.copy() for _, y in s]
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))


def test_the_order_quality_benchmark_reports_both_orders_per_store(tmp_path, capsys):
    """benchmarks.order_quality: one row per store and order, the two-level one with its pieces; on a class-sorted
    store the one-level order mixes batches about as a random permutation does, the two-level one worse."""
    import json

    from benchmarks.order_quality import main

    assert main(["--gb", "0.2", "--seeds", "2", "--json", "--data", str(tmp_path)]) == 0
    r = json.loads(capsys.readouterr().out)
    one, two = r["stores"]
    assert (one["order"], one["piece_rows"], two["order"]) == ("one-level", 0, "two-level")
    assert two["piece_rows"] == 192 and len(two["tvd_over_random"]) == 2
    assert max(one["tvd_over_random"]) < 1.1 < min(two["tvd_over_random"])


@pytest.mark.usefixtures("no_leaks")
def test_an_s3_url_in_pieces_gives_its_local_files_batches(aws_env, tmp_path):
    """The same over SeaweedFS's S3: two epochs, two shards each, every batch equal to the local file's."""
    pytest.importorskip("obstore")
    path = str(tmp_path / "ids.h5")
    ids = np.arange(ROWS)
    images = np.zeros((ROWS, 16, 16, 3), np.uint8)
    images[:, 0, 0, 0], images[:, 0, 0, 1] = ids // 256, ids % 256
    write_arrays(path, images, ids.astype(np.float32), block_rows=64, storage_order="sorted")
    aws_env.put("pieces/ids.h5", path)
    url = f"s3://{aws_env.bucket}/pieces/ids.h5"
    for shard in ((0, 2), (1, 2)):
        with h5stream.open(path, shard=shard, **OPEN) as a, \
                h5stream.open(url, shard=shard, remote={"timeout_s": 10}, **OPEN) as b:
            for _ in range(2):
                here = [(x.copy(), y.copy()) for x, y in a]
                there = [(x.copy(), y.copy()) for x, y in b]
                assert len(here) == len(there) > 0
                assert all(np.array_equal(x1, x2) and np.array_equal(y1, y2)
                           for (x1, y1), (x2, y2) in zip(here, there))


@pytest.mark.parametrize("piece", ["1e30", 2**70])
def test_a_piece_bytes_past_a_petabyte_is_one_config_error_at_open_not_a_reader_overflow(tmp_path, piece):
    path = str(tmp_path / "s.h5")
    write_arrays(path, np.zeros((300, 8, 8, 3), np.uint8), np.arange(300) % 3, block_rows=64)
    with pytest.raises(h5stream.ConfigError, match="past the largest piece") as info:
        h5stream.open(path, batch_size=8, piece_bytes=piece)
    assert "\n" not in str(info.value)
    with h5stream.open(path, batch_size=8, piece_bytes="100TB") as s:  # larger than the store: the whole store
        assert sorted(np.concatenate([y for _, y in s]).tolist()) == sorted((np.arange(300) % 3).tolist())
