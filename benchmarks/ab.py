"""The same workloads on two versions of h5stream, interleaved in one run: is a change within noise?

    python -m benchmarks.ab --base REV                 # REV (a commit, tag or branch) against this checkout
    python -m benchmarks.ab --base REV --rounds 7 --json

Each workload runs in a fresh interpreter whose ``PYTHONPATH`` puts one
version's ``h5stream`` first (``git archive REV h5stream`` unpacked under
``bench-data/ab/``, or this checkout), and uses only the public API that both
versions share (``h5stream.open``, ``Augment.preset``, ``h5stream ingest``), so
the same code measures both.  Every round runs every workload on both
versions, alternating which goes first; the table gives each version's median
and the median of the per-round ratios head / base, which is what survives the
drift of a shared machine.

Workloads (a store of 128x128x3 rows, batch 32, memory budget 256 MiB):

* ``stream warm``: rows/s of epoch 2 (file in the page cache), no augmentation;
* ``stream cold``: rows/s of epoch 1 from ``open`` on, the file evicted from the
  page cache first;
* ``augment, 2 workers``: rows/s of epochs 2-3 with the ``standard`` preset;
* ``ingest, 2 workers``: images/s of ``h5stream ingest`` of photo-like JPEGs to 128x128.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.harness import (REPO, add_data_option, add_json_option, by_name, child_command, emit, log, median,
                                new_parser, same_round_ratios, warm)

SIZE = 128
BATCH = 32
BUDGET = "256MiB"
WORKLOADS = ("stream warm", "stream cold", "augment, 2 workers", "ingest, 2 workers")


# -- the child side: runs with one version's h5stream first on sys.path ----------------------
def workload(argv: list[str]) -> int:
    """``workload NAME INPUT``: run one workload, print ``{"rate": per_second, "h5stream": its file}``."""
    name, source = argv
    import h5stream

    if name == "ingest, 2 workers":
        from h5stream import cli

        with tempfile.TemporaryDirectory(dir=os.path.dirname(source)) as tmp:
            out = os.path.join(tmp, "o.h5")
            n = sum(len(files) for _, _, files in os.walk(source) if files)
            t0 = time.perf_counter()
            rc = cli.main(["ingest", source, out, "--size", str(SIZE), "--workers", "2"])
            seconds = time.perf_counter() - t0
        if rc != 0:
            return rc
        rate = n / seconds
    else:
        options = {"batch_size": BATCH, "memory_budget": BUDGET, "shuffle": True, "seed": 0}
        if name == "augment, 2 workers":
            options.update(augment=h5stream.Augment.preset("standard"), workers=2)
        timed_epochs = {"stream warm": (1,), "stream cold": (0,), "augment, 2 workers": (1, 2)}[name]
        rows, seconds = 0, 0.0
        with h5stream.open(source, **options) as stream:
            for epoch in range(max(timed_epochs) + 1):
                t0 = time.perf_counter()
                n = sum(len(y) for _, y in stream)
                if epoch in timed_epochs:
                    rows, seconds = rows + n, seconds + time.perf_counter() - t0
        rate = rows / seconds
    print(json.dumps({"rate": rate, "h5stream": h5stream.__file__}))
    return 0


# -- the parent side ---------------------------------------------------------------------------
def unpack(rev: str, data_dir: str) -> str:
    """A folder holding ``rev``'s ``h5stream`` package (made once per commit); returns it."""
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--verify", f"{rev}^{{commit}}"], check=True,
                            capture_output=True, text=True).stdout.strip()
    root = os.path.join(data_dir, "ab", commit[:12])
    if not os.path.isdir(os.path.join(root, "h5stream")):
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        archive = subprocess.run(["git", "-C", REPO, "archive", commit, "h5stream"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", root], input=archive, check=True)
    return root


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run_one(version_root: str, name: str, source: str) -> float:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([version_root, REPO])  # that version's h5stream before this one's
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    if name == "stream cold":
        evict(source)
    elif name != "ingest, 2 workers":
        warm(source)
    # `python -c` puts its working directory first on sys.path: run it from the version's own folder.
    proc = subprocess.run(child_command("benchmarks.ab:workload", name, source), env=env, cwd=version_root,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed with {version_root}'s h5stream:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if not result["h5stream"].startswith(version_root):
        raise SystemExit(f"{name}: imported {result['h5stream']}, not the version under {version_root}")
    return float(result["rate"])


def measure(base: str, data_dir: str, rounds: int, gb: float, photos: int, workloads=WORKLOADS) -> dict:
    from benchmarks.data import ensure_photos, make_bench_file, rows_for_gb

    versions = {"base": unpack(base, data_dir), "head": REPO}
    store = os.path.join(data_dir, f"ab-{gb:g}g.h5")
    if not os.path.exists(store):
        make_bench_file(store, rows=rows_for_gb(gb, SIZE, 3), size=SIZE)
    inputs = {name: store for name in workloads}
    if "ingest, 2 workers" in workloads:
        inputs["ingest, 2 workers"] = ensure_photos(data_dir, photos)
    results = []
    for i in range(rounds):
        order = ("base", "head") if i % 2 == 0 else ("head", "base")
        row = {}
        for name in workloads:
            for version in order:
                log(f"  round {i + 1}/{rounds}: {name}, {version}")
                row[f"{name} | {version}"] = run_one(versions[version], name, inputs[name])
        results.append(row)
    per = by_name(results)
    table = {}
    for name in workloads:
        table[name] = {
            "base": median(per[f"{name} | base"]),
            "head": median(per[f"{name} | head"]),
            "head/base": same_round_ratios(results, f"{name} | head", f"{name} | base"),
        }
    return {"base": base, "head": "working tree", "rounds": rounds, "store_gb": gb, "photos": photos,
            "load_average": os.getloadavg(), "workloads": table, "rounds_raw": results}


def format_table(r: dict) -> str:
    lines = [f"h5stream {r['base']} (base) vs this checkout (head): {r['rounds']} rounds, medians, "
             f"store {r['store_gb']:g} GB of {SIZE}x{SIZE}x3, {r['photos']} JPEGs for ingest",
             f"  {'workload':<22}{'base /s':>11}{'head /s':>11}  {'head/base, same round: median (range)'}"]
    for name, w in r["workloads"].items():
        ratio = w["head/base"]
        lines.append(f"  {name:<22}{w['base']:>11,.0f}{w['head']:>11,.0f}  "
                     f"{ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})")
    lines.append(f"  load average at the end: {', '.join(f'{x:.2f}' for x in r['load_average'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = new_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare this checkout with")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each running both versions")
    parser.add_argument("--gb", type=float, default=0.5, help="size of the stream's store, GB")
    parser.add_argument("--photos", type=int, default=1000, help="JPEGs the ingest workload decodes")
    parser.add_argument("--only", nargs="+", choices=WORKLOADS, default=list(WORKLOADS), metavar="WORKLOAD",
                        help=f"run only these workloads (of: {'; '.join(WORKLOADS)})")
    add_data_option(parser)
    add_json_option(parser)
    args = parser.parse_args(argv)
    os.makedirs(args.data, exist_ok=True)
    emit(measure(args.base, args.data, args.rounds, args.gb, args.photos, tuple(args.only)), as_json=args.json,
         format_text=format_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
