"""Scale in rows: open time, first batch, steady rows/s and bookkeeping bytes per row of stores of many small rows.

    python -m benchmarks.scale                       # 1M and 20M rows (100M with --rows 100M)
    python -m benchmarks.scale --rows 1M --json
    python -m benchmarks.scale --rows 1M,20M,100M --dir /tmp/scale

Each store holds ``N`` rows of 4x4x3 uint8 pixels (48 bytes) and class labels, written with
:func:`h5stream.write` from ``(images, labels)`` arrays in their order (``order="sorted"``: class-sorted, the
stream's hardest case), the images an array-like of one random slice of rows repeated (:class:`TiledImages`, so
100M rows need no 4.8 GB in memory), made once under ``--dir`` and removed afterwards unless ``--keep`` (which also
reuses the finished stores kept before).  ``write s`` is that call.  Mind the disk: every row also stores its path
(its index: a few bytes, plus 8 for where it ends), so a store takes about 72 bytes a row (7.2 GB for 100M rows).

Per store and ``verify_reads`` setting (``"once"``, ``False``):

* ``open_s``: ``h5stream.open`` returning;
* ``first_s``: from ``open`` returning to the first batch;
* ``rows/s``: rows per second over the ``--steady`` batches after the first;
* ``B/row``: bytes the stream's bookkeeping holds per row of the store: the memory traced by
  :mod:`tracemalloc` (numpy's arrays included) once the first batch arrived, over the rows (an upper bound:
  it includes the shuffle buffer's batches, which are not per row); a second open, as tracing slows allocation;
* ``+B/row``: the traced bytes each row more costs, against the next smaller store (the batches cancel out).

Batch 256, the default memory budget, seed 0, in this process.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import tracemalloc

import numpy as np

from benchmarks.harness import add_json_option, emit, log, new_parser

SHAPE = (4, 4, 3)
BATCH = 256
SLICE = 1 << 20
SETTINGS = {"once": "once", "off": False}


def parse_rows(text: str) -> list[int]:
    """``"1M,20M"`` -> ``[1_000_000, 20_000_000]``."""
    out = []
    for part in text.split(","):
        part = part.strip().upper()
        scale = {"K": 1_000, "M": 1_000_000}.get(part[-1:], 1)
        out.append(int(float(part.rstrip("KM")) * scale))
    return out


class TiledImages:
    """``rows`` images of :data:`SHAPE`: ``SLICE`` random rows repeated, as an array-like (``shape``, ``dtype``,
    ``len``, indexing by an int, a slice or an int array, as a ``np.memmap`` or an h5py dataset offers them) that
    holds one slice in memory instead of ``rows * 48`` bytes."""

    def __init__(self, rows: int):
        self.pattern = np.random.default_rng(0).integers(0, 256, (SLICE, *SHAPE), dtype=np.uint8)
        self.shape, self.dtype = (rows, *SHAPE), np.dtype(np.uint8)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key):
        if isinstance(key, slice):
            key = np.arange(*key.indices(len(self)))
        return self.pattern[np.asarray(key) % SLICE]


def make_store(path: str, rows: int) -> float:
    """Write ``rows`` rows of :data:`SHAPE` (10 classes, class-sorted) to ``path`` with :func:`h5stream.write`;
    return the seconds."""
    import h5stream

    classes = 10
    labels = (np.arange(rows, dtype=np.int64) * classes // rows).astype(np.uint8)
    t0 = time.perf_counter()
    h5stream.write(path, (TiledImages(rows), labels), order="sorted", classes=[str(c) for c in range(classes)],
                   overwrite=True)
    return time.perf_counter() - t0


def _has_rows(path: str, rows: int) -> bool:
    """Whether ``path`` is a finished store of ``rows`` committed rows (kept from an earlier ``--keep`` run)."""
    from h5stream.store.meta import read_meta

    try:
        meta = read_meta(path)
        return meta.rows == rows and (meta.ingest is None or meta.ingest.finished)
    except Exception:
        return False


def measure(path: str, verify, steady: int) -> dict:
    import h5stream

    options = {"batch_size": BATCH, "seed": 0, "verify_reads": verify}
    t0 = time.perf_counter()
    stream = h5stream.open(path, **options)
    t_open = time.perf_counter()
    with stream:
        it = iter(stream)
        next(it)
        t_first = time.perf_counter()
        n = 0
        for _ in range(steady):
            x, _y = next(it)
            n += len(x)
        t_end = time.perf_counter()
    # Bookkeeping: a second open, traced.
    tracemalloc.start()
    try:  # tracing slows every allocation: this open is not timed, so it is not bound by the default timeout_s
        stream = h5stream.open(path, **options, timeout_s=600)
        with stream:
            next(iter(stream))
            traced = tracemalloc.get_traced_memory()[0]
            buffers = int(stream.plan.batches_bytes)
    finally:
        tracemalloc.stop()
    rows = stream.meta.rows if hasattr(stream, "meta") else None
    return {"open_s": t_open - t0, "first_s": t_first - t_open, "rows_per_s": n / max(t_end - t_first, 1e-9),
            "traced_bytes": traced, "budget_bytes": buffers, "rows": rows}


def run(args) -> dict:
    results = []
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    root = os.path.join(args.dir or tempfile.gettempdir(), "h5stream-scale") if args.keep else \
        tempfile.mkdtemp(prefix="h5stream-scale-", dir=args.dir)
    os.makedirs(root, exist_ok=True)
    try:
        for rows in parse_rows(args.rows):
            path = os.path.join(root, f"scale-{rows}.h5")
            need = rows * 72 * 1.05
            free = shutil.disk_usage(root).free
            if free < need:
                log(f"skipping {rows} rows: {free / 1e9:.1f} GB free, need ~{need / 1e9:.1f} GB")
                continue
            write_s = None
            if not (args.keep and _has_rows(path, rows)):
                log(f"writing {rows} rows to {path}")
                write_s = make_store(path, rows)
            for name, verify in SETTINGS.items():
                log(f"{rows} rows, verify_reads={verify!r}")
                try:
                    m = measure(path, verify, args.steady)
                except Exception as exc:  # e.g. ReaderError: the first batch took longer than timeout_s
                    log(f"failed: {exc}")
                    results.append({"rows": rows, "verify_reads": name, "write_s": write_s, "error": str(exc)})
                    continue
                m.update(rows=rows, verify_reads=name, write_s=write_s,
                         bytes_per_row=m["traced_bytes"] / rows)
                results.append(m)
            if not args.keep:
                os.remove(path)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    _marginal(results)
    return {"batch_size": BATCH, "row_shape": list(SHAPE), "steady_batches": args.steady,
            "cpus": os.cpu_count(), "load": os.getloadavg()[0], "results": results}


def _marginal(results: list[dict]) -> None:
    """Add ``marginal_bytes_per_row``: the traced bytes a row more costs, from the next smaller store with the
    same setting (what grows with the rows, the shuffle buffer's batches cancelled out)."""
    for r in results:
        smaller = [o for o in results if o["verify_reads"] == r["verify_reads"] and o["rows"] < r["rows"]
                   and "error" not in o]
        if smaller and "error" not in r:
            o = max(smaller, key=lambda o: o["rows"])
            r["marginal_bytes_per_row"] = (r["traced_bytes"] - o["traced_bytes"]) / (r["rows"] - o["rows"])


def format_text(result: dict) -> str:
    lines = [f"rows of {tuple(result['row_shape'])} uint8, batch {result['batch_size']}, "
             f"load average {result['load']:.1f} on {result['cpus']} CPUs",
             f"{'rows':>12} {'verify':>6} {'write s':>8} {'open s':>7} {'first s':>8} {'rows/s':>10} {'B/row':>7} "
             f"{'+B/row':>7}"]
    for r in result["results"]:
        write = "kept" if r["write_s"] is None else f"{r['write_s']:.1f}"
        if "error" in r:
            lines.append(f"{r['rows']:>12,} {r['verify_reads']:>6} {write:>8} failed: {r['error']}")
            continue
        lines.append(f"{r['rows']:>12,} {r['verify_reads']:>6} {write:>8} {r['open_s']:>7.2f} "
                     f"{r['first_s']:>8.2f} {r['rows_per_s']:>10,.0f} {r['bytes_per_row']:>7.1f} "
                     f"{r.get('marginal_bytes_per_row', float('nan')):>7.1f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = new_parser(__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1M,20M", help="comma-separated store sizes, e.g. 1M,20M,100M")
    parser.add_argument("--steady", type=int, default=2000, help="batches timed after the first")
    parser.add_argument("--dir", default=None, help="where the stores are written (default: the temp dir)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the stores (in DIR/h5stream-scale/) and reuse those already there")
    add_json_option(parser)
    args = parser.parse_args(argv)
    emit(run(args), as_json=args.json, format_text=format_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
