"""Keras / tf.data / torch adapters: real model.fit on a tiny model, epochs counted, validation, exact order."""

from __future__ import annotations

import os
import re
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import h5stream  # noqa: E402
from h5stream.errors import ConfigError  # noqa: E402
from h5stream.store.writer import write_arrays  # noqa: E402

try:  # few threads: the box is shared; raises if another test already started TF
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
except RuntimeError:
    pass

ROWS, BATCH, BUDGET = 100, 16, "32MiB"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """100 rows of 4x4x1, label = row id, class-sorted, 8-row blocks."""
    path = str(tmp_path_factory.mktemp("keras") / "rows.h5")
    ids = np.arange(ROWS)
    images = np.broadcast_to((ids % 251).astype(np.uint8)[:, None, None, None], (ROWS, 4, 4, 1))
    write_arrays(path, images, ids.astype(np.int64), block_rows=8, storage_order="sorted")
    return path


@pytest.fixture(scope="module")
def class_store(tmp_path_factory):
    """120 rows of 4x4x1 in shuffled storage order, 3 classes; the class is legible in the pixels."""
    path = str(tmp_path_factory.mktemp("keras") / "classes.h5")
    labels = np.random.default_rng(0).integers(0, 3, 120)
    images = np.broadcast_to((40 + 80 * labels).astype(np.uint8)[:, None, None, None], (120, 4, 4, 1))
    write_arrays(path, images, labels.astype(np.int64), block_rows=8, storage_order="shuffled",
                 class_names=["ant", "bee", "cat"])
    return path


