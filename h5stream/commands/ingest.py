"""`h5stream ingest SRC OUT.h5`: decode a folder of images into a store.

Everything is validated before OUT is created; bad image files are skipped,
listed in ``OUT.skipped.csv`` and counted, never written as partial rows;
what is left out on purpose (hidden entries, files the labels CSV does not
list) is listed there too and counted apart, by kind.
"""

from __future__ import annotations

import re
import sys

from h5stream.errors import ConfigError

MAX_SIDE = 16384


def parse_size(text: str) -> tuple[int, int]:
    """``"128"`` -> (128, 128); ``"128x96"`` -> (height 128, width 96)."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?", text)
    if not m:
        raise ConfigError(f"--size {text!r}: use N (square) or HxW, e.g. 128 or 128x96")
    h = int(m.group(1))
    w = int(m.group(2)) if m.group(2) is not None else h
    if not (1 <= h <= MAX_SIDE and 1 <= w <= MAX_SIDE):
        raise ConfigError(f"--size {text!r}: height and width must be 1..{MAX_SIDE}")
    return h, w


def add_arguments(parser) -> None:
    parser.add_argument("src", metavar="SRC", help="folder with one subfolder per class, or any folder plus --labels")
    parser.add_argument("out", metavar="OUT.h5", help="store to create (or extend with --append)")
    parser.add_argument("--labels", metavar="FILE.csv",
                        help="CSV with a 'path' or 'filename' column (relative to SRC) and numeric label columns")
    parser.add_argument("--label-columns", metavar="A,B",
                        help="label columns to use from --labels (default: every column but path/filename)")
    parser.add_argument("--size", metavar="N|HxW", help="output size: N (square) or HxW (default 128); with --append, size, resize, channels, "
                        "order and seed default to the store's and must match it if given")
    parser.add_argument("--resize", choices=("stretch", "crop", "pad"),
                        help="stretch ignores aspect (default); crop keeps the centre; pad fits on white")
    parser.add_argument("--channels", type=int, choices=(3, 1), help="3 = RGB (default), 1 = grayscale")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="decode processes (default: all cores; 0 = in-process; at most two per core)")
    parser.add_argument("--order", choices=("shuffled", "sorted"),
                        help="row order in the file: seeded random (default) or walk order")
    parser.add_argument("--seed", type=int, metavar="S", help="seed of the shuffled storage order (default 0)")
    parser.add_argument("--block-rows", type=int, metavar="N",
                        help="HDF5 chunk length in rows (default: largest power of two with a chunk <= 4 MiB)")
    parser.add_argument("--compression", choices=("none", "zlib", "blosc"), default="none",
                        help="chunk filter of a new file: none (default); zlib (plain h5py reads it); "
                        "blosc (faster, but h5py needs the hdf5plugin package)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--append", action="store_true",
                      help="add to OUT; files already in it (by relative path) are skipped; resumes a killed ingest")
    mode.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    parser.add_argument("--strict", action="store_true", help="fail (exit 1) on the first file that would be skipped")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def summary(result) -> str:
    """The line ``h5stream ingest`` prints when it is done."""
    verb = "created" if result.created else "appended to"
    counts = f"ingested {result.ingested}, skipped {result.skipped}"
    if result.unreadable_folders:
        counts += f" ({result.unreadable_folders} unreadable folder{'s' if result.unreadable_folders > 1 else ''})"
    if result.left_out:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(result.left_out.items()))
        counts += f", left out {sum(result.left_out.values())} ({kinds})"
    return (f"{verb} {result.out}: {counts}"
            + (f", already stored {result.already_stored}" if result.already_stored else "")
            + f"; {result.seconds:.1f} s, {result.images_per_s:.0f} images/s; "
            f"{result.rows} rows, {_mib(result.file_bytes)}")


def run(args) -> int:
    from h5stream.ingest.pack import IngestOptions, WORKERS_PER_CPU, default_workers, ingest, max_workers

    size = parse_size(args.size) if args.size is not None else None
    columns = None
    if args.label_columns is not None:
        columns = tuple(c.strip() for c in args.label_columns.split(",") if c.strip())
        if not columns:
            raise ConfigError("--label-columns is empty; name one or more CSV columns, e.g. --label-columns steer,throttle")
    workers = default_workers() if args.workers is None else args.workers
    if workers > max_workers():
        print(f"h5stream: --workers {workers} is more than this machine can use; decoding with {max_workers()} "
              f"({WORKERS_PER_CPU} per CPU available)", file=sys.stderr)
        workers = max_workers()
    result = ingest(IngestOptions(
        src=args.src, out=args.out, labels_csv=args.labels, label_columns=columns, size=size,
        resize=args.resize, channels=args.channels, order=args.order, seed=args.seed,
        workers=workers, block_rows=args.block_rows,
        compression=None if args.compression == "none" else args.compression,
        append=args.append, overwrite=args.overwrite, strict=args.strict,
    ))
    print(summary(result))
    if (result.skipped or result.left_out) and result.report_path:
        print(f"{'skipped files' if result.skipped else 'files left out'} and reasons: {result.report_path}")
    return 0
