"""What a Keras user expects from the stream side, checked on real stores and real processes.

``subset="both"`` and ``label_mode=None`` as ``image_dataset_from_directory`` has them; what a training script
that starts workers really needs (spawn); and the small surprises: SI units in the plan, more workers than cores,
the preview's file format, a small store's size, the bench plot's queue line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import h5stream  # noqa: E402
from h5stream.errors import ConfigError  # noqa: E402
from h5stream.store.writer import write_arrays  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_leaks")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS, CLASSES, BATCH = 200, 4, 16


def _ids(x):
    """Row id encoded in the first two pixels by ``make_store``."""
    return x[:, 0, 0, 0].astype(np.int64) + 256 * x[:, 0, 0, 1].astype(np.int64)


def make_store(path, rows=ROWS, classes=CLASSES, block_rows=32, shape=(6, 6, 3)):
    images = np.random.default_rng(0).integers(0, 255, (rows, *shape), dtype=np.uint8)
    images[:, 0, 0, 0] = np.arange(rows) % 256
    images[:, 0, 0, 1] = np.arange(rows) // 256
    write_arrays(path, images, np.arange(rows) % classes, block_rows=block_rows, storage_order="shuffled",
                 class_names=[f"c{i}" for i in range(classes)])
    return str(path)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("expect") / "s.h5")


# -- subset="both" ---------------------------------------------------------------------------------------------


def test_subset_both_returns_the_training_and_validation_streams(store):
    kw = dict(batch_size=BATCH, validation_split=0.25, seed=3, label_mode="categorical")
    pair = h5stream.open(store, subset="both", **kw)
    assert isinstance(pair, tuple) and len(pair) == 2
    train, val = pair
    with train, val, h5stream.open(store, subset="training", **kw) as t1, \
            h5stream.open(store, subset="validation", **kw) as v1:
        assert (train.subset, val.subset) == ("training", "validation")
        assert (train.shuffle, val.shuffle) == (True, False)  # Keras: the validation subset is not shuffled
        assert (train.rows, val.rows) == (ROWS - 50, 50)
        for both, alone in ((train, t1), (val, v1)):  # the same streams as opened one by one
            got = [(x, y) for x, y in both]
            want = [(x, y) for x, y in alone]
            assert len(got) == len(want)
            for (xg, yg), (xw, yw) in zip(got, want):
                np.testing.assert_array_equal(xg, xw)
                np.testing.assert_array_equal(yg, yw)
        ids_t = np.concatenate([_ids(x) for x, _ in train])
        ids_v = np.concatenate([_ids(x) for x, _ in val])
        assert not set(ids_t) & set(ids_v) and len(ids_t) + len(ids_v) == ROWS


def _batches(stream, epochs=1):
    return [[x.copy() for x, _ in stream] for _ in range(epochs)]


def test_subset_both_gives_validation_the_centre_crop_of_a_random_resized_crop_and_a_keras_augment_as_given(tmp_path):
    store = make_store(tmp_path / "s16.h5", shape=(16, 16, 3))
    kw = dict(batch_size=BATCH, validation_split=0.25, seed=3)
    torch_like = h5stream.Augment(output_size=12, horizontal_flip=True, rescale=1 / 255)
    centre = h5stream.Augment(output_size=12, crop="center", rescale=1 / 255)
    train, val = h5stream.open(store, subset="both", augment=torch_like, **kw)
    with train, val, h5stream.open(store, subset="training", augment=torch_like, **kw) as t1, \
            h5stream.open(store, subset="validation", augment=centre, **kw) as v1:
        for got, want in ((_batches(train), _batches(t1)), (_batches(val, 2), _batches(v1, 2))):
            assert len(got) == len(want)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(np.concatenate(g), np.concatenate(w))
        epochs = _batches(val, 2)  # no random transform left: every epoch alike
        np.testing.assert_array_equal(np.concatenate(epochs[0]), np.concatenate(epochs[1]))
    keras_like = h5stream.Augment(horizontal_flip=True, rotation_range=10)
    assert keras_like.evaluation() is keras_like and centre.evaluation() is centre
    train, val = h5stream.open(store, subset="both", augment=keras_like, **kw)
    with train, val, h5stream.open(store, subset="validation", augment=keras_like, **kw) as v1:
        np.testing.assert_array_equal(np.concatenate(_batches(val)[0]), np.concatenate(_batches(v1)[0]))


def test_the_evaluation_augment_keeps_the_deterministic_options():
    aug = h5stream.Augment(output_size=(20, 24), scale=(0.5, 1.0), horizontal_flip=True, brightness_range=(0.8, 1.2),
                           rescale=0.5, featurewise_center=True, samplewise_std_normalization=True,
                           dtype="float16").with_feature_stats([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    ev = aug.evaluation()
    assert (ev.output_size, ev.crop, ev.scale, ev.horizontal_flip, ev.brightness_range) == ((20, 24), "center", None,
                                                                                            False, None)
    assert (ev.rescale, ev.featurewise_center, ev.samplewise_std_normalization, ev.dtype) == (0.5, True, True,
                                                                                             np.float16)
    assert (ev.feature_mean, ev.feature_std) == ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0))


def test_subset_both_refuses_resume_and_a_stream_alone(store):
    with pytest.raises(ConfigError, match="its own resume="):
        h5stream.open(store, validation_split=0.25, subset="both", resume={"version": 1})
    with pytest.raises(ConfigError, match="returns \\(training, validation\\)"):
        h5stream.Stream(store, h5stream.streaming.options.StreamOptions(validation_split=0.25, subset="both"))


def test_subset_both_closes_the_training_stream_when_the_validation_one_cannot_open(store):
    """50 validation rows give no full batch of 64: the error comes back, and no reader thread stays behind."""
    import threading

    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(ConfigError, match="no full batch"):
        h5stream.open(store, batch_size=64, drop_remainder=True, validation_split=0.25, subset="both",
                      augment=h5stream.Augment(horizontal_flip=True), workers=1)
    left = [t for t in threading.enumerate() if t.ident not in before and t.name.startswith("h5stream")]
    assert left == []


# -- label_mode=None ---------------------------------------------------------------------------------------------


def test_label_mode_none_yields_the_images_alone(store):
    with h5stream.open(store, batch_size=BATCH, seed=1, label_mode=None) as bare, \
            h5stream.open(store, batch_size=BATCH, seed=1) as labelled:
        assert bare.label_mode is None and bare.yields_labels is False
        assert bare.label_shape is None and bare.label_dtype is None
        for got, (x, _y) in zip(bare, labelled):
            assert isinstance(got, np.ndarray)
            np.testing.assert_array_equal(got, x)


def test_label_mode_none_with_workers_and_a_split(store):
    aug = h5stream.Augment(horizontal_flip=True)
    with h5stream.open(store, batch_size=BATCH, label_mode=None, augment=aug, workers=1, validation_split=0.25,
                       subset="validation") as s:
        xs = list(s)
        assert all(isinstance(x, np.ndarray) for x in xs) and sum(len(x) for x in xs) == 50


def test_keras_predict_takes_a_stream_of_images_alone(store):
    keras = pytest.importorskip("keras")
    with h5stream.open(store, batch_size=BATCH, label_mode=None) as s:
        model = keras.Sequential([keras.Input((6, 6, 3)), keras.layers.Flatten(), keras.layers.Dense(2)])
        out = model.predict(s.keras(), verbose=0)
        assert out.shape == (ROWS, 2)


def test_tf_dataset_of_images_alone(store):
    tf = pytest.importorskip("tensorflow")
    with h5stream.open(store, batch_size=BATCH, label_mode=None) as s:
        ds = s.tf_dataset()
        assert isinstance(ds.element_spec, tf.TensorSpec)
        assert sum(int(x.shape[0]) for x in ds) == ROWS


def test_torch_dataset_of_images_alone(store):
    torch = pytest.importorskip("torch")
    with h5stream.open(store, batch_size=BATCH, label_mode=None) as s:
        batches = list(s.torch())
        assert all(isinstance(x, torch.Tensor) for x in batches)
        assert sum(len(x) for x in batches) == ROWS


# -- what a script with workers > 0 really needs (spawn) -------------------------------------------------------

SCRIPT_HEAD = """\
import os
import subprocess
import sys
import textwrap
import warnings
import sys

