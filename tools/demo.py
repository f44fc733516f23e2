"""The main job on sample data, end to end: make images -> ingest -> stream -> report.

    python tools/demo.py --out demo          (what `make demo` runs)

1. writes a class-per-folder set of sample JPEG/PNG images (once; reused after),
2. `h5stream ingest` packs them into demo/train.h5 (parallel decode, resized),
3. `h5stream info` describes the file,
4. streams one epoch without augmentation and one with the `standard`
   augmentation in worker processes, under a memory budget, and prints
   throughput and what the consumer waited.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import h5stream
from h5stream.cli import main as cli
from h5stream.samples import make_class_folder


def stream_epoch(path: str, **kw) -> tuple[float, int, float]:
    with h5stream.open(path, batch_size=64, seed=0, **kw) as s:
        print(f"  plan: {s.plan.describe()}")
        t0 = time.perf_counter()
        rows = sum(len(x) for x, _y in s)
        wall = time.perf_counter() - t0
        return rows / wall, rows, s.stats()["wait_s"] / wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="demo", help="working folder (default: demo)")
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--per-class", type=int, default=250)
    ap.add_argument("--size", default="64", help="stored image size for ingest (default 64)")
    ap.add_argument("--memory-budget", default="256MiB")
    ap.add_argument("--workers", type=int, default=2, help="augmenting worker processes (default 2)")
    args = ap.parse_args(argv)

    images = os.path.join(args.out, "images")
    store = os.path.join(args.out, "train.h5")
    if not os.path.isdir(images):
        print(f"[1/4] writing {args.classes} x {args.per_class} sample images to {images}/ ...")
        t0 = time.perf_counter()
        make_class_folder(images, classes=args.classes, per_class=args.per_class, size=(180, 240), fmt="mixed")
        print(f"      done in {time.perf_counter() - t0:.1f} s")
    else:
        print(f"[1/4] reusing sample images in {images}/")

    print(f"[2/4] h5stream ingest {images} {store} --size {args.size} --overwrite")
    rc = cli(["ingest", images, store, "--size", args.size, "--overwrite"])
    if rc:
        return rc

    print(f"[3/4] h5stream info {store}")
    rc = cli(["info", store])
    if rc:
        return rc

    print(f"[4/4] streaming with memory_budget={args.memory_budget}")
    rate, rows, waited = stream_epoch(store, memory_budget=args.memory_budget)
    print(f"  plain epoch: {rows} rows, {rate:,.0f} images/s")
    aug = h5stream.Augment.preset("standard", rescale=1 / 255)
    rate, rows, waited = stream_epoch(store, memory_budget=args.memory_budget, augment=aug, workers=args.workers)
    print(f"  augmented epoch ('standard' preset, {args.workers} workers): {rows} rows, {rate:,.0f} images/s, "
          f"consumer waited {waited:.0%} of the time (it does no work: the pipeline is the bottleneck here)")
    print("done. Next: examples/train_classifier.py trains a model from this file.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
