"""What several subcommands share: the ``--augment`` argument, a store's labels, the shuffle report, writing an
output file.

``bench`` and ``preview`` take ``--augment``; ``bench`` and ``info
--shuffle-report`` read every label and compute shuffle-quality figures.
Subcommands import this module, never each other.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable

import numpy as np

from h5stream.commands.arguments import BENCH_BUDGET


def augment_from_arg(text: str | None):
    """``--augment``: ``None`` -> no augmentation; ``"standard"`` -> ``Augment.preset("standard")``;
    else JSON of ``h5stream.Augment`` keyword arguments."""
    if text is None or text == "":
        return None
    from h5stream.augment import PRESETS, Augment
    from h5stream.errors import ConfigError

    if text == "standard":
        kwargs = dict(PRESETS["standard"])
    else:
        try:
            kwargs = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--augment {text!r}: not 'standard' nor JSON ({exc.msg}); "
                              "e.g. --augment '{\"horizontal_flip\": true}'") from None
        if not isinstance(kwargs, dict):
            raise ConfigError(f"--augment {text!r}: JSON must be an object of Augment arguments, "
                              "e.g. '{\"rotation_range\": 20}'")
    try:
        return Augment(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"--augment: {exc}; see help(h5stream.Augment) for the arguments") from None


def label_bins(meta) -> str:
    """What the shuffle figures count labels by: the classes, or quantile bins of a regression target."""
    from h5stream.order import quality

    if meta.label_kind == "none":
        return "no labels: one bin"
    return "classes" if meta.label_kind == "class" else f"{quality.REGRESSION_BINS} quantile bins of label 0"


def read_labels(meta) -> np.ndarray:
    """The committed rows' labels, read with plain h5py (8 bytes a row: small next to the pixels)."""
    from h5stream.store import schema
    from h5stream.store.access import read_consistent

    return read_consistent(meta.path, lambda f: f[schema.LABELS][: meta.rows])


def check_class_labels(meta, labels: np.ndarray) -> None:
    """Raise :class:`StoreFormatError` unless every class label is an index into the class list (the shuffle
    figures count rows per class).  Regression labels pass."""
    from h5stream.errors import StoreFormatError
    from h5stream.store import schema

    if meta.label_kind != schema.LABEL_CLASS or not labels.size:
        return
    n_classes = len(meta.class_names) if meta.class_names else None
    bad = labels < 0 if n_classes is None else (labels < 0) | (labels >= n_classes)
    if bad.any():
        row = int(np.flatnonzero(bad.reshape(len(labels), -1).any(axis=1))[0])
        allowed = "0 or more" if n_classes is None else f"0..{n_classes - 1} ({n_classes} class names)"
        raise StoreFormatError(
            f"{meta.path}: row {row} has class label {labels[row].tolist()}; class labels must be {allowed}, since the "
            "shuffle figures count rows per class (relabel the file, or store such targets as regression labels)"
        )


