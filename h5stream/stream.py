"""The object users iterate: :func:`open` wires order + read (+ augment) together.

``h5stream.open(path, batch_size=32, memory_budget="256MiB")`` returns a
:class:`Stream`.  Each ``iter(stream)`` yields one epoch of ``(images, labels)``
numpy batches; the next ``iter`` is the next epoch, reshuffled.  A reader thread
starts at ``open`` and keeps reading ahead (across epoch boundaries) within the
memory budget.  A stream is consumed from one thread at a time.
"""

from __future__ import annotations

import os
import weakref

import numpy as np

from h5stream import _interrupt as interrupt
from h5stream.errors import ConfigError, StreamClosedError
from h5stream.order.epoch import EpochLayout, check_shard, epoch_layout
from h5stream.read.plan import ReadPlan, parse_bytes, plan_read, unit_rows_for
from h5stream.feed import InlineFeed, PooledFeed, pool_slots
from h5stream.store.meta import StoreMeta, read_meta

STATE_VERSION = 1
_LAYOUT_KEYS = ("rows", "batch_size", "rows_per_fill", "unit_rows", "shard_index", "shard_count", "shuffle", "drop_remainder")


def open(  # noqa: A001 - the public name mirrors h5py.File / builtins.open on purpose
    path: str | os.PathLike,
    batch_size: int = 32,
    memory_budget: int | str = "256MiB",
    *,
    shuffle: bool = True,
    seed: int | None = 0,
    drop_remainder: bool = False,
    shard: tuple[int, int] | None = None,
    resume: dict | None = None,
    augment=None,
    workers: int = 0,
    rows_per_fill: int | None = None,
    timeout_s: float = 60.0,
) -> Stream:
    """Open a store for streaming.  See :class:`Stream` for what it yields.

    ``memory_budget`` (bytes, or "512MB" / "1.5GiB") bounds everything the
    stream allocates; ``shard=(index, count)`` streams one of ``count`` disjoint
    parts (data-parallel training); ``resume`` is a dict from :meth:`Stream.state`;
    ``seed=None`` draws a seed (recorded in ``state()``).

    The order of an epoch depends on the seed and on ``rows_per_fill`` (the
    shuffle window, ``stream.plan.rows_per_fill``), which by default is what the
    budget leaves after everything else, workers included.  Pass
    ``rows_per_fill`` to get the same batches with any number of workers or
    any budget that holds it; ``resume`` takes it from the state.
    """
    return Stream(
        path, batch_size=batch_size, memory_budget=memory_budget, shuffle=shuffle, seed=seed,
        drop_remainder=drop_remainder, shard=shard, resume=resume, augment=augment, workers=workers,
        rows_per_fill=rows_per_fill, timeout_s=timeout_s,
    )