def tiny_model():
    model = keras.Sequential([
        keras.Input((4, 4, 1)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
        keras.layers.Dense(ROWS, activation="softmax"),
    ])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


class CountBatches(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.per_epoch = []

    def on_epoch_begin(self, epoch, logs=None):
        self.per_epoch.append(0)

    def on_train_batch_end(self, batch, logs=None):
        self.per_epoch[-1] += 1


def _labels(batches):
    return np.concatenate([np.asarray(y) for _, y in batches])


@pytest.mark.parametrize("adapter", ["keras", "tf_dataset"])
def test_fit_runs_whole_epochs_with_validation_and_no_warning(store, adapter):
    train = h5stream.open(store, batch_size=BATCH, memory_budget=BUDGET, seed=3)
    val = h5stream.open(store, batch_size=BATCH, memory_budget=BUDGET, shuffle=False)
    with train, val:
        counter = CountBatches()
        from h5stream.keras import StallMonitor

        stall = StallMonitor(train, verbose=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = tiny_model().fit(
                getattr(train, adapter)(), validation_data=getattr(val, adapter)(), epochs=3, verbose=0,
                callbacks=[counter, stall], class_weight={c: 1.0 + (c % 2) for c in range(ROWS)},
            )
        messages = [str(w.message) for w in caught]
        assert not [m for m in messages if "ran out of data" in m], messages
        assert counter.per_epoch == [len(train)] * 3
        assert len(history.history["val_loss"]) == 3
        # Exactly three passes each: nothing read ahead into a fourth epoch and then lost.
        assert (train.state()["epoch"], train.state()["batch"]) == (3, 0)
        assert (val.state()["epoch"], val.state()["batch"]) == (3, 0)
        assert [r["steps"] for r in stall.epochs] == [len(train) - 1] + [len(train)] * 2  # first step: warm-up
        assert all(0.0 <= r["data_wait_fraction"] <= 1.0 for r in stall.epochs)
        assert len(history.history["data_wait_fraction"]) == 3


def test_stall_monitor_times_each_batch_at_its_place_in_the_pass_with_short_keras_epochs(store):
    """``steps_per_epoch=3`` of a 7-batch stream: Keras epochs of 3, 3, 1, 3 batches cut the stream's passes.
    The monitor asks the pass for the hand-over time of each batch at its place in the pass (the first step of
    fit is not timed), not at its place in the Keras epoch, which named batches handed over long before."""
    from h5stream.keras import StallMonitor

    with h5stream.open(store, batch_size=BATCH, memory_budget=BUDGET, seed=4) as s:
        stall = StallMonitor(s, verbose=False)
        passes, asked = stall._passes, []
        real_record = passes.record

        def record(consumed):
            asked.append(consumed)
            return real_record(consumed)

        passes.record = record  # the real pass logic, its calls logged
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Keras' own "ran out of data" at the cut
            tiny_model().fit(s.keras(), epochs=4, steps_per_epoch=3, verbose=0, callbacks=[stall])
        assert asked == [2, 3, 4, 5, 6, 7, 1, 2, 3]
        assert [r["steps"] for r in stall.epochs] == [2, 3, 1, 3]
        assert s.state()["epoch"] == 1  # the 10 batches ran into the stream's second epoch, none replayed


def test_pydataset_serves_the_stream_order_even_after_keras_peeks(store):
    with h5stream.open(store, batch_size=BATCH, memory_budget=BUDGET, seed=5) as s:
        expected = np.concatenate([s.epoch_order(0), s.epoch_order(1)])
        ds = s.keras()
        assert len(ds) == len(s)
        # Keras (TF backend) reads ds[0], ds[1] to learn shapes before the first epoch: not consumed.
        peeked = [ds[0], ds[1]]
        got = []
        for _ in range(2):
            ds.on_epoch_begin()
            got += [ds[i] for i in np.random.default_rng(0).permutation(len(ds))]  # fit(shuffle=True) order
            ds.on_epoch_end()
        np.testing.assert_array_equal(_labels(got), expected)
        np.testing.assert_array_equal(_labels(peeked), expected[: 2 * BATCH])


def test_a_loop_over_the_pydataset_is_one_pass_and_keeps_no_batch(store):
    """``for x, y in stream.keras()`` (a loop of the user's, not Keras'): one epoch per loop, in the stream's
    order, and a batch the loop let go of is freed -- not kept as a peek for a later pass (which held every
    batch of every loop in memory, outside the budget)."""
    import gc
    import weakref

    with h5stream.open(store, batch_size=BATCH, memory_budget=BUDGET, seed=9) as s:
        ds = s.keras()
        for epoch in range(2):
            labels, alive = [], []
            for x, y in ds:
                labels.append(np.asarray(y).copy())
                alive.append(weakref.ref(x))
            del x, y
            gc.collect()
            np.testing.assert_array_equal(np.concatenate(labels), s.epoch_order(epoch))
            assert [r for r in alive if r() is not None] == []
        assert (s.state()["epoch"], s.state()["batch"]) == (2, 0)
        history = tiny_model().fit(ds, epochs=1, verbose=0)  # and fit goes on with the next epoch
        assert len(history.history["loss"]) == 1 and s.state()["epoch"] == 3


def test_tf_dataset_signature_and_abandoned_iteration_is_replayed(store):
    with h5stream.open(store, batch_size=BATCH, memory_budget=BUDGET, seed=7) as s:
        ds = s.tf_dataset()
        x_spec, y_spec = ds.element_spec
        assert x_spec.shape.as_list() == [None, 4, 4, 1] and x_spec.dtype == tf.uint8
        assert y_spec.shape.as_list() == [None] and y_spec.dtype == tf.int64
        assert int(ds.cardinality()) == len(s)
        for _ in ds.take(2):  # an iteration stopped early (as a distribution strategy's build step does)
            pass
        first = _labels((x.numpy(), y.numpy()) for x, y in ds)
        second = _labels((x.numpy(), y.numpy()) for x, y in ds)
        np.testing.assert_array_equal(first, s.epoch_order(0))
        np.testing.assert_array_equal(second, s.epoch_order(1))
    with h5stream.open(store, batch_size=BATCH, memory_budget=BUDGET, drop_remainder=True) as s:
        x_spec, y_spec = s.tf_dataset().element_spec
        assert x_spec.shape[0] == BATCH and y_spec.shape[0] == BATCH


def test_two_iterations_of_one_tf_dataset_at_once_raise_instead_of_ending_short(store):
    """``Dataset.zip((ds, ds))`` iterates one stream twice at once: the older iteration, replaced by the newer
    pass, ended short (TensorFlow then raised its own cardinality error) or, without the cardinality, would give a
    short epoch; it raises StreamIterationError, by name, and the stream goes on with whole epochs after it."""
    with h5stream.open(store, batch_size=BATCH, memory_budget=BUDGET, seed=7) as s:
        ds = s.tf_dataset()
        with pytest.raises(tf.errors.OpError, match="StreamIterationError: .*this iteration of the tf.data.Dataset "
                                                    "was replaced after .* batches by a newer pass") as info:
            for _ in tf.data.Dataset.zip((ds, ds)):
                pass
        assert "open a second stream" in str(info.value)
        whole = _labels((x.numpy(), y.numpy()) for x, y in ds)
        assert len(whole) == s.rows  # a whole epoch, every row once


@pytest.mark.parametrize("prefetch", [1.5, "2", "two", -1, True])
def test_a_prefetch_that_is_not_a_whole_number_of_batches_is_one_config_error(store, prefetch):
    """``prefetch=1.5`` was taken as 1 and ``"2"`` as 2 quietly, ``"two"`` was int()'s own ValueError;
    ``tf.data.AUTOTUNE`` (-1) is refused saying why.  The same check in ``distributed_dataset``."""
    from h5stream.adapters.distribute import distributed_dataset
    from h5stream.adapters.tf import as_tf_dataset

    with h5stream.open(store, batch_size=BATCH, memory_budget=BUDGET) as s:
        with pytest.raises(ConfigError, match=r"prefetch must be an integer >= 0 \(batches\), got " + re.escape(
                repr(prefetch)) + ("(: tf.data.AUTOTUNE)" if prefetch == -1 else "$")):
            as_tf_dataset(s, prefetch=prefetch)
    with pytest.raises(ConfigError, match="prefetch must be an integer >= 0"):
        distributed_dataset(store, tf.distribute.get_strategy(), BATCH, prefetch=prefetch)


def test_balanced_class_weight():
    from h5stream.keras import balanced_class_weight

    w = balanced_class_weight([0, 0, 0, 1], n_classes=3)
    assert w[0] == pytest.approx(4 / 9) and w[1] == pytest.approx(4 / 3) and w[2] == 0.0


def test_torch_iterable_yields_tensors_in_stream_order(store):
    torch = pytest.importorskip("torch")
    with h5stream.open(store, batch_size=BATCH, memory_budget=BUDGET, seed=9) as s:
        ds = s.torch()
        loader = torch.utils.data.DataLoader(ds, batch_size=None)
        batches = list(loader)
        assert len(batches) == len(s) and all(isinstance(x, torch.Tensor) for x, _ in batches)
        np.testing.assert_array_equal(torch.cat([y for _, y in batches]).numpy(), s.epoch_order(0))


def test_fit_with_categorical_labels_on_a_validation_split(class_store):
    kw = dict(batch_size=BATCH, validation_split=0.25, label_mode="categorical", seed=2)
    with h5stream.open(class_store, subset="training", **kw) as train, \
            h5stream.open(class_store, subset="validation", **kw) as val:
        assert train.class_names == val.class_names == ["ant", "bee", "cat"]
        assert (train.rows, val.rows) == (90, 30) and not val.shuffle
        x_spec, y_spec = val.tf_dataset().element_spec
        assert y_spec.shape.as_list() == [None, 3] and y_spec.dtype == tf.float32
        model = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                                  keras.layers.Dense(3, activation="softmax")])
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss="categorical_crossentropy", metrics=["accuracy"])
        counter = CountBatches()
        history = model.fit(train.keras(), validation_data=val.keras(), epochs=4, verbose=0, callbacks=[counter])
        assert counter.per_epoch == [len(train)] * 4
        assert len(history.history["val_loss"]) == 4 and np.isfinite(history.history["val_loss"]).all()
        assert history.history["loss"][-1] < history.history["loss"][0]  # it learns from one-hot labels
        assert (val.state()["epoch"], val.state()["batch"]) == (4, 0)


