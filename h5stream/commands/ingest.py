"""`h5stream ingest SRC OUT.h5`: decode a folder of images into a store.

Everything is validated before OUT is created; bad image files are skipped,
listed in ``OUT.skipped.csv`` and counted, never written as partial rows;
what is left out on purpose (hidden entries, files the labels CSV does not
list) is listed there too and counted apart, by kind.

Ctrl-C or SIGTERM stops the run after committing what it appended, and says
how far it got and the command that finishes it (exit 130, or 143 for
SIGTERM): ``h5stream: interrupted: 1,280 of 19,200 files stored; finish with
`h5stream ingest SRC OUT.h5 ... --append```.
"""

from __future__ import annotations

import os
import re
import signal
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


def parse_pad_fill(text: str) -> tuple[int, int, int]:
    """``"0"`` -> (0, 0, 0); ``"255,128,0"`` -> (255, 128, 0)."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) in (1, 3) and all(p.isdigit() and int(p) <= 255 for p in parts):
        values = tuple(int(p) for p in parts)
        return values * 3 if len(values) == 1 else values
    raise ConfigError(f"--pad-fill {text!r}: use one value 0..255 (gray) or R,G,B, e.g. 0 or 255,255,255")


def parse_names(text: str | None, flag: str) -> tuple[str, ...] | None:
    """``"a, b"`` -> ("a", "b"); None stays None; an empty list is refused."""
    if text is None:
        return None
    names = tuple(c.strip() for c in text.split(",") if c.strip())
    if not names:
        raise ConfigError(f"{flag} is empty; name one or more, comma-separated, e.g. {flag} a,b")
    return names


def unlabeled_args(labels: str | None, label_kind: str | None) -> tuple[str | None, str | None]:
    """``--labels none`` -> (no CSV, label kind ``none``): a store of the images alone; anything else as given
    (``--labels ./none`` names a file called none)."""
    if labels != "none":
        return labels, label_kind
    if label_kind not in (None, "none"):
        raise ConfigError(f"--labels none asks for no labels, and --label-kind {label_kind} for {label_kind} "
                          "labels; drop one of them")
    return None, "none"


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


def _stop_on_sigterm(stopped_by: list[int]):
    """Make SIGTERM stop the run as Ctrl-C does (a KeyboardInterrupt, so what was appended is committed),
    noting it in ``stopped_by`` (the handler runs in the main thread, as Python runs every signal handler).
    Returns the handler to put back, None where none was installed (not the main thread, or SIGTERM ignored)."""
    import threading

    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        return None

    def stop(signum, _frame):
        stopped_by.append(signum)
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, stop)


def _identity(path: str):
    """What tells the file at ``path`` from one put there later (None when there is none)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


def _how_far(out: str, replacing=None) -> str:
    """What an interrupted run leaves at ``out``: how many of its files are stored and the command that
    finishes it.  ``replacing``: the :func:`_identity` of the store an ``--overwrite`` run was to replace."""
    if replacing is not None and _identity(out) == replacing:  # stopped before its first commit replaced it
        return f"{out} was not replaced: it is the store it was before this run; run the same command again"
    from h5stream.errors import H5StreamError, StoreNotFoundError
    from h5stream.store.meta import read_meta
    from h5stream.store.progress import continue_command, progress_text

    try:
        meta = read_meta(out)
    except StoreNotFoundError:  # stopped before its first commit
        return f"{out} was not created; nothing was stored"
    except H5StreamError as exc:  # e.g. stopped while HDF5 rewrote it: the error says what to run
        return str(exc)
    progress = meta.ingest
    if progress is None:  # stopped before this run recorded itself
        return f"{out} keeps its {meta.rows:,} committed rows; run the same command with --append to continue"
    if progress.finished:  # stopped after its last commit: every file is accounted for
        return f"{out} was complete before the interruption ({progress_text(progress)}); nothing is left to do"
    return f"{progress_text(progress)}; finish with `{continue_command(progress, out)}`"


def _part(text: str | None) -> tuple[int, int] | None:
    """``--part I/N`` -> (I, N); None without it."""
    if text is None:
        return None
    from h5stream.ingest.parts import parse_part

    return parse_part(text)


def run(args) -> int:
    from h5stream.ingest.options import COMMIT_ROWS
    from h5stream.ingest.pack import IngestOptions, WORKERS_PER_CPU, default_workers, ingest, max_workers

    labels_csv, label_kind = unlabeled_args(args.labels, args.label_kind)
    size = parse_size(args.size) if args.size is not None else None
    columns = parse_names(args.label_columns, "--label-columns")
    workers = default_workers() if args.workers is None else args.workers
    if workers > max_workers():
        print(f"h5stream: --workers {workers} is more than this machine can use; decoding with {max_workers()} "
              f"({WORKERS_PER_CPU} per CPU available)", file=sys.stderr)
        workers = max_workers()
    opts = IngestOptions(
        src=args.src, out=args.out, labels_csv=labels_csv, label_columns=columns, path_column=args.path_column,
        classes=parse_names(args.classes, "--classes"), label_kind=label_kind, follow_links=args.follow_links,
        pad_fill=parse_pad_fill(args.pad_fill) if args.pad_fill is not None else None, size=size,
        resize=args.resize, channels=args.channels, order=args.order, seed=args.seed,
        workers=workers, block_rows=args.block_rows,
        commit_rows=COMMIT_ROWS if args.commit_rows is None else args.commit_rows,
        compression=None if args.compression == "none" else args.compression,
        encoding=args.encoding, quality=args.quality,
        append=args.append, overwrite=args.overwrite, strict=args.strict, part=_part(args.part),
        row_digests=args.row_digests,
    )
    stopped_by: list[int] = []
    replacing = _identity(args.out) if args.overwrite else None
    previous = _stop_on_sigterm(stopped_by)
    try:
        result = ingest(opts)
    except KeyboardInterrupt:  # the ingest committed what it appended before this reached here
        signum = stopped_by[0] if stopped_by else signal.SIGINT
        how_far = _how_far(args.out, replacing)
        print(f"h5stream: interrupted{' (SIGTERM)' if signum == signal.SIGTERM else ''}: {how_far}", file=sys.stderr)
        return 128 + signum
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    print(summary(result))
    if (result.skipped or result.left_out) and result.report_path:
        print(f"{'skipped files' if result.skipped else 'files left out'} and reasons: {result.report_path}")
    return 0
