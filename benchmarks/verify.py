"""`h5stream verify` against a plain sequential h5py read of the same file: warm and cold page cache.

    python -m benchmarks.verify                        # bench-data/bench-1g.h5, made when missing
    python -m benchmarks.verify --file /tmp/v.h5 --gb 1  # another file (made when missing)
    python -m benchmarks.verify --json                   # one JSON object

The baseline reads every committed row of ``/images``, ``/labels`` and
``/paths`` with ``read_direct`` in the slices :func:`verify_store` uses, into
buffers allocated once: the same bytes in the same order, without hashing.
Both run in this process, alternating within each of ``--rounds`` rounds
(default 3); times are medians, the ratio the median of each round's own
verify / read ratio, which is what survives a shared machine's drift.  Cold
runs drop the file from the page cache first (``posix_fadvise(DONTNEED)``);
the fraction still cached after that is reported, since tmpfs or a mapping
keeps pages.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

import numpy as np

from benchmarks.data import make_bench_file, rows_for_gb
from benchmarks.harness import DATA_DIR, add_json_option, median, new_parser, warm

SIZE, CHANNELS = 128, 3


def sequential_read(path: str) -> float:
    """Seconds to read the committed rows of the three arrays as :func:`verify_store` does, without hashing."""
    import h5py

    from h5stream.store import pathrows, schema
    from h5stream.store.checksum import VERIFY_SLICE_BYTES
    from h5stream.store.meta import read_meta

    meta = read_meta(path)
    t0 = time.perf_counter()
    with h5py.File(path, "r", locking=False, rdcc_nbytes=0) as f:
        vlen = pathrows.is_vlen(f)  # variable-length paths: their own arrays per slice, as verify_store reads them
        names = (schema.IMAGES, schema.LABELS) if vlen else (schema.IMAGES, schema.LABELS, schema.PATHS)
        row_bytes = sum(f[n].dtype.itemsize * int(np.prod(f[n].shape[1:], dtype=np.int64)) for n in names)
        slice_rows = max(1, VERIFY_SLICE_BYTES // row_bytes // meta.block_rows) * meta.block_rows
        slice_rows = min(slice_rows, max(meta.block_rows, meta.rows))
        bufs = [np.empty((slice_rows, *f[n].shape[1:]), dtype=f[n].dtype) for n in names]
        for start in range(0, meta.rows, slice_rows):
            stop = min(start + slice_rows, meta.rows)
            for n, buf in zip(names, bufs):
                f[n].read_direct(buf, np.s_[start:stop], np.s_[0:stop - start])
            if vlen:
                pathrows.read_h5py(f, start, stop)
    return time.perf_counter() - t0


def verify(path: str) -> float:
    from h5stream.store.checksum import verify_store

    t0 = time.perf_counter()
    result = verify_store(path)
    seconds = time.perf_counter() - t0
    if not result.ok:
        raise SystemExit(f"{path}: verify did not pass ({result}); benchmark a good store")
    return seconds


def prepare(path: str, cold: bool) -> float | None:
    """Warm or evict ``path``; returns the cached fraction after an eviction (None when unknown)."""
    from h5stream.measure import cached_fraction, evict_from_page_cache

    if not cold:
        warm(path)
        return None
    evict_from_page_cache(path)
    return cached_fraction(path)


def run(path: str, rounds: int, caches: list[str]) -> dict:
    import h5py

    from h5stream.store import pathrows, schema
    from h5stream.store.meta import read_meta

    meta = read_meta(path)
    with h5py.File(path, "r", locking=False) as f:
        path_bytes = (8 * meta.rows + int(f[schema.PATH_ENDS][meta.rows - 1]) if pathrows.is_vlen(f) and meta.rows
                      else meta.rows * schema.PATH_BYTES)
    data_bytes = meta.rows * (meta.row_bytes + meta.label_row_bytes) + path_bytes
    out = {"file": os.path.abspath(path), "rows": meta.rows, "file_bytes": meta.file_bytes, "data_bytes": data_bytes,
           "rounds": rounds, "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
           "results": {}}
    for cache in caches:
        cold = cache == "cold"
        reads, verifies, ratios, left = [], [], [], []
        for r in range(rounds):
            order = ("read", "verify") if r % 2 == 0 else ("verify", "read")
            times = {}
            for what in order:
                fraction = prepare(path, cold)
                if fraction is not None:
                    left.append(fraction)
                times[what] = sequential_read(path) if what == "read" else verify(path)
                print(f"  {cache} round {r + 1}: {what} {times[what]:.3f} s", file=sys.stderr, flush=True)
            reads.append(times["read"])
            verifies.append(times["verify"])
            ratios.append(times["verify"] / times["read"])
        out["results"][cache] = {
            "read_s": median(reads), "verify_s": median(verifies),
            "read_gb_per_s": data_bytes / median(reads) / 1e9,
            "verify_gb_per_s": data_bytes / median(verifies) / 1e9,
            "ratio": median(ratios), "round_ratios": ratios,
            "read_rounds_s": reads, "verify_rounds_s": verifies,
            "cached_after_evict": max(left) if left else None,
        }
    return out


def table(out: dict) -> str:
    lines = [
        f"file: {out['file']} ({out['rows']} rows, {out['data_bytes'] / 1e9:.2f} GB of rows, "
        f"{out['file_bytes'] / 1e9:.2f} GB on disk); {out['rounds']} rounds, medians; {out['machine']}",
        "",
        "| page cache | sequential `read_direct` | `h5stream verify` | verify / read time (per-round ratios) |",
        "| --- | --- | --- | --- |",
    ]
    for cache, r in out["results"].items():
        note = "" if r["cached_after_evict"] is None else f" ({r['cached_after_evict']:.0%} left cached)"
        lines.append(
            f"| {cache}{note} | {r['read_s']:.3f} s, {r['read_gb_per_s']:.2f} GB/s | "
            f"{r['verify_s']:.3f} s, {r['verify_gb_per_s']:.2f} GB/s | "
            f"{r['ratio']:.2f}x ({', '.join(f'{x:.2f}' for x in r['round_ratios'])}) |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = new_parser(__doc__.split("\n\n")[0])
    p.add_argument("--file", default=os.path.join(DATA_DIR, "bench-1g.h5"), help="store to measure (made when missing)")
    p.add_argument("--gb", type=float, default=1.0, help="pixel GB of the store made when --file is missing")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians")
    p.add_argument("--no-cold", action="store_true", help="warm page cache only")
    add_json_option(p)
    args = p.parse_args(argv)
    if not os.path.exists(args.file):
        make_bench_file(args.file, rows=rows_for_gb(args.gb, SIZE, CHANNELS))
    out = run(args.file, args.rounds, ["warm"] if args.no_cold else ["warm", "cold"])
    print(json.dumps(out) if args.json else table(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
