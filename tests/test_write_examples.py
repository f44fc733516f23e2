"""The writer's examples run as a user runs them (small sizes): arrays, a torchvision-style Dataset, a generator
continued after a stop; each checks what it wrote and leaves no temporary folder behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import h5stream

pytestmark = pytest.mark.usefixtures("no_leaks")  # child processes: a killed writer, the examples

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("script, flags, expect", [
    ("write_arrays.py", ["--rows", "700"], "streamed one epoch: 700 rows in 3 batches"),
    ("write_dataset.py", ["--rows", "90", "--size", "24"], "first batch: images (64, 24, 24, 3) uint8"),
    ("write_generator.py", ["--rows", "120"], "items 60-119: 59 rows written, 2 skipped so far, 118 in"),
])
def test_write_example_runs_and_cleans_up(script, flags, expect, tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *flags],
                          env=dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=ROOT), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert expect in proc.stdout, proc.stdout
    assert os.listdir(tmp_path) == []


def test_the_generator_example_continues_a_store_it_stopped(tmp_path):
    out = tmp_path / "photos.h5"
    run = [sys.executable, os.path.join(ROOT, "examples", "write_generator.py"), "--out", str(out), "--rows", "120"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    first = subprocess.run([*run, "--stop-after", "70"], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0 and "unfinished" not in first.stdout, first.stderr[-2000:]
    assert h5stream.read_meta(out).rows == 69  # item 49 is corrupt
    second = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0 and "items 70-119: 49 rows written, 2 skipped so far, 118 in" in second.stdout
