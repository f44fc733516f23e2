"""The README's figures: a preview grid and a bench plot, as small PNGs under docs/.

    python -m benchmarks.figures                          # the committed docs/*.png
    python -m benchmarks.figures --store demo/train.h5    # the `make demo` store instead

By default it draws from a class-sorted synthetic store made by
:func:`benchmarks.data.make_bench_file` (3000 rows of 128x128x3, colour fields with a ring):
unlike the demo's flat-colour 64 px samples, rotation, shift and zoom are
visible in it, and it has the benchmark's image size.  Then:

* ``docs/preview.png`` -- ``h5stream preview STORE --augment standard --rows 3
  --cols 6 --seed 0``: the first images of epoch 0, augmented, titled by class;
* ``docs/bench.png`` -- ``h5stream bench STORE --augment standard --workers 2
  --epochs N --no-baselines --plot``: samples/s, CPU of the consumer, reader and
  each worker, queue fill and memory vs budget over time; ``N`` epochs make the
  run last about ``--min-rows`` rows.

Every step is a plain ``h5stream`` command, printed before it runs.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from benchmarks.data import make_bench_file
from benchmarks.harness import DATA_DIR, child_env, log, new_parser


def run(cmd: list[str]) -> str:
    """``python -m h5stream CMD...`` (printed first); its stdout."""
    log("+ h5stream " + " ".join(cmd))
    done = subprocess.run([sys.executable, "-m", "h5stream", *cmd], check=True, capture_output=True, text=True,
                          env=child_env())
    return done.stdout


def demo_store(path: str, *, rows: int, size: int) -> str:
    """A class-sorted synthetic store (colour fields with a ring, so rotation, shift and zoom show in the
    preview); kept if it already exists."""
    return make_bench_file(path, rows=rows, size=size, n_classes=10, progress=False)


def shrink_png(path: str, colors: int = 256) -> None:
    """Palette-quantise a PNG (a few times smaller; fine for a README picture)."""
    from PIL import Image

    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=colors)
    small.save(path, optimize=True)


def main(argv=None) -> int:
    p = new_parser(__doc__.split("\n\n")[0])
    p.add_argument("--store", default=None, help="store to draw from (default: a generated synthetic store)")
    p.add_argument("--out", default="docs", help="folder for the PNGs")
    p.add_argument("--min-rows", type=int, default=60_000, help="rows the bench run streams at least")
    p.add_argument("--workers", type=int, default=2, help="augmenting workers of the bench run")
    p.add_argument("--memory-budget", default="256MiB", help="the bench run's memory budget")
    args = p.parse_args(argv)
    store = args.store
    if store is None:
        store = demo_store(os.path.join(DATA_DIR, "figures-demo.h5"), rows=3000, size=128)
    os.makedirs(args.out, exist_ok=True)
    preview_png = os.path.join(args.out, "preview.png")
    bench_png = os.path.join(args.out, "bench.png")

    run(["preview", store, "--out", preview_png, "--augment", "standard", "--rows", "3", "--cols", "6", "--seed", "0"])
    shrink_png(preview_png)

    from h5stream.store.meta import read_meta

    epochs = max(1, math.ceil(args.min_rows / read_meta(store).rows))
    result = json.loads(run(["bench", store, "--augment", "standard", "--workers", str(args.workers),
                             "--epochs", str(epochs), "--memory-budget", args.memory_budget, "--no-baselines",
                             "--plot", bench_png, "--json"]))
    shrink_png(bench_png)
    print(f"{preview_png}: {os.path.getsize(preview_png) / 1e3:.0f} kB")
    print(f"{bench_png}: {os.path.getsize(bench_png) / 1e3:.0f} kB; {result['samples_per_s']:,.0f} samples/s "
          f"over {result['rows_streamed']:,} rows, peak {result['peak_mem_bytes'] / 2**20:.0f} MiB of "
          f"{result['memory_budget_bytes'] / 2**20:.0f} MiB, CPU "
          + ", ".join(f"{k} {v:.0f}%" for k, v in result["mean_cpu_pct"].items()
                      if not k.startswith(("h5stream-sampler", "tqdm"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
