"""tf.data: ``as_tf_dataset(stream)`` -- a ``tf.data.Dataset`` of the stream's batches.

The element signature is fixed from the stream's public description (no batch
is read to learn it): ``x`` is ``(None, H, W, C)`` of ``stream.image_dtype``
(uint8, or the augmentation's output dtype), ``y`` is ``(None,
*stream.label_shape)`` of ``stream.label_dtype`` (int64 class indices, float32
one-hot / binary labels or regression targets), or there is no ``y`` (the
element is ``x`` alone) for a stream with ``label_mode=None``; the batch dimension is
``batch_size`` instead of None when the stream drops remainders.  The cardinality is ``len(stream)``,
so Keras counts epochs without ``steps_per_epoch``.

Every ``iter(dataset)`` is one pass of the stream's shared
:class:`~h5stream.adapters._passes.Passes`: the next ``len(stream)`` batches; an iteration
abandoned early is replayed by the next one, and one that is asked for more after a newer one began (two at once,
as ``Dataset.zip((ds, ds))``) raises :class:`~h5stream.StreamIterationError` instead of ending short.
Auto-sharding is off because the stream shards itself (``h5stream.open(..., shard=(i, n))``).  The ``prefetch``
batches sit outside the stream's memory budget.

The dataset keeps the stream alive (so do datasets derived from it and their
iterators); once they and the stream are dropped, the stream is garbage-collected
and its finalizer stops its thread and workers.  The generator function itself
refers to the stream only weakly: TensorFlow keeps the functions of every
``from_generator`` dataset made in eager mode for the life of the process (in
the global graph's ``_py_funcs_used_in_graph``), and a strong reference there
would keep the stream, its reader thread and its workers too.
"""

from __future__ import annotations

import numbers
import weakref

from h5stream import _deps
from h5stream.adapters._passes import passes_for, replaced_error
from h5stream.errors import ConfigError, StreamClosedError

tf = _deps.tensorflow()


def element_spec(stream) -> tuple[tf.TensorSpec, tf.TensorSpec] | tf.TensorSpec:
    """``(x_spec, y_spec)`` of the stream's batches, from metadata only; ``x_spec`` alone for a stream with
    ``label_mode=None``."""
    batch = stream.batch_size if stream.drop_remainder else None
    x_spec = tf.TensorSpec((batch, *stream.image_shape), tf.as_dtype(stream.image_dtype), name="images")
    if not stream.yields_labels:
        return x_spec
    y_spec = tf.TensorSpec((batch, *stream.label_shape), tf.as_dtype(stream.label_dtype), name="labels")
    return x_spec, y_spec


def checked_prefetch(prefetch) -> int:
    """``prefetch`` (batches) as an int, or a :class:`ConfigError` naming the value and the fix."""
    if isinstance(prefetch, bool) or not isinstance(prefetch, numbers.Integral) or prefetch < 0:
        # int() would take 1.5 (as 1) or "2" quietly, and raise its own ValueError for "two"
        why = (": tf.data.AUTOTUNE (-1) would size that buffer itself, outside the stream's memory budget"
               if isinstance(prefetch, numbers.Integral) and prefetch == tf.data.AUTOTUNE else "")
        raise ConfigError(f"prefetch must be an integer >= 0 (batches), got {prefetch!r}{why}")
    return int(prefetch)


def as_tf_dataset(stream, prefetch: int = 2) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of ``(x, y)`` batches (``x`` alone with ``label_mode=None``), ``len(stream)`` per
    iteration, prefetching ``prefetch`` batches (an int >= 0; else ConfigError, ``tf.data.AUTOTUNE`` included)."""
    prefetch = checked_prefetch(prefetch)
    passes = passes_for(stream)
    passes_ref = weakref.ref(passes)  # see the module docstring: TensorFlow never frees this function
    del passes

    def live_passes():
        passes = passes_ref()
        if passes is None:  # only reachable through a dataset function kept after its dataset was dropped
            raise StreamClosedError("the h5stream stream behind this tf.data.Dataset was garbage-collected; "
                                    "keep the dataset (or the stream) referenced while it is iterated")
        return passes

    def one_pass():  # no strong reference across a yield: a suspended generator TensorFlow keeps pins nothing
        pass_id, served = live_passes().begin_pass(), 0
        while True:
            passes = live_passes()
            batch = passes.next_batch(pass_id)
            if batch is None:
                if served < passes.n:  # replaced by a newer pass: never a short epoch without a word
                    raise replaced_error(passes.stream.meta.path, "the tf.data.Dataset", served, passes.n)
                return
            del passes
            served += 1
            yield batch

    ds = tf.data.Dataset.from_generator(one_pass, output_signature=element_spec(stream))
    ds = ds.apply(tf.data.experimental.assert_cardinality(len(stream)))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    options.deterministic = True
    ds = ds.with_options(options)
    ds = ds.prefetch(int(prefetch)) if prefetch else ds
    # The strong reference: a dataset holds its input dataset, and an iterator its dataset.
    ds._h5stream_stream = stream
    return ds
