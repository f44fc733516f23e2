"""Keras 3: ``as_keras(stream)`` for ``model.fit``, and the callbacks ``ResumeCallback`` and ``StallMonitor``.

Why a ``keras.utils.PyDataset`` (and not a generator or a ``tf.data.Dataset``):

* it has a length, so ``fit`` needs no ``steps_per_epoch`` and every epoch is
  exactly ``len(stream)`` steps; a Python generator has none (Keras learns the
  length by running dry, warns "Your input ran out of data", and a generator
  cannot be restarted for the next epoch);
* Keras calls its ``on_epoch_begin`` / ``on_epoch_end``, which mark the passes
  of the shared :class:`~h5stream.adapters._passes.Passes` on the training thread;
* it works on every Keras backend (TensorFlow, JAX, torch) without needing
  tensorflow, takes ``class_weight``, and does not trigger fit's "shuffle=True
  will be ignored" warning that every ``tf.data.Dataset`` does;
* throughput is that of a ``tf.data.Dataset``: on the TensorFlow backend Keras
  wraps it in ``tf.data.Dataset.from_generator(...).prefetch(AUTOTUNE)``, the
  same pipeline :func:`h5stream.adapters.tf.as_tf_dataset` builds.

Its ``__getitem__`` ignores the index and serves the stream's next batch: the
stream's order is the shuffle, and ``fit(shuffle=True)`` (the default) only
permutes the indices Keras asks for.  Keras' own worker threads/processes are
off (``workers=1``); the stream has its reader thread and worker pool.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time

import numpy as np

from h5stream import _deps
from h5stream.adapters._keras_epochs import keras_carries_on
from h5stream.adapters._passes import passes_for
from h5stream.errors import ConfigError

keras = _deps.keras()

STATE_FILE = "h5stream_resume.json"


class StreamBatches(keras.utils.PyDataset):
    """A stream as a ``PyDataset``: ``len`` batches per epoch, each ``(x, y)`` numpy (``x`` alone for a stream
    with ``label_mode=None``, which ``predict`` takes).

    Not for Keras' own multiprocessing (the stream cannot be pickled); use the
    stream's ``workers=`` instead.

    It keeps the stream alive; dropping both frees the stream (its finalizer
    stops the reader thread and workers).  One exception, TensorFlow's: on
    the TensorFlow backend ``fit`` wraps this object in
    ``tf.data.Dataset.from_generator``, whose functions TensorFlow keeps for
    the life of the process, so a stream that went through ``fit`` there is
    freed by ``close()`` (or ``with``), not by dropping it.
    """

    def __init__(self, stream):
        super().__init__(workers=1, use_multiprocessing=False, max_queue_size=2)
        self.stream = stream
        self._passes = passes_for(stream)

    def __len__(self) -> int:
        return self._passes.n

    def __getitem__(self, index):
        batch = self._passes.next_batch()
        if batch is None:
            raise IndexError(f"batch {index}: this epoch already served its {self._passes.n} batches")
        return batch

    def __iter__(self):
        """One pass: the next ``len(self)`` batches, as a ``for`` loop over a ``PyDataset`` gives one epoch.

        Keras never iterates the dataset (it indexes it, inside its epoch hooks); a loop of the user's does.
        Without a pass, every batch would be a peek, kept for the next pass: a loop held each batch it had
        seen in memory, outside the budget, and the next ``fit`` replayed them.  A loop left early is replayed
        by the next pass, as with any adapter.  In the iterating thread."""
        self.on_epoch_begin()
        try:
            for index in range(len(self)):
                yield self[index]
        finally:
            self.on_epoch_end()

    def on_epoch_begin(self):
        """A pass begins, unless Keras carries on with the iterator of the epoch before (``steps_per_epoch`` below
        ``len``: see :mod:`h5stream.adapters._keras_epochs`), which continues the pass under way."""
        if not keras_carries_on():
            self._passes.begin_pass()

    def on_epoch_end(self):
        """The pass ends (rewound for the next one to replay if incomplete), unless Keras carries on with it."""
        if not keras_carries_on():
            self._passes.end_pass()


class DeviceBatches(StreamBatches):
    """On Keras' torch backend: each batch as torch tensors already on a device, uploaded ahead.

    Keras' torch trainer turns every numpy batch into a tensor with a
    synchronous ``torch.as_tensor(x, device=...)`` in the training thread,
    and passes a tensor already on its device through untouched.  So this
    dataset hands it the batches of :mod:`h5stream.adapters.torch_device`:
    uploaded ahead from page-locked memory by ``__getitem__`` itself, one pass
    per Keras epoch, converted on the device (``dtype``, ``layout``, ``mean`` /
    ``std``).  A batch Keras asks for outside an epoch (a peek) is converted in
    the asking thread and kept for the epoch, as :class:`StreamBatches` does.

    Threads: ``__getitem__`` and the epoch hooks run in Keras' training thread
    (``workers=1`` without multiprocessing: Keras runs no enqueuer); a pass's
    uploads run from ``on_epoch_begin`` to ``on_epoch_end``.  Owns the
    page-locked registrations; ``close()`` (idempotent) or dropping the object
    releases them, and the stream stays open.
    """

    def __init__(self, stream, opts):
        super().__init__(stream)
        import weakref

        from h5stream.concurrency.fork import OwnerOnly
        from h5stream.adapters.torch_device import DeviceState

        self.options = opts
        self._state = DeviceState(opts)
        self._finalizer = weakref.finalize(self, OwnerOnly(self._state.close))  # nothing in a forked child

    def __getitem__(self, index):
        from h5stream.adapters.torch_device import END, hand_over, upload_now

        uploader = self._state.uploader
        if uploader is None:  # outside an epoch: a peek, kept for the next pass by the pass logic
            batch = self._passes.next_batch()
            if batch is None:
                raise IndexError(f"batch {index}: this epoch already served its {self._passes.n} batches")
            return upload_now(batch, self.options)
        item = uploader.get()
        if item is END:
            raise IndexError(f"batch {index}: this epoch already served its {self._passes.n} batches")
        return hand_over(item, self.options)

    def on_epoch_begin(self):
        self._passes.check_process()  # a process forked from the stream's: before the state's lock
        if keras_carries_on() and self._state.uploader is not None:
            return  # the pass under way goes on, uploads and all
        self._state.stop_uploader()
        self._state.start(self._passes, self._passes.begin_pass())

    def on_epoch_end(self):
        if keras_carries_on():
            return
        self._state.stop_uploader()
        self._passes.end_pass()

    def stats(self) -> dict:
        """The uploads' counters (see :meth:`h5stream.adapters.torch_device.DeviceIterable.stats`)."""
        return self._state.snapshot()

    def close(self) -> None:
        """End the epoch's uploads and unregister the page-locked memory.  Idempotent; the stream stays open."""
        self._finalizer()


