"""The benchmarks' data: a large class-sorted store, cached JPEG folders and their ingested stores, in-memory rows.

* :func:`make_bench_file` -- a class-sorted store of synthetic rows that are
  not noise: per class a bank of smooth random colour fields (bilinear-upsampled
  low-resolution noise, tinted per class, with a class shape drawn on top), plus
  per-row fine noise and a flip, so compression and page-cache behaviour look
  like photos rather than constant or white-noise rows.  Class-sorted (all of
  class 0, then class 1, ...) is the hard case for a chunked shuffle.  Written
  with :class:`h5stream.store.writer.StoreWriter`; an existing file with the
  same rows and shape is kept unless ``overwrite``.
* :func:`ensure_photos` / :func:`ensure_folder` -- folders of generated JPEGs
  (photo-like ~500x375, or already at a small size), made once under the data
  cache; :func:`ensure_store` -- such a folder ingested by h5stream, cached
  next to it.
* :func:`read_rows` -- a store's first rows in memory; :func:`smooth_rows` --
  photo-like uint8 rows made in memory.

Command line (the store only)::

    python -m benchmarks.data --gb 1 --out bench-data/bench-1g.h5
    python -m benchmarks.data --gb 4 --out bench-data/bench-4g.h5
    python -m benchmarks.data --rows 5000 --size 32 --out /tmp/small.h5
"""

from __future__ import annotations

import math
import os
import sys
import time

import numpy as np

from benchmarks.harness import COMPLETE_MARKER, DATA_DIR, available_cores, cached_dir, new_parser

PHOTO_SIZE = (375, 500)
"""(height, width) of :func:`ensure_photos`' JPEGs."""

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


