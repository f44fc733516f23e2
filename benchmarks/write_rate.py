"""Write rate: the same arrays written by ``h5stream.write``, by ``h5stream ingest`` (as image files), by MosaicML
Streaming's ``MDSWriter`` and by LitData's ``optimize``, in the same run.

One run makes ``--n`` random RGB images of ``--size`` pixels with int labels (seeded), saves them once as PNG files
in class folders (untimed, cached under ``--data``), then measures, each in rows per second of the whole call:

* ``h5stream.write sorted``    -- ``h5stream.write(out, (x, y), order="sorted")``: rows in the arrays' order
* ``h5stream.write shuffled``  -- the same, stored shuffled (the default for a source with a length)
* ``h5stream ingest (files)``  -- ``h5stream ingest`` of the same images as PNG files (decode included), all cores
* ``streaming MDSWriter``      -- ``MDSWriter(columns={"image": "ndarray:uint8:HxWx3" , "label": "int"})``,
  one ``write`` per row, no compression (h5stream's default)
* ``litdata optimize``         -- ``optimize(fn, inputs=range(n), output_dir, num_workers=1)``, ``fn`` giving
  ``{"image": x[i], "label": y[i]}`` (starting its worker process included, as a user runs it: a fixed cost of
  seconds, which small ``--n`` makes dominate)

A peer that is not importable here is skipped and named in the output (install it in an environment of its own:
``pip install mosaicml-streaming litdata``).  Each measurement is repeated ``--rounds`` times, interleaved; the best
is reported and the ratios to ``h5stream.write sorted`` within each round, as medians.

Usage::

    python -m benchmarks.write_rate                      # 20000 rows of 32x32
    python -m benchmarks.write_rate --n 2000 --rounds 2 --json
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks.harness import by_name, cached_dir, child_env, interleave, log, new_parser, run_cli, same_round_ratios

WRITE = "h5stream.write sorted"
WRITE_SHUFFLED = "h5stream.write shuffled"
INGEST = "h5stream ingest (files)"
MDS = "streaming MDSWriter"
LITDATA = "litdata optimize"
PEERS = {MDS: "streaming", LITDATA: "litdata"}
PIP_NAMES = {"streaming": "mosaicml-streaming"}


def make_arrays(n: int, size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8), rng.integers(0, 10, n).astype(np.int64)


def save_files(root: str, x: np.ndarray, y: np.ndarray) -> None:
    """The arrays as PNG files, one folder per class (what ``h5stream ingest`` reads); lossless, so the same rows."""
    from PIL import Image

    for i, (image, label) in enumerate(zip(x, y)):
        folder = os.path.join(root, f"c{int(label)}")
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(image).save(os.path.join(folder, f"{i:07d}.png"), compress_level=1)


def importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# -- measurements: each returns rows/s ------------------------------------------------------
def bench_write(x, y, out: str, order: str) -> float:
    import h5stream

    t0 = time.perf_counter()
    result = h5stream.write(out, (x, y), order=order, overwrite=True)
    seconds = time.perf_counter() - t0
    assert result.rows == len(x)
    return len(x) / seconds


def bench_ingest(src: str, out: str, n: int, size: int) -> float:
    if os.path.exists(out):
        os.unlink(out)
    cmd = [sys.executable, "-m", "h5stream", "ingest", src, out, "--size", str(size), "--order", "sorted",
           "--overwrite"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=child_env())
    return n / (time.perf_counter() - t0)


def bench_mds(x, y, out: str) -> float:
    from streaming import MDSWriter

    shutil.rmtree(out, ignore_errors=True)
    h, w, c = x.shape[1:]
    columns = {"image": f"ndarray:uint8:{h},{w},{c}", "label": "int"}
    t0 = time.perf_counter()
    with MDSWriter(out=out, columns=columns, size_limit=1 << 26) as writer:
        for image, label in zip(x, y):
            writer.write({"image": image, "label": int(label)})
    return len(x) / (time.perf_counter() - t0)


class _Item:
    """``fn`` of ``optimize``: row ``i`` as a dict (pickled to litdata's worker process with its arrays)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __call__(self, i: int) -> dict:
        return {"image": self.x[i], "label": int(self.y[i])}


@contextlib.contextmanager
def stdout_to_stderr():
    """File descriptor 1 (also that of child processes started meanwhile) sent to stderr: stdout carries only the
    table or the JSON, and the peers print progress."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def bench_litdata(x, y, out: str) -> float:
    import litdata

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    with stdout_to_stderr():
        litdata.optimize(fn=_Item(x, y), inputs=list(range(len(x))), output_dir=out, chunk_bytes="64MB",
                         num_workers=1, mode="overwrite")
    return len(x) / (time.perf_counter() - t0)


def run(args) -> dict:
    x, y = make_arrays(args.n, args.size)
    src = cached_dir(os.path.join(args.data, f"write-rate-{args.n}-{args.size}"), lambda root: save_files(root, x, y))
    skipped = {name: f"{module} is not importable here (pip install {PIP_NAMES.get(module, module)})"
               for name, module in PEERS.items() if not importable(module)}
    with tempfile.TemporaryDirectory(prefix="h5stream-write-rate-") as tmp:
        measurements = {
            WRITE: lambda: bench_write(x, y, os.path.join(tmp, "w.h5"), "sorted"),
            WRITE_SHUFFLED: lambda: bench_write(x, y, os.path.join(tmp, "ws.h5"), "shuffled"),
            INGEST: lambda: bench_ingest(src, os.path.join(tmp, "i.h5"), args.n, args.size),
            MDS: lambda: bench_mds(x, y, os.path.join(tmp, "mds")),
            LITDATA: lambda: bench_litdata(x, y, os.path.join(tmp, "litdata")),
        }
        bench_write(x[:64], y[:64], os.path.join(tmp, "warm.h5"), "sorted")  # imports and first-use costs, untimed
        for name in skipped:
            log(f"skipping {name}: {skipped[name]}")
            del measurements[name]
        rounds = interleave(measurements, args.rounds, progress=True)
    rates = by_name(rounds)
    return {
        "rows": args.n, "size": args.size, "rounds": args.rounds,
        "rows_per_s": {name: max(values) for name, values in rates.items()},
        "ratios_to_write": {name: same_round_ratios(rounds, name, WRITE) for name in rates if name != WRITE},
        "skipped": skipped,
    }


def format_text(result: dict) -> str:
    lines = [f"write rate: {result['rows']} rows of {result['size']}x{result['size']}x3, best of "
             f"{result['rounds']} rounds", f"{'writer':<28} {'rows/s':>12} {'x write sorted (median)':>24}"]
    for name, rate in result["rows_per_s"].items():
        ratio = result["ratios_to_write"].get(name)
        lines.append(f"{name:<28} {rate:>12,.0f} {'' if ratio is None else format(ratio['median'], '.2f'):>24}")
    for name, why in result["skipped"].items():
        lines.append(f"{name:<28} {'skipped':>12}   {why}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = new_parser(__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=20000, help="rows")
    p.add_argument("--size", type=int, default=32, help="image side in pixels")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best counts")
    return run_cli(p, argv, run, format_text)


if __name__ == "__main__":
    raise SystemExit(main())
