"""What an ingest records in its store so that an unfinished one never looks finished.

:func:`start` sets, before the run's first commit, the files the run sets out to
account for, the rows of the store that are not its files and the source and
flags that continue it (see :mod:`h5stream.store.progress`); the ingest's
commits then raise its skipped count once the skip report is flushed.  On
``--append`` :func:`check_continues` refuses a different source while the
store's last ingest is unfinished: recording the new one would forget the old
one's missing files.  Used by the ingest's one thread.
"""

from __future__ import annotations

import numpy as np

from h5stream.errors import ConfigError
from h5stream.store import schema
from h5stream.store.progress import continue_command, progress_text, source_attr


def continue_options(opts) -> list[str]:
    """The flags of ``opts`` (an :class:`~h5stream.ingest.pack.IngestOptions`) that say which files are ingested
    and how, as ``h5stream ingest`` takes them (pure): what an ``--append`` that finishes the run passes again.
    ``--labels FILE.csv`` is recorded apart (a path; ``--labels none`` is a flag); how the work is done
    (workers, commit rows, progress bar) is not."""
    flags: list[str] = []
    if opts.path_column:
        flags += ["--path-column", opts.path_column]
    if opts.label_columns:
        flags += ["--label-columns", ",".join(opts.label_columns)]
    if opts.label_kind == schema.LABEL_NONE and not opts.labels_csv:
        flags += ["--labels", "none"]  # no labels, no CSV: every image under SRC
    elif opts.label_kind is not None:
        flags += ["--label-kind", opts.label_kind]
    if opts.classes:
        flags += ["--classes", ",".join(opts.classes)]
    if opts.follow_links:
        flags.append("--follow-links")
    if opts.size is not None:
        h, w = opts.size
        flags += ["--size", str(h) if h == w else f"{h}x{w}"]
    if opts.resize is not None:
        flags += ["--resize", opts.resize]
    if opts.pad_fill is not None:
        flags += ["--pad-fill", ",".join(map(str, opts.pad_fill))]
    if opts.channels is not None:
        flags += ["--channels", str(opts.channels)]
    if opts.order is not None:
        flags += ["--order", opts.order]
    if opts.seed is not None:
        flags += ["--seed", str(opts.seed)]
    if opts.block_rows is not None:
        flags += ["--block-rows", str(opts.block_rows)]
    if opts.strict:
        flags.append("--strict")
    if opts.row_digests is False:
        flags.append("--no-row-digests")
    if opts.part is not None:
        flags += ["--part", f"{opts.part[0]}/{opts.part[1]}"]
    return flags


def _source_key(src: str, labels: str | None, options) -> tuple:
    """What names the files of an ingest: its source, labels CSV and the flags that choose or label files."""
    options = list(options)
    chosen = []
    for flag in ("--labels", "--path-column", "--label-columns", "--label-kind", "--classes", "--part"):
        if flag in options:
            at = options.index(flag)
            chosen.append(tuple(options[at:at + 2]))
    return src, labels, tuple(chosen), "--follow-links" in options


def check_continues(meta, opts) -> None:
    """ConfigError when ``meta``'s store (appended to by ``opts``) holds an unfinished ingest of other files."""
    from h5stream.store.progress import parse_source

    progress = meta.ingest
    if progress is None or progress.finished:
        return
    src, labels, options = parse_source(source_attr(opts.src, opts.labels_csv, continue_options(opts)))
    if _source_key(src, labels, options) == _source_key(progress.src, progress.labels, progress.options):
        return
    raise ConfigError(
        f"{opts.out}: its ingest of {progress.src} is unfinished ({progress_text(progress)}); finish it first "
        f"with `{continue_command(progress, opts.out)}`, then append {opts.src}")


def check_part(meta, opts) -> None:
    """ConfigError when ``opts`` appends to ``meta``'s store as another part than it is (or as a part of a whole
    store, or the other way round): a part holds the files of its part alone."""
    have = (meta.part.index, meta.part.count) if meta.part is not None else None
    want = tuple(opts.part) if opts.part is not None else None
    if have == want:
        return
    theirs = f"part {have[0]}/{have[1]}" if have else "a whole store (no --part)"
    ours = f"--part {want[0]}/{want[1]}" if want else "no --part"
    fix = f"pass --part {have[0]}/{have[1]}" if have else "drop --part"
    raise ConfigError(f"{opts.out}: is {theirs}, this run asks for {ours}; {fix}, or ingest into a new file")


def start(writer, opts, files: int, rows_before: int, part=None) -> None:
    """Record on ``writer`` (flushed with its next commit) that this run sets out to account for ``files``
    files and that ``rows_before`` of the store's committed rows are not its files; none skipped yet; and,
    for ``--part``, which part of the source listing it is (``part``: a
    :class:`~h5stream.store.partattr.PartInfo`)."""
    if part is not None:
        from h5stream.store import partattr

        writer.set_attr(schema.ATTR_PART, partattr.encode(part))
    writer.set_attr(schema.ATTR_INGEST_FILES, np.int64(files))
    writer.set_attr(schema.ATTR_INGEST_ROWS_BEFORE, np.int64(rows_before))
    writer.set_attr(schema.ATTR_INGEST_SKIPPED, np.int64(0))
    writer.set_attr(schema.ATTR_INGEST_SOURCE, source_attr(opts.src, opts.labels_csv, continue_options(opts)))


def record_order(writer, source, appending: bool, files: int, adds_rows: bool) -> None:
    """Record on ``writer`` (flushed with its next commit) the source listing its rows' storage order is a
    permutation of (:func:`~h5stream.ingest.parts.listing_hash` of ``source``).  An ``--append`` that adds rows from
    a listing that grew (new files: another hash, or for a store that recorded none, another count of ``files``
    than its last ingest's) stores them after the others, shuffled among themselves: it records the first of them
    as ``appended_from`` (kept from an earlier such append), which ``validation_split`` refuses
    (:mod:`h5stream.order.split`).  A run killed part-way and continued with ``--append`` has the same listing, and
    its rows stay one storage order."""
    from h5stream.ingest.parts import listing_hash

    listing = listing_hash(source)
    attrs = writer.attrs
    if appending and adds_rows and schema.ATTR_APPENDED_FROM not in attrs:
        if schema.ATTR_ORDER_LISTING in attrs:
            grown = str(attrs[schema.ATTR_ORDER_LISTING]) != listing
        else:
            grown = schema.ATTR_INGEST_FILES in attrs and int(attrs[schema.ATTR_INGEST_FILES]) != files
        if grown:
            writer.set_attr(schema.ATTR_APPENDED_FROM, np.int64(writer.committed_rows))
    writer.set_attr(schema.ATTR_ORDER_LISTING, listing)


def record_skipped(writer, skipped: int) -> None:
    """This run's files skipped so far, all of them in the flushed skip report (set before a commit)."""
    writer.set_attr(schema.ATTR_INGEST_SKIPPED, np.int64(skipped))
