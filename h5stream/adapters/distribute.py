"""``tf.distribute``: one shard of the store per input pipeline, in one line.

``distributed_dataset(path, strategy, global_batch_size, **open_kwargs)`` calls
``strategy.distribute_datasets_from_function``; for each input pipeline (one
per worker under ``MultiWorkerMirroredStrategy``) it opens
``h5stream.open(path, batch_size=per_replica_batch, shard=(input_pipeline_id,
num_input_pipelines), **open_kwargs)`` and serves it with
:func:`h5stream.adapters.tf.as_tf_dataset`.  Shards are disjoint, cover every
row, and yield the same number of batches, so every worker takes the same
number of steps (collective ops need that) and one epoch across all workers
sees every row exactly once.  The same ``seed`` on every worker is required
(the default ``seed=0`` is): the shards of an epoch are cut from one
seed-dependent permutation of the blocks.

Each worker reads only its shard's blocks, so the file can sit on a shared
filesystem or be copied to every node; memory per worker is its own budget.

Training: Keras 3's ``fit`` fails under ``MultiWorkerMirroredStrategy``
(keras-team/keras#20585), so drive Keras 3 with a ``strategy.run`` loop over
``.dataset`` (one pass = one epoch), or use ``tf_keras`` (Keras 2), whose
``fit`` runs a distributed dataset for a given number of steps:
``distributed_dataset(..., repeat=True)`` and
``model.fit(dist.dataset, epochs=E, steps_per_epoch=dist.steps_per_epoch)``.
"""

from __future__ import annotations

import h5stream
from h5stream import _deps
from h5stream.adapters.tf import as_tf_dataset, checked_prefetch
from h5stream.errors import ConfigError

tf = _deps.tensorflow()


class DistributedInput:
    """The distributed dataset for ``model.fit`` and the streams it owns; ``close()`` closes them (idempotent)."""

    def __init__(self):
        self.dataset = None
        self.streams: list = []

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch of each local stream: the same on every worker (shards are cut to equal length)."""
        if not self.streams:
            raise ConfigError("no stream opened yet: the strategy has not built this worker's input pipeline")
        return len(self.streams[0])

    def state(self) -> list[dict]:
        """``state()`` of each local stream (usually one per worker)."""
        return [s.state() for s in self.streams]

    def close(self) -> None:
        for s in self.streams:
            s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def distributed_dataset(path, strategy, global_batch_size: int, *, prefetch: int = 2, x_dtype: str | None = "float32",
                        repeat: bool = False, **open_kwargs) -> DistributedInput:
    """Shard ``path`` over ``strategy``'s input pipelines; ``.dataset`` goes to ``model.fit``.

    ``global_batch_size`` is split evenly over the replicas in sync; the
    per-replica batch is the stream's ``batch_size``.  ``open_kwargs`` go to
    :func:`h5stream.open` (``memory_budget``, ``augment``, ``workers``, ``seed``,
    ``drop_remainder``, ``resume``...), except ``batch_size`` and ``shard``.
    ``x_dtype`` casts the images inside the pipeline (default float32, values
    unchanged): Keras builds a model under a strategy by all-reducing the first
    batch, and collective ops do not take uint8.  None keeps the stream's dtype.
    ``repeat=True`` makes each pipeline endless, epoch after epoch (each pass
    reshuffled), for trainers that count steps: ``tf_keras``' ``fit`` with
    ``steps_per_epoch=out.steps_per_epoch`` then sees exact epochs.
    ``prefetch``: batches each pipeline's ``tf.data`` keeps ready (an int >= 0,
    as :func:`~h5stream.adapters.tf.as_tf_dataset` takes it).

    Raises :class:`~h5stream.ConfigError` for ``batch_size`` or ``shard`` in
    ``open_kwargs``, ``subset="both"``, a ``global_batch_size`` that is not a
    positive multiple of the replicas in sync, or a bad ``prefetch``; and
    whatever :func:`h5stream.open` raises.
    """
    prefetch = checked_prefetch(prefetch)
    for key in ("batch_size", "shard"):
        if key in open_kwargs:
            raise ConfigError(f"distributed_dataset sets {key} itself; pass global_batch_size instead")
    if open_kwargs.get("subset") == "both":
        raise ConfigError("distributed_dataset streams one subset: call it once with subset='training' and once "
                          "with subset='validation'")
    replicas = int(strategy.num_replicas_in_sync)
    if isinstance(global_batch_size, bool) or int(global_batch_size) < 1 or int(global_batch_size) % replicas:
        raise ConfigError(
            f"global_batch_size={global_batch_size!r} must be a positive multiple of the {replicas} replicas in sync"
        )
    out = DistributedInput()

    def dataset_fn(context):
        stream = h5stream.open(
            path, batch_size=context.get_per_replica_batch_size(int(global_batch_size)),
            shard=(context.input_pipeline_id, context.num_input_pipelines), **open_kwargs,
        )
        out.streams.append(stream)
        ds = as_tf_dataset(stream, prefetch=0)
        if x_dtype is not None:
            dtype = tf.as_dtype(x_dtype)
            ds = ds.map((lambda x, y: (tf.cast(x, dtype), y)) if stream.yields_labels else
                        (lambda x: tf.cast(x, dtype)))  # label_mode=None: images alone
        if repeat:
            ds = ds.repeat()
        return ds.prefetch(prefetch) if prefetch else ds

    out.dataset = strategy.distribute_datasets_from_function(dataset_fn)
    return out

