"""What a local SeaweedFS server costs per access pattern: plain ranged GETs (obstore, no HDF5, no stream) of the
remote benchmark's store, in 1 MiB units, in whole chunks (the default unit under the default budget), widened to
the server's own 4 MiB chunks, and sequentially; throughput and the server's CPU seconds per GB.

    python -m benchmarks.remote_patterns [--gb 1.1] [--rounds 2] [--json]

The store is the one :mod:`benchmarks.remote` makes (``bench-data/remote-<gb>g.h5``); the server's files are
evicted from the page cache before each pattern.  Server and client share this machine's cores.
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
import tempfile
import time
from statistics import median

import numpy as np

from benchmarks.data import make_bench_file, rows_for_gb
from benchmarks.harness import evict_folder, new_parser, run_cli

SERVER_CHUNK = 4 << 20
"""SeaweedFS's filer stores an object in chunks of this size (its default ``-filer.maxMB``)."""


def patterns(path: str) -> dict[str, tuple[list[tuple[int, int]], int]]:
    """name -> (byte ranges in request order, requests in flight) for the store at ``path``."""
    from h5stream.read.locate import locate
    from h5stream.read.plan import unit_rows_for
    from h5stream.store.meta import read_meta

    meta = read_meta(path)
    size = os.path.getsize(path)
    offsets = [int(o) for o in locate(meta, cache_labels=False).image_chunks]
    chunk = meta.block_rows * meta.row_bytes
    unit = unit_rows_for(meta.block_rows, meta.row_bytes, False) * meta.row_bytes
    rng = np.random.default_rng(0)

    def shuffled(ranges):
        return [ranges[i] for i in rng.permutation(len(ranges))]

    chunks = [(o, o + chunk) for o in offsets]
    units = [(o + k, o + k + unit) for o in offsets for k in range(0, chunk, unit)]
    widened = [(a // SERVER_CHUNK * SERVER_CHUNK, min(-(-b // SERVER_CHUNK) * SERVER_CHUNK, size)) for a, b in chunks]
    sequential = [(s, min(s + SERVER_CHUNK, size)) for s in range(0, size, SERVER_CHUNK)]
    return {
        f"{unit >> 10} KiB units (read_unit='1MiB', the former default), shuffled": (shuffled(units), 8),
        f"whole HDF5 chunks ({chunk / (1 << 20):.0f} MiB), shuffled": (shuffled(chunks), 8),
        "whole chunks widened to the server's 4 MiB chunks, shuffled": (shuffled(widened), 8),
        "sequential 4 MiB, aligned": (sequential, 8),
    }


def run(args) -> dict:
    import obstore
    import psutil

    from benchmarks.seaweed import SeaweedS3

    local = os.path.join(args.data, f"remote-{args.gb:g}g.h5")
    make_bench_file(local, rows=rows_for_gb(args.gb, 128, 3), size=128, progress=True)
    todo = patterns(local)
    results: dict[str, list[dict]] = {name: [] for name in todo}
    with tempfile.TemporaryDirectory(dir=args.data, prefix="seaweed-") as workdir:
        server = SeaweedS3(workdir)
        try:
            server.put("store.h5", local)
            store, proc = server.store(), psutil.Process(server.process.pid)
            for _ in range(args.rounds):
                for name, (ranges, in_flight) in todo.items():
                    evict_folder(workdir)
                    cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()

                    def get(r):
                        return len(obstore.get_range(store, "store.h5", start=r[0], end=r[1]))

                    with concurrent.futures.ThreadPoolExecutor(in_flight) as pool:
                        got = sum(pool.map(get, ranges))
                    seconds = time.monotonic() - t0
                    cpu = sum(proc.cpu_times()[:2]) - cpu0
                    results[name].append({"mb_per_s": got / seconds / 1e6, "server_cpu_s_per_gb": cpu / (got / 1e9),
                                          "requests": len(ranges)})
        finally:
            server.stop()
    return {"command": "python -m benchmarks.remote_patterns " + " ".join(sys.argv[1:]), "rounds": args.rounds,
            "patterns": {name: {"mb_per_s": median(r["mb_per_s"] for r in runs),
                                "server_cpu_s_per_gb": median(r["server_cpu_s_per_gb"] for r in runs),
                                "requests": runs[0]["requests"], "runs": runs} for name, runs in results.items()}}


def format_text(r: dict) -> str:
    lines = [r["command"], f"{r['rounds']} round(s), medians", "",
             f"{'ranges':<62}{'MB/s':>8}{'server CPU s/GB':>17}{'requests':>10}"]
    for name, p in r["patterns"].items():
        lines.append(f"{name:<62}{p['mb_per_s']:>8.0f}{p['server_cpu_s_per_gb']:>17.1f}{p['requests']:>10}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = new_parser(__doc__.splitlines()[0], prog="python -m benchmarks.remote_patterns")
    parser.add_argument("--gb", type=float, default=1.1, help="store size, GB (the remote benchmark's)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; medians")
    return run_cli(parser, argv, run, format_text)


if __name__ == "__main__":
    sys.exit(main())
