"""A cropped stream trains: model.fit over Augment(output_size=...) batches, the tf.data signature of output_size."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import h5stream  # noqa: E402
from h5stream.store.writer import write_arrays  # noqa: E402

try:  # few threads: the box is shared; raises if another test already started TF
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
except RuntimeError:
    pass

ROWS, BATCH = 96, 16


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """96 rows of 20x28x3 stored, 3 classes legible in the pixels."""
    path = str(tmp_path_factory.mktemp("cropfit") / "rows.h5")
    labels = np.random.default_rng(0).integers(0, 3, ROWS)
    images = np.broadcast_to((40 + 80 * labels).astype(np.uint8)[:, None, None, None], (ROWS, 20, 28, 3))
    write_arrays(path, np.ascontiguousarray(images), labels.astype(np.int64), block_rows=8)
    return path


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("adapter, workers", [("keras", 0), ("tf_dataset", 2)])
def test_fit_on_a_cropped_stream_trains_at_output_size(store, adapter, workers):
    train_aug = h5stream.Augment(output_size=(12, 12), horizontal_flip=True)
    val_aug = h5stream.Augment(output_size=(12, 12), crop="center")
    train = h5stream.open(store, batch_size=BATCH, seed=3, augment=train_aug,
                          workers=workers)
    val = h5stream.open(store, batch_size=BATCH, shuffle=False, augment=val_aug)
    with train, val:
        assert train.image_shape == val.image_shape == (12, 12, 3)
        if adapter == "tf_dataset":
            x_spec, _ = train.tf_dataset().element_spec
            assert x_spec.shape.as_list() == [None, 12, 12, 3] and x_spec.dtype == tf.uint8
        model = keras.Sequential([
            keras.Input((12, 12, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
            keras.layers.Dense(3, activation="softmax"),
        ])
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        history = model.fit(getattr(train, adapter)(), validation_data=getattr(val, adapter)(), epochs=2,
                            verbose=0)
        assert len(history.history["loss"]) == 2 and np.isfinite(history.history["val_loss"]).all()
        assert (train.state()["epoch"], train.state()["batch"]) == (2, 0)
