"""Keras on the torch backend with ``stream.keras(device=...)``: torch tensors already on the device.

Keras' torch backend is chosen at ``import keras``, so the fits run in a subprocess with
``KERAS_BACKEND=torch``.  On CPU the uploads ahead, the passes and the peek all run; the CUDA copy itself is
the torch device adapter's, tested in ``tests/test_torch.py`` where CUDA exists.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import h5stream
from h5stream.errors import ConfigError
from h5stream.store.writer import write_arrays

pytestmark = [
    pytest.mark.usefixtures("no_leaks"),
    pytest.mark.skipif(importlib.util.find_spec("keras") is None or importlib.util.find_spec("torch") is None,
                       reason="needs keras and torch"),
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent('''
    import json, sys, threading
    import numpy as np
    import keras, torch
    import h5stream

    assert keras.backend.backend() == "torch"
    path = sys.argv[1]
    torch.set_num_threads(1)

    def h5stream_threads():
        return sorted(t.name for t in threading.enumerate() if t.name.startswith("h5stream"))

    def model():
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                              keras.layers.Dense(10, activation="softmax")])
        m.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        return m

    out = {}
    with h5stream.open(path, batch_size=16, seed=4) as s:
        m = model()
        m.fit(s.keras(), epochs=2, verbose=0)
        out["numpy"] = [w.tolist() for w in m.get_weights()]
    with h5stream.open(path, batch_size=16, seed=4) as s:
        ds = s.keras(device="cpu")
        peek = ds[0]  # outside an epoch: converted here and kept for the first one
        out["peek"] = [type(t).__name__ for t in peek] + [str(peek[0].device), str(peek[0].dtype)]
        m = model()
        before = h5stream_threads()
        m.fit(ds, epochs=2, verbose=0)
        out["device"] = [w.tolist() for w in m.get_weights()]
        stats = ds.stats()
        out["uploaded"] = stats["batches"]
        out["threads_before_fit"], out["threads_after_fit"] = before, h5stream_threads()
        out["batches_per_epoch"] = len(s)
        ds.close()
    print(json.dumps(out))
''')


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """100 rows of 4x4x1, labels 0-9, class-sorted, 8-row blocks."""
    path = str(tmp_path_factory.mktemp("keras_torch") / "rows.h5")
    ids = np.arange(100)
    images = np.broadcast_to((ids * 2 % 251).astype(np.uint8)[:, None, None, None], (100, 4, 4, 1))
    write_arrays(path, images, (ids % 10).astype(np.int64), block_rows=8, storage_order="sorted")
    return path


def test_fit_on_device_batches_trains_exactly_as_on_numpy_batches(store, tmp_path):
    """Two epochs of ``fit`` on ``stream.keras(device="cpu")``, after a peek at one batch: the same weights as
    ``fit`` on ``stream.keras()`` (same seed, same batches, same order), every batch was uploaded ahead, and
    the adapter started no thread (the training thread's ``__getitem__`` issues the uploads)."""
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT, encoding="utf-8")
    env = dict(os.environ, KERAS_BACKEND="torch", PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, str(script), store], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["peek"] == ["Tensor", "Tensor", "cpu", "torch.uint8"]
    for got, want in zip(out["device"], out["numpy"]):
        np.testing.assert_array_equal(np.array(got), np.array(want))
    # 7 batches an epoch; the peeked one is served from the pass logic, the rest uploaded ahead
    assert out["uploaded"] >= 2 * out["batches_per_epoch"] - 1
    assert out["threads_after_fit"] == out["threads_before_fit"]


def test_device_batches_need_the_torch_backend_and_known_options(store):
    keras = pytest.importorskip("keras")
    with h5stream.open(store, batch_size=16) as s:
        with pytest.raises(ConfigError, match="converts on a device: give device="):
            s.keras(dtype="float32")
        if keras.backend.backend() != "torch":
            with pytest.raises(ConfigError, match="needs Keras' torch backend .KERAS_BACKEND=torch."):
                s.keras(device="cpu")
        else:
            with pytest.raises(ConfigError, match=r"stream.keras\(layout='NCWH'\)"):
                s.keras(device="cpu", layout="NCWH")
