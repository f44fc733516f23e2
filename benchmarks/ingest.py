"""h5stream ingest (1 and 2 workers) vs. its decode floor and vs. Keras' directory loader.

On a cached folder of photo-like JPEGs (~500x375, :func:`benchmarks.data.ensure_photos`),
one run measures, each to 128x128 RGB:

* ``pillow floor``  -- Pillow open + decode + resize in this process, no draft (what a naive loop does)
* ``decode floor``  -- h5stream's decoder alone (draft, EXIF, mode, resize) in this process: no I/O to HDF5, no IPC
* ``decode floor x2`` -- the same decoder in 2 plain processes, half the files each: the most 2 cores
  give this machine for this work (vCPUs on a shared host rarely scale 2x)
* ``ingest wN``     -- ``h5stream ingest`` end to end (walk, N decode processes, HDF5 writes, commits)
* ``keras``         -- ``keras.utils.image_dataset_from_directory`` iterated once (tf.data, all cores), in a subprocess

Usage::

    python -m benchmarks.ingest                 # 3000 images, workers 1 and 2
    python -m benchmarks.ingest --n 1000 --json

Timings include process start-up of the decode workers; they do not include
importing TensorFlow.  Each measurement is repeated ``--rounds`` times,
interleaved, and the best is reported (a shared machine only ever adds time);
the ratios that matter are also taken within each round and their median
printed (the machine's speed drifts between rounds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.data import ensure_photos
from benchmarks.harness import (add_data_option, add_json_option, available_cores, by_name, child_command, child_env,
                                emit, interleave, log, new_parser, same_round_ratios, self_and_children_cpu_s)

PILLOW = "pillow floor (1 proc, no draft)"
DECODE = "decode floor (1 proc, h5stream decoder)"
DECODE_X2 = "decode floor x2 (2 plain procs, no IPC)"
KERAS = "keras image_dataset_from_directory (tf.data)"


def ingest_name(workers: int) -> str:
    return f"ingest --workers {workers}"


def list_images(root: str) -> list[str]:
    from h5stream.ingest.discover import discover_class_folders

    return [os.path.join(root, it.relpath) for it in discover_class_folders(root).items]


# -- measurements: each returns (wall s, CPU s) ---------------------------------------------
def bench_pillow(paths: list[str], size: int) -> tuple[float, float]:
    from PIL import Image

    t0, c0 = time.perf_counter(), self_and_children_cpu_s()
    for p in paths:
        with Image.open(p) as im:
            im.convert("RGB").resize((size, size), Image.Resampling.BILINEAR).tobytes()
    return time.perf_counter() - t0, self_and_children_cpu_s() - c0


def bench_decode(paths: list[str], size: int) -> tuple[float, float]:
    from h5stream.ingest.decode import DecodeSpec, decode_file

    spec = DecodeSpec(size=(size, size))
    t0, c0 = time.perf_counter(), self_and_children_cpu_s()
    for p in paths:
        decode_file(p, spec)
    return time.perf_counter() - t0, self_and_children_cpu_s() - c0


def decode_share(argv: list[str]) -> int:
    """Child of :func:`bench_decode_parallel`: ``argv = [size, share_file]``.

    Loads the decoder and its share of paths, prints ``ready``, waits for a line
    on stdin, decodes the share and prints the CPU seconds it took.
    """
    from h5stream.ingest.decode import DecodeSpec, decode_file

    size = int(argv[0])
    with open(argv[1]) as fh:
        paths = fh.read().split("\n")
    spec = DecodeSpec(size=(size, size))
    print("ready", flush=True)
    sys.stdin.readline()  # go
    c0 = time.process_time()
    for p in paths:
        decode_file(p, spec)
    print(time.process_time() - c0, flush=True)
    return 0


def bench_decode_parallel(paths: list[str], size: int, tmp: str, procs: int = 2) -> tuple[float, float]:
    """Wall time of ``procs`` plain processes decoding interleaved shares, started together (boot excluded)."""
    workers = []
    for k in range(procs):
        share = os.path.join(tmp, f"share{k}.txt")
        with open(share, "w") as fh:
            fh.write("\n".join(paths[k::procs]))
        workers.append(subprocess.Popen(child_command("benchmarks.ingest:decode_share", size, share), env=child_env(),
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for proc in workers:
        proc.stdout.readline()  # booted, imported, holding its share
    t0 = time.perf_counter()
    for proc in workers:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    cpu = [float(proc.stdout.readline()) for proc in workers]
    wall = time.perf_counter() - t0
    for proc in workers:
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()
    return wall, sum(cpu)


def bench_ingest(root: str, size: int, workers: int, tmp: str) -> tuple[float, float]:
    """Wall and CPU seconds (this process + workers, their start-up included) of one ingest."""
    from h5stream.ingest.pack import IngestOptions, ingest

    out = os.path.join(tmp, f"w{workers}.h5")
    t0, c0 = time.perf_counter(), self_and_children_cpu_s()
    result = ingest(IngestOptions(src=root, out=out, size=(size, size), workers=workers, overwrite=True,
                                  progress=False))
    seconds, cpu = time.perf_counter() - t0, self_and_children_cpu_s() - c0
    if result.skipped:
        raise SystemExit(f"benchmark ingest skipped {result.skipped} files; see {result.report_path}")
    os.unlink(out)
    return seconds, cpu


def keras_load(argv: list[str]) -> int:
    """Child of :func:`bench_keras`: ``argv = [root, size]``; iterates the folder once, prints a JSON line."""
    import keras

    root, size = argv[0], int(argv[1])
    t0, c0 = time.perf_counter(), time.process_time()
    ds = keras.utils.image_dataset_from_directory(root, image_size=(size, size), batch_size=32, shuffle=False,
                                                  verbose=False)
    n = 0
    for x, _ in ds:
        n += int(x.shape[0])
    print(json.dumps({"images": n, "seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}))
    return 0


def bench_keras(root: str, size: int) -> tuple[float, float] | None:
    """(wall s, CPU s) of Keras' directory loader in a fresh process, TensorFlow's import excluded.

    ``None`` when Keras or TensorFlow is not installed, or the loader failed (logged).
    """
    import importlib.util

    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("tensorflow") is None:
        return None
    proc = subprocess.run(child_command("benchmarks.ingest:keras_load", root, size), capture_output=True, text=True,
                          env=child_env(TF_CPP_MIN_LOG_LEVEL="2"))
    if proc.returncode != 0:
        log(f"keras baseline failed: {proc.stderr.strip().splitlines()[-1:]}")
        return None
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    return r["seconds"], r["cpu_s"]


# -- the run --------------------------------------------------------------------------------
def run(*, n: int, size: int, workers: list[int], seed: int, data_dir: str, rounds: int, keras: bool) -> dict:
    """Every measurement, ``rounds`` interleaved rounds; the ``--json`` object."""
    root = ensure_photos(data_dir, n, seed)
    paths = list_images(root)
    n = len(paths)
    mean_kb = sum(os.path.getsize(p) for p in paths) / n / 1024
    with tempfile.TemporaryDirectory(dir=data_dir) as tmp:
        measurements = {
            PILLOW: lambda: bench_pillow(paths, size),
            DECODE: lambda: bench_decode(paths, size),
            DECODE_X2: lambda: bench_decode_parallel(paths, size, tmp),
            **{ingest_name(w): (lambda w=w: bench_ingest(root, size, w, tmp)) for w in workers},
        }
        if keras:
            measurements[KERAS] = lambda: bench_keras(root, size)
        per_round = interleave(measurements, rounds)  # name -> (wall s, CPU s), round by round
    best = {name: min(runs, key=lambda m: m[0]) for name, runs in by_name(per_round).items()}
    order = [PILLOW, DECODE, DECODE_X2, *[ingest_name(w) for w in workers], KERAS]
    seconds = {k: best[k][0] for k in order if k in best}
    cpu_ms = {k: 1000 * best[k][1] / n for k in order if k in best}
    rates = {name: n / s for name, s in seconds.items()}
    ratios = {}
    w1, w2 = rates.get(ingest_name(1)), rates.get(ingest_name(2))
    if w1 and w2:
        ratios["ingest w2 / ingest w1"] = w2 / w1
    if w2 and KERAS in rates:
        ratios["ingest w2 / keras"] = w2 / rates[KERAS]
    ratios["decode floor x2 / decode floor"] = rates[DECODE_X2] / rates[DECODE]
    if w1:
        ratios["ingest w1 / decode floor"] = w1 / rates[DECODE]
    if w2:
        ratios["ingest w2 / decode floor x2"] = w2 / rates[DECODE_X2]
    round_rates = [{name: n / m[0] for name, m in r.items()} for r in per_round]
    paired = {label: same_round_ratios(round_rates, top, bottom) for label, (top, bottom) in {
        "ingest w2 / ingest w1": (ingest_name(2), ingest_name(1)),
        "ingest w2 / keras": (ingest_name(2), KERAS),
    }.items()}
    return {
        "images": n, "source": "500x375 JPEG q90", "mean_file_kib": mean_kb, "out_size": size, "rounds": rounds,
        "cpus": available_cores(), "seconds": seconds, "images_per_s": rates, "cpu_ms_per_image": cpu_ms,
        "ratios": ratios, "paired_ratios": {k: v for k, v in paired.items() if v is not None},
    }


def rounded(result: dict) -> dict:
    """``result`` with its figures rounded for the JSON output."""
    digits = {"seconds": 3, "images_per_s": 1, "cpu_ms_per_image": 3, "ratios": 2}
    out = dict(result, mean_file_kib=round(result["mean_file_kib"], 1))
    for key, d in digits.items():
        out[key] = {k: round(v, d) for k, v in result[key].items()}
    out["paired_ratios"] = {k: {m: round(x, 2) for m, x in v.items()} for k, v in result["paired_ratios"].items()}
    return out


def format_table(result: dict) -> str:
    n, size, seconds = result["images"], result["out_size"], result["seconds"]
    lines = [f"{n} JPEGs 500x375 (mean {result['mean_file_kib']:.0f} KiB) -> {size}x{size} RGB, "
             f"{result['cpus']} CPUs, best of {result['rounds']}"]
    width = max(len(k) for k in seconds)
    lines.append(f"{'':<{width}}  {'seconds':>8}  {'images/s':>9}  {'CPU ms/img':>10}")
    for name, s in seconds.items():
        lines.append(f"{name:<{width}}  {s:8.2f}  {result['images_per_s'][name]:9.0f}  "
                     f"{result['cpu_ms_per_image'][name]:10.2f}")
    lines += [f"{name}: {r:.2f}x" for name, r in result["ratios"].items()]
    lines += [f"{name}, same round: median {v['median']:.2f}x (rounds {v['min']:.2f}-{v['max']:.2f}x)"
              for name, v in result["paired_ratios"].items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = new_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=3000, help="number of JPEGs")
    parser.add_argument("--size", type=int, default=128, help="output side")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated photos")
    add_data_option(parser, "--cache")
    parser.add_argument("--rounds", type=int, default=3, help="repeat each measurement, keep the best")
    parser.add_argument("--no-keras", action="store_true", help="skip the Keras/tf.data baseline")
    add_json_option(parser)
    args = parser.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    result = run(n=args.n, size=args.size, workers=workers, seed=args.seed, data_dir=args.data, rounds=args.rounds,
                 keras=not args.no_keras)
    emit(rounded(result) if args.json else result, as_json=args.json, format_text=format_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
