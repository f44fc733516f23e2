"""The object users iterate: :func:`open` wires order + read (+ augment) together.

``h5stream.open(path, batch_size=32)`` returns a :class:`Stream`.  Each
``iter(stream)`` yields one whole epoch of ``(images, labels)`` numpy batches;
the next ``iter`` is the next epoch, reshuffled.  A reader thread starts at
``open`` and keeps reading ahead (across epoch boundaries) within the memory
budget.  A stream is consumed from one thread at a time, and that is enforced
(see :class:`Stream`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import threading
import warnings
import weakref

import numpy as np

from h5stream import _interrupt as interrupt
from h5stream.budget import StreamPlan, plan_stream
from h5stream.errors import (ConfigError, H5StreamError, ResourceLimitError, StoreFormatError, StreamClosedError,
                             StreamIterationError, descriptor_limit)
from h5stream.feed import InlineFeed, PooledFeed
from h5stream.feeder import ProcessFeed
from h5stream.labels import LabelEncoding, label_encoding
from h5stream.options import StreamOptions
from h5stream.order.epoch import EpochLayout, epoch_layout
from h5stream.order.split import BOTH, subset_rows
from h5stream.read.source import resolve_direct_io
from h5stream.store.access import writer_pids
from h5stream.store.meta import StoreMeta, read_meta

STATE_VERSION = 1
_LAYOUT_KEYS = ("rows", "row_start", "row_stop", "batch_size", "rows_per_fill", "unit_rows", "shard_index",
                "shard_count", "shuffle", "drop_remainder")


def open(path: str | os.PathLike, *args, **kwargs) -> Stream:  # noqa: A001 - mirrors h5py.File / builtins.open
    """Open a store for streaming: ``Stream(path, StreamOptions(...))``.  See :class:`Stream` for what it yields.

    ``batch_size``: rows per batch (the last batches of an epoch may be
    smaller unless ``drop_remainder=True``).

    ``memory_budget`` (bytes, or "512MB" / "1.5GiB") bounds everything the
    stream allocates, worker processes included.  None (default): 256 MiB for
    reading and shuffling (more if one batch needs more) plus what the
    ``workers`` need on top, so any worker count runs, with the same order;
    ``stream.plan.describe()`` states the split.  A budget below the minimum
    raises :class:`~h5stream.BudgetError` naming the budget, worker count or
    batch size that would fit.

    ``shuffle``: reshuffle every epoch (default: True, False for
    ``subset="validation"``); ``seed`` fixes the order (None draws one,
    recorded in ``state()``).

    ``validation_split=f, subset="training" | "validation" | "both"`` (Keras'
    ``image_dataset_from_directory`` convention): the last ``int(f * rows)``
    rows of the store are the validation subset, the rows before them the
    training subset.  The same for every seed, disjoint, together every
    committed row; the store must be in shuffled storage order (see
    :mod:`h5stream.order.split`).  Open one stream per subset with the same
    ``validation_split`` (or both at once, below); the validation stream is unshuffled by default and
    augmented only if given ``augment``.

    ``label_mode``: ``"int"`` (default; labels as stored), ``"categorical"``
    (one-hot float32, ``len(class_names)`` wide) or ``"binary"`` (float32
    ``(n, 1)``, two-class stores) or None (no labels, see below); see
    :mod:`h5stream.labels`.

    ``augment=h5stream.Augment(...)`` transforms every batch, in the consumer's
    thread or in ``workers`` spawned processes.  ``shard=(index, count)``
    streams one of ``count`` disjoint parts (data-parallel training).
    ``featurewise_center`` / ``featurewise_std_normalization`` use the
    per-channel mean and std of the rows trained on, as Keras'
    ``ImageDataGenerator.fit`` over the training data: with
    ``validation_split``, the training subset's, for the validation stream
    too; else every committed row's; all shards together, so every replica
    normalises alike.  ``open`` computes them in one pass over those rows
    (kept in this process's memory for the next stream of the same, unchanged
    file) and the workers get them with the ``Augment``.  Reading never writes
    the store.
    ``resume`` is a dict from :meth:`Stream.state`.  ``timeout_s``: how long
    to wait for a batch before raising :class:`~h5stream.ReaderError`.

    ``path`` may be a URL: ``s3://bucket/key`` (credentials, region and
    endpoint from the usual AWS environment variables and files) or
    ``http(s)://host/path`` (a server that honours ``Range``).  ``remote``
    (an :class:`h5stream.RemoteOptions` or a dict of its fields: ``endpoint``,
    ``region``, ``profile``, ``anonymous``, ``timeout_s``, ``max_in_flight``,
    ``headers``) says how to reach it.  Every guarantee of a local store holds.

    ``direct_io`` (local stores): read the pixels past the page cache
    (``O_DIRECT``).  ``"auto"`` (default) does so for a store larger than the
    memory the page cache could keep of it (``MemAvailable``): such a store is
    read from the disk every epoch anyway, and the page cache would only add a
    kernel copy, read-ahead and reclaim.  ``True`` forces it (a file system
    that refuses ``O_DIRECT`` raises :class:`~h5stream.ConfigError`), ``False``
    never.  ``stream.direct_io`` says which applies; its buffers (4 MiB) come
    on top of the default budget, out of a given one.

    The order of an epoch depends on the seed and on ``rows_per_fill`` (the
    shuffle window, ``stream.plan.rows_per_fill``), which by default is what
    the budget leaves after everything else.  Pass ``rows_per_fill`` to get the
    same batches under any budget that holds it; ``resume`` takes it from the
    state.

    ``read_unit`` (bytes or a string like ``"4MiB"``; default 1/32 of the
    fill and at most 1/1152 of the epoch, between 1 and 4 MiB: a whole chunk
    for a store of a few GB or more under the default budget): the
    contiguous piece rows move between fills in, and so the size of most
    reads (rounded down to a power-of-two part of a chunk, at most a chunk).
    Smaller units make two epochs' orders less alike; larger ones mean fewer,
    larger reads, which an object store serves with far less work per byte.
    It changes the order: a URL and its local file get the same default under
    the same options, so the same batches; ``resume`` takes it from the state.

    ``verify_reads`` (default ``"once"``): check the rows and labels read
    against the store's block checksums (``h5stream verify`` checks the same
    ones), on every read path -- local, ``O_DIRECT``, a URL, worker processes
    reading rows themselves -- and raise :class:`~h5stream.ChecksumError` (a
    :class:`~h5stream.ReaderError`) naming the file and the rows before a batch
    holding a damaged row goes out.  ``"once"`` checks each block the first
    time this stream reads it (reading it whole once more unless a read already
    holds all of it) and labels always: damage in the file is caught in the
    first epoch, at no cost after it.  ``True`` also checks every later read row
    by row (8 bytes a row kept), which catches bytes that change on disk while
    training, at the cost of a hash of every byte read.  A store without
    checksums streams unchecked.  False streams a damaged file as it is.

    ``subset="both"`` (with ``validation_split``) returns the pair
    ``(training, validation)`` of streams, as Keras'
    ``image_dataset_from_directory(subset="both")`` does: both take every
    other option as given (``augment`` and ``workers`` included, each stream
    its own workers, as Keras' ``ImageDataGenerator`` augments its validation
    subset too; open the subsets one by one for an unaugmented validation
    stream); the validation stream is unshuffled unless ``shuffle=True``.
    ``resume`` is refused there: each subset resumes from its own state.

    ``label_mode=None``: the stream yields the images alone (``x``, not
    ``(x, y)``), for ``model.predict`` (every adapter takes it).

    ``feeder=True`` (with ``workers > 0``): the reader thread and the workers'
    bookkeeping run in one more process, the feeder (the workers are its
    children); the training process only takes one small message per batch
    and lends the batch from shared memory, as without it.  Same batches,
    resume, errors and memory budget (which counts the feeder).  See
    :mod:`h5stream.feeder`.
    """
    options = StreamOptions(*args, **kwargs)
    if options.subset != BOTH:
        return Stream(path, options)
    if options.resume is not None:
        raise ConfigError("resume= with subset='both': a state belongs to one subset; open each subset with "
                          "subset='training' / 'validation' and its own resume=")
    training = Stream(path, dataclasses.replace(options, subset="training"))
    try:
        validation = Stream(path, dataclasses.replace(options, subset="validation"))
    except BaseException:
        training.close()
        raise
    return training, validation


open.__signature__ = inspect.Signature(
    [inspect.Parameter("path", inspect.Parameter.POSITIONAL_OR_KEYWORD),
     *inspect.signature(StreamOptions).parameters.values()],
    return_annotation="Stream | tuple[Stream, Stream]",
)


class Stream:
    """An endless, epoch-by-epoch supply of shuffled batches from one store (or one subset of it).

    Made by :func:`open`.  Owns a reader thread (and, with ``workers > 0``, a
    worker pool; with ``feeder=True`` both run in a feeder process it owns).
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
      :class:`~h5stream.StreamClosedError` (a ``for`` loop does not just end).
    """

    def __init__(self, path: str | os.PathLike, options: StreamOptions | None = None):
        options = StreamOptions() if options is None else options
        if not isinstance(options, StreamOptions):
            raise ConfigError(f"options must be an h5stream.options.StreamOptions, got {type(options).__name__}")
        self.options = options
        _refuse_in_a_starting_worker()
        from h5stream.shm import sweep_stale_segments

        sweep_stale_segments()  # what streams and ingests killed with their whole process group left in /dev/shm
        meta = read_meta(path, remote=options.remote)
        if options.verify_reads and meta.checksum_problem is not None:  # rows without a checksum, or no table
            raise StoreFormatError(f"{meta.checksum_problem} (verify_reads=False streams it unchecked)")
        if meta.rows == 0:
            raise ConfigError(f"{meta.path}: the store has no committed rows; ingest images into it first")
        if meta.uncommitted_rows and (meta.remote is not None or not writer_pids(meta.path)):  # no commit in flight
            warnings.warn(f"{meta.path}: rows {meta.rows}-{meta.rows + meta.uncommitted_rows - 1} were written and "
                          "never committed (a writer stopped mid-commit, or committed_rows was lowered); streaming "
                          f"the {meta.rows} committed rows; `h5stream repair {meta.path}` drops the others",
                          UserWarning, stacklevel=3)
        self._shard = options.shard or (0, 1)
        self.subset = options.subset
        self._rows = subset_rows(meta.rows, options.validation_split, options.subset, meta.storage_order, meta.path)
        self._labels: LabelEncoding = label_encoding(meta, options.label_mode)
        resume = options.resume
        seed = options.seed
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little") >> 1
        if resume is not None and "seed" in resume:
            seed = int(resume["seed"])
        self.meta: StoreMeta = meta
        self.batch_size = options.batch_size
        self.shuffle = options.shuffled
        self.seed = int(seed)
        self.drop_remainder = options.drop_remainder
        self.timeout_s = options.timeout_s
        if meta.remote is not None and options.direct_io is True:
            raise ConfigError(f"{meta.path}: direct_io=True is for a local store; leave it at 'auto' for a URL")
        self.direct_io: bool = meta.remote is None and resolve_direct_io(meta.path, options.direct_io)
        self.augment = self._prepare_augment(options.augment)
        self.workers = options.workers
        if self.workers and self.augment is None:
            raise ConfigError("workers > 0 needs augment=h5stream.Augment(...): without a transform there is "
                              "nothing for worker processes to do (reading already runs in its own thread)")
        if self.workers:
            self.augment.ensure_picklable()
            _warn_if_more_workers_than_cores(self.workers)
        rows_per_fill = options.rows_per_fill
        if rows_per_fill is None and resume is not None and "rows_per_fill" in resume:
            rows_per_fill = resume["rows_per_fill"]  # the order being resumed, whatever the workers now
        unit_bytes = options.read_unit
        if unit_bytes is None and resume is not None and "unit_rows" in resume:
            unit_bytes = int(resume["unit_rows"]) * meta.row_bytes  # likewise
        start, stop = self._rows
        from h5stream.read.locate import check_chunks

        chunk_cache = check_chunks(meta)  # one line for a layout that cannot stream; else the cache it needs
        self.plan: StreamPlan = plan_stream(meta, options.memory_budget, self.batch_size, augment=self.augment,
                                            workers=self.workers, rows_per_fill=rows_per_fill,
                                            epoch_rows=stop - start, out_label_row_bytes=self._labels.extra_row_bytes,
                                            direct_io=self.direct_io, unit_bytes=unit_bytes,
                                            verify_reads=options.verify_reads, chunk_cache_bytes=chunk_cache,
                                            feeder=options.feeder)
        # A plain function of the epoch (no reference to self: the reader thread holds it).
        self._layout_fn = layout_function(
            stop, self.plan, self.seed, self._shard, self.shuffle, self.drop_remainder, start_row=start,
        )
        first = self._layout(0)
        self._n_batches = first.n_batches
        if self._n_batches == 0:
            raise ConfigError(
                f"{meta.path}: {stop - start} rows give no full batch of {self.batch_size}"
                + (f" per shard ({self._shard[1]} shards)" if self._shard[1] > 1 else "")
                + " with drop_remainder=True; lower batch_size or set drop_remainder=False"
            )
        self._epoch, self._batch = 0, 0
        self._closed = False
        self._busy = threading.Lock()  # held by the one thread inside next() / iter() / restore(); never waited on
        self._generation = 0  # bumped by iter() and restore(): iterators of an older one are replaced
        self._resumed = False  # restore() set the position: the next iter() continues it instead of leaving it
        self._adapter_passes = None  # the adapters' shared h5stream.adapters._passes.Passes, owned by this stream
        interrupt.install()
        interrupt.hold()  # Ctrl-C while threads and workers start: raised where no lock is half taken
        try:
            if self.workers:
                feed_class = ProcessFeed if options.feeder else PooledFeed
                self._feed = feed_class(meta, self._layout_fn, self.plan, augment=self.augment, seed=self.seed,
                                        timeout_s=self.timeout_s, direct_io=self.direct_io,
                                        verify=options.verify_reads)
            else:
                self._feed = InlineFeed(meta, self._layout_fn, self.plan, augment=self.augment, seed=self.seed,
                                        timeout_s=self.timeout_s, direct_io=self.direct_io,
                                        verify=options.verify_reads)
            # The feed owns the thread, processes and shared memory; it never refers back to this object,
            # so garbage collection of an unclosed stream still reaches this finalizer.
            self._finalizer = weakref.finalize(self, self._feed.close)
            if resume is not None:
                self.restore(resume)
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
                + (f" or lower workers (now {self.workers}; workers=0 opens the fewest)" if self.workers else ""),
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

    # -- what it yields -------------------------------------------------------------
    @property
    def class_names(self) -> list[str] | None:
        """The store's class names (label ``i`` is ``class_names[i]``), or None for regression targets."""
        return list(self.meta.class_names) if self.meta.class_names is not None else None

    @property
    def rows(self) -> int:
        """Rows one epoch covers, over all shards: the store's committed rows, or its subset's."""
        return self._rows[1] - self._rows[0]

    @property
    def image_dtype(self) -> np.dtype:
        """dtype of the yielded images: uint8 as stored, or the augmentation's output dtype."""
        return np.dtype(self.augment.output_dtype()) if self.augment is not None else np.dtype(np.uint8)

    @property
    def label_mode(self) -> str | None:
        """``"int"``, ``"categorical"``, ``"binary"``, or None: batches are images alone."""
        return self._labels.mode

    @property
    def yields_labels(self) -> bool:
        """Whether a batch is ``(images, labels)`` (True) or ``images`` alone (``label_mode=None``)."""
        return self._labels.yields_labels

    @property
    def label_shape(self) -> tuple[int, ...] | None:
        """Shape of one yielded label: ``()`` for class indices, ``(n_classes,)`` one-hot, ``(1,)`` binary;
        None with ``label_mode=None``."""
        return self._labels.shape

    @property
    def label_dtype(self) -> np.dtype | None:
        """dtype of the yielded labels (int64 class indices, float32 otherwise; None with ``label_mode=None``)."""
        return self._labels.dtype

    # -- layout -------------------------------------------------------------------
    def _layout(self, epoch: int) -> EpochLayout:
        return self._layout_fn(epoch)

    def epoch_order(self, epoch: int | None = None) -> np.ndarray:
        """Row ids (int64) in the exact order this stream yields them in ``epoch`` (default: the current one).
        No I/O."""
        return self._layout(self._epoch if epoch is None else int(epoch)).order()

    # -- iteration ----------------------------------------------------------------
    def __len__(self) -> int:
        """Batches per epoch (for this shard)."""
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
            interrupt.hold()  # a Ctrl-C in a wait is raised between its polls (see h5stream._interrupt)
            try:
                got_epoch, index, x, y = self._feed.next()
            finally:
                interrupt.release()
            if (got_epoch, index) != (self._epoch, self._batch):  # pragma: no cover - internal invariant
                raise RuntimeError(f"feed out of step: got {(got_epoch, index)}, expected {(self._epoch, self._batch)}")
            # Advance before handing it over: state() taken after this batch resumes at the next one.
            self._batch += 1
            if self._batch == self._n_batches:
                self._epoch, self._batch = self._epoch + 1, 0
                it.done = True
            return self._labels.batch(x, y)

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
            "rows": self.meta.rows, "row_start": self._rows[0], "row_stop": self._rows[1], "subset": self.subset,
            "batch_size": self.batch_size, "rows_per_fill": self.plan.rows_per_fill,
            "unit_rows": self.plan.unit_rows,
            "shard_index": self._shard[0], "shard_count": self._shard[1], "shuffle": int(self.shuffle),
            "drop_remainder": int(self.drop_remainder),
        }

    def state(self) -> dict:
        """Where the stream stands: a small dict of ints (and the subset's name); ``restore`` /
        ``open(resume=...)`` continue from it, and refuse a state of another subset or layout."""
        return {"version": STATE_VERSION, "seed": self.seed, "epoch": self._epoch, "batch": self._batch,
                **self._layout_signature()}

    def restore(self, state: dict) -> None:
        """Continue with exactly the batches that would have come after ``state`` was taken: the next ``iter``
        serves the rest of the state's epoch.  Replaces any live iterator."""
        self._check_open()
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ConfigError(f"not an h5stream state (expected a dict from Stream.state(), version {STATE_VERSION})")
        mine = self._layout_signature()
        if state.get("subset") != self.subset:
            raise ConfigError(f"cannot resume: the state is of subset={state.get('subset')!r} but this stream is "
                              f"subset={self.subset!r}; resume each subset from its own state")
        defaults = {"row_start": 0, "row_stop": state.get("rows", self.meta.rows)}  # states of unsplit streams
        state = {**defaults, **state}
        for key in _LAYOUT_KEYS:
            if key in state and int(state[key]) != int(mine[key]):
                fix = ("open the stream with h5stream.open(..., resume=state), which takes the shuffle window from "
                       "the state" if key in ("rows_per_fill", "unit_rows") else
                       "reopen with the same file, validation_split, batch_size, shard, shuffle and drop_remainder")
                raise ConfigError(f"cannot resume: the state has {key}={state[key]} "
                                  f"but this stream has {key}={mine[key]}; {fix}")
        if int(state.get("seed", self.seed)) != self.seed:
            raise ConfigError(f"cannot resume: the state has seed={state['seed']} but this stream has seed={self.seed}")
        epoch, batch = int(state["epoch"]), int(state["batch"])
        if epoch < 0 or not 0 <= batch < self._n_batches:
            raise ConfigError(f"cannot resume at epoch={epoch}, batch={batch}: an epoch has {self._n_batches} batches")
        with self._entered("restore()"):
            self._epoch, self._batch = epoch, batch
            self._resumed = True
            self._generation += 1
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
        subset = f" subset={self.subset!r}" if self.subset else ""
        return (f"<h5stream.Stream {self.meta.path!r}{subset} rows={self.rows} batch_size={self.batch_size} "
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

            # Keras fits the statistics on the training data and applies them to both subsets: so the training
            # rows, all shards of them (every replica normalises alike), whichever subset this stream is.
            options = self.options
            training = subset_rows(self.meta.rows, options.validation_split,
                                   "training" if options.validation_split is not None else None,
                                   self.meta.storage_order, self.meta.path)
            mean, std = compute_feature_stats(self.meta.path, rows=training, remote=self.meta.remote)
            augment = augment.with_feature_stats(mean, std)  # workers get them inside the pickled Augment
        return augment

    # -- framework adapters (imported only when asked for) -------------------------
    def keras(self, device=None, **opts):
        """An object Keras 3 ``model.fit`` takes directly (one epoch per pass); with ``device`` (Keras' torch
        backend), torch tensors already there (see :func:`h5stream.adapters.keras.as_keras`)."""
        from h5stream.adapters.keras import as_keras

        return as_keras(self, device=device, **opts)

    def tf_dataset(self):
        """A ``tf.data.Dataset`` of this stream's batches, prefetching."""
        from h5stream.adapters.tf import as_tf_dataset

        return as_tf_dataset(self)

    def torch(self, device=None, **opts):
        """A ``torch.utils.data.IterableDataset`` yielding tensors; with ``device``, already there (see
        :func:`h5stream.adapters.torch.as_torch`)."""
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


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, which containers and ``taskset`` narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on macOS / Windows
        return os.cpu_count() or 1


def _warn_if_more_workers_than_cores(workers: int) -> None:
    """Warn (the stream still opens) when worker processes outnumber the cores: each is one core's work, and the
    extra ones only add memory and contention."""
    cores = usable_cores()
    if workers > cores:
        warnings.warn(f"h5stream.open(workers={workers}) on {cores} usable CPU core{'s' if cores > 1 else ''}: the "
                      f"extra workers only cost memory and context switches; workers={max(1, cores - 1)} leaves a "
                      "core to the training loop", UserWarning, stacklevel=4)


def _refuse_in_a_starting_worker() -> None:
    """Raise :class:`ConfigError` if this process is a spawned worker re-running its parent's script.

    With ``workers > 0`` and an ``Augment`` that refers to a function of the
    training script itself (``preprocessing_function`` defined there), each
    worker must re-run the script's top-level code, as ``__mp_main__``, to find
    that function (spawn's rule; h5stream's workers skip the script otherwise,
    see :mod:`h5stream._spawn`).  A script without the ``__main__`` guard would
    then open the stream again in every worker, and start workers of its own;
    ``multiprocessing`` marks that phase with ``_inheriting``.
    """
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise ConfigError(
            "h5stream.open ran while an augment worker was starting: a worker re-runs the training script's "
            "top-level code to find a function defined in it (the Augment's preprocessing_function); put the "
            "script's code under `if __name__ == \"__main__\":`, or define the function in a module of its own"
        )


def layout_function(rows: int, plan: StreamPlan, seed: int, shard=None, shuffle: bool = True,
                    drop_remainder: bool = False, start_row: int = 0) -> LayoutFunction:
    """``epoch -> EpochLayout`` for a stream of rows ``[start_row, rows)`` under ``plan`` (pure; holds no stream;
    picklable, for a feeder process)."""
    return LayoutFunction(rows, plan.block_rows, plan.rows_per_fill, plan.batch_size, plan.unit_rows, seed,
                          None if shard is None else tuple(shard), bool(shuffle), bool(drop_remainder), start_row)


@dataclasses.dataclass(frozen=True)
class LayoutFunction:
    """:func:`layout_function`'s result: plain values, called with the epoch."""

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

    def __call__(self, epoch: int) -> EpochLayout:
        return epoch_layout(self.rows, self.block_rows, self.rows_per_fill, self.batch_size, self.seed, epoch,
                            shard=self.shard, shuffle=self.shuffle, drop_remainder=self.drop_remainder,
                            unit_rows=self.unit_rows, start_row=self.start_row)
