"""The object users iterate: a :class:`Stream` wires order + read (+ augment) together.

``h5stream.open(path, batch_size=32)`` (:mod:`h5stream.streaming.api`) returns a :class:`Stream`.  Each
``iter(stream)`` yields one whole epoch of ``(images, labels)`` numpy batches;
the next ``iter`` is the next epoch, reshuffled.  A reader thread starts at
``open`` and keeps reading ahead (across epoch boundaries) within the memory
budget.  A stream is consumed from one thread at a time, and that is enforced
(see :class:`Stream`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref

import numpy as np

from h5stream import _optnames as opt
from h5stream.concurrency import fork as _fork
from h5stream.concurrency import interrupt
from h5stream.concurrency.cores import warn_if_more_workers_than_cores
from h5stream.concurrency.spawn import refuse_in_a_starting_worker
from h5stream.streaming.config import StreamConfig, checked_state, fit_feature_stats, gather_facts, resolve
from h5stream.errors import (ConfigError, H5StreamError, ResourceLimitError, StreamClosedError, StreamIterationError,
                             descriptor_limit, hide_passwords)
from h5stream.streaming.feeds import Feed, InlineFeed, PooledFeed
from h5stream.streaming.process_feed import ProcessFeed
from h5stream.streaming.options import StreamOptions
from h5stream.order.epoch import EpochLayout
from h5stream.store.partset import read_any
from h5stream.store.progress import warn_uncommitted, warn_unfinished

STATE_VERSION = 3
_LAYOUT_KEYS = ("rows", "row_start", "row_stop", "batch_size", "rows_per_fill", "unit_rows", "piece_rows",
                "shuffle", "drop_remainder")


def _from_config(name: str, doc: str) -> property:
    """A read-only attribute of :class:`Stream` that is its config's ``name``."""
    return property(lambda stream: getattr(stream.config, name), doc=doc)