def as_keras(stream, device=None, **opts) -> StreamBatches:
    """The stream as what ``model.fit`` / ``evaluate`` / ``predict`` take directly: ``model.fit(train.keras())``.

    Args:
        stream: an open :class:`h5stream.Stream`; the dataset uses only its public API and shares its batch
            sequence with every other adapter of it.
        device: None for numpy batches (every Keras backend).  A torch device (``"cuda"``, ``"cuda:1"``,
            ``"cpu"``; Keras' torch backend only) for torch tensors already there, uploaded ahead.
        **opts: with ``device`` only, the options of :func:`h5stream.adapters.torch.as_torch`: ``dtype``,
            ``layout``, ``mean``, ``std``, ``batches_ahead``.

    Returns:
        A ``keras.utils.PyDataset`` of ``len(stream)`` batches per epoch, ``(x, y)`` (``x`` alone for a stream
        opened with ``label_mode=None``): a :class:`StreamBatches`, or with ``device`` a
        :class:`DeviceBatches`, whose ``close()`` lets go of the page-locked registrations (the stream stays
        open).

    Raises:
        ConfigError: an option without ``device``; ``device`` on a backend other than torch; an unknown option
            or a bad value (the message names it and the valid choices).
        MissingDependencyError: Keras (with ``device``, torch too) cannot be imported (an ImportError; the
            message names what to install).
    """
    if device is None:
        if opts:
            raise ConfigError(f"stream.keras({', '.join(f'{k}=...' for k in opts)}) converts on a device: give "
                              "device= too (Keras' torch backend)")
        return StreamBatches(stream)
    backend = keras.backend.backend()
    if backend != "torch":
        why = ("Keras' JAX trainer already puts each batch on the device one step ahead"
               if backend == "jax" else "tf.data already prefetches the batches")
        raise ConfigError(f"stream.keras(device={device!r}) hands Keras torch tensors: it needs Keras' torch "
                          f"backend (KERAS_BACKEND=torch), and this Keras runs on {backend}; {why}: use "
                          "stream.keras()")
    from h5stream.adapters.torch_device import device_options_for

    return DeviceBatches(stream, device_options_for(stream, device, opts, caller="stream.keras"))


