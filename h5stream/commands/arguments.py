"""The command line's grammar: every subcommand's arguments, and the defaults its help shows.

Light on purpose (argparse only): :mod:`h5stream.cli` builds its parser from
here and imports a subcommand's module (:mod:`h5stream.commands.bench` ...)
only to run it.
"""

from __future__ import annotations

COMMANDS = {
    "ingest": "decode a folder of images into an HDF5 store",
    "info": "describe a store (rows, shapes, classes, layout)",
    "bench": "measure the stream against its baselines on a store",
    "preview": "write a grid of images as the stream yields them (PNG, JPEG, WebP, ...: --out's name says)",
    "verify": "check every committed row against the store's checksums and row digests",
    "repair": "rebuild a store whose writer was stopped mid-update; name the files of damaged rows",
}
"""Subcommand -> one-line help; ``h5stream.commands.<name>`` runs it."""

BENCH_BUDGET = "256MiB"
"""Memory budget of ``bench`` and of ``info --shuffle-report``."""
RANDOM_SECONDS = 10.0
"""How long ``bench`` times the one-row-per-call baseline before extrapolating it."""
MIN_TILE_PX = 96
"""``preview`` scales every tile by the smallest integer that makes it at least this wide (unless ``--scale``)."""


def add_arguments(name: str, parser) -> None:
    """Declare the arguments of subcommand ``name`` on ``parser``."""
    _ARGUMENTS[name](parser)


def _ingest(parser) -> None:
    parser.add_argument("src", metavar="SRC",
                        help="folder with one subfolder per class, or any folder plus --labels (or --labels none)")
    parser.add_argument("out", metavar="OUT.h5", help="store to create (or extend with --append)")
    parser.add_argument("--labels", metavar="FILE.csv|none",
                        help="comma-separated CSV with a 'path' or 'filename' column (files in SRC: relative to it, "
                        "or absolute) and label columns: a column of names gives classes, numeric columns "
                        "regression targets; 'none': no labels, every image under SRC, subfolders too, sorted "
                        "(as Keras' labels=None; ./none names a file called none)")
    parser.add_argument("--path-column", metavar="NAME",
                        help="the --labels column naming the files, as Keras' x_col (default: path or filename)")
    parser.add_argument("--label-columns", metavar="A,B",
                        help="label columns to use from --labels (default: every column but the path column)")
    parser.add_argument("--label-kind", choices=("class", "regression", "none"),
                        help="how to read the --labels column: class names, or numbers (default: class when a "
                        "value is not a number, so 0/1 stay regression targets unless you pass class); none: "
                        "the CSV only names the files, the store has no labels")
    parser.add_argument("--classes", metavar="A,B",
                        help="classes to keep, in label order (default: all, sorted); other class folders or "
                        "CSV rows are left out")
    parser.add_argument("--follow-links", action="store_true",
                        help="enter symlinked folders inside class folders (symlinked class folders are always "
                        "classes, as in Keras); loops are detected")
    parser.add_argument("--size", metavar="N|HxW",
                        help="output size: N (square) or HxW (default 128); with --append, size, resize, channels, "
                        "order, seed, compression, encoding and quality default to the store's and must match it if "
                        "given")
    parser.add_argument("--resize", choices=("stretch", "crop", "pad"),
                        help="stretch ignores aspect (default); crop keeps the centre; pad fits on --pad-fill")
    parser.add_argument("--pad-fill", metavar="V|R,G,B",
                        help="colour around a --resize pad image: 0..255 or R,G,B (default 0, black, as Keras)")
    parser.add_argument("--channels", type=int, choices=(3, 1), help="3 = RGB (default), 1 = grayscale")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="decode processes (default: all cores; 0 = in-process; at most two per core)")
    parser.add_argument("--order", choices=("shuffled", "sorted"),
                        help="row order in the file: seeded random (default) or walk order")
    parser.add_argument("--seed", type=int, metavar="S", help="seed of the shuffled storage order (default 0)")
    parser.add_argument("--block-rows", type=int, metavar="N",
                        help="HDF5 chunk length in rows (default: largest power of two with a chunk <= 4 MiB)")
    parser.add_argument("--commit-rows", type=int, metavar="N",
                        help="commit (flush, then publish the rows to readers) every N rows or more: what a killed "
                        "run can lose, against the writer's cost per commit (default 1024)")
    parser.add_argument("--compression", choices=("none", "zlib", "blosc"), default="none",
                        help="chunk filter of a new file: none (default); zlib (plain h5py reads it); "
                        "blosc (faster, but h5py needs the hdf5plugin package)")
    parser.add_argument("--encoding", choices=("raw", "jpeg", "auto"),
                        help="how a new file keeps each image: raw pixels (default), JPEG (5-10x smaller for photos, "
                        "decoded as the stream reads them), or auto (JPEG where a measured sample of the files is "
                        "3x smaller as JPEG and decodes at 50 MB of pixels/s a core or more, else raw)")
    parser.add_argument("--quality", type=int, metavar="Q", help="JPEG quality of --encoding jpeg/auto, 1-100 "
                        "(default 90)")
    parser.add_argument("--no-row-digests", dest="row_digests", action="store_const", const=False,
                        help="a new file without a digest per row (8 bytes a row; verify and the stream then check "
                        "whole blocks only, so a damaged row is found as its block); with --append, only to a store "
                        "written so")
    parser.add_argument("--part", metavar="I/N",
                        help="write part I (from 0) of N of the files found: a file's part is a hash of its path "
                        "relative to SRC, so N machines each given SRC write N parts that h5stream.open reads as one")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--append", action="store_true",
                      help="add to OUT; files already in it (by relative path) are skipped; resumes a killed ingest")
    mode.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    parser.add_argument("--strict", action="store_true",
                        help="fail (exit 1) on the first image that would be skipped (files that are not images, "
                        "by extension, are left out either way)")


