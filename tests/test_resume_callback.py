"""ResumeCallback: stop mid-epoch, then a new stream and model continue with exactly the batches that were next."""

from __future__ import annotations

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import h5stream  # noqa: E402
from h5stream.keras import ResumeCallback  # noqa: E402
from h5stream.store.writer import write_arrays  # noqa: E402

try:
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
except RuntimeError:
    pass

ROWS, BATCH, BUDGET, EPOCHS, STOP_AT = 90, 16, "32MiB", 3, 9  # 6 batches/epoch: stop in epoch 1 at batch 3


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("resume") / "rows.h5")
    ids = np.arange(ROWS)
    images = np.broadcast_to((ids % 251).astype(np.uint8)[:, None, None, None], (ROWS, 4, 4, 1))
    write_arrays(path, images, ids.astype(np.int64), block_rows=8, storage_order="sorted")
    return path


class Recorder(keras.Model):
    """Records the labels of every batch it trains on (eager train_step)."""

    def __init__(self, **kwargs):
        inputs = keras.Input((4, 4, 1))
        h = keras.layers.Flatten()(keras.layers.Rescaling(1 / 255)(inputs))
        super().__init__(inputs=inputs, outputs=keras.layers.Dense(ROWS, activation="softmax")(h), **kwargs)
        self.seen = []

    def train_step(self, data):
        self.seen.append(np.asarray(data[1]))
        return super().train_step(data)


def make_model():
    model = Recorder()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", run_eagerly=True)
    return model


class StopAt(keras.callbacks.Callback):
    def __init__(self, total):
        super().__init__()
        self.total, self.done = total, 0

    def on_train_batch_end(self, batch, logs=None):
        self.done += 1
        if self.done == self.total:
            self.model.stop_training = True


def open_train(store):
    return h5stream.open(store, batch_size=BATCH, memory_budget=BUDGET, seed=11)


