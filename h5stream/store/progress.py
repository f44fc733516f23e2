"""How far the ingest that last wrote a store got, and the command that finishes it.

An ingest records, in root attributes plain h5py reads (see
:mod:`h5stream.store.schema`), the files it set out to store
(``ingest_files``), the committed rows that are not its files
(``ingest_rows_before``), its files skipped so far (``ingest_skipped``) and
its source and options (``ingest_source``).  Its files stored are
``committed_rows - ingest_rows_before``; the store is **finished** when every
file is accounted for, stored or skipped (and so listed in the skip report).

Nothing is recorded as "finished" on its own: finished is worked out from
counts that are raised only with what they count already durable (the rows by
the ``committed_rows`` protocol of :class:`~h5stream.store.writer.StoreWriter`,
the skipped count after the skip report is flushed).  So a store whose ingest
was interrupted, failed or was killed at any moment never reads as finished,
and one whose last commit accounts for every file always does.  A store
written before these attributes has none of them and counts as finished.

Pure functions over plain values (:func:`warn_unfinished` only warns);
:func:`h5stream.store.meta.read_meta` reads and checks the attributes into
:class:`IngestProgress`.
"""

from __future__ import annotations

import json
import os
import shlex
import warnings
from dataclasses import dataclass

from h5stream.errors import hide_passwords


@dataclass(frozen=True)
class IngestProgress:
    """The last ingest of a store: ``files`` to store, ``stored`` (its committed rows), ``skipped`` (listed in
    the skip report), and what continues it: ``src`` and ``labels`` (absolute paths; ``labels`` None without
    a CSV) and ``options`` (its other flags, as ``h5stream ingest`` takes them)."""

    files: int
    stored: int
    skipped: int
    src: str
    labels: str | None
    options: tuple[str, ...]

    @property
    def done(self) -> int:
        """Files accounted for: stored or skipped."""
        return self.stored + self.skipped

    @property
    def finished(self) -> bool:
        return self.done >= self.files


def source_attr(src: str, labels: str | None, options) -> str:
    """The ``ingest_source`` attribute: JSON of the absolute source (and labels CSV) and the flags (pure but for
    making the paths absolute against the current folder)."""
    return json.dumps({"src": os.path.abspath(src), "labels": os.path.abspath(labels) if labels else None,
                       "options": [str(o) for o in options]})


def parse_source(text: str) -> tuple[str, str | None, tuple[str, ...]] | None:
    """``(src, labels, options)`` from an ``ingest_source`` attribute, or None if it is not one (pure)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("src"), str):
        return None
    labels, options = value.get("labels"), value.get("options", [])
    if labels is not None and not isinstance(labels, str):
        return None
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        return None
    return value["src"], labels, tuple(options)


def shown_path(path: str, cwd: str | None = None) -> str:
    """``path`` (absolute) as a command typed in ``cwd`` (default: the current folder) names it: relative when
    it lies below ``cwd``, else absolute."""
    rel = os.path.relpath(path, cwd or os.getcwd())
    return path if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


#: The ``src`` that :func:`h5stream.write` records: a Python source, continued in Python, not by a command.
WRITER_SOURCE = "<python source given to h5stream.write>"


def continue_command(progress: IngestProgress, out: str) -> str:
    """The shell command that finishes the ingest of ``progress`` into the store at ``out`` (for a store
    :func:`h5stream.write` made: the call that continues it)."""
    if progress.src == WRITER_SOURCE:
        return f"h5stream.write({str(out)!r}, source, resume=True) over the same source, in the same order"
    argv = ["h5stream", "ingest", shown_path(progress.src), str(out)]
    if progress.labels is not None:
        argv += ["--labels", shown_path(progress.labels)]
    return shlex.join([*argv, *progress.options, "--append"])


def progress_text(progress: IngestProgress) -> str:
    """``"1,280 of 19,200 files stored"`` (skipped files named apart when there are any)."""
    if not progress.skipped:
        return f"{progress.stored:,} of {progress.files:,} files stored"
    return (f"{progress.done:,} of {progress.files:,} files done ({progress.stored:,} stored, "
            f"{progress.skipped:,} skipped)")


def unfinished_message(meta) -> str | None:
    """For a store (a :class:`~h5stream.store.meta.StoreMeta`) whose last ingest did not finish: ``"unfinished:
    1,280 of 19,200 files stored; finish with `h5stream ingest ... --append`"``; None for a finished one (or one
    written before ingests recorded their progress)."""
    progress = getattr(meta, "ingest", None)
    if progress is None or progress.finished:
        return None
    return f"unfinished: {progress_text(progress)}; finish with `{continue_command(progress, meta.path)}`"


def warn_unfinished(meta, allow: bool, stacklevel: int = 4) -> None:
    """Warn (a :class:`UserWarning`) that ``meta``'s store is unfinished, unless ``allow`` or it is finished."""
    message = None if allow else unfinished_message(meta)
    if message is not None:
        text = hide_passwords(f"{meta.path}: {message}")
        warnings.warn(f"{text}; its batches hold only the rows stored so far (allow_unfinished=True streams them "
                      "without this warning)", UserWarning, stacklevel=stacklevel)


def warn_uncommitted(meta, stacklevel: int = 4) -> None:
    """Warn (a :class:`UserWarning`) that rows past ``meta.rows`` were written and never committed (a writer
    stopped mid-commit, or ``committed_rows`` was lowered), unless a writer is committing them now.  The stream
    serves the committed rows only; ``h5stream repair`` drops the others."""
    if not meta.uncommitted_rows:
        return
    if meta.remote is None:
        from h5stream.store.access import writer_pids

        if writer_pids(meta.path):
            return  # a commit in flight
    shown = hide_passwords(str(meta.path))
    warnings.warn(f"{shown}: rows {meta.rows}-{meta.rows + meta.uncommitted_rows - 1} were written and "
                  "never committed (a writer stopped mid-commit, or committed_rows was lowered); streaming "
                  f"the {meta.rows} committed rows; `h5stream repair {shown}` drops the others",
                  UserWarning, stacklevel=stacklevel)
