"""The cost of ``verify_reads``: the stream checking every read against the store's block checksums, and not.

    python -m benchmarks.verify_reads                          # bench-data/bench-1g.h5, made when missing
    python -m benchmarks.verify_reads --file /tmp/v.h5 --gb 0.5 --rounds 5
    python -m benchmarks.verify_reads --json                   # one JSON object
    python -m benchmarks.verify_reads --layouts rows           # the store as written only

Workloads (the store's 128x128x3 rows, batch 32, memory budget 256 MiB, the
default read unit: a quarter of a block per read):

* ``warm, epoch 1``: rows/s of the first epoch from ``open`` on, the file in
  the page cache: each row checked against its own digest (a store with row
  digests), or each block read and hashed whole once more (learned);
* ``warm, epochs 2-3``: rows/s of epochs 2 and 3, the steady state: each
  row checked against its digest as it is read;
* ``2 workers, epoch 2``: the ``standard`` preset in two worker processes,
  which read the cached rows by byte offset and check them.

Layouts (``--layouts``): ``rows``, the store as written (with ``/row_digests``);
``blocks``, a copy of it without them, as stores written before row digests
are (``FILE.blocks.h5``, made when missing): its first epoch only.  The table
also gives what the first epoch under ``"once"`` read besides the rows, as a
share of the pixel bytes (blocks read again, row digests).

Every round runs every workload with ``verify_reads=True``, ``"once"`` and
``False``, rotating which goes first; the table gives the medians and the
median of the per-round ratios to ``False`` (what survives the drift of a
shared machine).  All in this process.
"""

from __future__ import annotations

import os
import platform
import sys
import time

from benchmarks.data import make_bench_file, rows_for_gb
from benchmarks.harness import DATA_DIR, add_json_option, emit, log, median, new_parser, warm

SIZE, CHANNELS = 128, 3
BATCH, BUDGET = 32, "256MiB"
WORKLOADS = ("warm, epoch 1", "warm, epochs 2-3", "2 workers, epoch 2")
LAYOUTS = ("rows", "blocks")
OLD = ", without row digests"
"""What the ``blocks`` layout's rows are called in the results (after the workload's name)."""


SETTINGS = {"on": True, "once": "once", "off": False}
"""Name in the table -> ``verify_reads``."""


def rate(path: str, workload: str, verify) -> float:
    """Rows per second of ``workload`` with ``verify_reads=verify``."""
    import h5stream

    options = {"batch_size": BATCH, "memory_budget": BUDGET, "seed": 0, "verify_reads": verify}
    if workload.startswith("2 workers"):
        options.update(augment=h5stream.Augment.preset("standard"), workers=2)
    timed = {"warm, epoch 1": (0,), "warm, epochs 2-3": (1, 2), "2 workers, epoch 2": (1,)}[workload]
    rows, seconds = 0, 0.0
    t_open = time.perf_counter()
    with h5stream.open(path, **options) as stream:
        for epoch in range(max(timed) + 1):
            t0 = t_open if epoch == 0 else time.perf_counter()
            n = sum(len(x) for x, _ in stream)
            if epoch in timed:
                rows += n
                seconds += time.perf_counter() - t0
    return rows / seconds


def read_again(path: str) -> float:
    """Bytes a first epoch under ``"once"`` read besides its rows (blocks read again to be checked, row digests),
    as a share of the store's pixel bytes."""
    import h5stream

    with h5stream.open(path, batch_size=BATCH, memory_budget=BUDGET, seed=0) as stream:
        for _ in stream:
            pass
        stats = stream.stats()
        pixels = stream.meta.rows * stream.meta.row_bytes
    return (stats["verify_learn_bytes"] + stats["verify_digest_bytes"]) / pixels


def old_layout(path: str) -> str:
    """A copy of the store at ``path`` without ``/row_digests`` (stamped format 2, as written before them): made
    next to it when missing."""
    import shutil

    import h5py
    import numpy as np

    old = path[:-3] + ".blocks.h5" if path.endswith(".h5") else path + ".blocks.h5"
    if not os.path.exists(old):
        shutil.copyfile(path, old + ".tmp")
        with h5py.File(old + ".tmp", "r+") as f:
            del f["row_digests"]
            f.attrs["h5stream_format"] = np.int64(2)
        os.replace(old + ".tmp", old)
    return old


