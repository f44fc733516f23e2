"""Augmentation benchmark, one core: h5stream's Augment vs. the alternatives vs. Keras' ImageDataGenerator.

All candidates apply the ``standard`` preset's geometry (rotation 45, shifts
0.1, zoom [0.8, 1], horizontal flip) to the same uint8 rows, one image at a
time in this process, with every library limited to one thread:

* ``h5stream``      -- ``Augment.preset("standard")`` (OpenCV warp via RGBA + edge padding, uint8 channel shift)
* ``cv2 plain``     -- one ``cv2.warpAffine`` per 3-channel image + channel shift, no fast-path tricks
* ``scipy``         -- ``scipy.ndimage.affine_transform`` per image (what Keras calls), uint8 in/out
* ``pillow``        -- ``Image.transform(AFFINE, BILINEAR)`` (fill is constant: Pillow has no "nearest" edge mode)
* ``numpy batch``   -- vectorised bilinear gather over the whole batch, replicated edges
* ``keras idg``     -- ``ImageDataGenerator(**standard).flow(x, batch_size=32, shuffle=False)`` (float32 out)

Channel shift is applied by h5stream, cv2 plain and keras only (the others
measure the warp alone, which flatters them).  Figures are images/s, best of
``--repeats`` runs; keras runs once.

Usage::

    python tools/bench_augment.py                    # 128x128x3 and 32x32x3
    python tools/bench_augment.py --sizes 128 --json
"""

from __future__ import annotations

import os

# One core per candidate: set before numpy / OpenCV / TensorFlow load their thread pools.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from h5stream.augment import PRESETS, Augment  # noqa: E402
from h5stream.augment.transforms import affine_matrices  # noqa: E402


