"""One configuration step: a store's metadata and the user's options in, everything a stream runs by out.

:func:`resolve` is a pure function ``(meta, options, facts) -> StreamConfig``:
every check that needs the store, every default that depends on it (the
shuffle, the subset's rows, the label encoding, the memory plan, the epoch
layout) is decided there, once, and the frozen :class:`StreamConfig` is handed
down whole -- to the feed, to the feeder process (pickled once), to the worker
pool -- instead of a dozen keyword arguments re-read at every level.

What the environment says (a drawn seed, whether the file system takes
``O_DIRECT``, the HDF5 chunk cache the store's layout needs, the memory the
machine has) is gathered first by :func:`gather_facts`, the one step here that
does I/O, into :class:`Facts`: so the same ``(meta, options, facts)`` always
give the same configuration, and tests build any of them by hand.

The one part of a configuration that costs a pass over the data, the
per-channel statistics of ``featurewise_center`` / ``featurewise_std_normalization``,
is fitted after :func:`resolve` has accepted everything else
(:func:`fit_feature_stats`): a wrong option never waits for a pass over the store.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

import numpy as np

from h5stream.streaming.budget import StreamPlan, whole_blocks
from h5stream.streaming.planning import plan_stream
from h5stream.errors import ConfigError, StoreFormatError
from h5stream.labels import LabelEncoding, label_encoding
from h5stream.order.epoch import EpochLayout, epoch_layout, shard_layout
from h5stream.order.pieces import piece, resumed_stages, rest_of_epoch, rows_served
from h5stream.order.split import subset_rows
from h5stream.order.statecheck import check_complete, check_given, check_values
from h5stream.store.meta import StoreMeta

if TYPE_CHECKING:
    from h5stream.streaming.options import StreamOptions


@dataclasses.dataclass(frozen=True)
class Facts:
    """What the environment says, gathered by :func:`gather_facts` (or written by hand in a test).

    ``drawn_seed``: the seed used when ``options.seed`` is None (and no resumed
    state names one); ``direct_io``: whether this store would be read past the
    page cache under ``options.direct_io`` (False for a URL; for a set of parts, whether any part is);
    ``direct_parts``: for a set of parts, that answer part by part (empty for one store); ``chunk_cache_bytes``:
    HDF5's chunk cache for a store whose chunks split images (0 otherwise);
    ``available_bytes``: the memory the plan may take at most (None: no limit).
    """

    drawn_seed: int = 0
    direct_io: bool = False
    chunk_cache_bytes: int = 0
    available_bytes: int | None = None
    direct_parts: tuple = ()


def gather_facts(meta: StoreMeta, options: StreamOptions) -> Facts:
    """The facts :func:`resolve` needs about this machine and the store's file (see :class:`Facts`).  Raises
    what those probes raise: :class:`~h5stream.StoreFormatError` for a chunk layout that cannot stream,
    :class:`ConfigError` for ``direct_io=True`` on a file system that refuses it."""
    from h5stream.streaming.planning import available_memory_bytes
    from h5stream.read.locate import check_chunks
    from h5stream.read.source import resolve_direct_io

    if getattr(meta, "parts", ()):  # a set of parts (h5stream.store.partset): each part's facts, as one store's
        from h5stream.read.source import resolve_direct_io_parts

        parts = meta.parts
        direct = resolve_direct_io_parts([p.path if p.remote is None else None for p in parts], options.direct_io)
        return Facts(drawn_seed=int.from_bytes(os.urandom(8), "little") >> 1, direct_io=any(direct),
                     direct_parts=direct, available_bytes=available_memory_bytes(),
                     chunk_cache_bytes=sum(check_chunks(p) for p in parts if p.compression is not None))
    direct = False
    if meta.remote is None:
        direct = resolve_direct_io(meta.path, options.direct_io)
    return Facts(drawn_seed=int.from_bytes(os.urandom(8), "little") >> 1, direct_io=direct,
                 chunk_cache_bytes=check_chunks(meta), available_bytes=available_memory_bytes())


STATE_VERSIONS = (1, 2, 3)
"""States ``resume=`` takes: 3; 2 (before each epoch's fills were chained to the last epoch's, see
:func:`drawn_fills`); and 1 (before the epoch order was one for every shard count; see :func:`resume_point`)."""


def resume_point(state: dict, shard) -> tuple[int, int, tuple[tuple[int, int], ...], bool]:
    """``(epoch, batch, stages, legacy)``: where shard ``shard`` = ``(index, count)`` continues ``state``.  Pure.

    ``stages``: what other shard counts served of that epoch before (see :mod:`h5stream.order.pieces`); a state
    of another shard count adds its own stage, and the shard starts the rest of the epoch at batch 0.
    ``legacy``: the epoch is a version-1 state's, laid out by :func:`~h5stream.order.epoch.shard_layout` (its
    order depended on the shard count), so only the same shard continues it.  Raises :class:`ConfigError` for
    a state that cannot be continued so.
    """
    index, count = (int(v) for v in shard)
    epoch, batch = int(state["epoch"]), int(state["batch"])
    saved = (int(state.get("shard_index", 0)), int(state.get("shard_count", 1)))
    if epoch < 0 or batch < 0:
        raise ConfigError(f"cannot resume at epoch={epoch}, batch={batch}: both count from 0")
    if int(state["version"]) == 1:
        if saved[1] > 1 and batch:
            if saved != (index, count):
                raise ConfigError(
                    f"cannot resume: the state was saved by an earlier h5stream at shard={saved}, whose order "
                    f"depended on the shard count; continue its epoch with shard={saved}, or resume from a "
                    "state taken at an epoch's start")
            return epoch, batch, (), True
        stages, batch = resumed_stages((), saved[1], batch, count)  # one shard's order is today's order
    else:
        stages, batch = resumed_stages(state.get("stages", ()), saved[1], batch, count)
    return epoch, batch, stages, False


def drawn_fills(state: dict, shard) -> bool:
    """Whether the epoch ``state`` left part-served must finish in the order of states of version 1 and 2, whose
    fills were drawn anew every epoch (:func:`~h5stream.order.epoch.fill_schedule`) where today each epoch's are
    chained to the last one's (:mod:`h5stream.order.strata`): a state of before, saved inside an epoch after the
    first (epoch 0 is the same in both).  A version-1 state of the shard-count order (``legacy``) has its own.
    Pure."""
    epoch, batch, stages, legacy = resume_point(state, shard)
    return int(state["version"]) < 3 and epoch >= 1 and bool(batch or stages) and not legacy


@dataclasses.dataclass(frozen=True)
class LayoutFunction:
    """``epoch -> EpochLayout`` for a stream of rows ``[start_row, rows)``: plain values (picklable, for a feeder
    process), called with the epoch.  Holds no stream: the reader thread keeps it.

    ``resumed_epoch`` (-1: none) is the epoch a resumed state left part-served: ``stages`` says what other
    shard counts served of it (its layout is the rest's piece), ``legacy`` that it is a version-1 state's
    epoch (:func:`~h5stream.order.epoch.shard_layout`), ``drawn`` that its fills are drawn as a state of version
    1 or 2 had them (:func:`drawn_fills`).  Every other epoch is a plain one.
    """

    rows: int
    block_rows: int
    rows_per_fill: int
    batch_size: int
    unit_rows: int
    seed: int
    shard: tuple[int, int] | None
    shuffle: bool
    drop_remainder: bool
    start_row: int
    resumed_epoch: int = -1
    stages: tuple[tuple[int, int], ...] = ()
    legacy: bool = False
    piece_rows: int = 0  # the two-level order's pieces (0: the one-level order)
    drawn: bool = False

    def __call__(self, epoch: int) -> EpochLayout:
        make = shard_layout if (self.legacy and epoch == self.resumed_epoch) else epoch_layout
        extra = {} if make is shard_layout else {"stages": self.stages_of(epoch),
                                                 "piece_rows": self.piece_rows or None,
                                                 "chained": not (self.drawn and epoch == self.resumed_epoch)}
        return make(self.rows, self.block_rows, self.rows_per_fill, self.batch_size, self.seed, epoch,
                    shard=self.shard, shuffle=self.shuffle, drop_remainder=self.drop_remainder,
                    unit_rows=self.unit_rows, start_row=self.start_row, **extra)

    def stages_of(self, epoch: int) -> tuple[tuple[int, int], ...]:
        """What other shard counts served of ``epoch`` before this stream (empty for a plain epoch)."""
        return self.stages if epoch == self.resumed_epoch else ()

    def n_batches(self, epoch: int = -1) -> int:
        """Batches this shard serves in ``epoch`` (default: in a plain epoch).  Arithmetic only."""
        index, count = self.shard or (0, 1)
        rest = rest_of_epoch(self.rows - self.start_row, self.batch_size, self.drop_remainder,
                             self.stages_of(epoch))
        return len(piece(rest, index, count, self.batch_size, self.drop_remainder)[1])

    def serves(self, epoch: int, stages, legacy: bool, drawn: bool = False) -> bool:
        """Whether this function lays ``epoch`` out as a stream resumed at ``(epoch, stages, legacy, drawn)``
        needs."""
        special = bool(stages) or legacy or drawn
        if epoch == self.resumed_epoch:
            return (tuple(stages), legacy, drawn) == (self.stages, self.legacy, self.drawn)
        return not special

    def position(self, state: dict) -> tuple[int, int]:
        """``(epoch, batch)`` where a stream of this layout continues ``state`` (a state of its rows, batch size,
        window and seed, checked before).  Raises :class:`ConfigError` for a state of another shard count
        unless this function was made for it (``layout_function(..., resume=state)``), and for a state whose
        position or ``rows_consumed`` does not add up."""
        epoch, batch, stages, legacy = resume_point(state, self.shard or (0, 1))
        drawn = drawn_fills(state, self.shard or (0, 1))
        if not self.serves(epoch, stages, legacy, drawn):
            what = (f"a state of version {state['version']} saved inside epoch {epoch} (whose fills an earlier "
                    "h5stream drew otherwise)" if drawn and not self.drawn else
                    f"a state of shard count {state.get('shard_count', 1)} (or of an epoch resumed so)")
            raise ConfigError(f"cannot restore {what} into an open stream; open it with h5stream.open(..., "
                              "shard=..., resume=state)")
        n_batches = self.n_batches(epoch)
        if not 0 <= batch < max(n_batches, 1):
            raise ConfigError(f"cannot resume at epoch={epoch}, batch={batch}: that epoch has {n_batches} batches")
        if "rows_consumed" in state and not legacy and \
                int(state["rows_consumed"]) != self.state_keys(epoch, batch)["rows_consumed"]:
            raise ConfigError(f"cannot resume: the state says rows_consumed={state['rows_consumed']}, which its "
                              "stages and batch do not give; pass the dict Stream.state() returned, unchanged")
        if n_batches == 0:  # drop_remainder left no batch of that epoch's rest for these shards: the next one starts
            return epoch + 1, 0
        return epoch, batch

    def state_keys(self, epoch: int, batch: int) -> dict:
        """The keys of ``Stream.state()`` that say where in ``epoch`` the shards stand: the state's version,
        the earlier ``stages`` and ``rows_consumed``, the rows of the epoch all shards have served together."""
        count = (self.shard or (0, 1))[1]
        if self.legacy and epoch == self.resumed_epoch:
            return {"version": 1}  # still the version-1 order: only the same shard continues it
        stages = self.stages_of(epoch)
        done = stages + (((count, batch),) if batch else ())
        drawn = self.drawn and epoch == self.resumed_epoch  # still the version-2 order of fills
        return {"version": 2 if drawn else 3, "stages": [list(s) for s in stages],
                "rows_consumed": rows_served(self.rows - self.start_row, self.batch_size, self.drop_remainder,
                                             done)}


def layout_function(rows: int, plan: StreamPlan, seed: int, shard=None, shuffle: bool = True,
                    drop_remainder: bool = False, start_row: int = 0, resume: dict | None = None) -> LayoutFunction:
    """The :class:`LayoutFunction` of rows ``[start_row, rows)`` under ``plan``, continuing the state ``resume``
    (if any, see :func:`resume_point`; what is no state is left to ``Stream.restore`` to refuse).  Pure."""
    shard = (0, 1) if shard is None else tuple(int(v) for v in shard)
    resumed, stages, legacy, drawn = -1, (), False, False
    if resume is not None:
        epoch, _, stages, legacy = resume_point(resume, shard)
        drawn = drawn_fills(resume, shard)
        resumed = epoch if (stages or legacy or drawn) else -1
    return LayoutFunction(rows, plan.block_rows, plan.rows_per_fill, plan.batch_size, plan.unit_rows, seed,
                          shard, bool(shuffle), bool(drop_remainder), start_row, resumed, stages, legacy,
                          plan.piece_rows, drawn)


@dataclasses.dataclass(frozen=True)
class StreamConfig:
    """Everything a stream runs by, decided once by :func:`resolve`; frozen, picklable.

    ``rows``: the ``[start, stop)`` row range one epoch covers (the store, or
    its subset); ``shard``: ``(index, count)``; ``seed``: the seed in force
    (given, drawn, or the resumed state's); ``augment``: the
    :class:`~h5stream.Augment` (with its feature statistics once fitted) or
    None; ``verify_reads``: ``True``, ``"once"`` or ``False``; ``plan``: the
    memory plan the feed allocates by; ``layout``: ``epoch -> EpochLayout``;
    ``resume``: the state to continue from, or None.
    """

    meta: StoreMeta
    subset: str | None
    rows: tuple[int, int]
    shard: tuple[int, int]
    batch_size: int
    shuffle: bool
    seed: int
    drop_remainder: bool
    labels: LabelEncoding
    augment: object
    workers: int
    feeder: bool
    timeout_s: float
    direct_io: bool
    verify_reads: bool | str
    plan: StreamPlan
    layout: LayoutFunction
    resume: dict | None
    validation_split: float | None = None
    direct_parts: tuple = ()  # a set of parts: whether each part is read past the page cache (Facts.direct_parts)

    @property
    def reader_direct_io(self):
        """What the reader is told: ``direct_io``, or for a set of parts one answer per part."""
        return self.direct_parts or self.direct_io

    @property
    def path(self) -> str:
        return self.meta.path

    @property
    def epoch_rows(self) -> int:
        """Rows one epoch covers, over all shards."""
        return self.rows[1] - self.rows[0]

    @property
    def transform(self):
        """What the worker pool runs on every batch: the augmentation, or (``workers`` without one) the plain
        copy of the rows into the output slot (:func:`~h5stream.augment.worker.copy_rows`), so the workers do
        the reading and the one copy of every pixel in place of the training process."""
        if self.augment is not None:
            return self.augment
        from h5stream.augment.worker import copy_rows

        return copy_rows

    @property
    def output_dtype(self) -> np.dtype:
        """dtype of the images the feed yields: the augmentation's output dtype, else uint8 as stored."""
        return np.dtype(self.augment.output_dtype()) if self.augment is not None else np.dtype(np.uint8)

    @property
    def output_shape(self) -> tuple[int, ...]:
        """Shape of one yielded image: the augmentation's ``output_size`` with the stored channels, else the
        stored shape."""
        if self.augment is not None:
            return self.augment.output_shape(self.meta.image_shape)
        return tuple(self.meta.image_shape)

    @property
    def needs_feature_stats(self) -> bool:
        """Whether the augmentation normalises by statistics not fitted yet (see :func:`fit_feature_stats`)."""
        return self.augment is not None and self.augment.needs_feature_stats


def resolve(meta: StoreMeta, options: StreamOptions, facts: Facts) -> StreamConfig:
    """The configuration of a stream over the store ``meta`` with ``options`` on a machine described by
    ``facts``.  Pure: no I/O, the same inputs give the same result.

    Raises :class:`~h5stream.StoreFormatError` for a store whose committed
    rows lack checksums (damage) unless ``verify_reads=False``, and
    :class:`ConfigError` for options that do not fit the store (no
    committed rows, a label mode its labels cannot take, a batch size that
    leaves no batch), and :class:`~h5stream.BudgetError`
    for a memory budget that cannot hold the plan; each one line saying what to
    change.  The order of the epoch depends on the seed, on ``rows_per_fill``,
    ``unit_rows`` and ``piece_rows``: a resumed state names them (and the batch
    size, shuffle and drop_remainder), and they win over what the budget and the
    defaults would give; an option the caller gave that contradicts the state is a
    :class:`ConfigError` (:func:`~h5stream.order.statecheck.check_given`).
    """
    if options.verify_reads and meta.checksum_problem is not None:  # rows without a checksum, or no table
        raise StoreFormatError(f"{meta.checksum_problem} (verify_reads=False streams it unchecked)")
    if options.verify_reads and getattr(meta, "row_digest_problem", None) is not None:  # as verify refuses it
        raise StoreFormatError(f"{meta.row_digest_problem} (verify_reads=False streams it unchecked)")
    if meta.rows == 0:
        raise ConfigError(f"{meta.path}: the store has no committed rows; ingest images into it first")
    rows = subset_rows(meta.rows, options.validation_split, options.subset, meta.storage_order, meta.path,
                       *_set_kind(meta))
    labels = label_encoding(meta, options.label_mode)
    resume = options.resume
    if resume is not None:
        check_values(resume)  # before any of it is used
    if _is_state(resume):
        check_given(resume, _given_order(options, None, meta.block_rows))
        options = _state_defaults(options, resume)
    seed = facts.drawn_seed if options.seed is None else options.seed
    if resume is not None and "seed" in resume:
        seed = int(resume["seed"])
    parts = getattr(meta, "parts", ())
    if meta.remote is not None and options.direct_io is True and not parts:
        raise ConfigError(f"{meta.path}: direct_io=True is for a local store; leave it at 'auto' for a URL")
    direct_io = (meta.remote is None or bool(parts)) and facts.direct_io
    direct_parts = tuple(bool(d) for d in facts.direct_parts) if parts else ()
    augment = _checked_augment(options.augment)
    workers = options.workers
    if workers and augment is not None:
        augment.ensure_picklable()
    rows_per_fill = options.rows_per_fill
    if rows_per_fill is None and resume is not None and "rows_per_fill" in resume:
        rows_per_fill = int(resume["rows_per_fill"])  # the order being resumed, whatever the workers now
    unit_bytes = options.read_unit
    if unit_bytes is None and resume is not None and "unit_rows" in resume:
        unit_bytes = int(resume["unit_rows"]) * meta.row_bytes  # likewise
    piece_bytes = options.piece_bytes
    if piece_bytes is None and resume is not None and int(resume.get("piece_rows", 0)):
        piece_bytes = int(resume["piece_rows"]) * meta.row_bytes  # likewise
    start, stop = rows
    batch_size = options.batch_size
    plan = plan_stream(meta, options.memory_budget, batch_size, augment=augment, workers=workers,
                       rows_per_fill=rows_per_fill, epoch_rows=stop - start,
                       out_label_row_bytes=labels.extra_row_bytes, direct_io=direct_io, unit_bytes=unit_bytes,
                       available_bytes=facts.available_bytes, verify_reads=options.verify_reads,
                       chunk_cache_bytes=facts.chunk_cache_bytes, feeder=options.feeder, piece_bytes=piece_bytes)
    if _is_state(resume):
        check_given(resume, _given_order(options, plan, meta.block_rows))
    shard = options.shard or (0, 1)
    layout = layout_function(stop, plan, int(seed), shard, options.shuffled, options.drop_remainder,
                             start_row=start, resume=resume if _is_state(resume) else None)
    if layout.n_batches() == 0:
        raise ConfigError(
            f"{meta.path}: {stop - start} rows give no full batch of {batch_size}"
            + (f" per shard ({shard[1]} shards)" if shard[1] > 1 else "")
            + " with drop_remainder=True; lower batch_size or set drop_remainder=False"
        )
    return StreamConfig(
        meta=meta, subset=options.subset, rows=rows, shard=shard, batch_size=batch_size, shuffle=options.shuffled,
        seed=int(seed), drop_remainder=options.drop_remainder, labels=labels, augment=augment, workers=workers,
        feeder=options.feeder, timeout_s=options.timeout_s, direct_io=direct_io, direct_parts=direct_parts,
        verify_reads=options.verify_reads, plan=plan, layout=layout, resume=resume,
        validation_split=options.validation_split,
    )


def _state_defaults(options: StreamOptions, state: dict) -> StreamOptions:
    """``options`` with the batch size, shuffle and drop_remainder of ``state`` where the caller left them out: a
    resumed stream continues the state's order (what the caller gave is checked against it, see
    :func:`_given_order`).  The seed and the shuffle window are taken from it in :func:`resolve`."""
    taken = {name: cast(state[name]) for name, cast in (("batch_size", int), ("shuffle", lambda v: bool(int(v))),
                                                        ("drop_remainder", lambda v: bool(int(v))))
             if name not in options.given and name in state}
    if not taken:
        return options
    return options.changed(**taken)


def _given_order(options: StreamOptions, plan: StreamPlan | None, block_rows: int) -> dict:
    """``{option as passed: (state key, the value it gives)}`` for each order-shaping option the caller named (see
    :func:`~h5stream.order.statecheck.check_given`); ``seed=None`` and ``shuffle=None`` name no value of their own.
    Without ``plan``, the options whose value is the state's own (checked before the plan is made, so that a
    given ``rows_per_fill`` is named as a contradiction, not as a budget that cannot hold it: in whole
    ``block_rows`` blocks, as the plan rounds it); with it, the sizes the plan turns into rows (``read_unit``,
    ``piece_bytes``, and the fill exactly as planned)."""
    fill = options.rows_per_fill
    if plan is None:
        values = {"seed": (options.seed, "seed"), "batch_size": (options.batch_size, "batch_size"),
                  "shuffle": (options.shuffle, "shuffle"), "drop_remainder": (options.drop_remainder, "drop_remainder"),
                  "rows_per_fill": (fill, "rows_per_fill")}
        gives = {} if fill is None else {"rows_per_fill": max(int(block_rows), whole_blocks(fill, block_rows))}
    else:
        values = {"read_unit": (options.read_unit, "unit_rows"), "piece_bytes": (options.piece_bytes, "piece_rows"),
                  "rows_per_fill": (fill, "rows_per_fill")}
        gives = {"read_unit": plan.unit_rows, "piece_bytes": plan.piece_rows, "rows_per_fill": plan.rows_per_fill}
    return {f"{name}={value!r}": (key, gives.get(name, value)) for name, (value, key) in values.items()
            if name in options.given and value is not None}


def _set_kind(meta: StoreMeta) -> tuple[int, bool, int | None]:
    """``(parts, one_ingest, appended_from)`` as :func:`~h5stream.order.split.subset_rows` takes them: the parts of
    a set (0 for one store), whether they are one ``ingest --part`` set (the set's reader checked them all of one),
    and the first logical row an ``--append`` stored from a listing that grew (None: none)."""
    parts = getattr(meta, "parts", ()) or ()
    if not parts:
        return 0, False, meta.appended_from
    appended = [start + p.appended_from for p, start in zip(parts, meta.starts) if p.appended_from is not None]
    return len(parts), parts[0].part is not None, min(appended) if appended else None


def _is_state(state) -> bool:
    return isinstance(state, dict) and state.get("version") in STATE_VERSIONS and {"epoch", "batch"} <= state.keys()


def checked_state(state):
    """``state`` if it is a dict of a version :func:`resume_point` reads (or None), whole and of integers where
    ``Stream.state()`` puts them (:mod:`~h5stream.order.statecheck`); else :class:`ConfigError`."""
    if state is None:
        return None
    if isinstance(state, dict):
        check_values(state)
    if not _is_state(state):
        raise ConfigError(f"not an h5stream state (expected a dict from Stream.state(), version "
                          f"{' or '.join(map(str, STATE_VERSIONS))})")
    check_complete(state)
    return state


def _checked_augment(augment):
    """``augment`` if it is an :class:`~h5stream.Augment` (or None); else :class:`ConfigError`."""
    if augment is None:
        return None
    from h5stream.augment import Augment

    if not isinstance(augment, Augment):
        raise ConfigError(f"augment must be an h5stream.Augment, got {type(augment).__name__}")
    return augment


def fit_feature_stats(config: StreamConfig) -> StreamConfig:
    """``config`` with its augmentation's per-channel mean and std fitted, when it normalises featurewise (else
    ``config`` itself).  One pass over the rows trained on.

    Keras fits the statistics on the training data and applies them to both
    subsets: so the training rows, all shards of them (every replica
    normalises alike), whichever subset this stream is.  The result is kept in
    this process's memory for the next stream of the same, unchanged file; the
    workers get the statistics inside the pickled ``Augment``.
    """
    if not config.needs_feature_stats:
        return config
    from h5stream.augment.stats import feature_stats

    meta = config.meta
    training = subset_rows(meta.rows, config.validation_split,
                           "training" if config.validation_split is not None else None,
                           meta.storage_order, meta.path, *_set_kind(meta))
    mean, std = feature_stats(meta, rows=training)  # one store, or a set of parts read part by part
    return dataclasses.replace(config, augment=config.augment.with_feature_stats(mean, std))
