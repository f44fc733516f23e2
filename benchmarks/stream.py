"""`h5stream bench` on a >= 1 GB and a 4 GB class-sorted file, cold and warm, with the stream's targets.

    python -m benchmarks.stream                 # the tables + target checks
    python -m benchmarks.stream --json          # one JSON object with every run
    python -m benchmarks.stream --quick         # 0.2 GB + 0.8 GB, for trying it out

Makes the files with :func:`benchmarks.data.make_bench_file` when missing,
warms the page cache before warm runs (one sequential read), and runs every
measurement as ``python -m h5stream bench FILE --json`` in a fresh process, so
each memory baseline starts clean.  Every run is repeated ``--rounds`` times
(default 3), interleaved: rates and stream/baseline ratios are medians over
the rounds, memory the largest peak seen.  The 4 GB file is measured for the
stream only (its peak memory must match the 1 GB file's at the same budget);
``--full-4g`` adds its baselines.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time

from benchmarks.data import make_bench_file, rows_for_gb
from benchmarks.harness import (add_data_option, add_json_option, by_name, child_env, emit, interleave, log, median,
                                new_parser, warm)

SIZE, CHANNELS = 128, 3


def bench(path: str, *, cold: bool, args, baselines: bool = True) -> dict:
    """One ``h5stream bench PATH --json`` run in a fresh process (the page cache warmed first unless ``cold``)."""
    cmd = [sys.executable, "-m", "h5stream", "bench", path, "--json", "--batch-size", str(args.batch_size),
           "--memory-budget", args.memory_budget, "--epochs", str(args.epochs),
           "--random-seconds", str(args.random_seconds)]
    if cold:
        cmd.append("--cold")
    else:
        warm(path)
    if not baselines:
        cmd.append("--no-baselines")
    log("+ " + " ".join(cmd[1:]))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=child_env()).stdout
    result = json.loads(out)
    result["command"] = "h5stream " + " ".join(cmd[3:])
    return result


def combine(results: list[dict]) -> dict:
    """One run's figures from several rounds of the same measurement.

    Rates: medians.  Ratios: medians of each round's own ratio (stream and
    baseline measured in the same process, minutes apart at most), which is
    what survives a noisy shared machine.  Memory: the largest peak of any
    round.  Shuffle figures are seeded, so identical in every round.
    """
    out = dict(results[0])
    out["rounds"] = len(results)
    out["round_samples_per_s"] = [r["samples_per_s"] for r in results]
    for key in ("samples_per_s", "mb_per_s", "steady_samples_per_s"):
        out[key] = median(r.get(key) for r in results)
    if results[0].get("baselines"):
        out["baselines"] = {k: (median(r["baselines"][k] for r in results) if isinstance(v, (int, float))
                                and not isinstance(v, bool) else v)
                            for k, v in results[0]["baselines"].items()}
    if results[0].get("ratios"):
        out["ratios"] = {k: median(r["ratios"][k] for r in results) for k in results[0]["ratios"]}
        steady = [r["steady_samples_per_s"] / r["baselines"]["sequential_samples_per_s"] for r in results
                  if r.get("steady_samples_per_s") and r.get("baselines")]
        out["ratios"]["steady_vs_sequential"] = median(steady)
    out["peak_mem_bytes"] = max(r["peak_mem_bytes"] for r in results)
    out["within_budget"] = all(r["within_budget"] for r in results)
    return out


def targets(runs: dict) -> list[tuple[str, bool, str]]:
    """The stream's targets as (name, met, figures)."""
    out = []
    cold, warm_ = runs.get("1g_cold"), runs.get("1g_warm")
    if cold and cold.get("ratios"):
        r = cold["ratios"]
        out.append(("cold: stream >= 0.9x sequential", r["vs_sequential"] >= 0.9, f"{r['vs_sequential']:.2f}x"))
        out.append(("cold: stream >= 4x one-row random", r["vs_random_row"] >= 4, f"{r['vs_random_row']:.1f}x"))
    if warm_ and warm_.get("ratios"):
        r = warm_["ratios"]
        out.append(("warm: stream >= 0.8x read_direct ceiling", r["vs_sequential"] >= 0.8,
                    f"{r['vs_sequential']:.2f}x"))
        ratio = r.get("steady_vs_sequential")
        if ratio:
            out.append(("warm, epochs 2+ (after start-up): stream >= 0.8x read_direct ceiling", ratio >= 0.8,
                        f"{ratio:.2f}x"))
    ref = cold or warm_
    if ref:
        s = ref["shuffle"]
        out.append(("batch label TVD <= 1.1x full random", s["tvd_ratio_to_random"] <= 1.1,
                    f"{s['batch_label_tvd']:.3f} vs {s['batch_label_tvd_full_random']:.3f} "
                    f"({s['tvd_ratio_to_random']:.2f}x; single chunk {s['batch_label_tvd_single_chunk']:.3f})"))
        pairs = s.get("epoch_order_tau_pairs", [s["epoch_order_tau"]])
        out.append(("|epoch tau| <= 0.02", abs(s["epoch_order_tau"]) <= 0.02,
                    f"{s['epoch_order_tau']:+.4f} (epochs 0-1; max |tau| over {len(pairs)} pairs "
                    f"{max(map(abs, pairs)):.4f})"))
    for key, r in runs.items():
        out.append((f"{key}: peak - baseline <= budget", r["within_budget"],
                    f"{r['peak_mem_bytes'] / 2**20:.1f} of {r['memory_budget_bytes'] / 2**20:.0f} MiB"))
    for mode in ("cold", "warm"):
        a, b = runs.get(f"1g_{mode}"), runs.get(f"4g_{mode}")
        if a and b:
            ratio = b["peak_mem_bytes"] / max(1, a["peak_mem_bytes"])
            out.append((f"{mode}: same peak (+-10%) for 1 GB and 4 GB", abs(ratio - 1) <= 0.10,
                        f"{a['peak_mem_bytes'] / 2**20:.1f} vs {b['peak_mem_bytes'] / 2**20:.1f} MiB ({ratio:.2f}x)"))
    return out