def make_rows(n: int, size: int, seed: int = 0) -> np.ndarray:
    """Photo-like uint8 rows (smooth noise), (n, size, size, 3)."""
    import cv2

    rs = np.random.default_rng(seed)
    out = np.empty((n, size, size, 3), np.uint8)
    for i in range(n):
        small = rs.integers(0, 256, (size // 8 + 2, size // 8 + 2, 3)).astype(np.float32)
        out[i] = np.clip(cv2.resize(small, (size, size), interpolation=cv2.INTER_CUBIC), 0, 255)
    return out


def standard_matrices(aug: Augment, n: int, size: int):
    p = aug.draw(0, 0, np.arange(n), size, size)
    m = affine_matrices(p["theta"], p["tx"], p["ty"], p["shear"], p["zx"], p["zy"], size, size, p["flip_horizontal"])
    return m, np.rint(p["channel_shift_intensity"]).astype(np.int64)


def run_h5stream(x, aug, matrices, shifts):
    rows = np.arange(len(x))
    out = np.empty_like(x)
    return lambda: aug(x, seed=0, epoch=0, row_ids=rows, out=out)


def run_cv2_plain(x, aug, matrices, shifts):
    import cv2

    out = np.empty_like(x)
    size = x.shape[1]
    flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP

    def go():
        cv2.setNumThreads(1)
        for i in range(len(x)):
            cv2.warpAffine(x[i], matrices[i], (size, size), dst=out[i], flags=flags, borderMode=cv2.BORDER_REPLICATE)
            img = out[i].astype(np.int16)
            np.clip(img + shifts[i], img.min(), img.max(), out=img)
            out[i] = img

    return go


def run_scipy(x, aug, matrices, shifts):
    from scipy import ndimage

    out = np.empty_like(x)
    # (row, col, channel) coordinates: swap OpenCV's (x, y) and leave channels alone.
    mats = []
    for m in matrices:
        a = np.eye(3)
        a[0, :2] = m[1, [1, 0]]
        a[1, :2] = m[0, [1, 0]]
        mats.append((a, np.array([m[1, 2], m[0, 2], 0.0])))

    def go():
        for i in range(len(x)):
            ndimage.affine_transform(x[i], mats[i][0], mats[i][1], output=out[i], order=1, mode="nearest")

    return go


def run_pillow(x, aug, matrices, shifts):
    from PIL import Image

    out = np.empty_like(x)
    size = x.shape[1]
    coeffs = [tuple(m.reshape(-1)) for m in matrices]  # Pillow's AFFINE data is the inverse map too

    def go():
        for i in range(len(x)):
            img = Image.fromarray(x[i]).transform((size, size), Image.Transform.AFFINE, coeffs[i], Image.Resampling.BILINEAR)
            out[i] = np.asarray(img)

    return go


def run_numpy(x, aug, matrices, shifts):
    n, h, w, _ = x.shape
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    grid = np.stack([xs.ravel(), ys.ravel(), np.ones(h * w, np.float32)])  # (3, HW)
    mats = matrices.astype(np.float32)

    def go():
        src = mats @ grid  # (n, 2, HW)
        sx = np.clip(src[:, 0], 0, w - 1)
        sy = np.clip(src[:, 1], 0, h - 1)
        x0 = np.minimum(sx.astype(np.int32), w - 2)
        y0 = np.minimum(sy.astype(np.int32), h - 2)
        fx = (sx - x0)[..., None]
        fy = (sy - y0)[..., None]
        flat = x.reshape(n, h * w, -1).astype(np.float32)
        base = (y0 * w + x0)
        b = np.arange(n)[:, None]
        top = flat[b, base] * (1 - fx) + flat[b, base + 1] * fx
        bot = flat[b, base + w] * (1 - fx) + flat[b, base + w + 1] * fx
        return np.rint(top * (1 - fy) + bot * fy).astype(np.uint8)

    return go


def run_keras(x, aug, matrices, shifts):
    from keras.src.legacy.preprocessing.image import ImageDataGenerator

    params = {k: (list(v) if isinstance(v, tuple) else v) for k, v in PRESETS["standard"].items()}
    idg = ImageDataGenerator(**params)

    def go():
        it = idg.flow(x, batch_size=32, shuffle=False)
        for i in range(len(it)):
            it[i]

    return go


CANDIDATES = {
    "h5stream": run_h5stream,
    "cv2 plain": run_cv2_plain,
    "scipy": run_scipy,
    "pillow": run_pillow,
    "numpy batch": run_numpy,
    "keras idg": run_keras,
}


def measure(make, x, aug, matrices, shifts, repeats):
    fn = make(x, aug, matrices, shifts)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return len(x) / best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="128,32", help="square image sizes, comma-separated (default 128,32)")
    parser.add_argument("--n", type=int, default=0, help="images per run (default 512 at 128, scaled by area, max 4096)")
    parser.add_argument("--keras-n", type=int, default=0, help="images for keras (default: min(n, 512))")
    parser.add_argument("--repeats", type=int, default=3, help="runs per candidate; the best counts (keras: 1)")
    parser.add_argument("--only", default="", help="comma-separated candidates (default all): " + ", ".join(CANDIDATES))
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)

    import cv2

    names = [c.strip() for c in args.only.split(",") if c.strip()] or list(CANDIDATES)
    unknown = sorted(set(names) - set(CANDIDATES))
    if unknown:
        parser.error(f"unknown candidate(s) {unknown}; choose from {', '.join(CANDIDATES)}")
    aug = Augment.preset("standard")
    result = {
        "preset": {k: v for k, v in PRESETS["standard"].items()},
        "cpu": platform.processor() or platform.machine(),
        "cv2": cv2.__version__,
        "numpy": np.__version__,
        "cores_used": 1,
        "sizes": {},
    }
    for size in (int(s) for s in args.sizes.split(",")):
        n = args.n or int(min(4096, max(64, 512 * (128 * 128) / (size * size))))
        x = make_rows(n, size)
        matrices, shifts = standard_matrices(aug, n, size)
        row = {}
        for name in names:
            if name == "keras idg":
                try:
                    import keras  # noqa: F401
                except ImportError:
                    row[name] = None
                    continue
                kn = args.keras_n or min(n, 512)
                row[name] = measure(CANDIDATES[name], x[:kn], aug, matrices[:kn], shifts[:kn], 1)
            else:
                row[name] = measure(CANDIDATES[name], x, aug, matrices, shifts, args.repeats)
            print(f"  {size}x{size}: {name:12s} {row[name]:10.0f} img/s", file=sys.stderr)
        result["sizes"][str(size)] = row
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"one core, preset standard, cv2 {result['cv2']}; images/s (best of {args.repeats}); x = vs keras idg")
    print(f"{'size':>9} " + " ".join(f"{name:>13}" for name in names))
    for size, row in result["sizes"].items():
        keras_rate = row.get("keras idg")
        cells = []
        for name in names:
            v = row.get(name)
            cells.append(f"{'-':>13}" if v is None else f"{v:>13,.0f}")
        print(f"{size + 'x' + size:>9} " + " ".join(cells))
        if keras_rate:
            print(f"{'x keras':>9} " + " ".join(f"{(row[n] or 0) / keras_rate:>12.1f}x" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
