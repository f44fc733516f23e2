"""The local disk cache of a URL store: epoch 1 and epochs 2+ of a stream over ``s3://`` with the cache, against
the same store read as a local file, and the bytes fetched from the server per epoch.

    python -m benchmarks.remote_cache                          # 0.5 GB store, 3 epochs, the table
    python -m benchmarks.remote_cache --gb 0.1 --epochs 3 --json
    python -m benchmarks.remote_cache --latency-ms 20 --bandwidth-mbs 100   # through the proxy of benchmarks.remote

Makes the store with :func:`benchmarks.data.make_bench_file` when missing, starts ``weed server -s3`` on 127.0.0.1
(:class:`benchmarks.seaweed.SeaweedS3`), uploads the store, and runs, each in a fresh process: the URL stream with
``cache_dir`` a new empty folder (epoch 1 fills the cache), a second process on the same folder (the next run:
every piece already there), the URL stream without the cache (``cache_dir=None``), and the local file (its epoch 1
from the disk after the file is evicted from the page cache, later epochs as the page cache keeps it). Bytes
fetched per epoch are what the cache folder grew by during it (the pieces fetched; the store's header and chunk
index, read at open, are not in it); through the proxy (the options of :mod:`benchmarks.remote`, see
:mod:`benchmarks.remote_wire`) the run's bytes on the wire are shown too. Rates are the rows' bytes over each
epoch's wall time.

Target: epochs 2+ with the store within ``cache_limit`` >= 0.9x the local file's epochs 2+; 0 bytes fetched in
them.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from benchmarks.data import make_bench_file, rows_for_gb
from benchmarks.harness import child_command, child_env, median, new_parser, run_cli
from benchmarks.remote_wire import add_options, proxy_settings, routes

KEY = "bench/cache-store.h5"


def folder_bytes(folder: str) -> int:
    """Bytes of the files under ``folder`` (0 when it does not exist)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def child(argv: list[str]) -> int:
    """In a fresh process: ``PATH_OR_URL CACHE_DIR EPOCHS BATCH`` (CACHE_DIR ``none`` for a local file, ``off`` for
    a URL without the cache); prints
    one JSON object: the seconds, rows' bytes and bytes the cache grew by of each epoch."""
    import h5stream
    from h5stream.measure import evict_from_page_cache

    path, cache, epochs, batch = argv[0], argv[1], int(argv[2]), int(argv[3])
    kw = {} if cache == "none" else {"cache_dir": None if cache == "off" else cache}
    if cache == "none":
        evict_from_page_cache(path)
    out = {"seconds": [], "bytes": [], "fetched": []}
    with h5stream.open(path, batch_size=batch, seed=0, **kw) as stream:
        row_bytes = stream.meta.row_bytes
        for _ in range(epochs):
            before = folder_bytes(cache) if cache not in ("none", "off") else 0
            t0, rows = time.monotonic(), 0
            for x, _ in stream:
                rows += len(x)
            out["seconds"].append(time.monotonic() - t0)
            out["bytes"].append(rows * row_bytes)
            out["fetched"].append(None if cache == "off" else (folder_bytes(cache) if cache != "none" else 0) - before)
    print(json.dumps(out))
    return 0


def _run(argv: list, env: dict) -> dict:
    import subprocess

    proc = subprocess.run(child_command("benchmarks.remote_cache:child", *argv), env=env, capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"benchmarks.remote_cache: a run failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rates(run: dict) -> dict:
    """Epoch 1's MB/s and the median of epochs 2+ (None with one epoch)."""
    mbs = [b / s / 1e6 for b, s in zip(run["bytes"], run["seconds"])]
    return {"epoch1_mb_per_s": mbs[0], "later_mb_per_s": median(mbs[1:]), "fetched_per_epoch": run["fetched"],
            **({"wire": run["wire"]} if "wire" in run else {})}


def run(args) -> dict:
    from benchmarks.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3

    proxy = proxy_settings(args)
    local = os.path.join(args.data, f"remote-cache-{args.gb:g}g.h5")
    os.makedirs(args.data, exist_ok=True)
    make_bench_file(local, rows=rows_for_gb(args.gb, 128, 3), size=128, progress=True)
    with tempfile.TemporaryDirectory(dir=args.data, prefix="seaweed-") as workdir:
        server = SeaweedS3(workdir)
        try:
            server.put(KEY, local)
            url = f"s3://{server.bucket}/{KEY}"
            env = child_env(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                            AWS_ENDPOINT_URL=server.endpoint, AWS_EC2_METADATA_DISABLED="true")
            cache = os.path.join(workdir, "cache")
            with routes(proxy, {"remote": url}, server.endpoint) as ways:
                way = ways[-1]
                env = {**env, "AWS_ENDPOINT_URL": way.endpoint}
                out = {}
                for name in ("cached_first_run", "cached_next_run"):
                    with way.counted("remote") as wire:
                        out[name] = _run([url, cache, args.epochs, args.batch_size], env)
                    out[name] |= wire
                with way.counted("remote") as wire:
                    out["uncached"] = _run([url, "off", args.epochs, args.batch_size], env)
                out["uncached"] |= wire
                out["local"] = _run([local, "none", args.epochs, args.batch_size], env)
        finally:
            server.stop()
    result = {name: rates(r) for name, r in out.items()}
    local_later = result["local"]["later_mb_per_s"]
    later = result["cached_first_run"]["later_mb_per_s"]
    result["later_vs_local"] = later / local_later if later and local_later else None
    result["store_bytes"] = os.path.getsize(local)
    result["command"] = " ".join(["python -m benchmarks.remote_cache", *sys.argv[1:]])
    return result


def format_text(r: dict) -> str:
    lines = [f"{'run':<18} {'epoch 1 MB/s':>13} {'epochs 2+ MB/s':>15}  bytes fetched per epoch (MB)"]
    for name in ("cached_first_run", "cached_next_run", "uncached", "local"):
        row = r[name]
        later = "-" if row["later_mb_per_s"] is None else f"{row['later_mb_per_s']:.0f}"
        fetched = {"local": "(disk)", "uncached": "(every epoch)"}.get(name) or ", ".join(
            f"{b / 1e6:.1f}" for b in row["fetched_per_epoch"])
        lines.append(f"{name:<18} {row['epoch1_mb_per_s']:>13.0f} {later:>15}  {fetched}")
    ratio = r["later_vs_local"]
    lines.append(f"epochs 2+ with the cache / local file: {'-' if ratio is None else f'{ratio:.2f}x'} "
                 "(target >= 0.9x)")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = new_parser(__doc__.splitlines()[0], prog="python -m benchmarks.remote_cache")
    parser.add_argument("--gb", type=float, default=0.5, help="store size, GB")
    parser.add_argument("--batch-size", type=int, default=64, help="rows per batch")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per stream")
    add_options(parser)
    return run_cli(parser, argv, run, format_text)


if __name__ == "__main__":
    sys.exit(main())
