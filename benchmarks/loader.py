"""The loader alone against one memory copy: h5stream with no augmentation, ``workers=0`` and plain-reading workers.

    python -m benchmarks.loader                      # 20,000 rows of 128 px, 3 rounds, workers 0 and 2
    python -m benchmarks.loader --rows 5000 --rounds 2 --json

One copy of every byte is the least a loader can do, so each round measures, in this process and one after the
other: a memory copy (``np.copyto`` between two 256 MiB arrays, in rows of the store's size per second), then each
stream's rows per second in steady state (epochs after the first; the first batch's latency and the first epoch's
rate are reported apart), on a warm page cache, batch 256, budget 256 MiB with ``workers=0`` and the default budget
with workers (256 MiB for reading and shuffling plus what the workers need).  Rounds are interleaved and the ratio
stream / copy is taken within each round (the machine drifts between rounds): the table shows the medians, and the
CPU time of this process per row (with ``workers=0`` every thread of the loader is in it), which other jobs on a
shared machine sway less than the rate, and (``workers=0``) the share of the time the reader's I/O threads spent
reading.

How the page cache holds the file decides the rate more than anything in the loader: copying a row out of 4 KiB
page-cache pages costs about twice the CPU of copying it out of large folios (docs/performance.md, "The loader
alone").  A sequential read makes large folios where the kernel can (Linux 6.x, ext4/XFS); a stream's own cold
epoch leaves 4 KiB pages.  So the table's header says which share of the file's cached pages lie in large folios
(where ``/proc/kpageflags`` can be read, as root), and ``--page-cache reread`` drops the file from the page cache
and reads it sequentially before the rounds (the default, ``as-is``, keeps what is there).

FFCV's loader alone on the same rows is measured in each round too, where its venv is there (``--ffcv-python``,
default ``$H5STREAM_FFCV_PYTHON`` or ``.venv-ffcv/bin/python`` at the repository root; ``--ffcv-python ''``
leaves it out): raw ``RGBImageField`` rows, ``OrderOption.RANDOM``, ``os_cache=True``, ``--ffcv-threads`` (2) threads,
the same batch, in a child of its own venv (:mod:`benchmarks.ffcv_loader`; its first epoch includes numba's
compilation, as a user meets it).  Its ``.beton`` is written once, next to the store.
"""

from __future__ import annotations

import argparse
import mmap
import os
import struct
import sys
import time

import numpy as np

from benchmarks.data import make_bench_file
from benchmarks.encoded_crop import DEFAULT_FFCV_PYTHON
from benchmarks.harness import (DATA_DIR, add_json_option, by_name, emit, interleave, log, median, new_parser,
                                same_round_ratios, warm)

SIZE, CHANNELS, BATCH, BUDGET = 128, 3, 256, "256MiB"
COPY_BYTES = 256 << 20


def copy_rate(row_bytes: int, seconds: float = 1.0) -> float:
    """Rows of ``row_bytes`` per second that one ``np.copyto`` between two large arrays moves."""
    src = np.ones(COPY_BYTES, np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # both touched once: no page faults in the timed copies
    t0, c0, n = time.perf_counter(), time.process_time(), 0
    while time.perf_counter() - t0 < seconds:
        np.copyto(dst, src)
        n += 1
    rows = n * COPY_BYTES / row_bytes
    return {"steady_rows_s": rows / (time.perf_counter() - t0),
            "cpu_us_per_row": (time.process_time() - c0) / rows * 1e6}


def large_folio_share(path: str, samples: int = 4096) -> float | None:
    """The share of ``path``'s pages in the page cache that lie in large folios (compound pages), from ``samples``
    pages spread over the file (each read once through a read-only mapping: call it on a cached file), or None
    where ``/proc/kpageflags`` cannot be read (it needs root) or the file is empty."""
    size = os.path.getsize(path)
    pages = size // mmap.PAGESIZE
    if pages == 0:
        return None
    try:
        kpageflags = open("/proc/kpageflags", "rb", buffering=0)
    except OSError:
        return None
    with kpageflags, open("/proc/self/pagemap", "rb", buffering=0) as pagemap, open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), pages * mmap.PAGESIZE, prot=mmap.PROT_READ)
        try:
            view = np.frombuffer(mapped, np.uint8)
            first_page = view.ctypes.data // mmap.PAGESIZE
            large = seen = 0
            for page in np.linspace(0, pages - 1, min(samples, pages)).astype(np.int64).tolist():
                int(view[page * mmap.PAGESIZE])  # mapped now, so pagemap has its frame
                pagemap.seek((first_page + page) * 8)
                entry = struct.unpack("Q", pagemap.read(8))[0]
                frame = entry & ((1 << 55) - 1)
                if not entry >> 63 or frame == 0:  # not present, or frames hidden (not root)
                    continue
                kpageflags.seek(frame * 8)
                flags = struct.unpack("Q", kpageflags.read(8))[0]
                seen += 1
                large += bool(flags & (1 << 15 | 1 << 16))  # KPF_COMPOUND_HEAD, KPF_COMPOUND_TAIL
            del view
        finally:
            mapped.close()
    return large / seen if seen else None


