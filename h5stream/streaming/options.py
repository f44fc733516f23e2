"""The parameters of :func:`h5stream.open`, written once: a frozen dataclass, checked when it is made.

``h5stream.open(path, ...)`` is ``Stream(path, StreamOptions(...))``: the
signature, the defaults and the checks that need no store live here; what
depends on the store (label modes, the split, the budget's minimum) is
checked when the stream opens it.  The parameters are documented on
:func:`h5stream.open`.
"""

from __future__ import annotations

import functools
import numbers
import os
from collections.abc import Mapping
import dataclasses
from dataclasses import KW_ONLY, dataclass, field

from h5stream import _optnames as opt
from h5stream._kwargs import AUGMENT_NAMES, OPEN_HINTS, checked_kwargs
from h5stream.errors import ConfigError
from h5stream.labels import DEFAULT_LABEL_MODE, LABEL_MODES
from h5stream.order.epoch import check_shard
from h5stream.order.split import check_split
from h5stream.read.plan import parse_bytes
from h5stream.read.source import check_direct_io

SIZE_FIELDS = ("cache_limit", "cache_piece")
"""Fields of a ``remote`` dict that, as :func:`h5stream.open`'s own sizes, may be strings like ``"100GB"``."""


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class StreamOptions:
    """Everything :func:`h5stream.open` takes besides the path (see there); values are normalised
    (``memory_budget`` to bytes or None, ``shard`` to ``(index, count)``)."""

    batch_size: int = 32
    memory_budget: int | str | None = None
    _: KW_ONLY
    shuffle: bool | None = None
    seed: int | None = 0
    drop_remainder: bool = False
    shard: tuple[int, int] | None = None
    resume: dict | None = None
    augment: object = None
    workers: int = 0
    rows_per_fill: int | None = None
    timeout_s: float = 60.0
    validation_split: float | None = None
    subset: str | None = None
    label_mode: str | None = DEFAULT_LABEL_MODE  # "int", or None for a store without labels
    remote: object = None
    direct_io: bool | str = "auto"
    cache_dir: object = "auto"
    cache_limit: int | str | None = None
    read_unit: int | str | None = None
    piece_bytes: int | str | None = None
    verify_reads: bool | str = "once"
    feeder: bool = False
    allow_unfinished: bool = False
    given: frozenset = field(default=frozenset(), init=False, repr=False, compare=False)
    """The names of the options the caller passed (not left at their defaults): with ``resume=``, a given option
    that shapes the order must agree with the state, one left out is taken from it (see :func:`h5stream.open`)."""

    def __post_init__(self):
        if not _is_int(self.batch_size) or self.batch_size < 1:
            raise ConfigError(f"{opt.name('batch_size')} must be an integer >= 1, got {self.batch_size!r}")
        if not _is_int(self.workers) or self.workers < 0:
            raise ConfigError(f"{opt.name('workers')} must be an integer >= 0, got {self.workers!r}")
        if not isinstance(self.timeout_s, numbers.Real) or isinstance(self.timeout_s, bool) or self.timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0 (seconds), got {self.timeout_s!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ConfigError(f"{opt.name('seed')} must be an integer or None, got {self.seed!r}")
        if self.shuffle is not None and not isinstance(self.shuffle, bool):
            raise ConfigError(f"shuffle must be True, False or None (the subset's default), got {self.shuffle!r}")
        if self.resume is not None and not isinstance(self.resume, dict):
            raise ConfigError(f"resume must be a dict from Stream.state(), got {type(self.resume).__name__}")
        if self.label_mode is not DEFAULT_LABEL_MODE and self.label_mode not in LABEL_MODES:
            raise ConfigError(f"label_mode must be one of {', '.join(map(repr, LABEL_MODES))}, got {self.label_mode!r}")
        if not isinstance(self.feeder, bool):
            raise ConfigError(f"feeder must be True or False, got {self.feeder!r}")
        if self.feeder and not self.workers:
            raise ConfigError("feeder=True runs the reader and the worker pool in a feeder process: it needs "
                              "workers > 0 (with or without an augment); pass workers=N, or leave feeder=False")
        if not isinstance(self.allow_unfinished, bool):
            raise ConfigError(f"allow_unfinished must be True or False, got {self.allow_unfinished!r}")
        check_direct_io(self.direct_io)
        if not (isinstance(self.verify_reads, bool) or self.verify_reads == "once"):
            raise ConfigError(f"verify_reads must be True, 'once' or False, got {self.verify_reads!r}")
        split, subset = check_split(self.validation_split, self.subset)
        if self.remote is not None:
            from h5stream.remote.config import remote_options

            remote = self.remote
            if isinstance(remote, Mapping):  # its sizes as open()'s own: bytes, or a string like "100GB"
                remote = {k: parse_bytes(v, what=f"remote {k}") if k in SIZE_FIELDS and isinstance(v, str) else v
                          for k, v in remote.items()}
            object.__setattr__(self, "remote", remote_options(remote))
        cache_on = self.cache_dir is not None and self.cache_dir is not False
        if isinstance(self.cache_dir, (str, os.PathLike)) and not os.fspath(self.cache_dir):
            raise ConfigError("cache_dir is an empty string; give a folder's path, 'auto' (the user's cache folder) "
                              "or None (no cache)")
        if cache_on and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise ConfigError(f"cache_dir must be a folder's path, 'auto' (the user's cache folder) or None (no "
                              f"cache), got {self.cache_dir!r}")
        if cache_on and self.cache_dir != "auto":
            object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))
        if self.cache_limit is not None:
            object.__setattr__(self, "cache_limit", parse_bytes(self.cache_limit, what="cache_limit"))
        budget = None if self.memory_budget is None else parse_bytes(self.memory_budget)
        unit = None if self.read_unit is None else parse_bytes(self.read_unit, what="read_unit")
        piece = None if self.piece_bytes is None else parse_bytes(self.piece_bytes, what="piece_bytes")
        for name, value in (("batch_size", int(self.batch_size)), ("workers", int(self.workers)),
                            ("timeout_s", float(self.timeout_s)), ("drop_remainder", bool(self.drop_remainder)),
                            ("memory_budget", budget), ("validation_split", split), ("subset", subset),
                            ("read_unit", unit), ("piece_bytes", piece),
                            ("shard", None if self.shard is None else check_shard(self.shard))):
            object.__setattr__(self, name, value)

    @property
    def shuffled(self) -> bool:
        """Whether epochs are shuffled: ``shuffle``, which defaults to True except for the validation subset."""
        return self.subset != "validation" if self.shuffle is None else self.shuffle

    def changed(self, **changes) -> StreamOptions:
        """A copy with ``changes``, naming the same options as given (``dataclasses.replace`` passes every field
        to ``__init__``, which would record all of them as the caller's)."""
        out = dataclasses.replace(self, **changes)
        object.__setattr__(out, "given", self.given)
        return out


_POSITIONAL = tuple(f.name for f in dataclasses.fields(StreamOptions) if f.init and not f.kw_only)


def _recording_given(init):
    """``init`` that also records, in ``given``, which options the call named (positionally or by keyword)."""

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        object.__setattr__(self, "given", frozenset(_POSITIONAL[:len(args)]) | frozenset(kwargs))

    return __init__


# A keyword that names no option (Keras' image_size, batchsize, ...) is one line saying what h5stream calls it.
StreamOptions.__init__ = _recording_given(checked_kwargs(StreamOptions.__init__, where="h5stream.open()",
                                                         hints=OPEN_HINTS, elsewhere=AUGMENT_NAMES))
