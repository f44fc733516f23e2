"""Generate a large class-sorted benchmark store quickly (synthetic, but not noise).

    python tools/make_bench_file.py --gb 1 --out bench-data/bench-1g.h5
    python tools/make_bench_file.py --gb 4 --out bench-data/bench-4g.h5
    python tools/make_bench_file.py --rows 5000 --size 32 --out /tmp/small.h5

Rows are 128x128x3 uint8 (``--size``), ``--classes`` classes stored
**class-sorted** (all of class 0, then class 1, ...), the hard case for a
chunked shuffle.  Pixels: per class a bank of smooth random colour fields
(bilinear-upsampled low-resolution noise, tinted per class, with a class
shape drawn on top), plus per-row fine noise and a flip -- so compression and
page-cache behaviour look like photos rather than constant or white-noise
rows.  Written with :class:`h5stream.store.writer.StoreWriter`; an existing
file with the same rows and shape is kept unless ``--overwrite``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

BANK_PER_CLASS = 24
NOISE_BANK = 64
WRITE_ROWS = 1024
COMMIT_EVERY = 16


def class_bank(n_classes: int, size: int, channels: int, seed: int) -> np.ndarray:
    """``(n_classes, BANK_PER_CLASS, size, size, channels)`` uint8 base images."""
    import cv2

    rng = np.random.default_rng([seed, 0])
    bank = np.empty((n_classes, BANK_PER_CLASS, size, size, channels), dtype=np.uint8)
    yy, xx = np.mgrid[0:size, 0:size] / size
    for c in range(n_classes):
        tint = rng.uniform(60, 200, channels)
        for k in range(BANK_PER_CLASS):
            coarse = rng.normal(0, 40, (6, 6, channels)).astype(np.float32)
            field = cv2.resize(coarse, (size, size), interpolation=cv2.INTER_CUBIC).reshape(size, size, channels)
            img = field + tint
            # A class-specific shape at a random place: a ring whose radius grows with the class id.
            cy, cx = rng.uniform(0.3, 0.7, 2)
            r = 0.08 + 0.02 * (c % 10)
            ring = np.abs(np.hypot(yy - cy, xx - cx) - r) < 0.03
            img[ring] = 255 - tint
            bank[c, k] = np.clip(img, 0, 255).astype(np.uint8)
    return bank


def make_rows(bank: np.ndarray, noise: np.ndarray, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Images for ``labels``: a random bank image of the class + a random noise tile, half of them mirrored."""
    base = bank[labels, rng.integers(0, bank.shape[1], labels.size)].astype(np.int16)
    base += noise[rng.integers(0, noise.shape[0], labels.size)]
    flip = rng.random(labels.size) < 0.5
    base[flip] = base[flip, :, ::-1]
    return np.clip(base, 0, 255).astype(np.uint8)


def make_bench_file(out: str, *, rows: int, size: int = 128, channels: int = 3, n_classes: int = 10, seed: int = 0,
                    block_rows: int | None = None, compression: str | None = None, overwrite: bool = False,
                    progress: bool = True) -> str:
    """Write the store (see the module doc); returns ``out``.  Reuses a matching existing file unless ``overwrite``."""
    from h5stream.store.writer import StoreWriter

    if os.path.exists(out) and not overwrite:
        try:
            from h5stream.store.meta import read_meta

            meta = read_meta(out)
            if meta.rows == rows and meta.image_shape == (size, size, channels):
                return out
        except Exception:
            pass
        raise SystemExit(f"{out} exists with other contents; pass --overwrite to replace it")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    rng = np.random.default_rng([seed, 1])
    bank = class_bank(n_classes, size, channels, seed)
    noise = rng.integers(-3, 4, (NOISE_BANK, size, size, channels)).astype(np.int16)
    # Class-sorted: class c owns a contiguous run of rows (sizes differ by at most one).
    labels = np.repeat(np.arange(n_classes), np.diff(np.linspace(0, rows, n_classes + 1).round().astype(int)))
    t0 = time.monotonic()
    with StoreWriter.create(out, image_shape=(size, size, channels), class_names=[f"class{c}" for c in range(n_classes)],
                            block_rows=block_rows, storage_order="sorted", compression=compression,
                            overwrite=overwrite, expected_rows=rows) as writer:
        for i, start in enumerate(range(0, rows, WRITE_ROWS)):
            y = labels[start:start + WRITE_ROWS]
            writer.append(make_rows(bank, noise, y, rng), y, [f"synthetic/{start + j}" for j in range(y.size)])
            if (i + 1) % COMMIT_EVERY == 0:
                writer.commit()
                if progress:
                    done = start + y.size
                    print(f"\r{out}: {done}/{rows} rows, {done * size * size * channels / 1e9:.2f} GB, "
                          f"{time.monotonic() - t0:.0f} s", end="", file=sys.stderr, flush=True)
    if progress:
        print(f"\r{out}: {rows} rows, {os.path.getsize(out) / 1e9:.2f} GB in {time.monotonic() - t0:.0f} s",
              file=sys.stderr)
    return out


def rows_for_gb(gb: float, size: int, channels: int) -> int:
    """Rows whose pixels make at least ``gb`` * 1e9 bytes."""
    return math.ceil(gb * 1e9 / (size * size * channels))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench-data/bench-1g.h5")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--gb", type=float, default=None, help="pixel bytes, in GB (default 1.0)")
    size.add_argument("--rows", type=int, default=None)
    p.add_argument("--size", type=int, default=128, help="image height = width (default 128)")
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-rows", type=int, default=None, help="HDF5 chunk rows (default: h5stream's 4 MiB rule)")
    p.add_argument("--compression", choices=["none", "zlib", "blosc"], default="none")
    p.add_argument("--overwrite", action="store_true")
    args = p.parse_args(argv)
    rows = args.rows if args.rows is not None else rows_for_gb(args.gb or 1.0, args.size, args.channels)
    make_bench_file(args.out, rows=rows, size=args.size, channels=args.channels, n_classes=args.classes,
                    seed=args.seed, block_rows=args.block_rows,
                    compression=None if args.compression == "none" else args.compression, overwrite=args.overwrite)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
