"""The examples run end to end (--quick: tiny generated data, one epoch) as a user would run them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("script, flags, expect", [
    # the same script without workers: with the slow tests (the run with workers covers the rest of it)
    pytest.param("train_classifier.py", [], "validation accuracy:", marks=pytest.mark.slow),
    ("train_classifier.py", ["--workers", "2"], "validation accuracy:"),  # as its docstring shows, default budget
    # with --work: with the slow tests (make test runs it in its own temporary folder, below)
    pytest.param("train_regression.py", [], "validation MSE:", marks=pytest.mark.slow),
])
def test_example_runs_quick(script, flags, expect, tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", script), "--quick", "--work", str(tmp_path), *flags],
        env=env, capture_output=True, text=True, timeout=300,  # a safety net: a healthy run takes ~20 s
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert expect in proc.stdout
    assert os.path.exists(tmp_path / "train.h5") and os.path.exists(tmp_path / "val.h5")
    assert "ran out of data" not in proc.stderr
    if script == "train_classifier.py":  # 48 rows in batches of 16: the first step of fit builds the model
        assert "over 2 of 3 steps: the first, which builds the model, is not timed" in proc.stdout


@pytest.mark.parametrize("script, flags", [
    ("train_regression.py", []),  # the regression example's one run in make test: it trains, then cleans up
    pytest.param("train_classifier.py", [], marks=pytest.mark.slow),
    pytest.param("train_torch.py", ["--device", "cpu"], marks=pytest.mark.slow),
])
def test_example_without_work_removes_its_temporary_folder(script, flags, tmp_path):
    if script == "train_torch.py":
        pytest.importorskip("torch")
    env = dict(os.environ, TMPDIR=str(tmp_path), TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTRAOP_THREADS="1",
               TF_NUM_INTEROP_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), "--quick", *flags],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    if script == "train_regression.py":
        assert "validation MSE:" in proc.stdout
    assert [name for name in os.listdir(tmp_path) if name.startswith("h5stream-")] == []