def _info(parser) -> None:
    parser.add_argument("path", metavar="STORE", nargs="+",
                        help="store written by `h5stream ingest` (a path, or an s3:// or https:// URL); several "
                        "stores, a glob or a .json manifest: a set of parts read as one")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--shuffle-report", action="store_true",
                        help="add shuffle-quality figures (batch label mix, epoch tau, read plan) for a budget")
    parser.add_argument("--memory-budget", default=BENCH_BUDGET, metavar="BYTES",
                        help=f"budget for --shuffle-report (default {BENCH_BUDGET})")
    parser.add_argument("--batch-size", type=int, default=32, metavar="N",
                        help="batch size for --shuffle-report (default 32)")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="seed for --shuffle-report (default 0)")
    parser.add_argument("--workers", type=int, default=0, metavar="N",
                        help="--shuffle-report plans as a stream with this many augmenting workers (default 0)")
    parser.add_argument("--rows-per-fill", type=int, default=None, metavar="R",
                        help="--shuffle-report with this shuffle window pinned, as h5stream.open(rows_per_fill=) does")
    parser.add_argument("--read-unit", default=None, metavar="BYTES",
                        help="--shuffle-report with this read_unit (e.g. 4MiB), as h5stream.open(read_unit=) takes")
    parser.add_argument("--piece-bytes", default=None, metavar="BYTES",
                        help="--shuffle-report of the two-level order in pieces of this size (e.g. 8MiB), as "
                             "h5stream.open(piece_bytes=) takes")


def _bench(parser) -> None:
    parser.add_argument("path", metavar="FILE", help="store written by `h5stream ingest`")
    parser.add_argument("--batch-size", type=int, default=32, metavar="N", help="rows per batch (default 32)")
    parser.add_argument("--memory-budget", default=BENCH_BUDGET, metavar="BYTES",
                        help=f"stream memory budget (default {BENCH_BUDGET})")
    parser.add_argument("--epochs", type=int, default=1, metavar="N", help="stream epochs to time (default 1)")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="shuffle seed (default 0)")
    parser.add_argument("--cold", action="store_true",
                        help="evict the file from the page cache before and during each pass")
    parser.add_argument("--augment", default=None, metavar="standard|JSON",
                        help="augment in the stream (preset or Augment kwargs)")
    parser.add_argument("--workers", type=int, default=0, metavar="N",
                        help="worker processes of the stream: they augment, or without --augment read (default 0)")
    parser.add_argument("--random-seconds", type=float, default=RANDOM_SECONDS, metavar="S",
                        help="time budget of the one-row-per-call baseline, then extrapolated "
                        f"(default {RANDOM_SECONDS:g})")
    parser.add_argument("--no-baselines", action="store_true", help="measure the stream and shuffle quality only")
    parser.add_argument("--plot", default=None, metavar="PNG",
                        help="write a figure of throughput, CPU, queue and memory over time (needs matplotlib: "
                        "pip install -e '.[plot]')")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def _preview(parser) -> None:
    parser.add_argument("path", metavar="FILE", nargs="+",
                        help="store written by `h5stream ingest`; several, a glob or a .json manifest: a set of parts")
    parser.add_argument("--out", required=True, metavar="GRID.png",
                        help="image file to write; its extension picks the format (.png, .jpg, .webp, ...)")
    parser.add_argument("--augment", default=None, metavar="standard|JSON",
                        help="augment as the stream would (preset or Augment kwargs)")
    parser.add_argument("--rows", type=int, default=6, metavar="N", help="grid rows (default 6)")
    parser.add_argument("--cols", type=int, default=6, metavar="N", help="grid columns (default 6)")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="shuffle and augmentation seed (default 0)")
    parser.add_argument("--scale", type=int, default=None, metavar="N",
                        help=f"integer zoom per tile (default: tiles >= {MIN_TILE_PX} px wide)")
    parser.add_argument("--memory-budget", default=None, metavar="BYTES",
                        help="stream memory budget, e.g. 256MiB (default: h5stream.open's)")


VERIFY_EXIT = {0: "every committed row matches", 1: "damage (the first damaged rows named) or another error",
               2: "bad usage", 3: "not everything checked (no checksums; rows written but not committed)",
               4: "the ingest is unfinished (the command that finishes it named)"}
"""``verify``'s exit statuses, as its help states them."""


def _verify(parser) -> None:
    parser.epilog = ("exit status: " + "; ".join(f"{code} {what}" for code, what in VERIFY_EXIT.items())
                     + "; a set of parts: the worst part's (1 before 4 before 3)")
    parser.add_argument("path", metavar="FILE.h5", nargs="+",
                        help="store written by `h5stream ingest`; several, a glob or a .json manifest: a set of parts, "
                        "checked whole (every part present, all agreeing) and part by part")


def _repair(parser) -> None:
    parser.add_argument("path", metavar="FILE.h5", help="store written by `h5stream ingest`")
    parser.add_argument("--source", metavar="SRC", default=None,
                        help="the folder the store was ingested from: damaged pixel blocks are decoded again from "
                             "their files and written back where the result matches their checksums")


_ARGUMENTS = {"ingest": _ingest, "info": _info, "bench": _bench, "preview": _preview, "verify": _verify,
              "repair": _repair}
