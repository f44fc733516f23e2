"""Does the bounded shuffle hurt training?  Same model, same epochs, three ways of feeding a class-sorted file.

Data: scikit-learn's ``load_digits`` (1797 real 8x8 scans of handwritten
digits), upscaled to 32x32x3; the training split is enlarged with ``--copies``
jittered copies (random shifts of up to 2 px and pixel noise) so the file is
much larger than the shuffle buffer, and written **class-sorted** (all 0s,
then all 1s, ...): the worst case for any shuffle that reads contiguous rows.
The 360 held-out digits (not jittered) measure accuracy.

Regimes, each trained from the same initial weights per seed:

* ``memory``  -- arrays in RAM, ``model.fit(x, y, shuffle=True)``: a full shuffle every epoch;
* ``h5stream`` -- ``h5stream.open(file, memory_budget=--budget)``, shuffle buffer a few % of the file;
* ``chunk``   -- the single-contiguous-chunk shuffle: read ``100 * batch`` rows in file order,
  shuffle inside the chunk, cut batches; chunks in random order each epoch;
* ``h5stream jpeg`` (with ``--encoding jpeg``) -- the same training images written as a JPEG store
  (``--quality``, default 90: each row encoded as ``h5stream ingest --encoding jpeg`` does) and streamed as
  ``h5stream`` is, same budget and seeds: the rows the model sees are the decoded JPEGs;
* ``h5stream url`` (with ``--url http``) -- the same store served over HTTP with Range on 127.0.0.1 (the tests'
  ``RangeServer``, ``tests/remote_servers.py``, in a process of its own) and streamed from its URL with the
  same options as ``h5stream`` and otherwise the defaults: the local disk cache on (a new cache folder per run,
  removed after it), the default budget with ``h5stream``'s shuffle window pinned (``rows_per_fill``: ``--budget``
  leaves no room for the remote client, which the default budget adds on top).  A URL and its local copy with
  the same window and unit give the same batches, which the run checks (``url_same_order``: every epoch's order
  of the first seed).

Prints a table (mean and std of test accuracy over seeds) and, with ``--json``,
writes every figure.  Target: ``h5stream`` within 1 point of ``memory``; with
``--encoding jpeg``, ``h5stream jpeg`` within 0.5 point of ``h5stream`` (the raw store); with ``--url http``,
``h5stream url`` within 0.5 point of ``h5stream`` (the local file).

    python -m benchmarks.quality --seeds 0 1 2 --epochs 4 --json quality.json
    python -m benchmarks.quality --encoding jpeg --regimes h5stream --seeds 0 1 2   # raw against JPEG q90 only
    python -m benchmarks.quality --url http --regimes h5stream --seeds 0 1 2        # local file against its URL
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

import h5stream
from benchmarks.harness import new_parser
from h5stream.store.writer import write_arrays

SIZE = 32


def digits_dataset(copies: int, seed: int = 0):
    """``(x_train, y_train, x_test, y_test)``: uint8 (n, 32, 32, 3), int64 labels; train class-sorted."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    images = np.clip(d.images * 16, 0, 255).astype(np.uint8)  # 0..16 -> 0..255
    x_tr, x_te, y_tr, y_te = train_test_split(images, d.target, test_size=0.2, random_state=0, stratify=d.target)
    rng = np.random.default_rng(seed)
    parts, labels = [], []
    for c in range(copies):
        x = _upscale(x_tr)
        if c:  # copy 0 is the original
            x = _jitter(x, rng)
        parts.append(x)
        labels.append(y_tr)
    x_train, y_train = np.concatenate(parts), np.concatenate(labels).astype(np.int64)
    order = np.argsort(y_train, kind="stable")
    return x_train[order], y_train[order], _upscale(x_te), y_te.astype(np.int64)