def file_shuffle_report(path, *, memory_budget=BENCH_BUDGET, batch_size=32, seed=0, workers=0,
                        rows_per_fill=None, read_unit=None, piece_bytes=None) -> dict:
    """Shuffle-quality figures and the read plan for ``path`` at ``memory_budget``; pure apart from reading labels.

    ``workers`` plans as a stream with that many augmenting workers (uint8 output) would: their memory comes out
    of the budget, so the shuffle window shrinks; ``rows_per_fill`` pins the window, ``read_unit`` sets the unit
    and ``piece_bytes`` the two-level order's pieces as ``h5stream.open`` does.
    """
    from h5stream.augment import Augment
    from h5stream.streaming.planning import plan_stream
    from h5stream.streaming.options import StreamOptions
    from h5stream.order import quality
    from h5stream.read.plan import parse_bytes
    from h5stream.store.meta import read_meta
    from h5stream.streaming.config import layout_function

    from h5stream.read.locate import check_chunks
    from h5stream.read.source import resolve_direct_io

    meta = read_meta(path)
    if not meta.rows:
        from h5stream.errors import ConfigError

        raise ConfigError(f"{meta.path}: the store has no committed rows, so there is no order to report on; ingest "
                          "images into it first")
    unit = None if read_unit is None else parse_bytes(read_unit, what="read_unit")
    pieces = None if piece_bytes is None else parse_bytes(piece_bytes, what="piece_bytes")
    # Only laid out, never allocated: the plan of any budget can be reported, whatever this machine holds.  What
    # else shapes the plan is what h5stream.open gives it by default (read checks once, direct I/O "auto").
    plan = plan_stream(meta, parse_bytes(memory_budget), batch_size, workers=int(workers), rows_per_fill=rows_per_fill,
                       augment=Augment() if workers else None,  # augmenting workers load a transform's library
                       epoch_rows=meta.rows, unit_bytes=unit,
                       direct_io=meta.remote is None and resolve_direct_io(meta.path, "auto"),  # a URL: no O_DIRECT
                       verify_reads=StreamOptions.verify_reads, chunk_cache_bytes=check_chunks(meta),
                       available_bytes=None, piece_bytes=pieces)
    layout = layout_function(meta.rows, plan, seed)
    labels = read_labels(meta)
    check_class_labels(meta, labels)
    qlabels, n_classes = quality.quality_labels(labels, meta.label_kind, meta.class_names)
    report = quality.shuffle_report(qlabels, n_classes, lambda e: layout(e).order(), batch_size=batch_size, seed=seed)
    report["plan"] = plan.as_dict()
    report["plan_text"] = plan.describe()
    report["memory_budget_bytes"] = plan.budget_bytes
    report["seed"] = seed
    report["workers"] = int(workers)
    report["label_bins"] = label_bins(meta)
    return report


def format_shuffle_report(r: dict) -> list[str]:
    """Text lines of :func:`file_shuffle_report` for ``h5stream info``."""
    return [
        f"plan            {r['plan_text']}",
        f"batch label TVD {r['batch_label_tvd']:.3f} with this budget (batch {r['batch_size']}, {r['label_bins']}); "
        f"full random {r['batch_label_tvd_full_random']:.3f} (expected {r['batch_label_tvd_expected_random']:.3f}); "
        f"ratio {r['tvd_ratio_to_random']:.2f}x",
        f"                single contiguous chunk of {r['single_chunk_rows']} rows "
        f"{r['batch_label_tvd_single_chunk']:.3f}; "
        f"file order {r['batch_label_tvd_file_order']:.3f}  (0 = every batch has the file's label mix)",
        f"epoch tau       {r['epoch_order_tau']:+.4f} between epochs {r['epochs'][0]} and {r['epochs'][1]} "
        "(1 = same order, 0 = independent)",
    ]


def write_output(path: str | os.PathLike, write: Callable[[str], None], *, option: str) -> None:
    """``write(tmp_path)`` a complete file (``preview --out``, ``bench --plot``), then rename it to ``path`` (mode
    0666 less the umask, as ``open`` would create it): a failed write (disk full, ``RLIMIT_FSIZE``, no permission)
    leaves whatever was at ``path`` as it was and no partial file, and a symbolic link planted at ``path`` is
    replaced, never written through.  A failure is one :class:`~h5stream.errors.OutputWriteError` naming
    ``option`` (``"--out"``), the file and the reason."""
    from h5stream.errors import OutputWriteError

    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=os.path.splitext(name)[1] + ".tmp", dir=folder)
        os.close(fd)
        os.chmod(tmp, 0o666 & ~_umask())
        write(tmp)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise OutputWriteError(f"{option} {path}: cannot write it ({reason}); nothing was written there: free space, "
                               "or choose a folder you may write to", errno=exc.errno) from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _umask() -> int:
    """The process's umask (read by setting it and putting it back: the command's main thread calls this)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
