"""Smoke test of the pipeline benchmark's measurements on tiny real stores (figures, not speed)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import h5stream
from benchmarks import data
from benchmarks import pipeline as bp
from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")  # the measurements start worker processes and shared memory

SLOW_IMAGE_S = 0.002  # seconds the slow transform spends per image (simulated work, not synchronisation)


def slow_identity(image):
    """A preprocessing_function that takes a known minimum time (module level: picklable for spawn)."""
    import time

    time.sleep(SLOW_IMAGE_S)
    return image


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench_pipeline") / "tiny.h5"
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(96, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 3, size=96)
    write_arrays(str(path), images, labels, class_names=["a", "b", "c"])
    return str(path)


@pytest.mark.parametrize("workers,cold", [(0, False), pytest.param(1, True, marks=pytest.mark.slow)])
def test_measure_stream_reports_positive_figures(store, workers, cold):
    r = bp.measure_stream_rate(store, workers=workers, repeats=2, cold=cold)
    for key in ("images_per_s", "repeats_images_per_s", "images_per_repeat", "first_batch_s", "main_process_cores",
                "worker_cores", "cached_fraction_at_open", "output_dtype"):
        assert key in r, key
    assert len(r["repeats_images_per_s"]) == 2
    assert r["images_per_s"] > 0 and all(v > 0 for v in r["repeats_images_per_s"])
    assert r["images_per_repeat"] == 96 and r["first_batch_s"] > 0
    assert r["output_dtype"] == "uint8" and r["workers"] == workers and r["cold"] is cold


@pytest.mark.slow
def test_stall_collector_measures_a_real_wait(store):
    # One worker needs >= 32 * SLOW_IMAGE_S per batch and at most out_slots(1) batches are ahead of a consumer
    # that never pauses, so most of the remaining batches' production time must show up as waiting.
    batches = 10
    augment = h5stream.Augment(preprocessing_function=slow_identity)
    r = bp.measure_stall(store, workers=1, step_s=0.0, batches=batches, cold=False, augment=augment)
    for key in ("wall_s", "stats_wait_s", "own_wait_s", "stats_wait_fraction", "own_wait_fraction", "handoff_s",
                "own_wait_median_ms", "own_wait_p99_ms", "consumer_images_per_s"):
        assert key in r, key
    from h5stream.streaming.budget import out_slots

    must_wait_s = (batches - out_slots(1)) * 32 * SLOW_IMAGE_S
    assert r["stats_wait_s"] >= 0.5 * must_wait_s
    # The consumer's clock brackets every interval the stream's counter covers.
    assert r["own_wait_s"] >= r["stats_wait_s"]
    assert 0 < r["stats_wait_fraction"] <= r["own_wait_fraction"] <= 1
    assert r["images"] == batches * 32


@pytest.mark.slow
def test_quick_run_end_to_end(tmp_path, capsys):
    pytest.importorskip("keras")
    data_dir = tmp_path / "data"
    assert bp.main(["--quick", "--json", "--sizes", "32", "--data", str(data_dir)]) == 0
    result = json.loads(capsys.readouterr().out)
    r = result["sizes"]["32"]
    assert r["rows"] == 64
    assert set(r["stream_warm"]) == {"0", "1", "2"}
    rates = [r["idg"], r["transform_1core"], r["stream_cold"], r["tf_data"], *r["stream_warm"].values()]
    assert all(m["images_per_s"] > 0 for m in rates)
    assert r["idg"]["output_dtype"] == "float32" and r["transform_1core"]["batched_images_per_s"] > 0
    expected = {"transform_vs_idg", "transform_batched_vs_idg", "w0_vs_idg", "w1_vs_idg", "w2_vs_idg", "w2_vs_w1",
                "cold_vs_tf_data"}
    assert expected <= set(r["ratios"])
    assert r["stall"]["wall_s"] > 0 and r["stall"]["step_s"] > 0
    assert [t["name"] for t in r["targets"]][-1].startswith("consumer")
    assert all(isinstance(t["met"], bool) for t in r["targets"])
    # The table renders from the JSON object, and the cached store is reused (not ingested again).
    assert not any(t["applies"] for t in r["targets"])  # the targets are stated for 128x128 only
    table = bp.format_table(result)
    assert "targets: stated for 128x128" in table and "MISSED" not in table and "met   " not in table
    mtime = os.path.getmtime(r["store"])
    assert data.ensure_store(str(data_dir), r["folder"], 32) == r["store"]
    assert os.path.getmtime(r["store"]) == mtime