def balanced_class_weight(labels, n_classes: int | None = None) -> dict[int, float]:
    """``{class: weight}`` with ``weight = n / (n_classes * count)`` (scikit-learn's "balanced"), for
    ``fit(class_weight=)``.

    ``labels`` is every label of the training store (e.g. ``h5py.File(path)["labels"][:rows]``);
    classes absent from it get weight 0.
    """
    labels = np.asarray(labels).astype(np.int64).ravel()
    if labels.size == 0:
        raise ConfigError("balanced_class_weight: no labels given")
    k = int(n_classes if n_classes is not None else labels.max() + 1)
    counts = np.bincount(labels, minlength=k)
    return {c: (labels.size / (k * counts[c]) if counts[c] else 0.0) for c in range(k)}


def _write_then_rename(path: str, write, *, suffix: str = ".tmp") -> None:
    """``write(tmp)`` into a new file beside ``path``, synced, then renamed over ``path``.

    The temporary file is made by ``mkstemp`` (``O_CREAT | O_EXCL``, a fresh random name): a link planted at a
    name the callback would use is never written through, and the rename replaces a link at ``path`` itself,
    never the file it points to.  A failed write leaves ``path`` as it was and no temporary file."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".h5stream-", suffix=suffix)
    try:
        os.close(fd)
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _atomic_write_json(path: str, obj) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as fh:
            json.dump(obj, fh)

    _write_then_rename(path, write)


def load_resume_state(directory: str | os.PathLike) -> dict | None:
    """The saved record of a :class:`ResumeCallback` directory, or None if there is none."""
    path = os.path.join(os.fspath(directory), STATE_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as fh:
            record = json.loads(fh.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not a record written by h5stream's ResumeCallback ({exc}); remove it and "
                          "the weights beside it to start afresh, or give another directory") from None
    if not isinstance(record, dict) or not {"batches_done", "stream_state", "weights"} <= set(record):
        raise ConfigError(f"{path}: not a record written by h5stream's ResumeCallback (it lacks batches_done, "
                          "stream_state or weights); remove it and the weights beside it to start afresh, or give "
                          "another directory")
    return record


class ResumeCallback(keras.callbacks.Callback):
    """Save the model, optimizer and the training stream's position together; continue mid-epoch after a kill.

    ``ResumeCallback(directory, train)`` -- ``train`` is the stream passed to
    ``fit`` as ``train.keras()`` (or ``train.tf_dataset()``).  If ``directory``
    holds a checkpoint, the stream is moved to the saved position at once
    (before ``fit`` peeks at it) and, when training begins, the weights (with
    the optimizer's state) are loaded and ``fit`` starts at the saved epoch.

    A checkpoint is written every ``save_every`` batches (None: only at epoch
    ends) and at every epoch end: ``weights-<batch>.weights.h5`` first, then
    ``h5stream_resume.json`` naming it (replaced atomically), so a kill at any
    moment leaves a consistent pair.  The saved stream state is the one after
    the last batch the *model* trained on, not the reader's position (which runs
    ahead by the prefetched batches).

    After a mid-epoch resume the batch sequence is the uninterrupted run's, and
    training stops after the same total number of batches; Keras' epochs are
    then shifted against the stream's by the batches the interrupted epoch had
    done (each still ``len(stream)`` batches), because one ``fit`` cannot have a
    short first epoch.

    ``keep_weights=False`` saves and restores the stream's position only (the
    record's ``weights`` is null; the weights are left to another callback);
    such a record resumed with ``keep_weights=True``, or one whose weights file
    is gone, raises :class:`~h5stream.ConfigError` when training begins.  Raises :class:`~h5stream.ConfigError` for a
    ``save_every`` that is not an int >= 1, and for a ``directory`` holding an
    ``h5stream_resume.json`` this callback did not write.
    """

    def __init__(self, directory: str | os.PathLike, stream, save_every: int | None = None, keep_weights: bool = True):
        super().__init__()
        if save_every is not None and (isinstance(save_every, bool) or int(save_every) < 1):
            raise ConfigError(f"ResumeCallback: save_every must be an integer >= 1 or None, got {save_every!r}")
        self.directory = os.fspath(directory)
        self.stream = stream
        self.save_every = None if save_every is None else int(save_every)
        self.keep_weights = bool(keep_weights)
        self._passes = passes_for(stream)
        self._n = self._passes.n
        self.saved = load_resume_state(self.directory)
        # Global batch count since training began (uninterrupted run: epoch j = batches [j*n, (j+1)*n)).
        self.batches_done = int(self.saved["batches_done"]) if self.saved else 0
        if self.saved:
            self._passes.restore(self.saved["stream_state"])
        self._pass_offset = 0  # batches_done at the start of the current Keras epoch
        self._since_save = 0
        self._set_initial_epoch = False

    @property
    def initial_epoch(self) -> int:
        """The Keras epoch training continues in (0 on a fresh start)."""
        return self.batches_done // self._n

    # -- keras hooks ----------------------------------------------------------------
    def on_train_begin(self, logs=None):
        steps = self.params.get("steps") if self.params else None
        if steps is not None and int(steps) != self._n:
            # Its record counts Keras epochs as whole passes of the stream; k-batch epochs would save wrong positions.
            raise ConfigError(f"ResumeCallback needs Keras epochs of the stream's {self._n} batches, and this fit "
                              f"runs {steps} steps an epoch: drop steps_per_epoch= (the stream's length is the "
                              "epoch), or open the stream with the batch_size that gives the epochs you want")
        if self.saved and self.keep_weights:
            if self.saved["weights"] is None:
                raise ConfigError(f"{os.path.join(self.directory, STATE_FILE)} was saved by a ResumeCallback with "
                                  "keep_weights=False: it holds the stream's position but no weights; resume with "
                                  "keep_weights=False and restore the weights from your own checkpoint, or give "
                                  "another directory to start afresh")
            weights = os.path.join(self.directory, self.saved["weights"])
            if not os.path.isfile(weights):
                raise ConfigError(f"{os.path.join(self.directory, STATE_FILE)} names the weights "
                                  f"{self.saved['weights']}, which are not in {self.directory}: restore that file, or "
                                  "remove the record to start afresh")
            opt = getattr(self.model, "optimizer", None)
            if opt is not None and not opt.built:
                opt.build(self.model.trainable_variables)
            self.model.load_weights(weights)
        if self.saved and hasattr(self.model, "_initial_epoch"):
            # What keras.callbacks.BackupAndRestore does: fit reads it after on_train_begin.
            self.model._initial_epoch = self.initial_epoch
            self._set_initial_epoch = True

    def on_epoch_begin(self, epoch, logs=None):
        self._pass_offset = self.batches_done

    def on_train_batch_end(self, batch, logs=None):
        self.batches_done = self._pass_offset + batch + 1
        self._since_save += 1
        if self.save_every is not None and self._since_save >= self.save_every:
            self._save(batch + 1)
        epochs = self.params.get("epochs") if self.params else None
        if epochs is not None and self.batches_done >= int(epochs) * self._n:
            self.model.stop_training = True  # a resumed run ends where the uninterrupted one would

    def on_epoch_end(self, epoch, logs=None):
        consumed = self.batches_done - self._pass_offset
        if consumed > 0:
            self._save(consumed)

    def on_train_end(self, logs=None):
        if self._set_initial_epoch:
            self.model._initial_epoch = None
            self._set_initial_epoch = False

    # -- saving ---------------------------------------------------------------------
    def _save(self, consumed_in_pass: int) -> None:
        self._since_save = 0
        state, _ = self._passes.record(consumed_in_pass)
        os.makedirs(self.directory, exist_ok=True)
        old = self.saved["weights"] if self.saved else None
        name = f"weights-{self.batches_done}.weights.h5" if self.keep_weights else None
        if name is not None:
            _write_then_rename(os.path.join(self.directory, name), self.model.save_weights, suffix=".weights.h5")
        record = {"batches_done": self.batches_done, "batches_per_epoch": self._n, "stream_state": state,
                  "weights": name, "saved_at": time.time()}
        _atomic_write_json(os.path.join(self.directory, STATE_FILE), record)
        self.saved = record
        if old and old != name and os.path.exists(os.path.join(self.directory, old)):
            os.unlink(os.path.join(self.directory, old))


class StallMonitor(keras.callbacks.Callback):
    """Per epoch, the fraction of training-step time the model spent waiting for data.

    ``StallMonitor(train)`` with ``train`` the stream given to ``fit``.  A step
    that starts before its batch has been handed over by the stream waits for
    it: ``wait = max(0, t_batch_ready - t_step_begin)``.  Each epoch adds
    ``data_wait_fraction`` (sum of waits / sum of step times) and
    ``data_wait_s`` to the epoch logs (so History records them), keeps them in
    :attr:`epochs`, and prints one line when ``verbose``.  Near 0: the GPU/CPU
    running the model is the bottleneck; near 1: the input pipeline is (raise
    ``workers``, the memory budget, or use a faster disk).  The first step of
    each ``fit`` is left out: it traces/compiles the model before asking for data.
    """

    def __init__(self, stream, verbose: bool = True):
        super().__init__()
        self._passes = passes_for(stream)
        self.verbose = bool(verbose)
        self.epochs: list[dict] = []
        self._warm = False
        self._batches_done = self._epoch_start = 0
        self._reset()

    def on_train_begin(self, logs=None):
        self._warm = False
        self._batches_done = 0  # since fit began, which began a pass: Keras epochs may cut passes (steps_per_epoch)

    def _reset(self):
        self._wait_s = 0.0
        self._step_s = 0.0
        self._steps = 0
        self._untimed = 0  # the first step of fit, in this epoch
        self._t_begin = None

    def on_epoch_begin(self, epoch, logs=None):
        self._reset()
        self._epoch_start = self._batches_done

    def on_train_batch_begin(self, batch, logs=None):
        self._t_begin = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self._t_begin is None:
            return
        t_end = time.perf_counter()
        self._batches_done = self._epoch_start + batch + 1
        if not self._warm:
            self._warm = True
            self._untimed = 1
            return
        try:
            # The batch's place in the stream's pass: Keras epochs shorter than the stream (steps_per_epoch) cut
            # passes into pieces, and Keras starts a fresh iterator exactly where a pass ends.
            _, t_ready = self._passes.record((self._batches_done - 1) % self._passes.n + 1)
        except ConfigError:
            t_ready = None
        step = t_end - self._t_begin
        wait = 0.0 if t_ready is None else min(step, max(0.0, t_ready - self._t_begin))
        self._wait_s += wait
        self._step_s += step
        self._steps += 1

    def on_epoch_end(self, epoch, logs=None):
        fraction = self._wait_s / self._step_s if self._step_s > 0 else 0.0
        row = {"epoch": int(epoch), "steps": self._steps, "step_s": self._step_s, "data_wait_s": self._wait_s,
               "data_wait_fraction": fraction}
        self.epochs.append(row)
        if logs is not None:
            logs["data_wait_fraction"] = fraction
            logs["data_wait_s"] = self._wait_s
        if self.verbose:
            steps = (f"{self._steps} of {self._steps + self._untimed} steps: the first, which builds the model, "
                     "is not timed" if self._untimed else f"{self._steps} steps")
            print(f"h5stream: epoch {epoch + 1}: {100 * fraction:.1f}% of step time waiting for data "
                  f"({self._wait_s:.2f} s of {self._step_s:.2f} s over {steps})")
