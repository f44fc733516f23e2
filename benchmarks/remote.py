"""A store served by a local SeaweedFS (S3): the remote stream vs the same file streamed locally, cold, vs h5py over
fsspec (s3fs) reading the same batches; memory against the budget; time to the first batch.

    python -m benchmarks.remote                  # 1.1 GB store, the table and the target checks
    python -m benchmarks.remote --json           # one JSON object with every run
    python -m benchmarks.remote --gb 0.2 --epochs 1 --fsspec-seconds 10   # a quick try

Makes the store with :func:`benchmarks.data.make_bench_file` when missing, starts ``weed server -s3`` on
127.0.0.1 (:class:`benchmarks.seaweed.SeaweedS3`, data under ``--data``), uploads the store, and runs each
measurement in a fresh process (``h5stream bench``'s :func:`~h5stream.commands.bench.measure_stream` for the
two streams, so memory is sampled the same way).  Cold means the bytes come from the disk: the local file is
read with ``O_DIRECT`` (``direct_io=True``: eviction alone does not keep a file smaller than RAM out of the
page cache while it is read), and the server's volume files are kept out of the page cache while the remote
store is streamed (otherwise the server would answer from memory).  The fsspec baseline opens the object with
s3fs's defaults and reads each batch of the stream's own first-epoch order with one h5py fancy-index read (rows
sorted, as h5py requires), for at most ``--fsspec-seconds``; its epoch rate is extrapolated, which the table
says.  Rounds (``--rounds``) are interleaved; rates are medians, memory the largest peak.  Server and client
share this machine's cores: on a small machine the server's CPU is part of what is measured.

The same store is also streamed over plain HTTP from SeaweedFS's filer (which honours Range), the
``https://`` path; the server's CPU seconds per GB streamed are reported for both.

Targets (the issue's): remote >= 0.8x the local cold stream, >= 10x h5py over fsspec, peak memory <= budget.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from benchmarks.data import make_bench_file, rows_for_gb
from benchmarks.harness import (
    by_name,
    child_command,
    child_env,
    evict_folder,
    interleave,
    log,
    median,
    run_cli,
)

KEY = "bench/store.h5"
EVICT_EVERY_S = 0.5


def child(argv: list[str]) -> int:
    """In a fresh process: ``stream URL_OR_PATH COLD BATCH BUDGET EPOCHS SEED ROWS_PER_FILL READ_UNIT`` (COLD:
    ``no``, ``evict`` or ``direct``; READ_UNIT: ``default`` or bytes) or ``fsspec URL ORDER.npy BATCH
    SECONDS``; prints one JSON object."""
    kind = argv[0]
    if kind == "stream":
        from h5stream.commands.bench import measure_stream
        from h5stream.errors import ConfigError
        from h5stream.read.source import resolve_direct_io
        from h5stream.store.meta import read_meta

        path, cold, batch, budget, epochs, seed, fill = argv[1], argv[2], int(argv[3]), argv[4], \
            int(argv[5]), int(argv[6]), int(argv[7])
        read_unit = argv[8] if len(argv) > 8 and argv[8] != "default" else None
        t0 = time.monotonic()
        meta = read_meta(path)
        meta_s = time.monotonic() - t0
        # O_DIRECT where the file system takes it; else (tmpfs) evicting the file as it is read
        try:
            direct = cold == "direct" and resolve_direct_io(path, True)
        except ConfigError:
            direct = False
        from h5stream.read.plan import parse_bytes

        figures, _ = measure_stream(meta, batch_size=batch, budget=parse_bytes(budget), epochs=epochs, seed=seed,
                                    cold=cold == "evict" or (cold == "direct" and not direct), augment=None,
                                    workers=0, progress=False, rows_per_fill=fill,
                                    direct_io=True if direct else "auto", read_unit=read_unit)
        keep = ("samples_per_s", "mb_per_s", "startup_s", "first_batch_s", "epoch_seconds", "steady_mb_per_s",
                "compare_mb_per_s", "compare_basis", "peak_mem_bytes", "peak_rss_delta_bytes", "within_budget",
                "mean_cpu_pct")
        out = {k: figures[k] for k in keep}
        out["read_meta_s"] = meta_s
        out["direct_io"] = direct
        out["first_order_head"] = [int(v) for v in figures["orders"][0][:8]]
    elif kind == "open":
        out = _open_cost(argv[1])
    elif kind == "ceiling":
        out = _ceiling(argv[1])
    else:
        out = _fsspec(argv[1], argv[2], int(argv[3]), float(argv[4]))
    print(json.dumps(out))
    return 0


def _ceiling(url: str, request_bytes: int = 4 << 20, in_flight: int = 8) -> dict:
    """The server's own limit here: the whole object fetched once with plain ranged GETs (obstore, 4 MiB, 8 in
    flight, bodies dropped), no HDF5 and no stream."""
    import concurrent.futures

    import obstore

    from h5stream.remote.config import RemoteOptions, parse_url
    from h5stream.remote.source import make_store

    location = parse_url(url)
    store = make_store(location, RemoteOptions())
    size = int(obstore.head(store, location.key)["size"])
    t0 = time.monotonic()

    def fetch(start):
        return len(obstore.get_range(store, location.key, start=start, end=min(start + request_bytes, size)))

    with concurrent.futures.ThreadPoolExecutor(in_flight) as pool:
        got = sum(pool.map(fetch, range(0, size, request_bytes)))
    seconds = time.monotonic() - t0
    return {"mb_per_s": got / seconds / 1e6, "seconds": seconds, "bytes": got}


def _open_cost(url: str) -> dict:
    """Requests and seconds to learn what a stream needs of a remote store before its first read: the
    description, every chunk's offset and every label (what the reader's locate step does)."""
    from h5stream.read.locate import chunk_offsets
    from h5stream.remote.fileobj import remote_h5
    from h5stream.store.meta import _describe as describe

    t0 = time.monotonic()
    with remote_h5(url) as (f, raw):
        meta = describe(url, f)
        offsets = chunk_offsets(f["images"], meta.rows, meta.block_rows, url)
        labels = f["labels"][:meta.rows]
        return {"open_requests": raw.source.requests, "open_s": time.monotonic() - t0, "chunks": len(offsets),
                "label_chunks": -(-len(labels) // f["labels"].chunks[0])}


def _fsspec(url: str, order_path: str, batch: int, seconds: float) -> dict:
    import h5py
    import s3fs

    order = np.load(order_path)
    fs = s3fs.S3FileSystem(endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    t0 = time.monotonic()
    rows = 0
    first_batch_s = None
    with fs.open(url.removeprefix("s3://"), "rb") as fh, h5py.File(fh, "r") as f:
        images, labels = f["images"], f["labels"]
        row_bytes = int(np.prod(images.shape[1:]))
        open_s = time.monotonic() - t0
        start = time.monotonic()
        for b in range(0, len(order), batch):
            idx = np.sort(order[b:b + batch])
            x, y = images[idx], labels[idx]
            rows += len(idx)
            if first_batch_s is None:
                first_batch_s = time.monotonic() - t0
            if time.monotonic() - start >= seconds:
                break
        elapsed = time.monotonic() - start
    del x, y
    rate = rows / elapsed
    return {"samples_per_s": rate, "mb_per_s": rate * row_bytes / 1e6, "rows_read": rows,
            "extrapolated": rows < len(order), "open_s": open_s, "first_batch_s": first_batch_s}


@contextlib.contextmanager
def kept_cold_folder(folder: str, cold: bool = True):
    """Keep every file under ``folder`` out of the page cache while the block runs (a thread evicting it)."""
    if not cold:
        yield
        return
    stop = threading.Event()

    def run():
        while not stop.is_set():
            evict_folder(folder)
            stop.wait(EVICT_EVERY_S)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _run(argv: list, env: dict) -> dict:
    cmd = child_command("benchmarks.remote:child", *argv)
    log("+ " + " ".join(map(str, argv)))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"benchmarks.remote: {argv[0]} run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(args) -> dict:
    import h5stream
    from benchmarks.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3
    from h5stream.measure import evict_from_page_cache

    size = 128
    local = os.path.join(args.data, f"remote-{args.gb:g}g.h5")
    make_bench_file(local, rows=rows_for_gb(args.gb, size, 3), size=size, progress=True)
    os.makedirs(args.data, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.data, prefix="seaweed-") as workdir:
        t0 = time.monotonic()
        server = SeaweedS3(workdir)
        start_s = time.monotonic() - t0
        try:
            t0 = time.monotonic()
            server.put(KEY, local)
            upload_s = time.monotonic() - t0
            url = f"s3://{server.bucket}/{KEY}"
            env = child_env(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                            AWS_ENDPOINT_URL=server.endpoint, AWS_EC2_METADATA_DISABLED="true")
            # The remote client's memory comes out of the budget, so its fill is smaller: both streams use it,
            # and give the same batches.
            fill = remote_rows_per_fill(local, args)
            with h5stream.open(local, batch_size=args.batch_size, memory_budget=args.memory_budget,
                               seed=args.seed, rows_per_fill=fill, read_unit=args.read_unit) as s:
                order = s.epoch_order(0)
            order_path = os.path.join(workdir, "order.npy")
            np.save(order_path, order)
            stream_args = [args.batch_size, args.memory_budget, args.epochs, args.seed, fill,
                           args.read_unit or "default"]

            def remote(target=url):
                evict_folder(workdir)
                before = _cpu_s(server.process.pid)
                with kept_cold_folder(workdir):
                    result = _run(["stream", target, "no", *stream_args], env)
                result["server_cpu_s"] = _cpu_s(server.process.pid) - before
                return result

            def ceiling(target):
                evict_folder(workdir)
                with kept_cold_folder(workdir):
                    return _run(["ceiling", target], env)

            def local_cold():  # O_DIRECT: every byte from the disk, whatever the page cache holds
                evict_from_page_cache(local)
                return _run(["stream", local, "direct", *stream_args], env)

            def fsspec():
                evict_folder(workdir)
                with kept_cold_folder(workdir):
                    return _run(["fsspec", url, order_path, args.batch_size, args.fsspec_seconds], env)

            runs = {"remote": remote, "remote_http": lambda: remote(server.http_url(KEY)), "local_cold": local_cold,
                    "open": lambda: _run(["open", url], env)}
            for name, target in (("ceiling", url), ("ceiling_http", server.http_url(KEY))):
                runs[name] = functools.partial(ceiling, target)
            if not args.no_fsspec:
                runs["fsspec"] = fsspec
            rounds = interleave(runs, args.rounds)
        finally:
            server.stop()
    return summarize(by_name(rounds), args, local=local, url=url, start_s=start_s, upload_s=upload_s)


def remote_rows_per_fill(local: str, args) -> int:
    """The fill a stream of this store over a URL plans under ``--memory-budget`` (no request needed)."""
    import dataclasses

    from h5stream.read.plan import parse_bytes
    from h5stream.remote import RemoteOptions
    from h5stream.store.meta import read_meta
    from h5stream.budget import plan_stream

    meta = dataclasses.replace(read_meta(local), remote=RemoteOptions())
    return plan_stream(meta, parse_bytes(args.memory_budget), args.batch_size).rows_per_fill


def _cpu_s(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def summarize(results: dict, args, **facts) -> dict:
    def med(name, key):
        return median(r.get(key) for r in results.get(name, []))

    from h5stream.read.plan import parse_bytes

    out = {
        "command": "python -m benchmarks.remote " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "system": platform.platform()},
        "store_bytes": os.path.getsize(facts["local"]), "url": facts["url"],
        "server_start_s": facts["start_s"],
        "upload_mb_per_s": os.path.getsize(facts["local"]) / facts["upload_s"] / 1e6,
        "budget_bytes": parse_bytes(args.memory_budget), "rounds": args.rounds, "read_unit": args.read_unit,
        "runs": results,
    }
    opens = results.pop("open", [])
    if opens:
        out["open_requests"] = max(r["open_requests"] for r in opens)
        out["open_s"] = median(r["open_s"] for r in opens)
        out["chunks"], out["label_chunks"] = opens[0]["chunks"], opens[0]["label_chunks"]
    for name in ("ceiling", "ceiling_http"):
        if name in results:
            out[f"{name}_mb_per_s"] = median(r["mb_per_s"] for r in results.pop(name))
    for name in results:
        out[f"{name}_mb_per_s"] = med(name, "compare_mb_per_s") if name != "fsspec" else med(name, "mb_per_s")
        out[f"{name}_first_batch_s"] = med(name, "first_batch_s")
    for name in ("remote", "remote_http", "local_cold"):
        if name in results:
            out[f"{name}_peak_mem_bytes"] = max(r["peak_mem_bytes"] for r in results[name])
    for name in ("remote", "remote_http"):
        if name in results:  # bytes the stream read: the store's pixels, once per epoch
            gb = out["store_bytes"] * args.epochs / 1e9
            out[f"{name}_server_cpu_s_per_gb"] = median(r["server_cpu_s"] / gb for r in results[name])
    same = [r["first_order_head"] for name in ("remote", "remote_http", "local_cold") for r in results.get(name, [])]
    out["same_order"] = all(h == same[0] for h in same)
    remote, cold, fs = out.get("remote_mb_per_s"), out.get("local_cold_mb_per_s"), out.get("fsspec_mb_per_s")
    out["remote_vs_local_cold"] = remote / cold if remote and cold else None
    out["remote_vs_fsspec"] = remote / fs if remote and fs else None
    for name, ceil in (("remote", "ceiling"), ("remote_http", "ceiling_http")):
        if out.get(f"{name}_mb_per_s") and out.get(f"{ceil}_mb_per_s"):
            out[f"{name}_vs_server_limit"] = out[f"{name}_mb_per_s"] / out[f"{ceil}_mb_per_s"]
    vs_cold, vs_fs = out["remote_vs_local_cold"], out["remote_vs_fsspec"]
    out["targets"] = {
        "remote >= 0.8x local cold": None if vs_cold is None else vs_cold >= 0.8,
        "remote >= 10x h5py+fsspec": None if vs_fs is None else vs_fs >= 10,
        "peak <= budget": out.get("remote_peak_mem_bytes", 0) <= out["budget_bytes"],
    }
    return out


def format_text(r: dict) -> str:
    mib = 1 << 20
    lines = [
        f"{r['command']}",
        f"store {r['store_bytes'] / 1e9:.2f} GB at {r['url']} (SeaweedFS on 127.0.0.1, started in "
        f"{r['server_start_s']:.1f} s, upload {r['upload_mb_per_s']:.0f} MB/s); budget "
        f"{r['budget_bytes'] / mib:.0f} MiB; read_unit {r.get('read_unit') or 'default'}; {r['rounds']} round(s), "
        "medians",
        "",
        f"{'reader':<28}{'MB/s':>9}{'first batch':>13}{'peak memory':>14}",
    ]
    names = {"remote": "h5stream, s3:// (cold)", "remote_http": "h5stream, http:// (cold)",
             "local_cold": "h5stream, local file (cold)", "fsspec": "h5py over fsspec (s3fs)"}
    for key, label in names.items():
        if f"{key}_mb_per_s" not in r:
            continue
        peak = r.get(f"{key}_peak_mem_bytes")
        first = r.get(f"{key}_first_batch_s")
        extra = " (extrapolated)" if key == "fsspec" and any(x.get("extrapolated") for x in r["runs"][key]) else ""
        lines.append(f"{label:<28}{r[f'{key}_mb_per_s']:>9.0f}{first if first is not None else float('nan'):>12.2f}s"
                     f"{(peak / mib if peak is not None else float('nan')):>11.0f} MiB{extra}")
    lines.append("")
    for key, label in (("remote", "S3 gateway"), ("remote_http", "filer over HTTP")):
        if f"{key}_server_cpu_s_per_gb" in r:
            lines.append(f"server CPU ({label}): {r[f'{key}_server_cpu_s_per_gb']:.1f} s per GB streamed")
    if "open_requests" in r:
        lines.append(f"describe the store, list its {r['chunks']} chunks and read its labels ({r['label_chunks']} "
                     f"chunks): {r['open_requests']} requests, {r['open_s']:.2f} s")
    for key, label in (("remote", "s3://"), ("remote_http", "http://")):
        if f"{key}_vs_server_limit" in r:
            ceil = r["ceiling_mb_per_s" if key == "remote" else "ceiling_http_mb_per_s"]
            lines.append(f"server limit {label} (plain ranged GETs, 4 MiB, 8 in flight): {ceil:.0f} MB/s; "
                         f"the stream reaches {r[f'{key}_vs_server_limit']:.2f}x of it")
    if r["remote_vs_local_cold"] is not None:
        lines.append(f"remote / local cold: {r['remote_vs_local_cold']:.2f}x")
    if r["remote_vs_fsspec"] is not None:
        lines.append(f"remote / h5py+fsspec: {r['remote_vs_fsspec']:.1f}x")
    lines.append(f"same batches remote and local: {r['same_order']}")
    lines += [f"target {name}: {'met' if ok else ('not met' if ok is not None else 'not measured')}"
              for name, ok in r["targets"].items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.remote", description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.1, help="store size (default 1.1)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--memory-budget", default="512MiB")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--read-unit", default=None,
                        help="the streams' read_unit (default: h5stream's, about 1 MiB; e.g. 4MiB)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--fsspec-seconds", type=float, default=60.0, help="time limit of the fsspec baseline")
    parser.add_argument("--no-fsspec", action="store_true", help="skip the fsspec baseline (needs s3fs)")
    return run_cli(parser, argv, run, format_text)


if __name__ == "__main__":
    sys.exit(main())
