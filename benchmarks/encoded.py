"""Encoded stores against raw and compressed ones: bytes per image and images per second per core.

    python -m benchmarks.encoded                       # 2,000 photos at 128 px, 3 rounds
    python -m benchmarks.encoded --photos 300 --rounds 1 --size 128   # a smoke run
    python -m benchmarks.encoded --json                # one JSON object
    python -m benchmarks.encoded --size 256 --crop 224  # the crop comparison at 224 from 256 px

The same photo-like ~500x375 JPEGs (:func:`benchmarks.data.ensure_photos`) are ingested at ``--size`` px into
one store per kind: raw, ``--compression zlib``, ``--compression blosc`` and ``--encoding jpeg`` at quality 75,
90 and 95 (cached in ``--data``).  Per store:

* ``bytes/image``: the file's bytes per row, and the rows' own bytes (pixels, compressed chunks or JPEGs);
* ``loader``: a warm epoch of the plain stream with ``workers=0`` (one process reads, decompresses or decodes):
  images/s and images per CPU-second (this process's CPU time over the epoch: one core's worth of work);
* ``augmented``: the same with the ``standard`` augmentation in the consumer's thread.

Then decode + random resized crop to ``--crop`` px (default 7/8 of ``--size``: 112 from 128; 0 skips it) + flip
per core, h5stream on the JPEG q90 store against FFCV 1.0.2 on the same images and DALI's CPU pipeline on the same
JPEGs (:mod:`benchmarks.encoded_crop`; each peer runs from its own venv, ``--ffcv-python``, ``--dali-python``, and
is skipped with a line saying so where that is missing).

Every round streams every store in turn (the order rotating); the table gives medians and the median of the
per-round ratios to the raw store (what survives a shared machine's drift).
"""

from __future__ import annotations

import os
import platform
import sys

from benchmarks.data import ensure_photos
from benchmarks.harness import add_data_option, add_json_option, emit, log, median, new_parser, warm

KINDS = {
    "raw": {},
    "zlib": {"compression": "zlib"},
    "blosc": {"compression": "blosc"},
    "jpeg q75": {"encoding": "jpeg", "quality": 75},
    "jpeg q90": {"encoding": "jpeg", "quality": 90},
    "jpeg q95": {"encoding": "jpeg", "quality": 95},
}
WORKLOADS = ("loader", "augmented")
BATCH = 64


def available(kind: str) -> bool:
    """Whether the stream can read ``kind`` here: blosc through h5py needs the hdf5plugin package."""
    import importlib.util

    return kind != "blosc" or importlib.util.find_spec("hdf5plugin") is not None


def ensure_kind(data_dir: str, photos: str, size: int, kind: str) -> str:
    """``photos`` ingested at ``size`` as ``kind`` (cached; made again when its row count is off)."""
    from h5stream.ingest.pack import IngestOptions, default_workers, ingest
    from h5stream.store.meta import read_meta

    out = os.path.join(data_dir, f"encoded-{os.path.basename(photos)}-{size}-{kind.replace(' ', '')}.h5")
    n_files = sum(len(files) for _, _, files in os.walk(photos)) - 1  # the folder's completion marker
    if os.path.exists(out):
        try:
            if read_meta(out).rows == n_files:
                return out
        except Exception:  # a half-written cache from a killed run
            pass
    log(f"ingest {kind} at {size} px -> {out}")
    ingest(IngestOptions(src=photos, out=out, size=(size, size), workers=default_workers(), overwrite=True,
                         progress=False, **KINDS[kind]))
    return out


def stored_bytes(path: str) -> int:
    """The rows' own bytes: JPEGs, compressed chunks or pixels (no labels, paths, metadata)."""
    import h5py

    from h5stream.store import schema
    from h5stream.store.meta import read_meta

    meta = read_meta(path)
    if meta.encoded:
        return meta.encoded_bytes
    if meta.compression is None:
        return meta.rows * meta.row_bytes  # the chunks allocated whole hold no more of them
    with h5py.File(path, "r") as f:
        return int(f[schema.IMAGES].id.get_storage_size())


def epoch_rate(path: str, workload: str) -> dict:
    """One warm epoch (after one not timed): images/s and images per CPU-second."""
    import h5stream
    from benchmarks.encoded_crop import warm_epoch_rate

    return warm_epoch_rate(path, h5stream.Augment.preset("standard") if workload == "augmented" else None)