class Stream:
    """An endless, epoch-by-epoch supply of shuffled batches from one store (or one subset of it).

    Made by :func:`open` (``Stream(path, options)`` with a
    :class:`~h5stream.streaming.options.StreamOptions` is what it does).  Owns
    a reader thread (and, with ``workers > 0``, a worker pool; with
    ``feeder=True`` both run in a feeder process it owns).
    ``close()`` stops them; it is idempotent, called by ``with`` and, as a
    last resort, when the stream is garbage-collected.

    Iteration contract:

    * every ``iter(stream)`` serves one whole epoch, every row exactly once,
      and the next ``iter`` the next epoch.  An epoch left mid-way (a ``break``,
      a peek with ``next(iter(stream))``, an iterator dropped) is not resumed:
      the next ``iter`` starts the following epoch at its first batch.  Until
      then ``state()`` names the position after the last batch served (so a
      stream opened with ``resume=`` that state would finish the left epoch);
      from that ``iter`` on, the new epoch's first batch;
    * the one exception: after ``restore(state)`` or ``open(resume=state)``,
      the first ``iter`` serves the rest of that state's epoch (then whole
      epochs again), so resuming equals not stopping;
    * a new ``iter`` (or ``restore``) replaces the live iterator: the old one's
      ``next()`` raises :class:`~h5stream.StreamIterationError` instead of
      serving batches of another epoch;
    * one thread at a time: a ``next()``, ``iter()`` or ``restore()`` while
      another thread is inside one of them raises
      :class:`~h5stream.StreamIterationError` at once.  Handing the stream from
      thread to thread between calls (as ``tf.data`` does) is fine;
    * after ``close()`` every ``next()`` of a live iterator raises
      :class:`~h5stream.StreamClosedError` (a ``for`` loop does not just end);
    * a process forked after ``open`` leaves the stream as it was: in the
      child every use raises :class:`~h5stream.ForkedStreamError`, ``close()``
      releases nothing, and its exit stops nothing (see :mod:`h5stream.concurrency.fork`).

    Errors while iterating (``next()``), each before the batch it concerns is
    served, never a short or wrong batch instead: :class:`~h5stream.ReaderError`
    (reading failed, or no batch within ``timeout_s``; ``__cause__`` holds the
    original), :class:`~h5stream.ChecksumError` (a row read does not match the
    store's checksums), :class:`~h5stream.ImageDecodeError` (an encoded row does
    not decode), :class:`~h5stream.WorkerError` (a worker raised or died; the
    message carries its traceback or signal).  ``state()`` still names the
    position after the last batch served.
    """

    def __init__(self, path: str | os.PathLike, options: StreamOptions | None = None):
        options = StreamOptions() if options is None else options
        if not isinstance(options, StreamOptions):
            raise ConfigError("options must be an h5stream.streaming.options.StreamOptions, "
                              f"got {type(options).__name__}")
        self.options = options
        refuse_in_a_starting_worker()
        from h5stream.memory.shm import sweep_stale_segments

        sweep_stale_segments()  # what streams and ingests killed with their whole process group left in /dev/shm
        # one store, or a set of parts read as one
        meta = read_any(path, options.remote, options.timeout_s, options.cache_dir, options.cache_limit)
        if options.workers:  # before a BudgetError, which suggests the same count
            warn_if_more_workers_than_cores(options.workers)
        config = resolve(meta, options, gather_facts(meta, options))
        for store in getattr(meta, "parts", ()) or (meta,):  # a set of parts: each part for itself
            warn_uncommitted(store)
            warn_unfinished(store, options.allow_unfinished)  # once per open: subset="both" silences its second
        self.config: StreamConfig = fit_feature_stats(config)
        self._n_batches = self.config.layout.n_batches()  # of a plain epoch; a resumed one may have fewer
        self._epoch, self._batch = 0, 0
        self._closed = False
        self._owner_pid = _fork.owner_pid()  # everything below belongs to this process, not to a forked child
        self._busy = threading.Lock()  # held by the one thread inside next() / iter() / restore(); never waited on
        self._generation = 0  # bumped by iter() and restore(): iterators of an older one are replaced
        self._resumed = False  # restore() set the position: the next iter() continues it instead of leaving it
        self._adapter_passes = None  # the adapters' shared h5stream.adapters._passes.Passes, owned by this stream
        interrupt.install()
        interrupt.hold()  # Ctrl-C while threads and workers start: raised where no lock is half taken
        try:
            feed_class = InlineFeed if not config.workers else ProcessFeed if config.feeder else PooledFeed
            self._feed: Feed = feed_class(self.config)
            # The feed owns the thread, processes and shared memory; it never refers back to this object,
            # so garbage collection of an unclosed stream still reaches this finalizer.
            self._finalizer = weakref.finalize(self, _fork.OwnerOnly(self._feed.close))
            if config.resume is not None:
                self.restore(config.resume)
            else:
                self._feed.start(0, 0)
        except OSError as exc:
            self._close_started()
            limit = descriptor_limit(exc.errno)
            if limit is None or isinstance(exc, H5StreamError):
                raise
            what, fix = limit
            raise ResourceLimitError(
                f"{meta.path}: {what} while starting the stream; {fix}"
                + (f" or lower {opt.name('workers')} (now {self.workers}; {opt.setting('workers', 0)} opens the fewest)"
                   if self.workers else ""),
                errno=exc.errno) from exc
        except BaseException:
            self._close_started()
            raise
        finally:
            try:
                interrupt.release()  # a Ctrl-C held while starting is raised here ...
            except BaseException:
                self._close_started()  # ... and the caller, who never gets this stream, keeps none of its threads
                raise

    def _close_started(self) -> None:
        """Close what ``__init__`` started before it failed (nothing, if it failed before the feed existed)."""
        if getattr(self, "_finalizer", None) is not None:
            self.close()

    # -- what it runs by (read-only views of self.config) ------------------------------
    meta = _from_config("meta", "The store's :class:`~h5stream.store.meta.StoreMeta` as read at ``open``.")
    plan = _from_config("plan", "The memory plan the stream allocates by (``plan.describe()`` states it).")
    seed = _from_config("seed", "The seed in force: the one given, drawn (``seed=None``) or the resumed state's.")
    batch_size = _from_config("batch_size", "Rows per batch (the last of an epoch may have fewer).")
    shuffle = _from_config("shuffle", "Whether every epoch is reshuffled.")
    drop_remainder = _from_config("drop_remainder", "Whether each epoch's last, smaller batch is dropped.")
    timeout_s = _from_config("timeout_s", "Seconds a batch may take before :class:`~h5stream.ReaderError`.")
    direct_io = _from_config("direct_io", "Whether the pixels are read past the page cache (``O_DIRECT``).")
    augment = _from_config("augment", "The :class:`~h5stream.Augment` (feature statistics fitted), or None.")
    workers = _from_config("workers", "Worker processes (0: the transform runs in the consumer's thread).")
    subset = _from_config("subset", "``\"training\"``, ``\"validation\"`` or None (the whole store).")

    # -- what it yields -------------------------------------------------------------
    @property
    def class_names(self) -> list[str] | None:
        """The store's class names (label ``i`` is ``class_names[i]``), or None for regression targets or a
        store without labels."""
        return list(self.meta.class_names) if self.meta.class_names is not None else None

    @property
    def class_to_idx(self) -> dict[str, int] | None:
        """``{class name: label index}``, as torchvision's ``ImageFolder.class_to_idx``; None for regression."""
        names = self.class_names
        return None if names is None else {name: index for index, name in enumerate(names)}

    @property
    def file_paths(self) -> list[str]:
        """Each row's source path (relative to the ingest's SRC, as stored: see :mod:`h5stream.store.pathrows`), in
        row order, for this stream's rows (its subset's), as Keras' ``Dataset.file_paths``.  Read on first use, on
        the calling thread with a handle of its own (not the reader's), and kept."""
        if getattr(self, "_file_paths", None) is None:
            from h5stream.store.partset import read_paths_any

            self._file_paths = read_paths_any(self.meta, *self.config.rows, remote=self.meta.remote)
        return list(self._file_paths)

    @property
    def rows(self) -> int:
        """Rows one epoch covers, over all shards: the store's committed rows, or its subset's."""
        return self.config.epoch_rows

    @property
    def image_shape(self) -> tuple[int, ...]:
        """Shape of one yielded image: the stored ``meta.image_shape``, or the augmentation's ``output_size``
        with the stored channels."""
        return self.config.output_shape

    @property
    def image_dtype(self) -> np.dtype:
        """dtype of the yielded images: uint8 as stored, or the augmentation's output dtype."""
        return self.config.output_dtype

    @property
    def label_mode(self) -> str | None:
        """``"int"``, ``"categorical"``, ``"binary"``, or None: batches are images alone."""
        return self.config.labels.mode

    @property
    def yields_labels(self) -> bool:
        """Whether a batch is ``(images, labels)`` (True) or ``images`` alone (``label_mode=None``)."""
        return self.config.labels.yields_labels

    @property
    def label_shape(self) -> tuple[int, ...] | None:
        """Shape of one yielded label: ``()`` for class indices, ``(n_classes,)`` one-hot, ``(1,)`` binary;
        None with ``label_mode=None``."""
        return self.config.labels.shape

    @property
    def label_dtype(self) -> np.dtype | None:
        """dtype of the yielded labels (int64 class indices, float32 otherwise; None with ``label_mode=None``)."""
        return self.config.labels.dtype

    # -- layout -------------------------------------------------------------------
    def _layout(self, epoch: int) -> EpochLayout:
        return self.config.layout(epoch)

    def epoch_order(self, epoch: int | None = None) -> np.ndarray:
        """Row ids (int64) in the exact order this stream yields them in ``epoch`` (default: the current one).
        No I/O."""
        return self._layout(self._epoch if epoch is None else int(epoch)).order()

    # -- iteration ----------------------------------------------------------------
    def __len__(self) -> int:
        """Batches per epoch (for this shard); the rest of an epoch resumed from a state of another shard count
        may have fewer."""
        return self._n_batches

    @property
    def epoch(self) -> int:
        """The epoch of the position ``state()`` names (an epoch left mid-way: the next ``iter`` starts the next)."""
        return self._epoch

    def __iter__(self) -> _EpochIterator:
        """An iterator over one whole epoch: the next one, or the rest of a restored state's epoch.

        Leaves an epoch a previous iterator did not finish (see :class:`Stream`)
        and replaces any live iterator.  Raises :class:`StreamIterationError`
        if another thread is inside the stream meanwhile.
        """
        self._check_open()
        with self._entered("iter(stream)"):
            if self._batch and not self._resumed:
                # The epoch was left mid-way: its rest is not served; the next one starts at its first batch.
                self._feed.start(self._epoch + 1, 0)
                self._epoch, self._batch = self._epoch + 1, 0
            self._resumed = False
            self._generation += 1
            return _EpochIterator(self, self._generation)

    def _next_batch(self, it: _EpochIterator):
        """The next batch for ``it`` (see :meth:`_EpochIterator.__next__`); in the calling thread."""
        if it.done:
            raise StopIteration
        self._check_open()
        if it.generation != self._generation:
            raise StreamIterationError(self._replaced())
        with self._entered("next()"):
            if it.generation != self._generation:  # replaced by the thread that was inside until just now
                raise StreamIterationError(self._replaced())
            interrupt.hold()  # a Ctrl-C in a wait is raised between its polls (see h5stream.concurrency.interrupt)
            try:
                got_epoch, index, x, y = self._feed.next()
            finally:
                interrupt.release()
            if (got_epoch, index) != (self._epoch, self._batch):  # pragma: no cover - internal invariant
                raise RuntimeError(f"feed out of step: got {(got_epoch, index)}, expected {(self._epoch, self._batch)}")
            # Advance before handing it over: state() taken after this batch resumes at the next one.
            self._batch += 1
            if self._batch == self.config.layout.n_batches(self._epoch):
                self._epoch, self._batch = self._epoch + 1, 0
                it.done = True
            return self.config.labels.batch(x, y)

    @contextlib.contextmanager
    def _entered(self, what: str):
        """The block of the one thread allowed inside the stream; raises at once if another thread is there."""
        if not self._busy.acquire(blocking=False):
            raise StreamIterationError(
                f"{self.meta.path}: {what} while another thread is inside this stream; a stream is iterated from "
                "one thread at a time: consume it in one thread (hand batches to others through a queue), or open "
                "one stream per thread (shard=(i, n) splits the rows)"
            )
        try:
            yield
        finally:
            self._busy.release()

    def _replaced(self) -> str:
        return (f"{self.meta.path}: this iterator was replaced by a newer iter(stream) or restore(); a stream is "
                "iterated from one thread at a time, by one iterator: keep using the newest one")

    # -- resume -------------------------------------------------------------------
    def _layout_signature(self) -> dict:
        return {
            "rows": self.meta.rows, "row_start": self.config.rows[0], "row_stop": self.config.rows[1],
            "subset": self.subset,
            "batch_size": self.batch_size, "rows_per_fill": self.plan.rows_per_fill,
            "unit_rows": self.plan.unit_rows, "piece_rows": self.plan.piece_rows,
            "shard_index": self.config.shard[0], "shard_count": self.config.shard[1], "shuffle": int(self.shuffle),
            "drop_remainder": int(self.drop_remainder),
        }

    def state(self) -> dict:
        """Where the stream stands: a small dict of ints (and the subset's name, ``stages``: pairs of ints, and
        ``store``: the store's identity, see :attr:`~h5stream.store.meta.StoreMeta.identity`), JSON as it is;
        ``restore`` / ``open(resume=...)`` continue from it, also with another shard count (docs/design.md,
        "Resume"), and refuse a state of another store, subset or layout."""
        _fork.check_owner(self._owner_pid, self.meta.path)
        store = {} if self.meta.identity is None else {"store": self.meta.identity}
        return {"version": STATE_VERSION, "seed": self.seed, "epoch": self._epoch, "batch": self._batch,
                **self._layout_signature(), **self.config.layout.state_keys(self._epoch, self._batch), **store}

    def restore(self, state: dict) -> None:
        """Continue with exactly the batches that would have come after ``state`` was taken: the next ``iter``
        serves the rest of the state's epoch.  Replaces any live iterator.  A state of another shard count
        (docs/design.md, "Resume") needs a stream opened with ``resume=`` it."""
        self._check_open()
        state = checked_state(state)
        mine = self._layout_signature()
        if state.get("subset") != self.subset:
            raise ConfigError(f"cannot resume: the state is of subset={state.get('subset')!r} but this stream is "
                              f"subset={self.subset!r}; resume each subset from its own state")
        defaults = {"row_start": 0, "row_stop": state.get("rows", self.meta.rows),  # states of unsplit streams
                    "piece_rows": 0}  # and of the one-level order
        state = {**defaults, **state}
        for key in _LAYOUT_KEYS:
            if key in state and int(state[key]) != int(mine[key]):
                fix = ("open the stream with h5stream.open(..., resume=state), which takes the shuffle window from "
                       "the state" if key in ("rows_per_fill", "unit_rows", "piece_rows") else
                       "reopen with the same file, validation_split, batch_size, shard, shuffle and drop_remainder")
                raise ConfigError(f"cannot resume: the state has {key}={state[key]} "
                                  f"but this stream has {key}={mine[key]}; {fix}")
        if state.get("store") is not None and self.meta.identity is not None and state["store"] != self.meta.identity:
            raise ConfigError(f"cannot resume: the state was taken from another store than {self.meta.path} (or "
                              "another version of it, or its parts in another order): it has the same number of "
                              "rows, but not the same rows; resume a stream of the store the state was taken from")
        if int(state.get("seed", self.seed)) != self.seed:
            raise ConfigError(f"cannot resume: the state has seed={state['seed']} but this stream has "
                              f"seed={self.seed}; open the stream with h5stream.open(..., resume=state), which takes "
                              "the state's seed")
        epoch, batch = self.config.layout.position(state)
        with self._entered("restore()"):
            self._epoch, self._batch = epoch, batch
            self._resumed = True
            self._generation += 1
            self._feed.start(epoch, batch)

    # -- lifecycle ----------------------------------------------------------------
    def stats(self) -> dict:
        """Counters for monitoring: queue fill, batches, seconds the consumer waited, bytes read."""
        _fork.check_owner(self._owner_pid, self.meta.path)
        return {**self._feed.stats(), "epoch": self._epoch, "batch": self._batch}

    def _check_open(self) -> None:
        _fork.check_owner(self._owner_pid, self.meta.path)
        if self._closed:
            raise StreamClosedError(f"{self.meta.path}: the stream is closed; open it again with h5stream.open(...)")

    def close(self) -> None:
        """Stop the reader (and workers) and free the buffers.  Idempotent.

        A Ctrl-C arriving meanwhile is raised once everything is released (a
        fraction of a second), not in the middle of it (see :mod:`h5stream.concurrency.interrupt`).  In a process forked
        after ``open``, only this copy is marked closed: what it would stop is the parent's.
        """
        if self._closed:
            return
        self._closed = True
        if not _fork.in_owner(self._owner_pid):
            return
        interrupt.hold()
        try:
            self._finalizer()
        finally:
            interrupt.release()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (every ``next()`` then raises :class:`~h5stream.StreamClosedError`)."""
        return self._closed

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        subset = f" subset={self.subset!r}" if self.subset else ""
        name = hide_passwords(str(self.meta.path))
        return (f"<h5stream.Stream {name!r}{subset} rows={self.rows} batch_size={self.batch_size} "
                f"batches={self._n_batches} epoch={self._epoch} {'closed' if self._closed else 'open'}>")

    # -- framework adapters (imported only when asked for) -------------------------
    def keras(self, device=None, **opts):
        """An object Keras 3 ``model.fit`` takes directly (one epoch per pass); with ``device`` (Keras' torch
        backend), torch tensors already there, converted as ``opts`` say: ``dtype``, ``layout``, ``mean``,
        ``std``, ``batches_ahead`` (see :func:`h5stream.adapters.keras.as_keras` for each, and its errors)."""
        from h5stream.adapters.keras import as_keras

        return as_keras(self, device=device, **opts)

    def tf_dataset(self):
        """A ``tf.data.Dataset`` of this stream's batches, prefetching."""
        from h5stream.adapters.tf import as_tf_dataset

        return as_tf_dataset(self)

    def torch(self, device=None, **opts):
        """A ``torch.utils.data.IterableDataset`` yielding tensors (wrap it as ``DataLoader(ds, batch_size=None)``);
        with ``device``, already there, converted as ``opts`` say: ``dtype``, ``layout``, ``mean``, ``std``,
        ``batches_ahead`` (see :func:`h5stream.adapters.torch.as_torch` for each, and its errors)."""
        from h5stream.adapters.torch import as_torch

        return as_torch(self, device=device, **opts)


class _EpochIterator:
    """What ``iter(stream)`` returns: the batches of one epoch, pulled from the stream by ``next()``.

    Holds the stream (a ``for x in h5stream.open(...)`` keeps it open).  Not
    tied to a thread: any thread may call ``next()``, one at a time.
    """

    __slots__ = ("_stream", "generation", "done")

    def __init__(self, stream: Stream, generation: int):
        self._stream = stream
        self.generation = generation
        self.done = False  # the epoch's last batch was served: StopIteration from now on

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self):
        """``(images, labels)`` (``images`` alone with ``label_mode=None``); StopIteration after the epoch's
        last batch; :class:`StreamClosedError` after ``close()``, :class:`StreamIterationError` if replaced or
        if another thread is inside the stream."""
        return self._stream._next_batch(self)