class Stream:
    """An endless, epoch-by-epoch supply of shuffled batches from one store.

    Owns a reader thread (and, with ``workers > 0``, a worker pool).  ``close()``
    stops them; it is idempotent, called by ``with`` and, as a last resort, when
    the stream is garbage-collected.
    """

    def __init__(self, path, *, batch_size, memory_budget, shuffle, seed, drop_remainder, shard, resume, augment,
                 workers, rows_per_fill, timeout_s):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ConfigError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 0:
            raise ConfigError(f"workers must be an integer >= 0, got {workers!r}")
        if timeout_s is None or timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0, got {timeout_s!r}")
        budget = parse_bytes(memory_budget)
        self._shard = check_shard(shard)
        from h5stream.shm import sweep_stale_segments

        sweep_stale_segments()  # what streams and ingests killed with their whole process group left in /dev/shm
        meta = read_meta(path)
        if meta.rows == 0:
            raise ConfigError(f"{meta.path}: the store has no committed rows; ingest images into it first")
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little") >> 1
        if resume is not None and "seed" in resume:
            seed = int(resume["seed"])
        self.meta: StoreMeta = meta
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_remainder = bool(drop_remainder)
        self.timeout_s = float(timeout_s)
        self.augment = self._prepare_augment(augment)
        self.workers = int(workers)
        if self.workers and self.augment is None:
            raise ConfigError("workers > 0 needs augment=h5stream.Augment(...): without a transform there is "
                              "nothing for worker processes to do (reading already runs in its own thread)")
        if self.workers:
            self.augment.ensure_picklable()
        if rows_per_fill is None and isinstance(resume, dict) and "rows_per_fill" in resume:
            rows_per_fill = resume["rows_per_fill"]  # the order being resumed, whatever the workers now
        self.plan: ReadPlan = stream_plan(meta, budget, self.batch_size, augment=self.augment, workers=self.workers,
                                          rows_per_fill=rows_per_fill)
        # A plain function of the epoch (no reference to self: the reader thread holds it).
        self._layout_fn = layout_function(
            meta.rows, self.plan, self.seed, self._shard, self.shuffle, self.drop_remainder,
        )
        first = self._layout(0)
        self._n_batches = first.n_batches
        if self._n_batches == 0:
            raise ConfigError(
                f"{meta.path}: {meta.rows} rows give no full batch of {batch_size}"
                + (f" per shard ({self._shard[1]} shards)" if self._shard[1] > 1 else "")
                + " with drop_remainder=True; lower batch_size or set drop_remainder=False"
            )
        self._epoch, self._batch = 0, 0
        self._closed = False
        interrupt.install()
        interrupt.hold()  # Ctrl-C while threads and workers start: raised where no lock is half taken
        try:
            if self.workers:
                self._feed = PooledFeed(meta, self._layout_fn, self.plan, augment=self.augment,
                                        workers=self.workers, seed=self.seed, timeout_s=self.timeout_s)
            else:
                self._feed = InlineFeed(meta, self._layout_fn, self.plan, augment=self.augment, seed=self.seed,
                                        timeout_s=self.timeout_s)
            # The feed owns the thread, processes and shared memory; it never refers back to this object,
            # so garbage collection of an unclosed stream still reaches this finalizer.
            self._finalizer = weakref.finalize(self, self._feed.close)
            try:
                if resume is not None:
                    self.restore(resume)
                else:
                    self._feed.start(0, 0)
            except BaseException:
                self.close()
                raise
        finally:
            interrupt.release()

    # -- layout -------------------------------------------------------------------
    def _layout(self, epoch: int) -> EpochLayout:
        return self._layout_fn(epoch)

    def epoch_order(self, epoch: int | None = None) -> np.ndarray:
        """Row ids (int64) in the exact order this stream yields them in ``epoch`` (default: the current one).  No I/O."""
        return self._layout(self._epoch if epoch is None else int(epoch)).order()

    # -- iteration ----------------------------------------------------------------
    def __len__(self) -> int:
        """Batches per epoch (for this shard)."""
        return self._n_batches

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self._epoch

    def __iter__(self):
        """Yield the rest of the current epoch (all of it, unless a previous iteration stopped early)."""
        self._check_open()
        return self._iterate()

    def _iterate(self):
        epoch = self._epoch
        while self._epoch == epoch and not self._closed:
            interrupt.hold()  # a Ctrl-C in a wait is raised between its polls (see h5stream._interrupt)
            try:
                got_epoch, index, x, y = self._feed.next()
            finally:
                interrupt.release()
            if (got_epoch, index) != (self._epoch, self._batch):  # pragma: no cover - internal invariant
                raise RuntimeError(f"feed out of step: got {(got_epoch, index)}, expected {(self._epoch, self._batch)}")
            # Advance before yielding: state() taken after this batch resumes at the next one.
            self._batch += 1
            if self._batch == self._n_batches:
                self._epoch, self._batch = self._epoch + 1, 0
            yield x, y

    # -- resume -------------------------------------------------------------------
    def _layout_signature(self) -> dict:
        return {
            "rows": self.meta.rows, "batch_size": self.batch_size, "rows_per_fill": self.plan.rows_per_fill,
            "unit_rows": self.plan.unit_rows,
            "shard_index": self._shard[0], "shard_count": self._shard[1], "shuffle": int(self.shuffle),
            "drop_remainder": int(self.drop_remainder),
        }

    def state(self) -> dict:
        """Where the stream stands: a small dict of ints; ``restore`` / ``open(resume=...)`` continue from it."""
        return {"version": STATE_VERSION, "seed": self.seed, "epoch": self._epoch, "batch": self._batch,
                **self._layout_signature()}

    def restore(self, state: dict) -> None:
        """Continue with exactly the batches that would have come after ``state`` was taken."""
        self._check_open()
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ConfigError(f"not an h5stream state (expected a dict from Stream.state(), version {STATE_VERSION})")
        mine = self._layout_signature()
        for key in _LAYOUT_KEYS:
            if key in state and int(state[key]) != int(mine[key]):
                fix = ("open the stream with h5stream.open(..., resume=state), which takes the shuffle window from "
                       "the state" if key == "rows_per_fill" else
                       "reopen with the same file, batch_size, shard, shuffle and drop_remainder")
                raise ConfigError(f"cannot resume: the state has {key}={state[key]} but this stream has {key}={mine[key]}; {fix}")
        if int(state.get("seed", self.seed)) != self.seed:
            raise ConfigError(f"cannot resume: the state has seed={state['seed']} but this stream has seed={self.seed}")
        epoch, batch = int(state["epoch"]), int(state["batch"])
        if epoch < 0 or not 0 <= batch < self._n_batches:
            raise ConfigError(f"cannot resume at epoch={epoch}, batch={batch}: an epoch has {self._n_batches} batches")
        self._epoch, self._batch = epoch, batch
        self._feed.start(epoch, batch)

    # -- lifecycle ----------------------------------------------------------------
    def stats(self) -> dict:
        """Counters for monitoring: queue fill, batches, seconds the consumer waited, bytes read."""
        return {**self._feed.stats(), "epoch": self._epoch, "batch": self._batch}

    def _check_open(self) -> None:
        if self._closed:
            raise StreamClosedError(f"{self.meta.path}: the stream is closed; open it again with h5stream.open(...)")

    def close(self) -> None:
        """Stop the reader (and workers) and free the buffers.  Idempotent.

        A Ctrl-C arriving meanwhile is raised once everything is released (a
        fraction of a second), not in the middle of it (see :mod:`h5stream._interrupt`).
        """
        if self._closed:
            return
        self._closed = True
        interrupt.hold()
        try:
            self._finalizer()
        finally:
            interrupt.release()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<h5stream.Stream {self.meta.path!r} rows={self.meta.rows} batch_size={self.batch_size} "
                f"batches={self._n_batches} epoch={self._epoch} {'closed' if self._closed else 'open'}>")

    # -- augmentation ---------------------------------------------------------------
    def _prepare_augment(self, augment):
        if augment is None:
            return None
        from h5stream.augment import Augment

        if not isinstance(augment, Augment):
            raise ConfigError(f"augment must be an h5stream.Augment, got {type(augment).__name__}")
        if augment.needs_feature_stats:
            from h5stream.augment.stats import compute_feature_stats

            mean, std = compute_feature_stats(self.meta.path)
            augment = augment.with_feature_stats(mean, std)
        return augment

    # -- framework adapters (imported only when asked for) -------------------------
    def keras(self):
        """An object Keras 3 ``model.fit`` takes directly (one epoch per pass)."""
        from h5stream.adapters.keras import as_keras

        return as_keras(self)

    def tf_dataset(self):
        """A ``tf.data.Dataset`` of this stream's batches, prefetching."""
        from h5stream.adapters.tf import as_tf_dataset

        return as_tf_dataset(self)

    def torch(self):
        """A ``torch.utils.data.IterableDataset`` yielding tensors."""
        from h5stream.adapters.torch import as_torch

        return as_torch(self)


