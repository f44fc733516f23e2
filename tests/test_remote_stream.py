"""h5stream.open(URL): the guarantees of a local store, over SeaweedFS's S3 and an HTTP server on 127.0.0.1.

The store's label is each row's id, so every property is checked row by row: the same batches as the same
file read locally (over several epochs), every row exactly once, shards from two processes disjoint and
complete, resume, and a server that dies mid-epoch failing the stream with a clear error and no leak.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

import h5stream
from conftest import drop_row_digests
from h5stream.errors import BudgetError, ConfigError, ReaderError, RemoteUnavailableError, StoreNotFoundError
from h5stream.remote.config import RemoteOptions
from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")
pytest.importorskip("obstore")

ROWS = 3000
OPEN = {"batch_size": 50, "memory_budget": "64MiB", "rows_per_fill": 400, "seed": 11}


@pytest.fixture(scope="module")
def ids_file(tmp_path_factory):
    """3000 rows of 16x16x3 whose label is the row id (and whose pixels encode it too), in chunks of 64 rows."""
    path = str(tmp_path_factory.mktemp("ids") / "ids.h5")
    ids = np.arange(ROWS)
    images = np.empty((ROWS, 16, 16, 3), np.uint8)
    images[...] = (ids % 251).astype(np.uint8)[:, None, None, None]
    images[:, 0, 0, 0] = ids // 256
    images[:, 0, 0, 1] = ids % 256
    write_arrays(path, images, ids.astype(np.float32), block_rows=64, storage_order="sorted")
    return path


@pytest.fixture(params=["s3", "http"])
def ids_url(request, ids_file, tmp_path):
    """``(local path, URL, remote options)`` of :func:`ids_file` on each server."""
    if request.param == "s3":
        seaweed = request.getfixturevalue("aws_env")
        seaweed.put("ids/ids.h5", ids_file)
        return ids_file, f"s3://{seaweed.bucket}/ids/ids.h5", RemoteOptions(timeout_s=10)
    server = request.getfixturevalue("range_server")
    os.link(ids_file, server.root / "ids.h5")
    return ids_file, server.url + "ids.h5", {"timeout_s": 10}


def epochs(stream, n):
    return [[(x.copy(), y.copy()) for x, y in stream] for _ in range(n)]


def test_a_url_streams_the_same_batches_as_the_local_file_and_every_row_once(ids_url):
    local, url, options = ids_url
    with h5stream.open(local, **OPEN) as a, h5stream.open(url, remote=options, **OPEN) as b:
        assert b.meta.rows == ROWS and b.meta.path == url
        here, there = epochs(a, 3), epochs(b, 3)
    for epoch_here, epoch_there in zip(here, there):
        assert len(epoch_here) == len(epoch_there)
        for (x1, y1), (x2, y2) in zip(epoch_here, epoch_there):
            assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
        ids = np.concatenate([y for _, y in epoch_there]).astype(np.int64)
        assert sorted(ids.tolist()) == list(range(ROWS))  # every row exactly once
        x = np.concatenate([x for x, _ in epoch_there])
        assert np.array_equal(x[:, 0, 0, 0].astype(np.int64) * 256 + x[:, 0, 0, 1], ids)  # each row's own pixels
    assert not np.array_equal(*(np.concatenate([y for _, y in e]) for e in there[:2]))  # reshuffled each epoch


def test_read_meta_of_a_url_equals_the_local_description(ids_url):
    import dataclasses

    local, url, options = ids_url
    remote = h5stream.read_meta(url, remote=options)
    assert dataclasses.replace(remote, path=local) == h5stream.read_meta(local)


def test_resume_over_a_url_continues_with_the_batches_it_would_have_given(ids_url):
    _, url, options = ids_url
    with h5stream.open(url, remote=options, **OPEN) as whole:
        expected = epochs(whole, 2)
    with h5stream.open(url, remote=options, **OPEN) as first:
        it = iter(first)
        for _ in range(17):
            next(it)
        state = first.state()
    with h5stream.open(url, remote=options, resume=state, **OPEN) as rest:
        got = [y.copy() for _, y in rest] + [y.copy() for _, y in rest]
    want = [y for _, y in expected[0][17:]] + [y for _, y in expected[1]]
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))


SHARD_SCRIPT = r"""
import json, sys
import h5stream
url, index, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ids = []
with h5stream.open(url, batch_size=50, memory_budget="64MiB", rows_per_fill=400, seed=5, shard=(index, 2),
                   remote={"timeout_s": 10}) as stream:
    for epoch in range(2):
        ids.append([int(v) for _, y in stream for v in y])
