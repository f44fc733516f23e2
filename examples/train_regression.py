"""Regression from an HDF5 store: images + a CSV of float targets (like steering angles) -> CNN -> MSE.

    .venv/bin/python examples/train_regression.py                      # generates sample images + labels.csv
    .venv/bin/python examples/train_regression.py --data drive/ --labels drive/angles.csv --val-data drive_val/ \
        --val-labels drive_val/angles.csv --epochs 10

The CSV has a path column (relative to --data) and one or more float columns;
the store keeps them as float32 targets.  Without --data, images whose colour
encodes the target are generated with h5stream.samples.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

import h5stream
from h5stream import cli
from h5stream.samples import make_regression_folder


def ingest(src: str, labels: str, out: str, size: int, quick: bool) -> None:
    argv = ["ingest", src, out, "--labels", labels, "--size", str(size), "--overwrite"]
    if cli.main(argv + (["--workers", "0"] if quick else [])) != 0:
        raise SystemExit(f"ingest of {src} failed")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", help="image folder (default: generate sample images)")
    p.add_argument("--labels", help="CSV of targets for --data (default: DATA/labels.csv)")
    p.add_argument("--val-data", help="held-out image folder")
    p.add_argument("--val-labels", help="CSV of targets for --val-data (default: VAL_DATA/labels.csv)")
    p.add_argument("--work", help="where to put stores and generated images (default: a temporary folder)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--memory-budget", default=None,
                   help="stream memory budget, e.g. 512MiB (default: h5stream's, 256 MiB)")
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny data, one epoch (CI)")
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.batch_size, args.size = 1, 16, 24
    work = args.work
    if work is None:  # a folder of our own: removed when the script exits (--work keeps yours)
        work = tempfile.mkdtemp(prefix="h5stream-regression-")
        atexit.register(shutil.rmtree, work, ignore_errors=True)
    src, val_src = args.data, args.val_data
    labels, val_labels = args.labels, args.val_labels
    if src is None:
        n = 40 if args.quick else 600
        src, val_src = os.path.join(work, "train"), os.path.join(work, "val")
        labels, _ = make_regression_folder(src, n, targets=1, size=(48, 64), seed=args.seed)
        val_labels, _ = make_regression_folder(val_src, max(8, n // 4), targets=1, size=(48, 64), seed=args.seed + 1)
    labels = labels or os.path.join(src, "labels.csv")
    train_path = os.path.join(work, "train.h5")
    ingest(src, labels, train_path, args.size, args.quick)
    val_path = None
    if val_src is not None:
        val_path = os.path.join(work, "val.h5")
        ingest(val_src, val_labels or os.path.join(val_src, "labels.csv"), val_path, args.size, args.quick)

    import keras

    keras.utils.set_random_seed(args.seed)
    train = h5stream.open(train_path, batch_size=args.batch_size, memory_budget=args.memory_budget, seed=args.seed)
    val = (h5stream.open(val_path, batch_size=args.batch_size, memory_budget=args.memory_budget, shuffle=False)
           if val_path else None)
    try:
        meta = train.meta
        n_targets = int(np.prod(meta.label_shape)) if meta.label_shape else 1
        print(f"train: {meta.rows} images {meta.image_shape}, targets {meta.label_columns or n_targets}")
        model = keras.Sequential([
            keras.Input(meta.image_shape), keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(32, activation="relu"), keras.layers.Dense(n_targets),
        ])
        if not meta.label_shape:
            model.add(keras.layers.Reshape(()))
        model.compile(optimizer="adam", loss="mse")
        model.fit(train.keras(), validation_data=val.keras() if val else None, epochs=args.epochs, verbose=2)
        if val is not None:
            mse = model.evaluate(val.keras(), verbose=0)
            print(f"validation MSE: {mse:.5f} ({val.meta.rows} held-out images)")
    finally:
        train.close()
        if val is not None:
            val.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