def test_torch_dataloader_that_would_batch_again_is_refused(store):
    torch = pytest.importorskip("torch")
    with h5stream.open(store, batch_size=BATCH, memory_budget=BUDGET, seed=9) as s:
        with pytest.raises(ConfigError, match="batch_size=None"):
            next(iter(torch.utils.data.DataLoader(s.torch())))  # torch's default batch_size=1
        batches = list(torch.utils.data.DataLoader(s.torch(), batch_size=None))
        assert len(batches) == len(s) and batches[0][0].shape == (BATCH, 4, 4, 1)
        np.testing.assert_array_equal(torch.cat([y for _, y in batches]).numpy(), s.epoch_order(0))


@pytest.mark.parametrize("kind", ["http", "s3"])
def test_fit_and_tf_data_over_a_url_serve_the_local_files_batches(store, kind, request):
    """The adapters over an ``http://`` (Range) or ``s3://`` (SeaweedFS) store: the same batches as the same file
    read locally, whole epochs in ``model.fit``, nothing read past the last one."""
    pytest.importorskip("obstore")
    if kind == "http":
        server = request.getfixturevalue("range_server")
        os.link(store, server.root / "rows.h5")
        url = server.url + "rows.h5"
    else:
        seaweed = request.getfixturevalue("aws_env")
        seaweed.put("keras/rows.h5", store)
        url = f"s3://{seaweed.bucket}/keras/rows.h5"
    kw = dict(batch_size=BATCH, memory_budget="64MiB", rows_per_fill=40, seed=4)
    with h5stream.open(url, remote={"timeout_s": 10}, **kw) as remote, h5stream.open(store, **kw) as local:
        got = _labels((x.numpy(), y.numpy()) for x, y in remote.tf_dataset())
        np.testing.assert_array_equal(got, local.epoch_order(0))
        np.testing.assert_array_equal(got, _labels(local))
        counter = CountBatches()
        history = tiny_model().fit(remote.keras(), epochs=2, verbose=0, callbacks=[counter])
        assert counter.per_epoch == [len(remote)] * 2 and np.isfinite(history.history["loss"]).all()
        assert (remote.state()["epoch"], remote.state()["batch"]) == (3, 0)