with open(out, "w") as fh:
    json.dump(ids, fh)
"""


def test_two_processes_streaming_shards_of_a_url_cover_every_row_once(aws_env, ids_file, tmp_path):
    aws_env.put("ids/shards.h5", ids_file)
    url = f"s3://{aws_env.bucket}/ids/shards.h5"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    procs = [subprocess.Popen([sys.executable, "-c", SHARD_SCRIPT, url, str(i), str(tmp_path / f"{i}.json")],
                              env=env, stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        errors = [p.communicate(timeout=300)[1] for p in procs]  # a safety net: a healthy run takes seconds
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], errors
    shard0, shard1 = (json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2))
    for epoch in range(2):
        assert not set(shard0[epoch]) & set(shard1[epoch])
        assert collections.Counter(shard0[epoch] + shard1[epoch]) == collections.Counter(range(ROWS))
    with h5stream.open(ids_file, batch_size=50, memory_budget="64MiB", rows_per_fill=400, seed=5,
                       shard=(1, 2)) as local:  # the same shard as the same file read locally
        assert [int(v) for _, y in local for v in y] == shard1[0]


def test_augmenting_workers_give_the_same_batches_for_a_url_as_for_the_local_file(range_server, ids_file):
    os.link(ids_file, range_server.root / "ids.h5")
    augment = h5stream.Augment(horizontal_flip=True, brightness_range=(0.8, 1.2))
    kwargs = dict(OPEN, augment=augment, workers=2, memory_budget=None)
    with h5stream.open(ids_file, **kwargs) as a, h5stream.open(range_server.url + "ids.h5", **kwargs) as b:
        for (x1, y1), (x2, y2) in zip(a, b):
            assert np.array_equal(x1, x2) and np.array_equal(y1, y2)


def test_a_server_that_dies_mid_epoch_fails_the_stream_in_one_line_and_leaks_nothing(range_server, ids_file):
    os.link(ids_file, range_server.root / "ids.h5")
    stream = h5stream.open(range_server.url + "ids.h5", remote={"timeout_s": 1.5}, timeout_s=30, cache_dir=None,
                           **OPEN)  # uncached: the rest of the epoch needs the server
    try:
        it = iter(stream)
        next(it)
        range_server.stop()
        with pytest.raises(ReaderError) as info:
            for _ in range(4):  # what was read ahead runs out within an epoch or two
                for _ in it:
                    pass
                it = iter(stream)
        assert "\n" not in str(info.value)
        assert isinstance(info.value.__cause__, RemoteUnavailableError)
    finally:
        stream.close()


def test_a_missing_url_fails_at_open_in_one_line(range_server):
    with pytest.raises(StoreNotFoundError) as info:
        h5stream.open(range_server.url + "absent.h5")
    assert "\n" not in str(info.value)


def test_info_and_verify_read_a_url(range_server, h5cli):
    url = range_server.url + "store.h5"
    code, out, err = h5cli("info", url, "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["path"] == url and info["rows"] == 2500 and info["file_bytes"] == (range_server.root /
                                                                                    "store.h5").stat().st_size
    code, out, err = h5cli("verify", url)
    assert code == 0, err


def test_the_cli_says_in_one_line_when_credentials_are_wrong(aws_env, s3_store, h5cli, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    code, out, err = h5cli("info", s3_store[1])
    assert code != 0 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("h5stream: error: ") and "access denied" in lines[0]


def test_bench_and_preview_take_a_url(range_server, h5cli, tmp_path):
    url = range_server.url + "store.h5"
    code, out, err = h5cli("bench", url, "--json", "--epochs", "1", "--memory-budget", "96MiB")
    assert code == 0, err
    result = json.loads(out)
    assert result["file"] == url and result["rows_streamed"] == 2500 and result["baselines"] == {}
    code, out, err = h5cli("bench", url, "--cold")
    assert code != 0 and "drop --cold" in err and len(err.strip().splitlines()) == 1
    code, out, err = h5cli("preview", url, "--out", tmp_path / "p.png")
    assert code == 0, err
    assert (tmp_path / "p.png").stat().st_size > 0


def test_the_remote_clients_memory_is_on_top_of_the_default_budget_and_inside_a_given_one(remote_store_file):
    import dataclasses

    from h5stream.streaming.planning import plan_stream

    local = dataclasses.replace(h5stream.read_meta(remote_store_file), rows=2_000_000)  # larger than any budget
    remote = dataclasses.replace(local, remote=RemoteOptions(max_in_flight=8))
    by_default = plan_stream(local, None, 32), plan_stream(remote, None, 32)
    assert by_default[1].remote_client_bytes > 0 and by_default[0].remote_client_bytes == 0
    assert by_default[1].rows_per_fill == by_default[0].rows_per_fill  # the same batches as the local file
    assert by_default[1].budget_bytes == by_default[0].budget_bytes + by_default[1].remote_client_bytes
    budget = 256 << 20
    with pytest.raises(BudgetError) as info:  # the local file's fill leaves no room for the client
        plan_stream(remote, budget, 32)
    fits = info.value.rows_per_fill
    assert f"rows_per_fill={fits}" in str(info.value) and fits < plan_stream(local, budget, 32).rows_per_fill
    given = plan_stream(local, budget, 32, rows_per_fill=fits), plan_stream(remote, budget, 32, rows_per_fill=fits)
    assert given[1].total_bytes <= budget and given[1].rows_per_fill == given[0].rows_per_fill == fits
    assert "remote client" in given[1].describe()


def test_a_larger_read_unit_reads_a_url_in_fewer_larger_requests_with_the_local_files_batches(range_server):
    """store.h5: 2500 rows of 3 KiB in chunks of 1024 rows.  The default unit is 256 rows (768 KiB); with
    read_unit="4MiB" it is the whole chunk, so an epoch's pixels take a quarter of the GETs (3 instead of 10;
    the metadata's come on top), and the local file opened with the same read_unit gives the same batches."""
    url, local = range_server.url + "store.h5", str(range_server.root / "store.h5")
    kw = dict(batch_size=100, memory_budget="96MiB", rows_per_fill=2048, seed=3)

    def gets(**extra):
        before = range_server.requests.get("GET", 0)
        with h5stream.open(url, **kw, **extra) as s:
            unit = s.plan.unit_rows
            batches = [(x.copy(), y.copy()) for x, y in s]
        return range_server.requests.get("GET", 0) - before, unit, batches

    small, unit_small, _ = gets()
    large, unit_large, remote = gets(read_unit="4MiB")
    assert (unit_small, unit_large) == (256, 1024)
    assert large < small, (large, small)
    with h5stream.open(local, **kw, read_unit="4MiB") as s:
        here = [(x.copy(), y.copy()) for x, y in s]
    assert len(here) == len(remote) and all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
                                            for a, b in zip(here, remote))
    with h5stream.open(local, batch_size=2500, shuffle=False) as s:
        stored = next(iter(s))[0]
    assert sorted(map(bytes, np.concatenate([x for x, _ in remote]))) == sorted(map(bytes, stored))  # each row once


