"""The options of :func:`h5stream.write` and :class:`~h5stream.ingest.pywrite.Writer`: an
:class:`~h5stream.ingest.options.IngestOptions` (the ingest's own options object) made from keywords and checked by
the ingest's checks, its messages naming the keywords (``block_rows``) instead of the flags (``--block-rows``).
Every field of it that is not about finding files or how ingest runs is a keyword, so an option added to ingest
later is one too.  Pure but for the checks of the store's folder.
"""

from __future__ import annotations

import dataclasses
import os
import re

import numpy as np

from h5stream.errors import ConfigError
from h5stream.ingest.options import IngestOptions, check_options
from h5stream.ingest.spec import RESIZE_MODES
from h5stream.store import schema, sidecar
from h5stream.store.progress import WRITER_SOURCE

__all__ = ["write_options"]

#: IngestOptions fields about finding and decoding files, or how ingest runs: not options of the writer.
#: ``part`` cuts a folder's file listing by each file's path; a Python source has no such listing.
NOT_WRITER_OPTIONS = frozenset({"src", "out", "labels_csv", "label_columns", "path_column", "follow_links",
                                "append", "workers", "progress", "part"})
#: Ingest options refused by name, with what to do instead.
REFUSED = {"part": "part is h5stream ingest --part's (a folder's files cut by their paths); h5stream.write stores "
                   "the whole source it is given: give each part's items to a write of its own"}


def writer_option_names() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(IngestOptions) if f.name not in NOT_WRITER_OPTIONS)


def write_options(path, *, resume: bool = False, **options) -> IngestOptions:
    """The :class:`IngestOptions` of a write to ``path`` (pure but for the checks of the path's folder):
    ConfigError naming an unknown option or a bad value."""
    allowed = writer_option_names()
    unknown = sorted(set(options) - set(allowed))
    for name in unknown:
        if name in REFUSED:
            raise ConfigError(REFUSED[name])
    if unknown:
        raise ConfigError(f"unknown option {unknown[0]!r} for h5stream.write; it takes {', '.join(allowed)}, "
                          "resume")
    size = options.get("size")
    if size is not None:
        pair = (size, size) if isinstance(size, int) else tuple(size)
        if len(pair) != 2 or not all(isinstance(v, int | np.integer) and not isinstance(v, bool) and v >= 1
                                     for v in pair):
            raise ConfigError(f"size must be a positive int or (height, width), got {size!r}")
        options["size"] = (int(pair[0]), int(pair[1]))
    if options.get("resize") is not None and options["resize"] not in RESIZE_MODES:
        raise ConfigError(f"resize must be one of {', '.join(RESIZE_MODES)}, got {options['resize']!r}")
    if options.get("channels") not in (None, 1, 3):
        raise ConfigError(f"channels must be 1 or 3, got {options['channels']!r}")
    if options.get("label_kind") not in (None, *schema.LABEL_KINDS):
        raise ConfigError(f"label_kind must be one of {', '.join(schema.LABEL_KINDS)}, got {options['label_kind']!r}")
    if options.get("classes") is not None:
        classes = options["classes"]
        if isinstance(classes, str) or not all(isinstance(c, str) for c in classes):
            raise ConfigError(f"classes must be a list of class names (str), got {classes!r}")
        if len(set(classes)) != len(classes):
            raise ConfigError(f"classes must not repeat a name, got {list(classes)}")
        options["classes"] = tuple(classes)
    if options.get("compression") == "none":
        options["compression"] = None
    if resume and options.get("overwrite"):
        raise ConfigError("resume=True and overwrite=True contradict each other; pick one")
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise ConfigError(f"the store's path must be a file name (str, bytes or os.PathLike) such as 'train.h5', "
                          f"got {type(path).__name__}")
    opts = IngestOptions(src=WRITER_SOURCE, out=os.fsdecode(path), append=bool(resume), **options)
    try:
        check_options(opts)
    except ConfigError as exc:  # the ingest's checks name its flags: name the keywords instead
        raise ConfigError(python_names(str(exc))) from None
    if opts.overwrite:  # refused before the Writer removes the old store: as ingest --overwrite refuses a link
        sidecar.refuse_link(opts.out)
    return opts


def python_names(message: str) -> str:
    """``message`` with the ingest's flags (``--block-rows``) as this function's keywords (``block_rows``)."""
    return re.sub(r"--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", "_"), message)