def _upscale(images8: np.ndarray) -> np.ndarray:
    x = np.kron(images8, np.ones((SIZE // 8, SIZE // 8), np.uint8))  # nearest-neighbour 8x8 -> 32x32
    return np.repeat(x[..., None], 3, axis=-1)


def _jitter(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    out = np.empty_like(x)
    for i in range(len(x)):
        dy, dx = rng.integers(-2, 3, size=2)
        out[i] = np.roll(x[i], (dy, dx), axis=(0, 1))
    noise = rng.integers(-12, 13, size=x.shape)
    return np.clip(out.astype(np.int16) + noise, 0, 255).astype(np.uint8)


def write_jpeg_store(path: str, x: np.ndarray, y: np.ndarray, *, quality: int, block_rows: int,
                     rows_per_write: int = 4096):
    """``x``, ``y`` as a class-sorted JPEG store at ``quality`` (the rows encoded as ingest encodes them)."""
    from h5stream.ingest.encode import encode_rows
    from h5stream.store.meta import read_meta
    from h5stream.store.writer import StoreWriter

    with StoreWriter.create(path, image_shape=x.shape[1:], class_names=[str(c) for c in range(int(y.max()) + 1)],
                            block_rows=block_rows, storage_order="sorted", expected_rows=len(x),
                            encoding="jpeg", jpeg_quality=quality) as w:
        for start in range(0, len(x), rows_per_write):
            stop = min(start + rows_per_write, len(x))
            w.append(encode_rows(x[start:stop], quality), y[start:stop], [f"row{i}" for i in range(start, stop)])
            w.commit()
    return read_meta(path)


@contextlib.contextmanager
def http_served(folder: str):
    """``http://127.0.0.1:PORT/`` serving the files of ``folder`` with Range: the tests' ``RangeServer``
    (``tests/remote_servers.py``) in a process of its own, so that the training's threads never compete with the
    server's for this interpreter.  Stopped (and reaped) on leaving."""
    tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
    sys.path.insert(0, tests)
    try:
        from remote_servers import RangeServerProcess
    finally:
        sys.path.remove(tests)
    with RangeServerProcess(folder) as server:
        yield server.url


def build_model(seed: int):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((SIZE, SIZE, 3)), keras.layers.Rescaling(1 / 255),
        keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def chunk_batches(x, y, batch: int, chunk_rows: int, seed: int, epoch: int):
    """One epoch of the single-contiguous-chunk shuffle (pure: depends on seed and epoch only)."""
    rng = np.random.default_rng([seed, epoch])
    starts = np.arange(0, len(x), chunk_rows)
    for s in rng.permutation(starts):
        idx = s + rng.permutation(min(chunk_rows, len(x) - s))
        for b in range(0, len(idx), batch):
            sel = np.sort(idx[b:b + batch])
            yield x[sel], y[sel]


def run(args) -> dict:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    x_train, y_train, x_test, y_test = digits_dataset(args.copies)
    tmp = tempfile.mkdtemp(prefix="h5quality-")
    path = os.path.join(tmp, "digits_sorted.h5")
    meta = write_arrays(path, x_train, y_train, block_rows=args.block_rows, storage_order="sorted")
    opts = {"batch_size": args.batch_size, "memory_budget": args.budget, "read_unit": args.read_unit}
    with h5stream.open(path, **opts) as probe:
        plan = probe.plan
    chunk_rows = 100 * args.batch_size
    jpeg_path = None
    if args.encoding == "jpeg":
        jpeg_path = os.path.join(tmp, "digits_sorted_jpeg.h5")
        jmeta = write_jpeg_store(jpeg_path, x_train, y_train, quality=args.quality, block_rows=args.block_rows)
    info = {"train_rows": int(meta.rows), "test_rows": int(len(y_test)), "file_bytes": int(meta.file_bytes),
            "budget": args.budget, "read_unit": args.read_unit, "unit_rows": int(plan.unit_rows),
            "block_rows": int(meta.block_rows), "shuffle_buffer_rows": int(plan.rows_per_fill),
            "n_buffers": int(plan.n_buffers),
            "buffer_fraction_of_file": plan.rows_per_fill / meta.rows, "chunk_rows": chunk_rows,
            "chunk_fraction_of_file": min(1.0, chunk_rows / meta.rows), "epochs": args.epochs,
            "batch_size": args.batch_size, "seeds": args.seeds, "storage_order": "sorted"}
    if jpeg_path:
        with h5stream.open(jpeg_path, **opts) as probe:
            jplan = probe.plan
        info.update(encoding="jpeg", jpeg_quality=args.quality, jpeg_file_bytes=int(jmeta.file_bytes),
                    jpeg_bytes_per_image=jmeta.encoded_bytes / jmeta.rows,
                    jpeg_shuffle_buffer_rows=int(jplan.rows_per_fill), jpeg_unit_rows=int(jplan.unit_rows))
    print(f"train {meta.rows} rows ({meta.file_bytes / 2**20:.1f} MiB, class-sorted), test {len(y_test)}; "
          f"h5stream budget {args.budget}: buffer {plan.rows_per_fill} rows "
          f"({100 * info['buffer_fraction_of_file']:.1f}% of the file, units of {plan.unit_rows} rows, "
          f"{plan.rows_per_fill // plan.unit_rows} per fill) x {plan.n_buffers}; "
          f"chunk {chunk_rows} rows ({100 * info['chunk_fraction_of_file']:.1f}%)", flush=True)
    if jpeg_path:
        print(f"JPEG q{args.quality} store: {jmeta.file_bytes / 2**20:.1f} MiB, "
              f"{info['jpeg_bytes_per_image']:,.0f} B/image against {x_train[0].nbytes:,} raw; h5stream buffer "
              f"{jplan.rows_per_fill} rows (units of {jplan.unit_rows} rows) x {jplan.n_buffers}", flush=True)
    regimes = list(args.regimes) + (["h5stream jpeg"] if jpeg_path else []) + (["h5stream url"] if args.url else [])
    results: dict[str, list[float]] = {r: [] for r in regimes}
    with contextlib.ExitStack() as stack:
        url = url_opts = None
        if args.url:
            url = stack.enter_context(http_served(tmp)) + os.path.basename(path)
            cache = tempfile.mkdtemp(prefix="h5quality-cache-")
            stack.callback(shutil.rmtree, cache, True)
            url_opts = url_options(opts, plan.rows_per_fill, cache)
            info.update(url_kind=args.url, url_same_order=same_order(path, url, opts, url_opts, args.seeds[0],
                                                                     args.epochs))
            print(f"over {url}: the same order as the local file in every epoch of seed {args.seeds[0]}: "
                  f"{info['url_same_order']}", flush=True)
        train_all(args, results, x_train, y_train, x_test, y_test, path, jpeg_path, url, opts, url_opts, chunk_rows)
    return report(args, info, results, path, jpeg_path, tmp)


def url_options(opts: dict, rows_per_fill: int, cache_dir: str) -> dict:
    """The URL regime's options: the local regime's ``opts`` with its shuffle window pinned and the default budget
    (``--budget`` leaves no room for the remote client, which comes on top of the default budget, so the default
    budget gives a URL its local copy's window), and the default disk cache in ``cache_dir``."""
    return {**opts, "memory_budget": None, "rows_per_fill": int(rows_per_fill), "cache_dir": cache_dir}


def same_order(path: str, url: str, opts: dict, url_opts: dict, seed: int, epochs: int) -> bool:
    """Whether the URL stream's order is the local file's in each of ``epochs`` epochs of ``seed``."""
    with h5stream.open(path, **opts, seed=seed) as here, h5stream.open(url, **url_opts, seed=seed) as there:
        return all(np.array_equal(here.epoch_order(e), there.epoch_order(e)) for e in range(epochs))


def train_all(args, results, x_train, y_train, x_test, y_test, path, jpeg_path, url, opts, url_opts,
              chunk_rows) -> None:
    """Train every regime of ``results`` for every seed, appending each test accuracy to its list."""
    import keras

    sources = {"h5stream": (path, opts), "h5stream jpeg": (jpeg_path, opts), "h5stream url": (url, url_opts)}
    for seed in args.seeds:
        for regime in results:
            t0 = time.perf_counter()
            model = build_model(seed)
            if regime == "memory":
                model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, shuffle=True, verbose=0)
            elif regime in sources:
                source, options = sources[regime]
                with h5stream.open(source, **options, seed=seed) as s:
                    model.fit(s.keras(), epochs=args.epochs, verbose=0)
            else:
                for epoch in range(args.epochs):
                    for xb, yb in chunk_batches(x_train, y_train, args.batch_size, chunk_rows, seed, epoch):
                        model.train_on_batch(xb, yb)
            acc = float(model.evaluate(x_test, y_test, batch_size=256, verbose=0)[1])
            results[regime].append(acc)
            print(f"  seed {seed} {regime:13s} accuracy {100 * acc:6.2f}%  ({time.perf_counter() - t0:.1f} s)",
                  flush=True)
            keras.backend.clear_session()


def report(args, info: dict, results: dict, path: str, jpeg_path: str | None, tmp: str) -> dict:
    """Print the table and the targets' verdicts; remove the stores; the figures as a dict."""
    summary = {k: {"accuracy": v, "mean": float(np.mean(v)), "std": float(np.std(v))} for k, v in results.items()}
    print(f"\n{'regime':13s} {'mean acc %':>10s} {'std':>6s}  per seed")
    for k, s in summary.items():
        print(f"{k:13s} {100 * s['mean']:10.2f} {100 * s['std']:6.2f}  "
              + " ".join(f"{100 * a:.2f}" for a in s["accuracy"]))
    out = {"config": info, "results": summary}
    if "memory" in summary and "h5stream" in summary:
        gap = out["gap_points"] = 100 * (summary["memory"]["mean"] - summary["h5stream"]["mean"])
        print(f"h5stream is {abs(gap):.2f} points {'below' if gap > 0 else 'above'} the in-memory full shuffle on "
              f"average (target: within 1 point): {'met' if abs(gap) <= 1 else 'MISSED'}")
    if jpeg_path and "h5stream" in summary:
        jgap = out["jpeg_gap_points"] = jpeg_gap(summary["h5stream"]["accuracy"], summary["h5stream jpeg"]["accuracy"])
        print(f"the JPEG q{args.quality} store is {abs(jgap['mean']):.2f} points "
              f"{'below' if jgap['mean'] > 0 else 'above'} the raw store on average (per seed: "
              + " ".join(f"{g:+.2f}" for g in jgap["per_seed"])
              + f"; target: within 0.5 point): {'met' if abs(jgap['mean']) <= 0.5 else 'MISSED'}")
    if args.url and "h5stream" in summary:
        ugap = out["url_gap_points"] = jpeg_gap(summary["h5stream"]["accuracy"], summary["h5stream url"]["accuracy"])
        print(f"the store over {args.url}:// is {abs(ugap['mean']):.2f} points "
              f"{'below' if ugap['mean'] > 0 else 'above'} the local file on average (per seed: "
              + " ".join(f"{g:+.2f}" for g in ugap["per_seed"])
              + f"; target: within 0.5 point): {'met' if abs(ugap['mean']) <= 0.5 else 'MISSED'}")
    for p in (path, jpeg_path):
        if p:
            os.unlink(p)
    os.rmdir(tmp)
    return out


def jpeg_gap(raw: list[float], jpeg: list[float]) -> dict:
    """Points the JPEG store's (or the URL's) accuracy is below the raw local store's: per seed (same seed, same
    initial weights) and their mean (pure)."""
    per_seed = [100 * (r - j) for r, j in zip(raw, jpeg)]
    return {"per_seed": per_seed, "mean": float(np.mean(per_seed))}


def main(argv=None) -> int:
    p = new_parser(__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training runs per regime")
    p.add_argument("--epochs", type=int, default=4, help="training epochs")
    p.add_argument("--batch-size", type=int, default=32, help="rows per batch")
    p.add_argument("--copies", type=int, default=8, help="jittered copies of the training digits (file size)")
    p.add_argument("--budget", default="8MiB", help="h5stream memory budget")
    p.add_argument("--block-rows", type=int, default=32, help="rows per HDF5 chunk")
    p.add_argument("--read-unit", default=None,
                   help="h5stream.open(read_unit=) for the h5stream regime, e.g. 4MiB (default: h5stream's)")
    p.add_argument("--threads", type=int, default=2, help="TensorFlow intra/inter-op threads")
    p.add_argument("--encoding", choices=["raw", "jpeg"], default="raw",
                   help="jpeg: also train on the same images as a JPEG store (regime 'h5stream jpeg')")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality with --encoding jpeg")
    p.add_argument("--url", choices=["http"], default=None,
                   help="http: also train from the store's URL on a local HTTP server (regime 'h5stream url')")
    p.add_argument("--regimes", nargs="+", choices=["memory", "h5stream", "chunk"],
                   default=["memory", "h5stream", "chunk"], help="regimes to train")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    out = run(args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    # TensorFlow reads this when it loads (inside run()): warnings and errors only.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