def image_bytes_fetched(server, path) -> np.ndarray:
    """How many times the server sent each byte of the image chunks of ``path`` (its range log)."""
    cover = np.zeros(os.path.getsize(path) + 1, np.int32)
    for a, b in server.ranges:
        cover[a] += 1
        cover[b] -= 1
    cover = np.cumsum(cover)
    with h5py.File(path, "r") as f:
        chunks = [f["images"].id.get_chunk_info(i) for i in range(f["images"].id.get_num_chunks())]
    return np.concatenate([cover[c.byte_offset:c.byte_offset + c.size] for c in chunks])


@pytest.mark.parametrize("layout", ["rows", "blocks"])
def test_the_first_epoch_over_a_url_fetches_each_row_once_or_a_block_once_more_around_it(range_server, layout):
    """verify_reads="once": a store with row digests checks each row against its own digest, so the first epoch
    fetches every pixel byte once (the server's range log); without them (a store written before) each block is
    learned on its first read: a read holding part of a block has the rest of it read, not the whole block again,
    so the first epoch fetches less than twice the pixels.  The batches are the local file's, checked or not."""
    url, local = range_server.url + "store.h5", str(range_server.root / "store.h5")
    if layout == "blocks":
        drop_row_digests(local)
    kw = dict(batch_size=100, memory_budget="96MiB", rows_per_fill=2048, seed=3)
    with h5stream.open(url, **kw) as s:
        assert s.plan.unit_rows < s.meta.block_rows, s.plan.describe()  # reads hold parts of blocks
        remote = [(x.copy(), y.copy()) for x, y in s]
        stats, pixels = s.stats(), s.meta.rows * s.meta.row_bytes
    if layout == "rows":
        # Every row's digest read; a few more where two reads of the same rows race (the first fill's first batch
        # is read ahead of its runs: docs/design.md, "The local disk cache"), each checking them itself.
        assert stats["verify_learn_bytes"] == 0
        assert s.meta.rows * 8 <= stats["verify_digest_bytes"] < 2 * s.meta.rows * 8, stats
        assert image_bytes_fetched(range_server, local).max() == 1, "a pixel byte was fetched twice"
    else:
        assert 0 < stats["verify_learn_bytes"] < pixels, (stats, pixels)
    with h5stream.open(local, **kw, verify_reads=False) as s:
        here = [(x.copy(), y.copy()) for x, y in s]
    assert len(here) == len(remote) and all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
                                            for a, b in zip(here, remote))