def test_resume_mid_epoch_continues_with_the_next_batches(store, tmp_path):
    ckpt = tmp_path / "ckpt"
    with open_train(store) as ref_stream:
        reference = make_model()
        reference.fit(ref_stream.keras(), epochs=EPOCHS, verbose=0)
        n = len(ref_stream)
    assert len(reference.seen) == EPOCHS * n

    with open_train(store) as first:
        model = make_model()
        model.fit(first.keras(), epochs=EPOCHS, verbose=0,
                  callbacks=[ResumeCallback(ckpt, first, save_every=1), StopAt(STOP_AT)])
        saved_weights = [w.copy() for w in model.get_weights()]
    assert len(model.seen) == STOP_AT
    record = json.loads((ckpt / "h5stream_resume.json").read_text())
    assert record["batches_done"] == STOP_AT
    assert sorted(os.listdir(ckpt)) == ["h5stream_resume.json", f"weights-{STOP_AT}.weights.h5"]

    with open_train(store) as second:  # a fresh stream and model, as after a restart
        resumed = make_model()
        callback = ResumeCallback(ckpt, second)
        assert callback.initial_epoch == STOP_AT // n

        class CheckRestored(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                for a, b in zip(self.model.get_weights(), saved_weights):
                    np.testing.assert_array_equal(a, b)
                assert int(self.model.optimizer.iterations.numpy()) == STOP_AT  # optimizer state came back

        history = resumed.fit(second.keras(), epochs=EPOCHS, verbose=0, callbacks=[callback, CheckRestored()])

    combined = model.seen + resumed.seen
    assert len(combined) == len(reference.seen)
    for got, want in zip(combined, reference.seen):
        np.testing.assert_array_equal(got, want)
    assert len(history.epoch) == EPOCHS - STOP_AT // n
    assert history.epoch[0] == STOP_AT // n


def test_fresh_directory_starts_at_zero_and_saves_each_epoch(store, tmp_path):
    with open_train(store) as s:
        callback = ResumeCallback(tmp_path / "new", s)
        assert callback.initial_epoch == 0 and callback.saved is None
        make_model().fit(s.keras(), epochs=1, verbose=0, callbacks=[callback])
        record = json.loads((tmp_path / "new" / "h5stream_resume.json").read_text())
        assert record["batches_done"] == len(s)
        assert (record["stream_state"]["epoch"], record["stream_state"]["batch"]) == (1, 0)


def test_saving_never_writes_through_a_link_planted_in_the_directory(store, tmp_path):
    """Whoever can write the checkpoint folder may plant links at the names the callback writes: the files they
    point to stay as they were, and the checkpoint is saved all the same."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    victims = {}
    with open_train(store) as s:
        n = len(s)
        for name in ("h5stream_resume.json.tmp", f"weights-{n}.weights.h5"):
            victim = tmp_path / f"victim-{len(victims)}"
            victim.write_bytes(b"precious")
            os.symlink(victim, ckpt / name)
            victims[victim] = b"precious"
        callback = ResumeCallback(ckpt, s)
        make_model().fit(s.keras(), epochs=1, verbose=0, callbacks=[callback])
    assert {v: v.read_bytes() for v in victims} == victims
    record = json.loads((ckpt / "h5stream_resume.json").read_text())
    assert record["batches_done"] == n and not (ckpt / "h5stream_resume.json").is_symlink()
    assert (ckpt / record["weights"]).is_file() and not (ckpt / record["weights"]).is_symlink()
    assert not [p for p in os.listdir(ckpt) if p.startswith(".h5stream-")]


@pytest.mark.parametrize("content", [b"precious", b"\xff\xfe", b"[1, 2]", b'{"batches_done": 3}'])
def test_a_resume_file_that_is_not_a_record_is_one_line_naming_it(store, tmp_path, content):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "h5stream_resume.json").write_bytes(content)
    with open_train(store) as s, pytest.raises(h5stream.ConfigError) as info:
        ResumeCallback(ckpt, s)
    msg = str(info.value)
    assert msg.startswith(str(ckpt / "h5stream_resume.json")) and "start afresh" in msg and "\n" not in msg


def test_a_fit_with_epochs_shorter_than_the_stream_is_refused(store, tmp_path):
    """``steps_per_epoch`` below the stream's length cuts its passes into several Keras epochs; the callback's
    record counts a Keras epoch as one pass, so it refuses before training rather than saving wrong positions."""
    with open_train(store) as train:
        resume = ResumeCallback(tmp_path / "ckpt", train)
        with pytest.raises(h5stream.ConfigError, match=r"stream's 6 batches, and this fit runs 2 steps an epoch"):
            make_model().fit(train.keras(), epochs=2, steps_per_epoch=2, verbose=0, callbacks=[resume])
        assert not (tmp_path / "ckpt").exists()


def test_a_position_only_record_names_no_weights_and_a_weights_resume_of_it_is_one_line(store, tmp_path):
    """``keep_weights=False`` saves the stream's position alone: its record names no weights file (it named one it
    never wrote), it resumes with ``keep_weights=False``, and a resume that wants weights from it, or from a record
    whose weights file is gone, is one line when training begins, before any batch is taken."""
    ckpt = tmp_path / "ckpt"
    with open_train(store) as s:
        make_model().fit(s.keras(), epochs=1, verbose=0, callbacks=[ResumeCallback(ckpt, s, keep_weights=False)])
        n = len(s)
    record = json.loads((ckpt / "h5stream_resume.json").read_text())
    assert record["weights"] is None and record["batches_done"] == n and os.listdir(ckpt) == ["h5stream_resume.json"]
    with open_train(store) as s:
        model = make_model()
        model.fit(s.keras(), epochs=2, verbose=0, callbacks=[ResumeCallback(ckpt, s, keep_weights=False)])
        assert len(model.seen) == n  # the second epoch only: the position resumed without weights
    with open_train(store) as s:
        model = make_model()
        with pytest.raises(h5stream.ConfigError, match="keep_weights=False: it holds the stream's position but no "
                                                       "weights") as info:
            model.fit(s.keras(), epochs=3, verbose=0, callbacks=[ResumeCallback(ckpt, s)])
        assert "\n" not in str(info.value) and model.seen == []
    # a record with weights whose file is gone
    full = tmp_path / "full"
    with open_train(store) as s:
        make_model().fit(s.keras(), epochs=1, verbose=0, callbacks=[ResumeCallback(full, s)])
    name = json.loads((full / "h5stream_resume.json").read_text())["weights"]
    os.remove(full / name)
    with open_train(store) as s:
        model = make_model()
        with pytest.raises(h5stream.ConfigError, match=f"names the weights {name}, which are not in"):
            model.fit(s.keras(), epochs=2, verbose=0, callbacks=[ResumeCallback(full, s)])
        assert model.seen == []
