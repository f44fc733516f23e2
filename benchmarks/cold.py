"""A store larger than RAM: the stream against the disk's own limit and h5py, with the targets.

    python -m benchmarks.cold                    # builds the store once, then 3 interleaved rounds (~10 min each)
    python -m benchmarks.cold --json             # one JSON object
    python -m benchmarks.cold --compare-ref main # also the warm small-store figures of h5stream at git ref main
    python -m benchmarks.cold --quick            # a small store with direct I/O forced: seconds, for the test

The store (:func:`benchmarks.data.make_bench_file`, 128x128x3 class-sorted
rows) is sized from ``MemTotal`` to at least ``--ram-factor`` (1.3) times
RAM, so no epoch can come from the page cache; it is built once under
``bench-data/`` (git-ignored) and refused with a message where the disk lacks
the room.  Every measurement runs in a fresh process, after the store is
dropped from the page cache (a measurement must not find what the previous
one left there), in this order each round:

* **h5py** -- ``read_direct`` of 3,200-row slices in file order, the whole file.
* **disk** -- the device's own limit: ``fio`` reading the whole file in order
  with ``O_DIRECT``, twice: 1 MiB requests with 4 in flight, and 4 MiB requests
  with 16 in flight (64 MiB in flight: enough for a device whose rate grows
  with the queue); the better of the two counts.  Without ``fio``, an
  ``O_DIRECT`` reader here (4 MiB requests, one at a time).
* **stream** -- ``h5stream.open`` (defaults: ``direct_io="auto"``), no
  augmentation, ``workers=0``, one epoch: right after the disk's limit and
  right before its random rate, since the disk's rate drifts from minute to
  minute on a shared host.
* **disk random** (with ``fio``) -- the device for the stream's own pattern: every
  piece of the stream's read size (its unit, 1 to 4 MiB by h5stream's rule) once, in random order,
  as many in flight as the stream keeps.  A virtual disk may serve sequential
  reads faster than any other order (its host reads ahead); this shows how much.
* **stream aug w2** -- ``Augment.preset("standard")`` and 2 workers, one epoch.
* **warm aug w2** -- the same on a small store (``--small-gb``, default 1 GB)
  read once first, so it is served from the page cache; the target's reference.
* **warm w0** -- that small store, warm, no augmentation: the case
  ``direct_io="auto"`` leaves to the page cache.  With ``--compare-ref``, the
  two warm measurements are also made with the h5stream of a git ref
  (extracted once under ``bench-data/``), in the same rounds: before and after.

Stream rates are rows/s after the first batch: one epoch of the large
store; whole epochs of the warm small one until ``--warm-seconds``.  The
time from ``open`` to the first batch is given apart.  CPU: user and kernel
seconds of the process and its workers over the timed part, as cores.  Memory: peak PSS of the process tree
less its baseline, sampled by :class:`~h5stream.measure.ResourceSampler`.
Ratios are medians of same-round ratios.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.harness import (REPO, add_data_option, add_json_option, by_name, child_command, child_env, emit,
                                interleave, log, median, new_parser, same_round_ratios, warm)

SIZE, CHANNELS = 128, 3
ROW_BYTES = SIZE * SIZE * CHANNELS
BUDGET = "256MiB"
QUICK_BUDGET = "256MiB"
BATCH_SIZE = 32
H5PY_SLICE_ROWS = 3200
DISK_TRIES = ((1 << 20, 4), (4 << 20, 16))
"""The disk limit's ``fio`` runs: (request bytes, requests in flight); the better one counts."""
TARGETS = {"stream_vs_disk": 0.9, "stream_vs_h5py": 1.0, "aug_cold_vs_warm": 0.85}
FREE_MARGIN_BYTES = 2 << 30
"""Room left on the disk after the store is built."""


# -- the stores ---------------------------------------------------------------------------------------------------
def mem_total_bytes() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("benchmarks.cold: cannot read MemTotal from /proc/meminfo (Linux only)")