def test_with_default_options_a_url_reads_chunk_sized_units_and_gives_the_local_files_batches(range_server):
    """55 MB of 12 KiB rows in 3 MiB chunks: a store this small keeps units near 1 MiB (64 rows: a 1/1152 share
    of the epoch is less), the same for the URL and the local file; an epoch's pixels take at most one GET per
    unit, and the URL gives the local file's batches, epoch after epoch, with no option set."""
    rows = 4500
    local = str(range_server.root / "big.h5")
    ids = np.arange(rows)
    images = np.empty((rows, 64, 64, 3), np.uint8)
    images[...] = (ids % 251).astype(np.uint8)[:, None, None, None]
    write_arrays(local, images, ids.astype(np.float32), block_rows=256, storage_order="sorted")
    del images
    with h5stream.open(local, batch_size=64, seed=5) as a:
        here = [[y.copy() for _, y in a] for _ in range(2)]
        local_unit = a.plan.unit_rows
    before = range_server.requests.get("GET", 0)
    with h5stream.open(range_server.url + "big.h5", batch_size=64, seed=5) as b:
        assert b.plan.unit_rows == local_unit == 64, b.plan.describe()
        there = [[y.copy() for _, y in b] for _ in range(2)]
    gets = range_server.requests.get("GET", 0) - before
    assert gets <= 2 * -(-rows // 64) + 10, gets  # two epochs of whole units, plus the metadata's few
    assert all(np.array_equal(p, q) for e1, e2 in zip(here, there) for p, q in zip(e1, e2))
    assert [len(e) for e in here] == [len(e) for e in there]
    assert sorted(np.concatenate(there[1]).astype(np.int64).tolist()) == list(range(rows))


def test_the_default_unit_is_a_whole_chunk_under_the_default_budget_for_a_url_and_its_local_file(remote_store_file):
    """A large store (6 GB of 3 KiB rows, 1024-row chunks of 3 MiB): under the default budget the fill is over
    100 MiB, so the default unit is the whole chunk, one request of the size an object store serves at its full
    rate, for the URL and the local file alike; a small budget's fill keeps 1 MiB units (256 rows), so the
    shuffle still mixes many places of the file, and so does a store of 300 MB (a 1/1152 share of its epoch is
    under 1 MiB: two epochs' orders stay unrelated)."""
    import dataclasses

    from h5stream.streaming.planning import plan_stream

    local = dataclasses.replace(h5stream.read_meta(remote_store_file), rows=2_000_000)
    assert (local.block_rows, local.row_bytes) == (1024, 3072)
    remote = dataclasses.replace(local, remote=RemoteOptions())
    here, there = plan_stream(local, None, 32), plan_stream(remote, None, 32)
    assert here.rows_per_fill * local.row_bytes >= 96 << 20
    assert here.unit_rows == there.unit_rows == 1024 and here.rows_per_fill == there.rows_per_fill
    small = plan_stream(local, 96 << 20, 32)  # the URL's, if its client fits beside this fill
    assert small.unit_rows == 256 and small.rows_per_fill // small.unit_rows >= 4
    assert plan_stream(remote, None, 32, unit_bytes=1 << 20).unit_rows == 256  # a given read_unit is kept
    few = dataclasses.replace(remote, rows=100_000)
    few_here = dataclasses.replace(local, rows=100_000)
    assert plan_stream(few, None, 32).unit_rows == plan_stream(few_here, None, 32).unit_rows == 256


@pytest.mark.parametrize("url, why", [("http://256.1.1.1/x.h5", "invalid IPv4 address"),
                                      ("http://:80/x.h5", "empty host"),
                                      ("http://host:99999/x.h5", "Port out of range")])
def test_a_url_the_client_cannot_parse_is_one_line_malformed_not_a_traceback(url, why, h5cli):
    pytest.importorskip("obstore")
    with pytest.raises(ConfigError, match=f"malformed URL .{why}"):
        h5stream.open(url, batch_size=4)
    code, out, err = h5cli("info", url)
    lines = err.strip().splitlines()
    assert code != 0 and out == "" and len(lines) == 1 and lines[0].startswith("h5stream: error: ")
    assert "malformed URL" in lines[0] and "timeout_s" not in lines[0]


def test_an_s3_endpoint_with_a_bad_port_is_one_line_not_a_client_panic(monkeypatch):
    pytest.importorskip("obstore")
    for name, value in (("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s"),
                        ("AWS_ENDPOINT_URL", "http://127.0.0.1:99999")):
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match="S3 endpoint 'http://127.0.0.1:99999' is not a valid"):
        h5stream.open("s3://bucket/store.h5", batch_size=4)


@pytest.mark.parametrize("url", ["gs://bucket/store.h5", "ftp://host/store.h5", "AZ://container/store.h5"])
def test_a_url_of_a_scheme_h5stream_does_not_read_is_named_so_not_a_missing_file(url, h5cli):
    with pytest.raises(ConfigError, match=f"{url.split(':')[0].lower()}:// URLs are not supported") as info:
        h5stream.open(url, batch_size=4)
    assert "no such file" not in str(info.value) and "ingest" not in str(info.value)
    code, out, err = h5cli("info", url)
    lines = err.strip().splitlines()
    assert code != 0 and out == "" and len(lines) == 1 and "URLs are not supported" in lines[0]