def bank_rows(bank: np.ndarray, noise: np.ndarray, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
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
    with StoreWriter.create(out, image_shape=(size, size, channels),
                            class_names=[f"class{c}" for c in range(n_classes)],
                            block_rows=block_rows, storage_order="sorted", compression=compression,
                            overwrite=overwrite, expected_rows=rows) as writer:
        for i, start in enumerate(range(0, rows, WRITE_ROWS)):
            y = labels[start:start + WRITE_ROWS]
            writer.append(bank_rows(bank, noise, y, rng), y, [f"synthetic/{start + j}" for j in range(y.size)])
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


#: Photos per part when a folder is made by several processes (see :func:`make_jpegs`).
JPEGS_PER_PART = 1000


def make_jpegs(root: str, n: int, *, size: tuple[int, int] | None = None, seed: int = 0,
               processes: int | None = None, per_part: int = JPEGS_PER_PART) -> None:
    """:func:`h5stream.samples.make_realistic_jpegs` into ``root`` by ``processes`` processes (default: every
    available core), each making parts of ``per_part`` photos: the same files as one process makes,
    since each photo depends only on ``seed`` and its index."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from h5stream.concurrency.spawn import main_module_hidden
    from h5stream.samples import make_realistic_jpegs

    kw = dict(seed=seed) if size is None else dict(seed=seed, size=size)
    parts = [(lo, min(lo + per_part, n)) for lo in range(0, n, per_part)]
    processes = min(processes or available_cores(), len(parts))
    if processes <= 1:
        make_realistic_jpegs(root, n, **kw)
        return
    # Spawned, not forked (the caller may have threads: a test runner's, a benchmark's), without re-running the
    # caller's main script (which may be a benchmark's, or standard input).
    with main_module_hidden(), ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        for done in [pool.submit(make_realistic_jpegs, root, hi, start=lo, **kw) for lo, hi in parts]:
            done.result()


def ensure_photos(data_dir: str, n: int, seed: int = 0) -> str:
    """A cached folder of ``n`` photo-like ~500x375 JPEGs in 4 class folders (made by
    :func:`h5stream.samples.make_realistic_jpegs`)."""
    return cached_dir(os.path.join(data_dir, f"jpegs-{n}-seed{seed}"),
                      lambda root: make_jpegs(root, n, seed=seed))


def ensure_folder(data_dir: str, n: int, size: int, seed: int = 0, at_size: bool = False) -> tuple[str, str]:
    """A cached folder of ``n`` JPEGs in 4 class folders for rows of ``size``; returns (path, what the sources are).

    Size 128 and up uses :func:`ensure_photos`' ~500x375 photos; smaller sizes, and any size with ``at_size``,
    use JPEGs already at ``size`` (nothing to shrink: what a loader of JPEGs resized once beforehand reads).
    """
    if size >= 128 and not at_size:
        return ensure_photos(data_dir, n, seed), f"{PHOTO_SIZE[1]}x{PHOTO_SIZE[0]} JPEG"
    root = cached_dir(os.path.join(data_dir, f"jpegs-{n}-{size}px-seed{seed}"),
                      lambda root: make_jpegs(root, n, size=(size, size), seed=seed))
    return root, f"{size}x{size} JPEG"


def ensure_store(data_dir: str, folder: str, size: int) -> str:
    """``folder`` ingested at ``size`` x ``size`` by h5stream's ingest (cached next to it; made again if incomplete)."""
    from h5stream.ingest.pack import IngestOptions, default_workers, ingest
    from h5stream.store.meta import read_meta

    out = os.path.join(data_dir, f"pipeline-{os.path.basename(folder)}-{size}.h5")
    n_files = sum(1 for _, _, files in os.walk(folder) for name in files if name != COMPLETE_MARKER)
    if os.path.exists(out):
        try:
            if read_meta(out).rows == n_files:
                return out
        except Exception:  # a half-written cache from a killed run: make it again
            pass
    result = ingest(IngestOptions(src=folder, out=out, size=(size, size), workers=default_workers(),
                                  overwrite=True, progress=False))
    if result.skipped:
        raise SystemExit(f"ingest skipped {result.skipped} files of {folder}; see {result.report_path}")
    return out


def read_rows(path: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` rows and labels of a store, in memory."""
    import h5py

    from h5stream.store import schema
    from h5stream.store.meta import read_meta

    n = min(n, read_meta(path).rows)
    with h5py.File(path, "r") as f:
        return f[schema.IMAGES][:n], f[schema.LABELS][:n]


def smooth_rows(n: int, size: int, seed: int = 0) -> np.ndarray:
    """Photo-like uint8 rows (smooth noise), (n, size, size, 3)."""
    import cv2

    rs = np.random.default_rng(seed)
    out = np.empty((n, size, size, 3), np.uint8)
    for i in range(n):
        small = rs.integers(0, 256, (size // 8 + 2, size // 8 + 2, 3)).astype(np.float32)
        out[i] = np.clip(cv2.resize(small, (size, size), interpolation=cv2.INTER_CUBIC), 0, 255)
    return out


def main(argv=None) -> int:
    p = new_parser("Write a large class-sorted benchmark store (synthetic, but not noise).")
    p.add_argument("--out", default=os.path.join(DATA_DIR, "bench-1g.h5"),
                   help="the store to write")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--gb", type=float, default=None, help="pixel bytes, in GB (default 1.0)")
    size.add_argument("--rows", type=int, default=None, help="rows to write (instead of --gb)")
    p.add_argument("--size", type=int, default=128, help="image height = width")
    p.add_argument("--channels", type=int, default=3, help="channels per pixel")
    p.add_argument("--classes", type=int, default=10, help="labels, stored sorted by class")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic pixels")
    p.add_argument("--block-rows", type=int, default=None, help="HDF5 chunk rows (default: h5stream's 4 MiB rule)")
    p.add_argument("--compression", choices=["none", "zlib", "blosc"], default="none",
                   help="HDF5 compression of the pixels")
    p.add_argument("--overwrite", action="store_true", help="replace the store if it exists")
    args = p.parse_args(argv)
    rows = args.rows if args.rows is not None else rows_for_gb(args.gb or 1.0, args.size, args.channels)
    make_bench_file(args.out, rows=rows, size=args.size, channels=args.channels, n_classes=args.classes,
                    seed=args.seed, block_rows=args.block_rows,
                    compression=None if args.compression == "none" else args.compression, overwrite=args.overwrite)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
