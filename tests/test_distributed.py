"""Two MultiWorkerMirroredStrategy workers on 127.0.0.1, each streaming its shard: every row exactly once.

Keras 3's ``fit`` fails under this strategy (keras-team/keras#20585): the first
test trains a Keras 3 model with a ``strategy.run`` loop and checks the rows;
the second runs ``tf_keras``' ``model.fit`` over the same input for two epochs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from h5stream.store.writer import write_arrays  # noqa: E402

ROWS = 100
# Both worker scripts start the same way: one TF thread each, this cluster's strategy, argv = (store, result file).
PREAMBLE = r'''
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
from h5stream.adapters.distribute import distributed_dataset

path, out = sys.argv[1], sys.argv[2]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
'''
WORKER = PREAMBLE + r'''
import keras
with strategy.scope():
    model = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                              keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.01)
    optimizer.build(model.trainable_variables)

@tf.function
def train_step(x, y):
    def replica_step(x, y):
        with tf.GradientTape() as tape:
            err = model(x, training=True)[:, 0] - y / 100.0
            loss = tf.reduce_mean(err * err) / strategy.num_replicas_in_sync
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None)

seen, losses = [], []
with distributed_dataset(path, strategy, global_batch_size=16, memory_budget="32MiB", seed=4) as dist:
    for x, y in dist.dataset:  # one epoch
        losses.append(float(train_step(x, y)))
        seen += [int(v) for part in strategy.experimental_local_results(y) for v in part.numpy()]
    s = dist.streams[0]
    result = {"seen": seen, "order": s.epoch_order(0).tolist(), "state": s.state(), "batches": len(s),
              "losses": losses, "weights": [w.tolist() for w in model.get_weights()]}
with open(out, "w") as fh:
    json.dump(result, fh)
'''


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


FIT_WORKER = PREAMBLE + r'''
import tf_keras
with strategy.scope():
    model = tf_keras.Sequential([tf_keras.Input((4, 4, 1)), tf_keras.layers.Rescaling(1 / 255),
                                 tf_keras.layers.Flatten(), tf_keras.layers.Dense(1)])
    model.compile(optimizer=tf_keras.optimizers.SGD(0.01), loss="mse")
with distributed_dataset(path, strategy, global_batch_size=16, memory_budget="32MiB", seed=4, repeat=True) as dist:
    steps = dist.steps_per_epoch
    history = model.fit(dist.dataset, epochs=2, steps_per_epoch=steps, verbose=2)
    result = {"steps": steps, "batches": len(dist.streams[0]), "loss": history.history["loss"],
              "weights": [w.tolist() for w in model.get_weights()], "epoch": dist.streams[0].state()["epoch"]}
with open(out, "w") as fh:
    json.dump(result, fh)
'''


def _rows_file(tmp_path) -> str:
    path = str(tmp_path / "rows.h5")
    ids = np.arange(ROWS)
    images = np.broadcast_to((ids % 251).astype(np.uint8)[:, None, None, None], (ROWS, 4, 4, 1))
    write_arrays(path, images, ids.astype(np.float32), block_rows=8, storage_order="sorted")  # target = row id
    return path


def _run_two_workers(tmp_path, worker_source: str, path: str) -> tuple[list[dict], list[str]]:
    """Run ``worker_source`` as workers 0 and 1 of one cluster; their JSON results and logs."""
    script = tmp_path / "worker.py"
    script.write_text(worker_source)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(2)]}
    procs = []
    for index in range(2):
        env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
                   TF_CPP_MIN_LOG_LEVEL="2")
        log = open(tmp_path / f"log{index}.txt", "w")
        procs.append((subprocess.Popen([sys.executable, str(script), path, str(tmp_path / f"out{index}.json")],
                                       env=env, stdout=log, stderr=subprocess.STDOUT), log))
    try:
        for proc, _ in procs:
            proc.wait(timeout=300)  # a safety net only: a healthy run takes seconds
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    logs = [(tmp_path / f"log{i}.txt").read_text() for i in range(2)]
    for index, (proc, _) in enumerate(procs):
        assert proc.returncode == 0, logs[index][-3000:]
    return [json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(2)], logs


@pytest.mark.slow  # a multi-process training run (make test-all)
def test_two_workers_each_stream_their_shard_and_cover_every_row_once(tmp_path):
    results, _ = _run_two_workers(tmp_path, WORKER, _rows_file(tmp_path))
    for r in results:
        assert r["seen"] == r["order"]  # each worker trained on exactly its shard's epoch order
        assert (r["state"]["epoch"], r["state"]["batch"]) == (1, 0)
        assert len(r["losses"]) == r["batches"]
    assert results[0]["batches"] == results[1]["batches"]  # same step count on every worker
    union = sorted(results[0]["seen"] + results[1]["seen"])
    assert union == list(range(ROWS))  # every row exactly once across the workers
    assert results[0]["losses"] == results[1]["losses"]  # all-reduced: the workers trained one model
    assert results[0]["weights"] == results[1]["weights"]


@pytest.mark.slow
def test_tf_keras_fit_runs_exact_epochs_on_two_workers(tmp_path):
    pytest.importorskip("tf_keras")
    results, logs = _run_two_workers(tmp_path, FIT_WORKER, _rows_file(tmp_path))
    for r, log in zip(results, logs):
        assert "ran out of data" not in log
        assert r["steps"] == r["batches"] == 7  # 50 rows per shard in batches of 8
        assert len(r["loss"]) == 2 and all(np.isfinite(r["loss"]))
        assert r["loss"][1] > 0  # the second epoch had data (an epoch that ran dry reports 0)
        assert r["epoch"] >= 2  # each stream was read through two whole epochs (the prefetch may be ahead)
    assert results[0]["loss"] == results[1]["loss"]  # all-reduced: one model on both workers
    assert results[0]["weights"] == results[1]["weights"]