def reread(path: str) -> None:
    """Drop ``path`` from the page cache, then read it sequentially (the kernel's read-ahead makes large folios
    where the file system has them)."""
    from h5stream.measure.cold import evict_from_page_cache

    evict_from_page_cache(path)
    warm(path)


def stream_rates(path: str, workers: int, epochs: int) -> dict:
    """One stream's first-batch seconds, first-epoch and steady (later epochs) rows per second."""
    import h5stream
    from h5stream.read.source import LocalFile

    t0 = time.perf_counter()
    budget = BUDGET if workers == 0 else None  # with workers: 256 MiB for reading plus what they need
    with h5stream.open(path, batch_size=BATCH, memory_budget=budget, workers=workers, seed=0) as stream:
        rows, first_batch_s = 0, None
        for _x, y in stream:
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - t0
            rows += len(y)
        first_epoch = rows / (time.perf_counter() - t0)
        read_s = stream.stats()["read_s"]
        t1, c1, rows = time.perf_counter(), time.process_time(), 0
        for _ in range(epochs):
            for _x, y in stream:
                rows += len(y)
        wall = time.perf_counter() - t1
        # CPU of this process's threads (the workers' own not included): less swayed by other jobs than the rate.
        cpu = (time.process_time() - c1) / rows * 1e6 if workers == 0 else None
        # With workers=0, the share of the steady epochs' wall time the reader's I/O threads spent in reads: what
        # is left, they waited for the reader thread (or the consumer).  The workers read themselves otherwise.
        busy = (stream.stats()["read_s"] - read_s) / (wall * LocalFile.max_in_flight) if workers == 0 else None
        return {"first_batch_s": first_batch_s, "first_epoch_rows_s": first_epoch,
                "steady_rows_s": rows / wall, "cpu_us_per_row": cpu, "io_busy": busy}


def ffcv_measurement(path: str, epochs: int, python: str, threads: int):
    """A callable measuring FFCV's loader alone on the rows of ``path`` in a child (see the module doc), or the
    reason it cannot (a string)."""
    from benchmarks.encoded_crop import peer_child

    if not python or not os.path.exists(python):
        return f"no FFCV venv at {python!r} (--ffcv-python): FFCV not measured"
    beton = os.path.splitext(path)[0] + ".beton"
    images_npy, labels_npy = beton + ".images.npy", beton + ".labels.npy"
    if not os.path.exists(beton) and not os.path.exists(images_npy):
        import h5py

        from h5stream.store import schema

        log(f"exporting {path} for FFCV's writer")
        with h5py.File(path, "r") as f:
            images, labels = f[schema.IMAGES], f[schema.LABELS]
            out = np.lib.format.open_memmap(images_npy + ".tmp", mode="w+", dtype=np.uint8, shape=images.shape)
            for start in range(0, len(images), 4096):
                out[start:start + 4096] = images[start:start + 4096]
            out.flush()
            del out
            np.save(labels_npy, np.asarray(labels[:]).reshape(len(images), -1)[:, 0].astype(np.int64))
        os.replace(images_npy + ".tmp", images_npy)

    def measure() -> dict:
        got = peer_child(python, "ffcv_loader.py", "FFCV", images_npy, labels_npy, beton, BATCH, threads, epochs)
        if "skipped" in got:
            raise SystemExit(got["skipped"])
        for npy in (images_npy, labels_npy):  # the .beton holds the rows now
            if os.path.exists(npy):
                os.remove(npy)
        return got

    return measure