def large_rows(ram_factor: float) -> int:
    """Rows of a store of at least ``ram_factor`` times this machine's RAM, in whole 1,024-row writes."""
    rows = math.ceil(ram_factor * mem_total_bytes() / ROW_BYTES)
    return -(-rows // 1024) * 1024


def ensure_store(path: str, rows: int) -> str:
    """The store at ``path`` with ``rows`` rows, built when missing; SystemExit when the disk lacks room."""
    from benchmarks.data import make_bench_file

    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        need = rows * ROW_BYTES + FREE_MARGIN_BYTES
        free = shutil.disk_usage(os.path.dirname(path)).free
        if free < need:
            raise SystemExit(f"benchmarks.cold: {path} needs {need / 1e9:.1f} GB (the store and a margin) but "
                             f"{free / 1e9:.1f} GB are free on that disk; free room, or pass --data on a larger disk")
        log(f"building {path}: {rows:,} rows, {rows * ROW_BYTES / 1e9:.1f} GB (once; minutes)")
    return make_bench_file(path, rows=rows, size=SIZE, channels=CHANNELS)


def ref_tree(ref: str, data_dir: str) -> str:
    """The ``h5stream`` package of git ``ref``, extracted once under ``data_dir``; returns the folder holding it."""
    sha = subprocess.run(["git", "-C", REPO, "rev-parse", "--verify", ref + "^{commit}"], check=True,
                         capture_output=True, text=True).stdout.strip()
    root = os.path.join(data_dir, f"h5stream-{sha[:12]}")
    if not os.path.isdir(os.path.join(root, "h5stream")):
        tmp = tempfile.mkdtemp(dir=data_dir)
        archive = subprocess.run(["git", "-C", REPO, "archive", sha, "h5stream"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        os.replace(tmp, root)
    return root


# -- children: one measurement each, one JSON line on stdout ----------------------------------------------------
def _cpu(pids) -> tuple[float, float]:
    import psutil

    user = system = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        user, system = user + t.user, system + t.system
    return user, system


def stream_child(argv: list[str]) -> int:
    """``h5stream.open(path, **options)``, one epoch or, with ``seconds``, whole epochs until that long:
    ``argv`` = [path, budget, seconds, options as JSON].  The rate is taken after the first batch."""
    import h5stream
    from h5stream.measure import ResourceSampler

    path, budget, seconds, options = argv[0], argv[1], float(argv[2]), json.loads(argv[3])
    augment = options.pop("augment", None)
    if augment:
        options["augment"] = h5stream.Augment.preset(augment)
    with ResourceSampler(0.1) as sampler:  # its first sample is the baseline
        t0 = time.perf_counter()
        with h5stream.open(path, batch_size=BATCH_SIZE, memory_budget=budget, seed=0, **options) as stream:
            batches = iter(stream)
            next(batches)
            first_batch_s = time.perf_counter() - t0
            pids = [os.getpid(), *stream.stats().get("worker_pids", [])]
            cpu0, t1, rows, epochs = _cpu(pids), time.perf_counter(), 0, 1
            while True:
                for x, _ in batches:
                    rows += len(x)
                if time.perf_counter() - t1 >= seconds:
                    break
                batches, epochs = iter(stream), epochs + 1
            elapsed = time.perf_counter() - t1
            cpu1 = _cpu(pids)
            stats = stream.stats()
            direct_io = getattr(stream, "direct_io", False)
        timeline = sampler.stop()
    baseline = int(timeline.mem_bytes[0]) if timeline.mem_bytes.size else 0
    print(json.dumps({
        "rows_per_s": rows / elapsed, "mb_per_s": rows * ROW_BYTES / elapsed / 1e6, "seconds": elapsed,
        "epochs": epochs, "first_batch_s": first_batch_s, "user_cores": (cpu1[0] - cpu0[0]) / elapsed,
        "kernel_cores": (cpu1[1] - cpu0[1]) / elapsed, "peak_mem_bytes": max(0, timeline.peak_mem_bytes - baseline),
        "direct_io": bool(direct_io), "read_bytes": stats.get("read_bytes"),
        "h5stream": os.path.dirname(h5stream.__file__),
    }))
    return 0


def h5py_child(argv: list[str]) -> int:
    """``read_direct`` of the whole ``/images`` in file order, ``H5PY_SLICE_ROWS`` rows per call."""
    import h5py
    import numpy as np

    with h5py.File(argv[0], "r") as f:
        images = f["images"]
        rows = images.shape[0]
        buf = np.empty((H5PY_SLICE_ROWS, *images.shape[1:]), images.dtype)
        cpu0, t0 = _cpu([os.getpid()]), time.perf_counter()
        for start in range(0, rows, H5PY_SLICE_ROWS):
            n = min(H5PY_SLICE_ROWS, rows - start)
            images.read_direct(buf, np.s_[start:start + n], np.s_[0:n])
        seconds = time.perf_counter() - t0
        cpu1 = _cpu([os.getpid()])
    print(json.dumps({"rows_per_s": rows / seconds, "mb_per_s": rows * ROW_BYTES / seconds / 1e6,
                      "seconds": seconds, "user_cores": (cpu1[0] - cpu0[0]) / seconds,
                      "kernel_cores": (cpu1[1] - cpu0[1]) / seconds}))
    return 0


def direct_reader_child(argv: list[str]) -> int:
    """The whole file with ``O_DIRECT`` in 4 MiB reads: the disk's limit where ``fio`` is missing."""
    import mmap

    path = argv[0]
    block = 4 << 20
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, block)
    try:
        size, done = os.fstat(fd).st_size, 0
        t0 = time.perf_counter()
        while done < size:
            got = os.preadv(fd, [buf], done)
            if got <= 0:
                break
            done += got
        seconds = time.perf_counter() - t0
    finally:
        buf.close()
        os.close(fd)
    print(json.dumps({"mb_per_s": done / seconds / 1e6, "seconds": seconds, "tool": "O_DIRECT reader, 4 MiB"}))
    return 0


def _child(entry: str, *args, h5stream_root: str | None = None) -> dict:
    """Run ``entry`` in a fresh interpreter; with ``h5stream_root``, it imports the h5stream package found there
    (its working directory, first on ``sys.path`` for ``python -c``) and the benchmarks from this checkout."""
    out = subprocess.run(child_command(entry, *args), env=child_env(), cwd=h5stream_root, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


# -- measurements --------------------------------------------------------------------------------------------------
def disk_limit(path: str, use_fio: bool) -> dict:
    from h5stream.measure import evict_from_page_cache

    evict_from_page_cache(path)
    if not use_fio:
        return _child("benchmarks.cold:direct_reader_child", path)
    tries = [_fio(path, "read", block, depth) for block, depth in DISK_TRIES]
    best = max(tries, key=lambda t: t["mb_per_s"])
    return {**best, "tries": {t["tool"]: t["mb_per_s"] for t in tries}}


def disk_random(path: str, budget: str, direct_io="auto") -> dict:
    """The disk's rate for the stream's own pattern: every piece of the stream's read size once, in random order
    (``fio --rw=randread``), as many in flight as the stream keeps."""
    from h5stream.read.source import DIRECT_IN_FLIGHT

    return _fio(path, "randread", stream_unit_bytes(path, budget, direct_io), DIRECT_IN_FLIGHT)


def stream_unit_bytes(path: str, budget: str, direct_io="auto") -> int:
    """The read unit (bytes) of the cold stream on ``path``: h5stream's own plan for it (``memory_budget=budget``,
    ``batch_size=BATCH_SIZE``, the stream's other defaults), whose default unit follows the fill."""
    from h5stream.streaming.planning import plan_stream
    from h5stream.streaming.options import StreamOptions
    from h5stream.read.plan import parse_bytes
    from h5stream.read.source import resolve_direct_io
    from h5stream.store.meta import read_meta

    meta = read_meta(path)
    plan = plan_stream(meta, parse_bytes(budget), BATCH_SIZE, direct_io=resolve_direct_io(path, direct_io),
                       verify_reads=StreamOptions().verify_reads, available_bytes=None)
    return plan.unit_rows * meta.row_bytes


def _fio(path: str, pattern: str, block: int, depth: int) -> dict:
    cmd = ["fio", "--name=disk", f"--filename={path}", "--readonly", f"--rw={pattern}", f"--bs={block}", "--direct=1",
           "--ioengine=libaio", f"--iodepth={depth}", "--output-format=json"]
    job = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["jobs"][0]["read"]
    size = f"{block >> 20} MiB" if block % (1 << 20) == 0 else f"{block >> 10} KiB"
    tool = f"fio O_DIRECT, {'random ' if pattern == 'randread' else ''}{size}, {depth} in flight"
    return {"mb_per_s": job["bw_bytes"] / 1e6, "seconds": job["runtime"] / 1e3, "tool": tool}


def cold_child(entry: str, path: str, *args) -> dict:
    from h5stream.measure import evict_from_page_cache

    evict_from_page_cache(path)
    return _child(entry, path, *args)


def measurements(large: str, small: str, *, budget: str, warm_s: float, use_fio: bool, direct_io,
                 ref_path: str | None) -> dict:
    """name -> measurement, in round order."""
    plain = {} if direct_io == "auto" else {"direct_io": direct_io}
    aug2 = {"augment": "standard", "workers": 2}

    def cold(options: dict) -> dict:
        return cold_child("benchmarks.cold:stream_child", large, budget, 0, json.dumps(options))

    def warm_stream(options: dict, h5stream_root: str | None = None) -> dict:
        warm(small)
        return _child("benchmarks.cold:stream_child", small, budget, warm_s, json.dumps(options),
                      h5stream_root=h5stream_root)

    out = {  # the disk's two rates right before and after the stream they are compared with
        "h5py": lambda: cold_child("benchmarks.cold:h5py_child", large),
        "disk": lambda: disk_limit(large, use_fio),
        "stream": lambda: cold(plain),
        **({"disk_random": lambda: disk_random(large, budget, direct_io)} if use_fio else {}),
        "stream_aug_w2": lambda: cold({**plain, **aug2}),
        "warm_aug_w2": lambda: warm_stream(aug2),
        "warm_w0": lambda: warm_stream({}),
    }
    if ref_path:
        out["warm_aug_w2_ref"] = lambda: warm_stream(aug2, ref_path)
        out["warm_w0_ref"] = lambda: warm_stream({}, ref_path)
    return out


def summarize(rounds: list[dict]) -> dict:
    """Per measurement its medians (memory: the largest peak), the same-round ratios, and each round's rates."""
    runs = {}
    for name, results in by_name(rounds).items():
        keys = [k for k, v in results[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        runs[name] = {**results[0], **{k: median(r.get(k) for r in results) for k in keys}, "rounds": len(results)}
        if "peak_mem_bytes" in results[0]:
            runs[name]["peak_mem_bytes"] = max(r["peak_mem_bytes"] for r in results)
        if "tries" in results[0]:
            runs[name]["tries"] = {k: median(r["tries"][k] for r in results) for k in results[0]["tries"]}
    mb = [{k: v["mb_per_s"] for k, v in r.items()} for r in rounds]
    rows = [{k: v["rows_per_s"] for k, v in r.items() if "rows_per_s" in v} for r in rounds]
    ratios = {
        "stream_vs_disk": same_round_ratios(mb, "stream", "disk"),
        "stream_vs_disk_random": same_round_ratios(mb, "stream", "disk_random"),
        "stream_vs_h5py": same_round_ratios(mb, "stream", "h5py"),
        "aug_cold_vs_warm": same_round_ratios(rows, "stream_aug_w2", "warm_aug_w2"),
        "warm_w0_vs_ref": same_round_ratios(rows, "warm_w0", "warm_w0_ref"),
        "warm_aug_w2_vs_ref": same_round_ratios(rows, "warm_aug_w2", "warm_aug_w2_ref"),
    }
    per_round = [{k: {f: v[f] for f in ("rows_per_s", "mb_per_s") if f in v} for k, v in r.items()} for r in rounds]
    return {"runs": runs, "ratios": {k: v for k, v in ratios.items() if v is not None}, "rounds": per_round}


def targets(result: dict, budget_bytes: int) -> list[dict]:
    ratios, runs, out = result["ratios"], result["runs"], []
    names = {"stream_vs_disk": "stream (workers 0) >= 0.9x the disk's O_DIRECT rate",
             "stream_vs_h5py": "stream (workers 0) >= 1.0x h5py read_direct",
             "aug_cold_vs_warm": "augmenting stream, 2 workers, > RAM >= 0.85x its warm small-store rate"}
    for key, name in names.items():
        if key in ratios:
            r = ratios[key]
            out.append({"name": name, "met": r["median"] >= TARGETS[key],
                        "figures": f"{r['median']:.2f}x (rounds {r['min']:.2f}-{r['max']:.2f})"})
    for key in ("stream", "stream_aug_w2"):
        if key in runs:
            peak = runs[key]["peak_mem_bytes"]
            out.append({"name": f"{key}: peak - baseline <= budget", "met": peak <= budget_bytes,
                        "figures": f"{peak / 2**20:.1f} of {budget_bytes / 2**20:.0f} MiB"})
    return out


# -- output ----------------------------------------------------------------------------------------------------------
LABELS = {
    "disk": "disk limit", "disk_random": "disk, the stream's read size in random order",
    "h5py": "h5py `read_direct`, 3,200-row slices in file order",
    "stream": "h5stream, workers 0, no augmentation", "stream_aug_w2": "h5stream, `standard` augmentation, 2 workers",
    "warm_aug_w2": "same, small store, warm page cache", "warm_w0": "h5stream, workers 0, small store, warm",
    "warm_aug_w2_ref": "same at the reference commit (augmentation, 2 workers)",
    "warm_w0_ref": "same at the reference commit (workers 0)",
}


def format_text(result: dict) -> str:
    env, runs = result["environment"], result["runs"]
    what = f"{env['large_gb']:.1f} GB store, {env['ram_ratio']:.2f}x RAM; small {env['small_gb']:.1f} GB"
    lines = [f"| measurement ({what}) | rows/s | MB/s | first batch | CPU user + kernel (cores) | peak − baseline "
             "| direct I/O |", "|---|---|---|---|---|---|---|"]
    for key, r in runs.items():
        label = LABELS.get(key, key) + (f" ({r['tool']})" if "tool" in r else "")
        rate = f"{r['rows_per_s']:,.0f}" if "rows_per_s" in r else "-"
        first = f"{r['first_batch_s']:.2f} s" if "first_batch_s" in r else "-"
        cpu = f"{r['user_cores']:.2f} + {r['kernel_cores']:.2f}" if "user_cores" in r else "-"
        peak = f"{r['peak_mem_bytes'] / 2**20:.0f} MiB" if "peak_mem_bytes" in r else "-"
        direct = ("yes" if r["direct_io"] else "no") if "direct_io" in r else "-"
        lines.append(f"| {label} | {rate} | {r['mb_per_s']:,.0f} | {first} | {cpu} | {peak} | {direct} |")
    lines.append("")
    for key, r in runs.items():
        if "tries" in r:
            lines.append(f"{LABELS.get(key, key)}, each try: "
                         + "; ".join(f"{tool} {mb:,.0f} MB/s" for tool, mb in r["tries"].items()))
    for key, r in result["ratios"].items():
        lines.append(f"ratio {key}: {r['median']:.2f}x (rounds {r['min']:.2f}-{r['max']:.2f})")
    lines += [f"{'PASS' if t['met'] else 'MISS'}  {t['name']}: {t['figures']}" for t in result["targets"]]
    lines.append(f"\n{env['cpus']} CPUs, {env['mem_total_gib']:.1f} GiB RAM, load average {env['loadavg_1m']:.1f} "
                 f"at the start and {env['loadavg_end_1m']:.1f} at the end, Python {env['python']}; {env['rounds']} "
                 f"interleaved rounds in {env['seconds'] / 60:.1f} min (medians; memory: the largest peak); budget "
                 f"{env['budget']}, batch {BATCH_SIZE}" + (f"; reference {env['ref']}" if env.get("ref") else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = new_parser(__doc__.split("\n\n")[0])
    add_data_option(p)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians")
    p.add_argument("--ram-factor", type=float, default=1.3, help="store size / MemTotal")
    p.add_argument("--small-gb", type=float, default=1.0, help="the warm small store, GB")
    p.add_argument("--warm-seconds", type=float, default=20.0,
                   help="warm measurements run whole epochs until this long, seconds")
    p.add_argument("--budget", default=BUDGET, help="the streams' memory_budget")
    p.add_argument("--compare-ref", default=None, metavar="REF",
                   help="also measure the warm small store with h5stream at this git ref (before/after)")
    p.add_argument("--no-fio", action="store_true", help="the O_DIRECT reader here instead of fio")
    p.add_argument("--quick", action="store_true",
                   help="a small store with direct_io=True instead of one larger than RAM; one round; seconds")
    add_json_option(p)
    args = p.parse_args(argv)
    args.data = os.path.abspath(args.data)  # children of a reference commit run elsewhere
    from benchmarks.data import make_bench_file, rows_for_gb

    direct_io = "auto"
    if args.quick:
        large = ensure_quick(args.data)
        small, direct_io, args.rounds, args.no_fio = large, True, 1, True
        args.warm_seconds, args.budget = 0.0, QUICK_BUDGET
    else:
        large = ensure_store(os.path.join(args.data, f"cold-{large_rows(args.ram_factor)}rows.h5"),
                             large_rows(args.ram_factor))
        small = make_bench_file(os.path.join(args.data, f"bench-{args.small_gb:g}g.h5"),
                                rows=rows_for_gb(args.small_gb, SIZE, CHANNELS), size=SIZE, channels=CHANNELS)
    use_fio = not args.no_fio and shutil.which("fio") is not None
    ref_path = ref_tree(args.compare_ref, args.data) if args.compare_ref else None
    load0, t0 = os.getloadavg()[0], time.monotonic()
    from h5stream.read.plan import parse_bytes

    budget_bytes = parse_bytes(args.budget)
    plan = measurements(large, small, budget=args.budget, warm_s=args.warm_seconds, use_fio=use_fio,
                        direct_io=direct_io, ref_path=ref_path)
    rounds = interleave(plan, max(1, args.rounds), progress=True)
    result = summarize(rounds)
    result["targets"] = targets(result, budget_bytes)
    result["environment"] = {
        "python": platform.python_version(), "cpus": os.cpu_count(), "mem_total_gib": mem_total_bytes() / 2**30,
        "loadavg_1m": load0, "loadavg_end_1m": os.getloadavg()[0], "seconds": time.monotonic() - t0,
        "rounds": len(rounds), "large": large, "large_gb": os.path.getsize(large) / 1e9,
        "ram_ratio": os.path.getsize(large) / mem_total_bytes(), "small_gb": os.path.getsize(small) / 1e9,
        "ref": args.compare_ref, "quick": args.quick, "budget": args.budget,
    }
    emit(result, as_json=args.json, format_text=format_text)
    return 0


def ensure_quick(data_dir: str) -> str:
    """The ``--quick`` store: 2,048 rows (0.1 GB), made once."""
    from benchmarks.data import make_bench_file

    return make_bench_file(os.path.join(data_dir, "cold-quick.h5"), rows=2048, size=SIZE, channels=CHANNELS,
                           progress=False)


if __name__ == "__main__":
    sys.exit(main())
