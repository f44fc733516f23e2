"""Augmentation on one core: h5stream's Augment vs. the alternatives vs. Keras' ImageDataGenerator.

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

Also the Augment alone as the pipeline benchmark measures it
(:func:`measure_transform`, :func:`measure_transform_processes`).

Usage::

    python -m benchmarks.augment                    # 128x128x3 and 32x32x3
    python -m benchmarks.augment --sizes 128 --json
"""

from __future__ import annotations

import os

if __name__ == "__main__":
    # One thread per library, for this program only (a benchmark importing this module keeps its threads):
    # OpenBLAS, OpenMP, MKL and TensorFlow size their pools from these when they load, so before numpy below.
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS",
                 "TF_NUM_INTEROP_THREADS"):
        os.environ.setdefault(_var, "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.data import smooth_rows  # noqa: E402
from benchmarks.harness import add_json_option, emit, log, new_parser  # noqa: E402
from h5stream.augment import PRESETS, Augment  # noqa: E402
from h5stream.augment.transforms import affine_matrices  # noqa: E402

PRESET = "standard"
"""The preset every augmentation benchmark applies."""
BATCH_SIZE = 32
"""Rows per batch where a benchmark batches (the pipeline's streams and baselines)."""


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
            img = Image.fromarray(x[i]).transform((size, size), Image.Transform.AFFINE, coeffs[i],
                                                  Image.Resampling.BILINEAR)
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

    params = {k: (list(v) if isinstance(v, tuple) else v) for k, v in PRESETS[PRESET].items()}
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


# -- the Augment alone, as the pipeline benchmark measures it ---------------------------------
def measure_transform(x: np.ndarray, *, repeats: int = 3, batch_size: int = BATCH_SIZE) -> dict:
    """Images/s of the ``standard`` Augment alone in this process over rows in memory, best of ``repeats``.

    ``images_per_s`` is this benchmark's ``h5stream`` candidate (all rows in one
    call): the transform's per-image ceiling.  ``batched_images_per_s`` calls
    it once per ``batch_size`` rows, as a worker does, so it includes the
    per-call costs (parameter draw, matrices) a stream pays per batch.  No
    reading, IPC or copies in either.
    """
    aug = Augment.preset(PRESET)
    aug(x[:2], seed=0, epoch=0, row_ids=np.arange(min(2, len(x))))  # loads OpenCV outside the clock

    def batched(x, aug, matrices, shifts):
        out = np.empty_like(x)

        def go():
            for i in range(0, len(x), batch_size):
                j = min(i + batch_size, len(x))
                aug(x[i:j], seed=0, epoch=0, row_ids=np.arange(i, j), out=out[i:j])

        return go

    return {"images_per_s": measure(run_h5stream, x, aug, None, None, repeats),
            "batched_images_per_s": measure(batched, x, aug, None, None, repeats),
            "batch_size": batch_size, "images": len(x), "statistic": f"best of {repeats}"}


def _spin_transform(x, seconds, batch_size, queue):
    """In a spawned process: the ``standard`` Augment over ``x`` in batches for ``seconds``; puts images/s."""
    aug = Augment.preset(PRESET)
    out = np.empty_like(x[:batch_size])
    ids = np.arange(len(x))
    aug(x[:batch_size], seed=0, epoch=0, row_ids=ids[:batch_size], out=out[:len(x[:batch_size])])
    n, epoch, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for i in range(0, len(x), batch_size):
            j = min(i + batch_size, len(x))
            aug(x[i:j], seed=0, epoch=epoch, row_ids=ids[i:j], out=out[:j - i])
            n += j - i
        epoch += 1
    queue.put(n / (time.perf_counter() - t0))


def measure_transform_processes(x: np.ndarray, *, procs: int = 2, seconds: float = 3.0, rounds: int = 2,
                                batch_size: int = BATCH_SIZE) -> dict:
    """Images/s of the Augment alone in 1 and in ``procs`` independent processes, batch by batch, no I/O or IPC.

    The ratio is what ``procs`` cores of this machine give to pure augmentation
    (shared caches, memory bandwidth, the hypervisor): the ceiling for the
    ``workers=procs`` / ``workers=1`` scaling of a stream, which also needs CPU
    for its reader and consumer.  Medians of ``rounds`` interleaved rounds.
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    rates = {1: [], procs: []}
    for _ in range(rounds):
        for k in (1, procs):
            queue = ctx.Queue()
            ps = [ctx.Process(target=_spin_transform, args=(x, seconds, batch_size, queue)) for _ in range(k)]
            for p in ps:
                p.start()
            total = sum(queue.get(timeout=600) for _ in ps)
            for p in ps:
                p.join()
            rates[k].append(total)
    one, many = statistics.median(rates[1]), statistics.median(rates[procs])
    return {"procs": procs, "one_images_per_s": one, "many_images_per_s": many, "scaling": many / one,
            "rounds": rounds, "seconds": seconds}


# -- the run --------------------------------------------------------------------------------
def format_table(result: dict) -> str:
    names = result["candidates"]
    lines = [f"one core, preset standard, cv2 {result['cv2']}; images/s (best of {result['repeats']}); "
             "x = vs keras idg",
             f"{'size':>9} " + " ".join(f"{name:>13}" for name in names)]
    for size, row in result["sizes"].items():
        keras_rate = row.get("keras idg")
        cells = []
        for name in names:
            v = row.get(name)
            cells.append(f"{'-':>13}" if v is None else f"{v:>13,.0f}")
        lines.append(f"{size + 'x' + size:>9} " + " ".join(cells))
        if keras_rate:
            lines.append(f"{'x keras':>9} " + " ".join(f"{(row[n] or 0) / keras_rate:>12.1f}x" for n in names))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = new_parser(__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="128,32", help="square image sizes, comma-separated")
    parser.add_argument("--n", type=int, default=0,
                        help="images per run (default 512 at 128, scaled by area, max 4096)")
    parser.add_argument("--keras-n", type=int, default=0, help="images for keras (default: min(n, 512))")
    parser.add_argument("--repeats", type=int, default=3, help="runs per candidate; the best counts (keras: 1)")
    parser.add_argument("--only", default="", help="comma-separated candidates (default all): " + ", ".join(CANDIDATES))
    add_json_option(parser)
    args = parser.parse_args(argv)

    import cv2

    names = [c.strip() for c in args.only.split(",") if c.strip()] or list(CANDIDATES)
    unknown = sorted(set(names) - set(CANDIDATES))
    if unknown:
        parser.error(f"unknown candidate(s) {unknown}; choose from {', '.join(CANDIDATES)}")
    aug = Augment.preset(PRESET)
    result = {
        "preset": dict(PRESETS[PRESET]),
        "cpu": platform.processor() or platform.machine(),
        "cv2": cv2.__version__,
        "numpy": np.__version__,
        "cores_used": 1,
        "repeats": args.repeats,
        "candidates": names,
        "sizes": {},
    }
    for size in (int(s) for s in args.sizes.split(",")):
        n = args.n or int(min(4096, max(64, 512 * (128 * 128) / (size * size))))
        x = smooth_rows(n, size)
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
            log(f"  {size}x{size}: {name:12s} {row[name]:10.0f} img/s")
        result["sizes"][str(size)] = row
    emit(result, as_json=args.json, format_text=format_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