def run(args) -> dict:
    from h5stream.store.meta import read_meta

    photos = ensure_photos(args.data, args.photos)
    stores = {kind: ensure_kind(args.data, photos, args.size, kind) for kind in KINDS if available(kind)}
    out = {"photos": photos, "size": args.size, "rounds": args.rounds, "batch_size": BATCH,
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}", "stores": {}}
    for kind, path in stores.items():
        meta = read_meta(path)
        out["stores"][kind] = {"file": path, "rows": meta.rows, "file_bytes_per_image": meta.file_bytes / meta.rows,
                               "bytes_per_image": stored_bytes(path) / meta.rows,
                               "raw_bytes_per_image": meta.row_bytes}
        warm(path)
    names = list(stores)
    samples = {w: {k: [] for k in names} for w in WORKLOADS}
    for r in range(args.rounds):
        for w in WORKLOADS:
            for kind in names[r % len(names):] + names[:r % len(names)]:
                got = epoch_rate(stores[kind], w)
                samples[w][kind].append(got)
                log(f"  round {r + 1}/{args.rounds}: {w}, {kind}: {got['images_per_s']:,.0f} img/s, "
                    f"{got['images_per_cpu_s']:,.0f} img/CPU-s")
    for w in WORKLOADS:
        for kind in names:
            s = samples[w][kind]
            per_core = [x["images_per_cpu_s"] for x in s]
            raw_core = [x["images_per_cpu_s"] for x in samples[w]["raw"]]
            out["stores"][kind][w] = {
                "images_per_s": median(x["images_per_s"] for x in s),
                "images_per_cpu_s": median(per_core),
                "per_core_vs_raw": median(a / b for a, b in zip(per_core, raw_core)),
                "rounds": s,
            }
    if args.crop:
        from benchmarks.encoded_crop import run_crop

        out["crop"] = run_crop(stores, args.crop, args.rounds, args.data, args.ffcv_python, args.dali_python)
    return out


def table(out: dict) -> str:
    lines = [
        f"{out['size']} px rows of {out['photos']}; {out['rounds']} rounds, medians, batch {out['batch_size']}, "
        f"workers=0; {out['machine']}",
        "",
        "| store | bytes/image (file) | x smaller than raw | loader img/s | loader img/CPU-s (vs raw) "
        "| augmented img/s | augmented img/CPU-s (vs raw) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind, s in out["stores"].items():
        lo, au = s["loader"], s["augmented"]
        lines.append(
            f"| {kind} | {s['bytes_per_image']:,.0f} ({s['file_bytes_per_image']:,.0f}) | "
            f"{s['raw_bytes_per_image'] / s['bytes_per_image']:.1f}x | {lo['images_per_s']:,.0f} | "
            f"{lo['images_per_cpu_s']:,.0f} ({lo['per_core_vs_raw']:.2f}x) | {au['images_per_s']:,.0f} | "
            f"{au['images_per_cpu_s']:,.0f} ({au['per_core_vs_raw']:.2f}x) |")
    if "crop" in out:
        from benchmarks.encoded_crop import crop_table

        lines.append(crop_table(out["crop"]))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = new_parser(__doc__.split("\n\n")[0])
    p.add_argument("--photos", type=int, default=2000, help="photos to ingest")
    p.add_argument("--size", type=int, default=128, help="stored side in px")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians")
    p.add_argument("--crop", type=int, default=None,
                   help="random resized crop output side for the FFCV comparison (default 7/8 of --size; 0: none)")
    p.add_argument("--ffcv-python", default=None, help="FFCV's venv's python (default $H5STREAM_FFCV_PYTHON or "
                   ".venv-ffcv/bin/python at the repository root)")
    p.add_argument("--dali-python", default=None, help="DALI's venv's python (default $H5STREAM_DALI_PYTHON or "
                   ".venv-dali/bin/python at the repository root)")
    add_data_option(p)
    add_json_option(p)
    args = p.parse_args(argv)
    if args.crop is None:
        args.crop = args.size * 7 // 8
    if args.ffcv_python is None:
        from benchmarks.encoded_crop import DEFAULT_FFCV_PYTHON

        args.ffcv_python = DEFAULT_FFCV_PYTHON
    if args.dali_python is None:
        from benchmarks.encoded_crop import DEFAULT_DALI_PYTHON

        args.dali_python = DEFAULT_DALI_PYTHON
    emit(run(args), as_json=args.json, format_text=table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
