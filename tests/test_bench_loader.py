"""benchmarks.loader: the copy, each stream and FFCV's loader (where its venv is) in every round, the table and JSON."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks import loader
from benchmarks.encoded_crop import DEFAULT_FFCV_PYTHON

pytestmark = pytest.mark.usefixtures("no_leaks")


def _run(tmp_path, capsys, ffcv_python: str) -> dict:
    store = tmp_path / "rows.h5"
    assert loader.main(["--file", str(store), "--rows", "600", "--rounds", "1", "--epochs", "1", "--workers", "0",
                        "--ffcv-python", ffcv_python, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_smoke_run_measures_the_copy_and_the_stream_and_says_when_ffcv_is_missing(tmp_path, capsys):
    missing = str(tmp_path / "no-ffcv" / "python")
    out = _run(tmp_path, capsys, missing)
    assert out["rows"] == 600 and set(out["results"]) == {"copy", "workers=0"}
    stream = out["results"]["workers=0"]
    assert stream["steady_rows_s"] > 0 and stream["first_batch_s"] > 0 and len(stream["rounds"]) == 1
    assert stream["steady_over_copy"]["median"] > 0
    assert out["ffcv_skipped"] == f"no FFCV venv at {missing!r} (--ffcv-python): FFCV not measured"
    assert "workers=0" in loader.table(out)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(DEFAULT_FFCV_PYTHON), reason="no FFCV venv")
def test_ffcv_s_loader_runs_in_the_same_rounds_on_the_same_rows(tmp_path, capsys):
    out = _run(tmp_path, capsys, DEFAULT_FFCV_PYTHON)
    ffcv = out["results"]["FFCV, 2 thr."]
    assert ffcv["steady_rows_s"] > 0 and ffcv["steady_over_copy"]["median"] > 0
    assert (tmp_path / "rows.beton").exists() and not list(tmp_path.glob("*.npy"))