import numpy as np

import h5stream

print("script top level ran", flush=True)
"""
SCRIPT_FUNCTION = """\
def invert(image):
    return 255.0 - image
"""
SCRIPT_BODY = """\
augment = h5stream.Augment({augment})
with h5stream.open(sys.argv[1], batch_size=16, shuffle=False, augment=augment, workers=2) as s:
    batches = [x for x, _ in s]
rows, first = sum(len(x) for x in batches), batches[0]
print("rows", rows, "first pixel", float(first[0, 0, 0, 2]), flush=True)
"""


def _run_script(tmp_path, source: str, store: str):
    """Run ``source`` as ``python script.py STORE``; return the process and the processes left with its mark."""
    import uuid

    import psutil

    script = tmp_path / "script.py"
    script.write_text(source, encoding="utf-8")
    mark = uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
               H5STREAM_TEST_MARK=mark)
    proc = subprocess.run([sys.executable, str(script), store], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    left = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("H5STREAM_TEST_MARK") == mark:
                left.append(p)
        except (psutil.Error, OSError):
            continue
    return proc, left


def _body(augment: str, guarded: bool) -> str:
    if not guarded:
        return SCRIPT_BODY.format(augment=augment)
    return 'if __name__ == "__main__":\n' + textwrap.indent(SCRIPT_BODY.format(augment=augment), "    ")


def test_a_script_without_the_main_guard_runs_workers_and_they_never_run_it(tmp_path, store):
    """Workers start without the script (``__main__`` hidden from spawn): no guard needed, top level ran once."""
    proc, left = _run_script(tmp_path, SCRIPT_HEAD + _body("horizontal_flip=True", guarded=False), store)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"rows {ROWS}" in proc.stdout
    assert proc.stdout.count("script top level ran") == 1
    assert left == []


def test_a_script_level_preprocessing_function_works_with_the_guard(tmp_path, store):
    """A function defined in the script reaches the workers; each worker re-runs the script's top level to find it."""
    source = SCRIPT_HEAD + SCRIPT_FUNCTION + _body("preprocessing_function=invert", guarded=True)
    proc, left = _run_script(tmp_path, source, store)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with h5stream.open(store, batch_size=16, shuffle=False) as s:
        x, _ = next(iter(s))
    assert f"rows {ROWS}" in proc.stdout and f"first pixel {255.0 - float(x[0, 0, 0, 2])}" in proc.stdout
    assert proc.stdout.count("script top level ran") == 1 + 2  # the script, then once in each of the 2 workers
    assert left == []


