"""What one ingest run is asked to do (:class:`IngestOptions`), checked before the store is locked, and what a run
into a new store writes (:class:`IngestTarget`, from :func:`resolve_new`; ``--append`` resolves it from the store:
:mod:`h5stream.ingest.append`).  Checks of the options and the paths they name; nothing is written.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass

from h5stream.errors import ConfigError, StoreExistsError
from h5stream.ingest.discover import Source
from h5stream.ingest.spec import DEFAULT_PAD_FILL, DecodeSpec

ORDERS = ("shuffled", "sorted")
#: Rows between commits (at least; a commit ends on a block boundary).  A commit costs the writing process the same
#: CPU whatever its size (two flushes with fsync, the labels, paths and checksums since the last one), so fewer
#: commits cost less per row; what a crash loses grows with it: at most 1024 rows (or one block) of decoding.  The
#: figures: docs/performance.md, "Commits every 1024 rows".
COMMIT_ROWS = 1024
MAX_SEED = 2**63 - 1  # the order_seed attribute is an int64


@dataclass(frozen=True)
class IngestOptions:
    """Everything one ingest run needs.  ``spec.size`` etc. may be None on append (taken from the store)."""

    src: str
    out: str
    labels_csv: str | None = None
    label_columns: tuple[str, ...] | None = None
    path_column: str | None = None  # CSV: the column naming the files (default: path or filename)
    classes: tuple[str, ...] | None = None  # choose and order the classes (folders or a CSV class column)
    label_kind: str | None = None  # CSV: None decides by the column (text: class, numbers: regression)
    follow_links: bool = False  # enter symlinked folders below the class folders
    pad_fill: tuple[int, int, int] | None = None  # None: black on a new store, the store's on append
    size: tuple[int, int] | None = None
    resize: str | None = None
    channels: int | None = None
    order: str | None = None
    seed: int | None = None
    workers: int = 0
    block_rows: int | None = None
    compression: str | None = None
    encoding: str | None = None  # raw | jpeg | auto (see ingest/encode.py); None: raw, or the store's on append
    quality: int | None = None  # JPEG quality, 1-100 (None: 90, or the store's on append)
    append: bool = False
    overwrite: bool = False
    strict: bool = False
    commit_rows: int = COMMIT_ROWS
    progress: bool | None = None  # None: a bar only when stderr is a terminal
    part: tuple[int, int] | None = None  # (index, count): part index of count (h5stream.ingest.parts)
    row_digests: bool | None = None  # a digest per row (/row_digests); None: yes on a new store, the store's on append



@dataclass(frozen=True)
class IngestTarget:
    """What one run writes, resolved from the options and, on ``--append``, from the store: the decoding, the
    storage order and its seed, the class list (new classes appended), the relative paths already stored, and the
    rows the store holds before the run."""

    spec: DecodeSpec
    order: str
    seed: int
    class_names: tuple[str, ...] | None
    stored: frozenset[str]
    start_rows: int
    path_limit: int | None = None  # most bytes of a path the store holds: a format-1 store's fixed width


def check_options(opts: IngestOptions) -> None:
    """Everything about the options and OUT that can be refused before the store is locked."""
    if opts.append and opts.overwrite:
        raise ConfigError("--append and --overwrite contradict each other; pick one")
    if opts.workers < 0:
        raise ConfigError(f"--workers must be >= 0, got {opts.workers}")
    if opts.seed is not None and not 0 <= opts.seed <= MAX_SEED:
        raise ConfigError(f"--seed must be between 0 and {MAX_SEED}, got {opts.seed}")
    if opts.block_rows is not None and opts.block_rows < 1:
        raise ConfigError(f"--block-rows must be >= 1, got {opts.block_rows}")
    if isinstance(opts.commit_rows, bool) or not isinstance(opts.commit_rows, numbers.Integral) or opts.commit_rows < 1:
        raise ConfigError(f"--commit-rows must be an integer >= 1, got {opts.commit_rows!r}")
    if opts.encoding is not None and opts.encoding not in ("raw", "jpeg", "auto"):
        raise ConfigError(f"--encoding must be one of raw, jpeg, auto, got {opts.encoding!r}")
    if opts.quality is not None and (isinstance(opts.quality, bool) or not isinstance(opts.quality, numbers.Integral)
                                     or not 1 <= opts.quality <= 100):
        raise ConfigError(f"--quality must be an integer from 1 to 100, got {opts.quality!r}")
    if opts.quality is not None and (opts.encoding == "raw" or (opts.encoding is None and not opts.append)):
        raise ConfigError(f"--quality {opts.quality} is the JPEG quality of --encoding jpeg or auto; add one of "
                          "them, or drop --quality")
    if opts.encoding == "auto" and opts.part is not None:
        raise ConfigError("--encoding auto with --part: auto decides for each part alone, by its own sample and this "
                          "machine's decoding speed, and every part of a set must have the same encoding; give "
                          "every part --encoding jpeg, or --encoding raw")
    if opts.encoding in ("jpeg", "auto") and opts.compression is not None:
        raise ConfigError(f"--encoding {opts.encoding} and --compression {opts.compression} contradict each other: "
                          "JPEG rows are compressed already; pick one")
    if opts.order is not None and opts.order not in ORDERS:
        raise ConfigError(f"--order must be one of {', '.join(ORDERS)}, got {opts.order!r}")
    out = opts.out
    if not out:
        raise ConfigError("the store's path is empty; give a file name such as train.h5")
    if out.endswith(("/", os.sep)) and not os.path.isdir(out):
        raise ConfigError(f"{out}: names a folder (it ends in {out[-1]}); give a file name such as "
                          f"{os.path.join(out, 'train.h5')}")
    if os.path.isdir(out):
        if opts.append:
            raise StoreExistsError(f"{out}: is a directory; give the .h5 file to append to")
        raise StoreExistsError(f"{out}: is a directory; give a file name such as {os.path.join(out, 'train.h5')}")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise ConfigError(f"{out}: folder {parent} does not exist; create it first")



def resolve_new(opts: IngestOptions, source: Source) -> IngestTarget:
    out = opts.out
    if os.path.exists(out) and not opts.overwrite:
        raise StoreExistsError(f"{out}: already exists; pass --append to add to it or --overwrite to replace it")
    size = opts.size or (128, 128)
    return IngestTarget(
        spec=DecodeSpec(size=size, resize=opts.resize or "stretch", channels=opts.channels or 3,
                        pad_fill=opts.pad_fill or DEFAULT_PAD_FILL, encoding=opts.encoding or "raw",
                        quality=90 if opts.quality is None else opts.quality),
        order=opts.order or "shuffled",
        seed=0 if opts.seed is None else opts.seed,
        class_names=tuple(source.class_names) if source.class_names is not None else None,
        stored=frozenset(),
        start_rows=0,
    )

