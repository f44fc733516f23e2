"""``model.fit(stream.keras(), steps_per_epoch=k)`` on every Keras backend: the Keras epochs cut the stream's
sequence, they never replay it.

Keras' backend is chosen at ``import keras``, so each fit runs in a subprocess with ``KERAS_BACKEND`` set (slow:
a fresh Keras each; the default suite checks the same fit in-process on the TensorFlow backend, in
``test_keras_adapter.py::test_stall_monitor_times_each_batch_at_its_place_in_the_pass_with_short_keras_epochs``).  The
model records the rows of every batch it trains on (the pixels of row ``i`` are ``i``).
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
from h5stream.store.writer import write_arrays

pytestmark = [
    pytest.mark.usefixtures("no_leaks"),
    pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="needs keras"),
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS, BATCH, SEED = 100, 16, 5  # 7 batches an epoch, the last of 4 rows

SCRIPT = textwrap.dedent('''
    import json, sys, warnings
    import numpy as np
    import keras
    import h5stream

    path, epochs, steps, backend = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    device = sys.argv[5] if len(sys.argv) > 5 else None
    assert keras.backend.backend() == backend, keras.backend.backend()
    seen = []

    class Record(keras.layers.Layer):
        def call(self, x):
            symbolic = isinstance(x, keras.KerasTensor) or "Tracer" in type(x).__name__  # tracing (jax)
            if not symbolic and str(getattr(x, "device", "")) != "meta":  # torch's shape inference: no data
                seen.append(keras.ops.convert_to_numpy(x)[:, 0, 0, 0].astype(int).tolist())
            return x

    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((4, 4, 1)), Record(), keras.layers.Rescaling(1 / 255),
                          keras.layers.Flatten(), keras.layers.Dense(100, activation="softmax")])
    m.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", run_eagerly=True)
    with h5stream.open(path, batch_size=16, seed=5, memory_budget="32MiB") as s, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = s.keras() if device is None else s.keras(device=device)  # device: torch tensors uploaded ahead
        history = m.fit(ds, epochs=epochs, steps_per_epoch=steps, verbose=0)
    print(json.dumps({"seen": seen, "epochs": len(history.history["loss"])}))
''')


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("fit_steps") / "rows.h5")
    ids = np.arange(ROWS)
    images = np.broadcast_to(ids.astype(np.uint8)[:, None, None, None], (ROWS, 4, 4, 1))
    write_arrays(path, images, ids.astype(np.int64), block_rows=8, storage_order="sorted")
    return path


def run_fit(store, tmp_path, backend, epochs, steps, device=None):
    if importlib.util.find_spec({"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}[backend]) is None:
        pytest.skip(f"needs {backend}")
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT, encoding="utf-8")
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    argv = [sys.executable, str(script), store, str(epochs), str(steps), backend] + ([device] if device else [])
    done = subprocess.run(argv, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("backend, device", [
    pytest.param("tensorflow", None, marks=pytest.mark.slow), pytest.param("jax", None, marks=pytest.mark.slow),
    pytest.param("torch", None, marks=pytest.mark.slow), pytest.param("torch", "cpu", marks=pytest.mark.slow)],
    ids=["tensorflow", "jax", "torch", "torch-device"])
def test_steps_per_epoch_below_the_streams_length_continues_the_stream(store, tmp_path, backend, device):
    """``steps_per_epoch=3`` of a 7-batch stream, 4 epochs: Keras takes 3, 3, then the 1 batch left of its
    iterator (its own "ran out of data" cut), then 3 from a fresh one.  The 10 batches trained on are the stream's
    first 10 -- its whole epoch 0, each row once, then the start of epoch 1 -- not the first 3 batches again
    and again.  On the torch backend also through ``stream.keras(device="cpu")``, whose uploads run ahead."""
    out = run_fit(store, tmp_path, backend, epochs=4, steps=3, device=device)
    with h5stream.open(store, batch_size=BATCH, seed=SEED) as s:
        expected = np.concatenate([s.epoch_order(0), s.epoch_order(1)[: 3 * BATCH]])
    got = np.concatenate([np.asarray(b) for b in out["seen"]])
    assert out["epochs"] == 4
    assert [len(b) for b in out["seen"]] == [BATCH] * 6 + [ROWS - 6 * BATCH] + [BATCH] * 3
    np.testing.assert_array_equal(got, expected)
    assert sorted(got[:ROWS].tolist()) == list(range(ROWS))
