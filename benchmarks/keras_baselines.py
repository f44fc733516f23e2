"""The pipeline benchmark's baselines: Keras' ImageDataGenerator over rows in memory, tf.data from a JPEG folder.

* :func:`measure_idg` -- ``ImageDataGenerator(**standard).flow(x, y, batch_size)``
  passes; :class:`IdgServer` runs it in a subprocess that imports TensorFlow
  once and then makes one pass whenever asked, so it can be sampled in the
  same rounds as the streams without TensorFlow's threads running beside them.
* :func:`measure_tf_folder` -- ``keras.utils.image_dataset_from_directory``
  mapped through Keras' random layers closest to the ``standard`` preset
  (:func:`tf_augment_layers`) and prefetched, cold or warm.

TensorFlow and Keras are imported only inside these functions.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import numpy as np

from benchmarks.augment import BATCH_SIZE, PRESET
from benchmarks.data import read_rows
from benchmarks.harness import child_command, child_env, evict_folder


def keras_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("keras") is not None and importlib.util.find_spec("tensorflow") is not None


def measure_idg(x: np.ndarray, y: np.ndarray, *, repeats: int = 3, batch_size: int = BATCH_SIZE,
                seed: int = 0) -> dict:
    """Images/s of Keras' ``ImageDataGenerator(**standard).flow(x, y, batch_size)``, median of ``repeats`` passes."""
    from keras.src.legacy.preprocessing.image import ImageDataGenerator

    from h5stream.augment import PRESETS

    params = {k: (list(v) if isinstance(v, tuple) else v) for k, v in PRESETS[PRESET].items()}
    idg = ImageDataGenerator(**params)
    rates = []
    for r in range(repeats):
        it = idg.flow(x, y, batch_size=batch_size, seed=seed + r)
        t0 = time.perf_counter()
        n = 0
        for _ in range(len(it)):
            xb, _ = next(it)
            n += len(xb)
        rates.append(n / (time.perf_counter() - t0))
    return {"images_per_s": statistics.median(rates), "repeats_images_per_s": rates, "images": len(x),
            "output_dtype": str(xb.dtype)}


def idg_server(argv: list[str]) -> int:
    """Child of :class:`IdgServer`: ``argv = [store, rows]``.

    Reads the rows, makes a first small pass (imports, first calls), prints
    ``ready``; then for every ``go`` line on stdin makes one pass and prints
    its figures as a JSON line.  Any other line, or end of input, ends it.
    """
    x, y = read_rows(argv[0], int(argv[1]))
    measure_idg(x[:64], y[:64], repeats=1)  # imports keras, scipy; first calls
    print("ready", flush=True)
    k = 0
    for line in sys.stdin:
        if line.strip() != "go":
            break
        r = measure_idg(x, y, repeats=1, seed=k)
        k += 1
        print(json.dumps({"images_per_s": r["images_per_s"], "output_dtype": r["output_dtype"]}), flush=True)
    return 0


class IdgServer:
    """Keras' ImageDataGenerator in a subprocess, measured on demand between the stream runs; owns the process.

    The subprocess imports TensorFlow once (before any stream is timed) and
    then sleeps until asked for one pass, so ImageDataGenerator is sampled in
    the same rounds as the streams -- under the same drift of a shared
    machine -- while TensorFlow's threads never run beside a stream.
    :meth:`close` is idempotent.
    """

    def __init__(self, store: str, rows: int):
        self.rows = rows
        self.rates: list[float] = []
        self.output_dtype = None
        self._proc = subprocess.Popen(child_command("benchmarks.keras_baselines:idg_server", store, rows),
                                      env=child_env(TF_CPP_MIN_LOG_LEVEL="3"),
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self._proc.stdout.readline().strip() != "ready":
            self.close()
            raise RuntimeError("the ImageDataGenerator subprocess did not start (is keras installed?)")

    def measure(self) -> float:
        """One pass; returns its images/s."""
        self._proc.stdin.write("go\n")
        self._proc.stdin.flush()
        r = json.loads(self._proc.stdout.readline())
        self.rates.append(r["images_per_s"])
        self.output_dtype = r["output_dtype"]
        return r["images_per_s"]

    def result(self) -> dict:
        return {"images_per_s": statistics.median(self.rates), "repeats_images_per_s": list(self.rates),
                "images": self.rows, "output_dtype": self.output_dtype,
                "statistic": f"median of {len(self.rates)} passes interleaved with the streams"}

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.stdin.close()
            except OSError:
                pass
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if not self._proc.stdout.closed:
            self._proc.stdout.close()


def tf_augment_layers():
    """Keras' random layers closest to the ``standard`` preset (no channel shift layer exists)."""
    import keras

    return keras.Sequential([
        keras.layers.RandomFlip("horizontal"),
        keras.layers.RandomRotation(45 / 360, fill_mode="nearest"),
        keras.layers.RandomZoom((-0.2, 0.0), fill_mode="nearest"),
        keras.layers.RandomTranslation(0.1, 0.1, fill_mode="nearest"),
    ])


def measure_tf_folder(folder: str, size: int, *, repeats: int = 3, cold: bool = True,
                      batch_size: int = BATCH_SIZE, seed: int = 0) -> dict:
    """Images/s of tf.data from the JPEG ``folder``: decode + resize + Keras random layers + prefetch.

    Each repeat is a fresh pass over the folder (shuffled file order), with
    every JPEG evicted from the page cache first when ``cold``.  The first
    batch (graph tracing, pipeline start) is timed apart.
    """
    import keras
    import tensorflow as tf

    augment = tf_augment_layers()
    ds = keras.utils.image_dataset_from_directory(folder, image_size=(size, size), batch_size=batch_size,
                                                  shuffle=True, seed=seed, verbose=False)
    ds = ds.map(lambda x, y: (augment(x, training=True), y), num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    rates, first = [], []
    for _ in range(repeats):
        if cold:
            evict_folder(folder)
        t_open = time.perf_counter()
        it = iter(ds)
        x, _ = next(it)
        t0 = time.perf_counter()
        first.append(t0 - t_open)
        n = 0
        for x, _ in it:
            n += int(x.shape[0])
        if n:
            rates.append(n / (time.perf_counter() - t0))
    return {"images_per_s": statistics.median(rates) if rates else 0.0, "repeats_images_per_s": rates,
            "first_batch_s": statistics.median(first), "cold": cold, "output_dtype": x.dtype.name,
            "tensorflow": tf.__version__, "keras": keras.__version__}
