"""Image classification from an HDF5 store: folder of class subfolders -> `h5stream ingest` -> small CNN.

    .venv/bin/python examples/train_classifier.py                     # generates sample images first
    .venv/bin/python examples/train_classifier.py --data photos/ --val-data photos_val/ --epochs 10 --workers 2

Training streams a shuffled, augmented epoch at a time within --memory-budget;
validation streams the held-out store in file order without augmentation.
Without --data, class-per-folder images are generated with h5stream.samples.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import h5stream
from h5stream import cli
from h5stream.samples import make_class_folder


def ingest(src: str, out: str, size: int, quick: bool) -> None:
    argv = ["ingest", src, out, "--size", str(size), "--overwrite"] + (["--workers", "0"] if quick else [])
    if cli.main(argv) != 0:
        raise SystemExit(f"ingest of {src} failed")


def build_model(image_shape, n_classes: int):
    import keras

    return keras.Sequential([
        keras.Input(image_shape), keras.layers.Rescaling(1 / 255),
        keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(n_classes, activation="softmax"),
    ])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", help="folder with one subfolder per class (default: generate sample images)")
    p.add_argument("--val-data", help="held-out folder laid out like --data (default: generated, or none)")
    p.add_argument("--work", help="where to put stores and generated images (default: a temporary folder)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--memory-budget", default=None,
                   help="stream memory budget, e.g. 512MiB (default: h5stream's, 256 MiB plus what --workers need)")
    p.add_argument("--workers", type=int, default=0, help="augmentation processes (0: in the training process)")
    p.add_argument("--size", type=int, default=32, help="image side after ingest (pixels)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny data, one epoch (CI)")
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.batch_size, args.size = 1, 16, 24
    work = args.work
    if work is None:  # a folder of our own: removed when the script exits (--work keeps yours)
        work = tempfile.mkdtemp(prefix="h5stream-classifier-")
        atexit.register(shutil.rmtree, work, ignore_errors=True)
    src, val_src = args.data, args.val_data
    if src is None:
        per_class = 12 if args.quick else 150
        src, val_src = os.path.join(work, "train"), os.path.join(work, "val")
        make_class_folder(src, classes=4, per_class=per_class, size=(48, 48), seed=args.seed)
        make_class_folder(val_src, classes=4, per_class=max(4, per_class // 4), size=(48, 48), seed=args.seed + 1)
    train_path = os.path.join(work, "train.h5")
    ingest(src, train_path, args.size, args.quick)
    val_path = None
    if val_src is not None:
        val_path = os.path.join(work, "val.h5")
        ingest(val_src, val_path, args.size, args.quick)

    import keras

    from h5stream.keras import StallMonitor

    keras.utils.set_random_seed(args.seed)
    augment = h5stream.Augment(rotation_range=15, width_shift_range=0.1, height_shift_range=0.1,
                               zoom_range=(0.9, 1.0), horizontal_flip=True)
    train = h5stream.open(train_path, batch_size=args.batch_size, memory_budget=args.memory_budget,
                          seed=args.seed, augment=augment, workers=args.workers)
    val = (h5stream.open(val_path, batch_size=args.batch_size, memory_budget=args.memory_budget, shuffle=False)
           if val_path else None)
    try:
        meta = train.meta
        print(f"train: {meta.rows} images {meta.image_shape}, classes {train.class_names}; "
              f"{len(train)} batches/epoch; {train.plan.describe()}")
        model = build_model(meta.image_shape, len(train.class_names))
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        model.fit(train.keras(), validation_data=val.keras() if val else None, epochs=args.epochs,
                  callbacks=[StallMonitor(train)], verbose=2)
        if val is not None:
            loss, acc = model.evaluate(val.keras(), verbose=0)
            print(f"validation accuracy: {100 * acc:.1f}% ({val.meta.rows} held-out images)")
    finally:
        train.close()
        if val is not None:
            val.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