def stream_plan(meta: StoreMeta, budget_bytes: int, batch_size: int, *, augment=None, workers: int = 0,
                rows_per_fill: int | None = None) -> ReadPlan:
    """The memory plan a stream over ``meta`` uses (pure; what ``Stream.plan`` holds)."""
    out_row_bytes, worker_bytes = None, 0
    if augment is not None:
        out_row_bytes = meta.row_bytes * np.dtype(augment.output_dtype()).itemsize
    if workers:
        from h5stream.augment.pool import WORKER_OVERHEAD_BYTES, worker_buffer_bytes

        worker_bytes = WORKER_OVERHEAD_BYTES + worker_buffer_bytes(batch_size, meta.image_shape)
    return plan_read(
        budget_bytes, rows=meta.rows, row_bytes=meta.row_bytes, label_row_bytes=meta.label_row_bytes,
        block_rows=meta.block_rows, batch_size=batch_size, out_row_bytes=out_row_bytes,
        n_out_slots=pool_slots(workers) if workers else 0, workers=workers, worker_bytes=worker_bytes,
        unit_rows=unit_rows_for(meta.block_rows, meta.row_bytes, meta.compression is not None),
        rows_per_fill=rows_per_fill,
    )


def layout_function(rows: int, plan: ReadPlan, seed: int, shard=None, shuffle: bool = True,
                    drop_remainder: bool = False):
    """``epoch -> EpochLayout`` for a stream of ``rows`` rows under ``plan`` (pure; holds no stream)."""

    def layout(epoch: int) -> EpochLayout:
        return epoch_layout(rows, plan.block_rows, plan.rows_per_fill, plan.batch_size, seed, epoch, shard=shard,
                            shuffle=shuffle, drop_remainder=drop_remainder, unit_rows=plan.unit_rows)

    return layout