def run(path: str, rounds: int, workloads=WORKLOADS, layouts=("rows",)) -> dict:
    import h5py

    from h5stream.store.meta import read_meta

    meta = read_meta(path)
    with h5py.File(path, "r") as f:
        if "row_digests" not in f:
            raise SystemExit(f"{path} has no row digests (written before them): remove it to have it made again")
    warm(path)
    out = {"file": os.path.abspath(path), "rows": meta.rows, "block_rows": meta.block_rows,
           "file_bytes": meta.file_bytes, "rounds": rounds,
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}", "results": {}}
    names = list(SETTINGS)
    # (name in the results, file, workload): the old layout's first epoch, beside the store's every workload
    runs = [(w, path, w) for w in workloads]
    if "blocks" in layouts:
        old = old_layout(path)
        warm(old)
        runs += [(w + OLD, old, w) for w in workloads if w == "warm, epoch 1"]
    samples = {key: {name: [] for name in names} for key, _, _ in runs}
    for r in range(rounds):
        for key, file, w in runs:
            for name in names[r % len(names):] + names[:r % len(names)]:
                samples[key][name].append(rate(file, w, SETTINGS[name]))
                log(f"  round {r + 1}/{rounds}: {key}, verify {name}: {samples[key][name][-1]:,.0f} rows/s")
    for key, file, w in runs:
        if w == "warm, epoch 1" and "blocks" in layouts:
            samples[key]["read_again"] = read_again(file)
    for w, s in samples.items():
        res = out["results"][w] = {}
        if "read_again" in s:
            res["once_read_again_share"] = s.pop("read_again")
        for name in names:
            res[f"{name}_rows_per_s"] = median(s[name])
            res[f"{name}_rounds"] = s[name]
        for name in ("on", "once"):
            ratios = [a / b for a, b in zip(s[name], s["off"])]
            res[f"{name}_ratio"] = median(ratios)
            res[f"{name}_round_ratios"] = ratios
    return out


def table(out: dict) -> str:
    lines = [
        f"file: {out['file']} ({out['rows']} rows, {out['file_bytes'] / 1e9:.2f} GB, blocks of "
        f"{out['block_rows']} rows); {out['rounds']} rounds, medians; {out['machine']}",
        "",
        "| workload | verify_reads=False | True | True / False (per-round ratios) | \"once\" | "
        "\"once\" / False (per-round ratios) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]

    def ratio(r, name):
        return f"{r[name + '_ratio']:.3f} ({', '.join(f'{x:.3f}' for x in r[name + '_round_ratios'])})"

    for w, r in out["results"].items():
        lines.append(f"| {w} | {r['off_rows_per_s']:,.0f} rows/s | {r['on_rows_per_s']:,.0f} rows/s | "
                     f"{ratio(r, 'on')} | {r['once_rows_per_s']:,.0f} rows/s | {ratio(r, 'once')} |")
    again = [(w, r["once_read_again_share"]) for w, r in out["results"].items() if "once_read_again_share" in r]
    if again:
        lines += ["", "read besides the rows in epoch 1 under \"once\" (share of the pixel bytes): "
                  + "; ".join(f"{w}: {share:.3f}" for w, share in again)]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = new_parser(__doc__.split("\n\n")[0])
    p.add_argument("--file", default=os.path.join(DATA_DIR, "bench-1g.h5"), help="store to stream (made when missing)")
    p.add_argument("--gb", type=float, default=1.0, help="pixel GB of the store made when --file is missing")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians")
    p.add_argument("--workload", action="append", choices=WORKLOADS, help="only these workloads (repeatable)")
    p.add_argument("--layouts", default=",".join(LAYOUTS),
                   help="rows (the store as written), blocks (a copy without row digests): comma-separated")
    add_json_option(p)
    args = p.parse_args(argv)
    if not os.path.exists(args.file):
        make_bench_file(args.file, rows=rows_for_gb(args.gb, SIZE, CHANNELS))
    layouts = tuple(x for x in args.layouts.split(",") if x)
    if not set(layouts) <= set(LAYOUTS):
        p.error(f"--layouts takes {', '.join(LAYOUTS)}, got {args.layouts!r}")
    emit(run(args.file, args.rounds, tuple(args.workload or WORKLOADS), layouts), as_json=args.json,
         format_text=table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