def _rate(v) -> str:
    return "-" if v is None else f"{v:,.0f}"


def markdown(runs: dict) -> str:
    """The throughput and memory table, and the shuffle-quality table, in Markdown."""
    lines = [
        "| file | page cache | h5stream stream | stream, epochs 2+ | sequential `read_direct` (ceiling) | "
        "one row per call, random | single-chunk shuffle | stream / sequential | stream / random | "
        "peak − baseline (budget) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs.values():
        b = r.get("baselines") or {}
        ratios = r.get("ratios") or {}
        random_note = ""
        if b.get("random_row_extrapolated"):
            random_note = f" (extrapolated from {b['random_row_rows_measured']:,} rows)"
        cells = [f"{r['file_bytes'] / 1e9:.1f} GB", "cold" if r["cold"] else "warm",
                 f"{_rate(r['samples_per_s'])}/s ({r['mb_per_s']:,.0f} MB/s)",
                 f"{_rate(r.get('steady_samples_per_s'))}/s"]
        if ratios:
            cells += [f"{_rate(b['sequential_samples_per_s'])}/s",
                      f"{_rate(b['random_row_samples_per_s'])}/s{random_note}",
                      f"{_rate(b['single_chunk_shuffle_samples_per_s'])}/s",
                      f"{ratios['vs_sequential']:.2f}x", f"{ratios['vs_random_row']:.1f}x"]
        else:
            cells += ["-"] * 5
        cells.append(f"{r['peak_mem_bytes'] / 2**20:.0f} MiB ({r['memory_budget_bytes'] / 2**20:.0f} MiB)")
        lines.append("| " + " | ".join(cells) + " |")
    ref = runs.get("1g_cold") or runs.get("1g_warm")
    if ref:
        s = ref["shuffle"]
        lines += [
            "",
            f"| shuffle quality ({ref['file_bytes'] / 1e9:.1f} GB, {ref['storage_order']}, batch {ref['batch_size']}) "
            "| batch label TVD | epoch-to-epoch Kendall τ |",
            "|---|---|---|",
            f"| h5stream stream | {s['batch_label_tvd']:.3f} | {s['epoch_order_tau']:+.3f} |",
            f"| full random permutation (same run) | {s['batch_label_tvd_full_random']:.3f} "
            f"(exact expectation {s['batch_label_tvd_expected_random']:.3f}) | ~0 |",
            f"| single contiguous chunk ({s['single_chunk_rows']} rows) | {s['batch_label_tvd_single_chunk']:.3f} | "
            f"{s['epoch_order_tau_single_chunk']:+.3f} |",
            f"| file order (no shuffle) | {s['batch_label_tvd_file_order']:.3f} | 1 |",
        ]
    return "\n".join(lines)


def format_text(result: dict) -> str:
    """The tables, one PASS/MISS line per target, and the environment."""
    runs, env = result["runs"], result["environment"]
    lines = [markdown(runs), ""]
    lines += [f"{'PASS' if t['met'] else 'MISS'}  {t['name']}: {t['figures']}" for t in result["targets"]]
    lines.append(f"\n{env['cpus']} CPUs, load average {env['loadavg_1m']:.1f}, Python {env['python']}; "
                 f"{env['rounds']} interleaved rounds (rates and ratios: medians; memory: the largest peak); "
                 f"command per run: {next(iter(runs.values()))['command']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = new_parser(__doc__.split("\n\n")[0])
    add_data_option(p)
    p.add_argument("--gb", type=float, nargs=2, default=[1.0, 4.0], metavar=("SMALL", "LARGE"),
                   help="sizes of the two stores, GB")
    p.add_argument("--quick", action="store_true", help="0.2 GB and 0.8 GB files, short random baseline")
    p.add_argument("--batch-size", type=int, default=32, help="rows per batch")
    p.add_argument("--memory-budget", default="256MiB", help="the stream's memory budget")
    p.add_argument("--epochs", type=int, default=3, help="epochs per run")
    p.add_argument("--random-seconds", type=float, default=10.0,
                   help="how long the one-row-per-call random baseline reads")
    p.add_argument("--full-4g", action="store_true", help="also run the baselines on the large file")
    p.add_argument("--warm-only", action="store_true", help="skip the cold runs")
    p.add_argument("--rounds", type=int, default=3,
                   help="repeat every run, interleaved; rates and ratios are medians, memory the largest")
    add_json_option(p)
    args = p.parse_args(argv)
    if args.quick:
        args.gb, args.random_seconds = [0.2, 0.8], min(args.random_seconds, 3.0)
    files = {}
    for tag, gb in zip(("1g", "4g"), args.gb):
        path = os.path.join(args.data, f"bench-{gb:g}g.h5")
        files[tag] = make_bench_file(path, rows=rows_for_gb(gb, SIZE, CHANNELS), size=SIZE, channels=CHANNELS)
    measurements = {
        f"{tag}_{mode}": (lambda path=path, mode=mode, tag=tag:
                          bench(path, cold=mode == "cold", args=args, baselines=tag == "1g" or args.full_4g))
        for mode in (("warm",) if args.warm_only else ("cold", "warm"))
        for tag, path in files.items()
    }
    rounds = max(1, args.rounds)
    t0 = time.monotonic()
    runs = {key: combine(results) for key, results in by_name(interleave(measurements, rounds)).items()}
    env = {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine(),
           "loadavg_1m": os.getloadavg()[0], "seconds": time.monotonic() - t0, "rounds": rounds}
    result = {"runs": runs, "targets": [{"name": n, "met": m, "figures": f} for n, m, f in targets(runs)],
              "environment": env}
    emit(result, as_json=args.json, format_text=format_text, indent=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
