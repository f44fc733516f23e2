"""The stream's one copy alone: 16-row runs of a warm store into scattered rows of 20 batches, against one large copy.

    python -m benchmarks.loader_copies                  # the store of benchmarks.loader, 4 rounds
    python -m benchmarks.loader_copies --rounds 6 --json

What the reader's I/O threads do, without the stream around it: ``preadv`` each run of 16 rows from the page cache
straight into 16 scattered rows of 240 MiB of batches (20 batches of 256 rows, as ``benchmarks.loader``'s budget
makes them), by one thread and by two (the reader's I/O threads), into batches on 4 KiB pages and on transparent
huge pages (``MADV_HUGEPAGE`` before the first touch); and, staged, each run read whole into one buffer and copied
into its rows by numpy.  Each round also times ``benchmarks.loader``'s reference, ``np.copyto`` between two 256 MiB
arrays; the ratios are taken within each round (medians, min-max), with the CPU time per row (threads together).
"""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np

from benchmarks.harness import add_json_option, by_name, emit, interleave, median, new_parser, warm
from benchmarks.loader import add_store_options, copy_rate, store_path

RUN, BATCHES, BATCH = 16, 20, 256


class Runs:
    """The runs of one pass: ``RUN``-row runs from random places of the store into a random permutation of the
    batches' rows."""

    def __init__(self, path: str):
        from h5stream.memory.rawio import private_memory
        from h5stream.read.locate import locate
        from h5stream.store.meta import read_meta

        meta = read_meta(path)
        chunks = locate(meta, False, digests=False).image_chunks
        self.row_bytes, rows = meta.row_bytes, BATCHES * BATCH
        rng = np.random.default_rng(0)
        firsts = rng.permutation(meta.rows // RUN)[:rows // RUN] * RUN
        blocks = firsts // meta.block_rows
        self.offsets = (chunks[blocks] + (firsts - blocks * meta.block_rows) * meta.row_bytes).tolist()
        self.dest = rng.permutation(rows).reshape(-1, RUN)
        self.fd = os.open(path, os.O_RDONLY)
        self.memory = {}
        for huge in (False, True):
            mem = private_memory(rows * self.row_bytes)
            if huge:
                mem.madvise(14)  # MADV_HUGEPAGE, before the first touch
            batches = np.frombuffer(mem, np.uint8).reshape(rows, self.row_bytes)
            batches[:, ::4096] = 1  # touched once: no page faults in the timed passes
            self.memory[huge] = (mem, batches)

    def preadv(self, batches: np.ndarray, lo: int, hi: int) -> None:
        rb, view = self.row_bytes, memoryview(batches.reshape(-1))
        for off, dest in zip(self.offsets[lo:hi], self.dest[lo:hi].tolist()):
            os.preadv(self.fd, [view[k * rb:(k + 1) * rb] for k in dest], off)

    def staged(self, batches: np.ndarray, lo: int, hi: int) -> None:
        stage = np.empty((RUN, self.row_bytes), np.uint8)
        for off, dest in zip(self.offsets[lo:hi], self.dest[lo:hi]):
            os.preadv(self.fd, [stage], off)
            batches[dest] = stage

    def rate(self, how: str, huge: bool, threads: int) -> dict:
        """Rows per second and CPU µs per row of the best of 3 passes."""
        fn, batches, n = getattr(self, how), self.memory[huge][1], len(self.offsets)
        best = None
        for _ in range(3):
            t0, c0 = time.perf_counter(), time.process_time()
            parts = [threading.Thread(target=fn, args=(batches, k * n // threads, (k + 1) * n // threads))
                     for k in range(threads)]
            for t in parts:
                t.start()
            for t in parts:
                t.join()
            rows, wall = n * RUN, time.perf_counter() - t0
            got = {"steady_rows_s": rows / wall, "cpu_us_per_row": (time.process_time() - c0) / rows * 1e6}
            best = got if best is None or got["steady_rows_s"] > best["steady_rows_s"] else best
        return best


WAYS = {"preadv, 4 KiB pages, 1 thread": ("preadv", False, 1), "preadv, huge pages, 1 thread": ("preadv", True, 1),
        "preadv, 4 KiB pages, 2 threads": ("preadv", False, 2), "preadv, huge pages, 2 threads": ("preadv", True, 2),
        "staged, 4 KiB pages, 1 thread": ("staged", False, 1), "staged, huge pages, 1 thread": ("staged", True, 1)}


def run(path: str, rounds: int) -> dict:
    warm(path)
    runs = Runs(path)
    measurements = {"copy": lambda: copy_rate(runs.row_bytes)}
    for name, (how, huge, threads) in WAYS.items():
        measurements[name] = lambda how=how, huge=huge, threads=threads: runs.rate(how, huge, threads)
    got = interleave(measurements, rounds, progress=True)
    out = {"file": os.path.abspath(path), "row_bytes": runs.row_bytes, "rounds": rounds, "cpus": os.cpu_count(),
           "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None, "results": {}}
    for name, results in by_name(got).items():
        ratios = [r[name]["steady_rows_s"] / r["copy"]["steady_rows_s"] for r in got]
        out["results"][name] = {"steady_rows_s": median(x["steady_rows_s"] for x in results),
                                "cpu_us_per_row": median(x["cpu_us_per_row"] for x in results),
                                "over_copy": {"median": median(ratios), "min": min(ratios), "max": max(ratios)},
                                "rounds": results}
    return out


def table(out: dict) -> str:
    lines = [f"{BATCHES} batches of {BATCH} rows of {out['row_bytes']:,} B, runs of {RUN} rows, warm, {out['rounds']} "
             f"rounds (medians), {out['cpus']} CPUs, load average {out['load_average']:.1f} at the end",
             f"{'':<32} {'rows/s':>10} {'/ copy (same round)':>22} {'CPU us/row':>11}"]
    for name, r in out["results"].items():
        ratio = r["over_copy"]
        lines.append(f"{name:<32} {r['steady_rows_s']:>10,.0f} "
                     f"{ratio['median']:>8.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f}) {r['cpu_us_per_row']:>11.1f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = new_parser(__doc__.split("\n\n")[0])
    add_store_options(p)
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds; medians")
    add_json_option(p)
    args = p.parse_args(argv)
    path = store_path(args)
    emit(run(path, args.rounds), as_json=args.json, format_text=table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
