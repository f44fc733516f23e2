"""Framework adapters: the only modules of h5stream that import keras, tensorflow or torch.

Each adapter takes an open :class:`h5stream.Stream` and uses only its public
API.  They share one :class:`h5stream.adapters._passes.Passes` per stream, so a
stream's batches come out in the same order whichever adapter pulls them.

* :mod:`h5stream.adapters.keras` -- ``as_keras(stream)`` (a ``keras.utils.PyDataset``
  that ``model.fit`` takes directly), ``ResumeCallback``, ``StallMonitor``;
* :mod:`h5stream.adapters.tf` -- ``as_tf_dataset(stream)``;
* :mod:`h5stream.adapters.torch` -- ``as_torch(stream)``;
* :mod:`h5stream.adapters.distribute` -- ``distributed_dataset(path, strategy, global_batch_size)``
  for ``tf.distribute.MultiWorkerMirroredStrategy``.

Importing this package imports no framework; import the submodule you need.
"""