def run(path: str, rounds: int, workers: list[int], epochs: int, page_cache: str = "as-is",
        ffcv_python: str = "", ffcv_threads: int = 2) -> dict:
    from h5stream.store.meta import read_meta

    meta = read_meta(path)
    if page_cache == "reread":
        reread(path)
    warm(path)
    share = large_folio_share(path)
    measurements = {"copy": lambda: copy_rate(meta.row_bytes)}
    for w in workers:
        measurements[f"workers={w}"] = lambda w=w: stream_rates(path, w, epochs)
    ffcv = ffcv_measurement(path, epochs, ffcv_python, ffcv_threads) if ffcv_python else None
    if callable(ffcv):
        measurements[f"FFCV, {ffcv_threads} thr."] = ffcv
    elif ffcv:
        log(ffcv)
    got = interleave(measurements, rounds, progress=True)
    steady = [{name: r["steady_rows_s"] for name, r in results.items()} for results in got]
    out = {"file": os.path.abspath(path), "rows": meta.rows, "row_bytes": meta.row_bytes, "batch_size": BATCH,
           "memory_budget": f"{BUDGET} (workers: the default)", "rounds": rounds, "epochs": epochs,
           "cpus": os.cpu_count(), "page_cache": page_cache, "large_folio_share": share, "results": {}}
    for name, runs in by_name(got).items():
        entry = {key: median(r.get(key) for r in runs) for key in runs[0]}
        if name != "copy":
            entry["steady_over_copy"] = same_round_ratios(steady, name, "copy")
        entry["rounds"] = runs
        out["results"][name] = entry
    if isinstance(ffcv, str):
        out["ffcv_skipped"] = ffcv
    return out


def table(out: dict) -> str:
    share = out.get("large_folio_share")
    folios = "unknown" if share is None else f"{share:.0%} of it in large folios"
    lines = [f"{out['rows']:,} rows of {out['row_bytes']:,} B, batch {out['batch_size']}, {out['memory_budget']}, "
             f"warm, {out['rounds']} rounds (medians), {out['cpus']} CPUs",
             f"page cache: {out.get('page_cache', 'as-is')}, {folios}",
             f"{'':<12} {'steady rows/s':>14} {'/ copy (same round)':>22} {'first epoch rows/s':>19} "
             f"{'first batch s':>14} {'CPU us/row':>11} {'I/O busy':>9}"]
    for name, r in out["results"].items():
        ratio = r.get("steady_over_copy")
        ratio_text = f"{ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})" if ratio else "1"
        first_epoch = f"{r['first_epoch_rows_s']:,.0f}" if "first_epoch_rows_s" in r else "-"
        first_batch = f"{r['first_batch_s']:.3f}" if "first_batch_s" in r else "-"
        cpu = f"{r['cpu_us_per_row']:.1f}" if r.get("cpu_us_per_row") is not None else "-"
        busy = f"{r['io_busy']:.0%}" if r.get("io_busy") is not None else "-"
        lines.append(f"{name:<12} {r['steady_rows_s']:>14,.0f} {ratio_text:>22} {first_epoch:>19} {first_batch:>14} "
                     f"{cpu:>11} {busy:>9}")
    return "\n".join(lines)


def add_store_options(p: argparse.ArgumentParser) -> None:
    """``--rows`` and ``--file``: the raw 128-px store this benchmark and ``benchmarks.loader_copies`` read."""
    p.add_argument("--rows", type=int, default=20_000, help="rows of the store made when --file is missing")
    p.add_argument("--file", default=None, help="store to read (default: bench-data/loader-<rows>.h5, made)")


def store_path(args) -> str:
    """The store ``args`` (:func:`add_store_options`) name, made when missing."""
    path = args.file or os.path.join(DATA_DIR, f"loader-{args.rows}.h5")
    if not os.path.exists(path):
        log(f"making {path}")
        make_bench_file(path, rows=args.rows, size=SIZE, channels=CHANNELS, progress=False)
    return path


def main(argv=None) -> int:
    p = new_parser(__doc__.split("\n\n")[0])
    add_store_options(p)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians")
    p.add_argument("--workers", default="0,2", help="comma-separated worker counts (no augmentation)")
    p.add_argument("--epochs", type=int, default=2, help="steady-state epochs measured after the first")
    p.add_argument("--page-cache", choices=("as-is", "reread"), default="as-is",
                   help="reread: drop the file from the page cache and read it sequentially first (large folios)")
    p.add_argument("--ffcv-python", default=DEFAULT_FFCV_PYTHON,
                   help="python of a venv with FFCV, for its loader in the same rounds ('' to leave it out; "
                        "$H5STREAM_FFCV_PYTHON, where set, replaces the path below)")
    p.add_argument("--ffcv-threads", type=int, default=2, help="FFCV loader's num_workers (threads)")
    add_json_option(p)
    args = p.parse_args(argv)
    path = store_path(args)
    out = run(path, args.rounds, [int(w) for w in args.workers.split(",")], args.epochs, args.page_cache,
              args.ffcv_python, args.ffcv_threads)
    emit(out, as_json=args.json, format_text=table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