def test_a_script_level_preprocessing_function_without_the_guard_is_refused_with_the_fix(tmp_path, store):
    """Without the guard each worker would open the stream again: h5stream.open refuses there and names the guard;
    the script fails (no hang), and no worker is left behind."""
    source = SCRIPT_HEAD + SCRIPT_FUNCTION + _body("preprocessing_function=invert", guarded=False)
    proc, left = _run_script(tmp_path, source, store)
    assert proc.returncode != 0
    assert "h5stream.open ran while an augment worker was starting" in proc.stderr
    assert 'put the script\'s code under `if __name__ == "__main__":`' in proc.stderr
    assert "WorkerError" in proc.stderr and "died during start-up" in proc.stderr
    assert left == []


# -- small surprises ---------------------------------------------------------------------------------------------


def test_the_plan_says_an_si_budget_is_powers_of_1000(store):
    with h5stream.open(store, batch_size=BATCH, memory_budget="1GB") as s:
        text = s.plan.describe()
    assert "1 GB = 10^9 bytes = 953.7 MiB" in text and "MB/GB are powers of 1000" in text
    with h5stream.open(store, batch_size=BATCH, memory_budget="64MiB") as s:
        assert "powers of 1000" not in s.plan.describe()


def test_more_workers_than_usable_cores_warns_with_the_core_count(store, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    aug = h5stream.Augment(horizontal_flip=True)
    with pytest.warns(UserWarning, match=r"workers=2\) on 1 usable CPU core: .*workers=1") as record:
        with h5stream.open(store, batch_size=BATCH, augment=aug, workers=2) as s:
            assert sum(len(x) for x, _ in s) == ROWS
    assert record[0].filename == __file__  # points at the caller's open()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with h5stream.open(store, batch_size=BATCH, augment=aug, workers=1):
            pass


@pytest.mark.parametrize(("name", "format_"), [("grid.jpg", "JPEG"), ("grid.JPEG", "JPEG"), ("grid.png", "PNG"),
                                               ("grid.webp", "WEBP")])
def test_preview_writes_the_format_its_file_name_asks_for(h5cli, store, tmp_path, name, format_):
    from PIL import Image

    out = tmp_path / name
    code, _out, err = h5cli("preview", store, "--out", str(out), "--rows", "2", "--cols", "2")
    assert code == 0, err
    with Image.open(out) as image:
        assert image.format == format_


def test_preview_refuses_a_name_without_a_known_image_format(h5cli, store, tmp_path):
    code, _out, err = h5cli("preview", store, "--out", str(tmp_path / "grid.xyz"), "--rows", "2", "--cols", "2")
    assert code != 0 and "h5stream: error: --out" in err and "name the file .png" in err
    assert not (tmp_path / "grid.xyz").exists()


def test_info_says_why_a_small_store_is_many_times_its_pixels(h5cli, tmp_path):
    import json

    path = make_store(tmp_path / "small.h5", rows=150, block_rows=1024, shape=(32, 32, 3))
    code, out, err = h5cli("info", path, "--json")
    assert code == 0, err
    info = json.loads(out)
    space = info["space"]
    assert space["pixel_bytes"] == 150 * 32 * 32 * 3
    assert space["chunk_bytes"] >= 1024 * 32 * 32 * 3  # one whole block of pixels is allocated
    assert space["chunk_bytes"] + space["metadata_bytes"] == info["file_bytes"] == os.path.getsize(path)
    code, out, err = h5cli("info", path)
    assert "450.0 KiB, in" in out and "HDF5 allocates a chunk whole: 1024 image rows" in out
    assert "HDF5 metadata" in out


def test_bench_plot_says_what_the_queue_holds_with_workers():
    from h5stream.commands.bench import queue_fill_label

    assert "handed to the workers" in queue_fill_label(2) and "workers set the pace" in queue_fill_label(2)
    assert "ready for the consumer" in queue_fill_label(0)


def test_distributed_dataset_of_images_alone(store):
    tf = pytest.importorskip("tensorflow")
    from h5stream.adapters.distribute import distributed_dataset

    strategy = tf.distribute.get_strategy()
    with distributed_dataset(store, strategy, BATCH, label_mode=None) as out:
        rows = sum(int(x.shape[0]) for x in out.dataset)
    assert rows == ROWS
    with pytest.raises(ConfigError, match="streams one subset"):
        distributed_dataset(store, strategy, BATCH, validation_split=0.25, subset="both")
