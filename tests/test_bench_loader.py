"""benchmarks.loader: the copy, each stream and FFCV's loader (where its venv is) in every round, the table and JSON."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from benchmarks import loader
from benchmarks.encoded_crop import DEFAULT_FFCV_PYTHON
from benchmarks.harness import REPO

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
@pytest.mark.skipif(not os.path.exists(DEFAULT_FFCV_PYTHON), reason=f"no FFCV venv at {DEFAULT_FFCV_PYTHON}")
def test_ffcv_s_loader_runs_in_the_same_rounds_on_the_same_rows(tmp_path, capsys):
    out = _run(tmp_path, capsys, DEFAULT_FFCV_PYTHON)
    ffcv = out["results"]["FFCV, 2 thr."]
    assert ffcv["steady_rows_s"] > 0 and ffcv["steady_over_copy"]["median"] > 0
    assert (tmp_path / "rows.beton").exists() and not list(tmp_path.glob("*.npy"))


def _default_ffcv_python(**env) -> str:
    """``DEFAULT_FFCV_PYTHON`` as a fresh interpreter sees it, with ``env`` (None: unset) over this environment."""
    child = {k: v for k, v in os.environ.items() if k != "H5STREAM_FFCV_PYTHON"}
    child.update({k: v for k, v in env.items() if v is not None})
    child["PYTHONPATH"] = REPO
    proc = subprocess.run([sys.executable, "-c", "from benchmarks.encoded_crop import DEFAULT_FFCV_PYTHON as p; "
                           "print(p)"], capture_output=True, text=True, env=child, cwd=REPO, timeout=60, check=True)
    return proc.stdout.strip()


def test_ffcvs_python_defaults_to_a_git_ignored_venv_at_the_repository_root_as_dalis(tmp_path):
    """FFCV's venv follows DALI's convention (``.venv-dali``): ``.venv-ffcv`` in the clone, not a path of one
    machine; ``$H5STREAM_FFCV_PYTHON`` overrides it. A symlink there (to a venv elsewhere) is ignored by git too."""
    assert _default_ffcv_python(H5STREAM_FFCV_PYTHON=None) == os.path.join(REPO, ".venv-ffcv", "bin", "python")
    other = str(tmp_path / "ffcv" / "bin" / "python")
    assert _default_ffcv_python(H5STREAM_FFCV_PYTHON=other) == other
    if shutil.which("git") is None or not os.path.exists(os.path.join(REPO, ".git")):
        pytest.skip("not a git checkout")
    for path in (".venv-ffcv", ".venv-dali"):  # a venv, or a symlink to one
        ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO, timeout=60)
        assert ignored.returncode == 0, f"{path} is not git-ignored"
