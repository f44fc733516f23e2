"""What an installer sees: one version, a licence, extras that never replace a framework the user has."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import h5stream
from h5stream import cli

tomllib = pytest.importorskip("tomllib")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def project():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_version_is_written_once_and_the_command_prints_it(project, capsys):
    assert re.fullmatch(r"\d+\.\d+\.\d+", h5stream.__version__)
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "h5stream.__version__"}
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"h5stream {h5stream.__version__}\n"
    proc = subprocess.run([sys.executable, "-m", "h5stream", "--version"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert (proc.returncode, proc.stdout) == (0, f"h5stream {h5stream.__version__}\n"), proc.stderr


def test_the_licence_file_is_mit_and_ships_with_the_package(project):
    with open(os.path.join(ROOT, "LICENSE"), encoding="utf-8") as f:
        text = f.read()
    assert text.startswith("MIT License") and "h5stream developers" in text
    assert project["project"]["license"] == "MIT" and project["project"]["license-files"] == ["LICENSE"]


def _names(requirements):
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_extras_never_bring_a_tensorflow_unless_asked_for(project):
    extras = project["project"]["optional-dependencies"]
    assert _names(extras["keras"]) == {"keras"}  # any backend the user already has stays
    assert _names(extras["tf-cpu"]) == {"keras", "tensorflow-cpu"}
    assert {"torch", "plot", "dev"} <= set(extras)
    for name, requirements in extras.items():
        if name != "tf-cpu":
            assert not any(n.startswith("tensorflow") for n in _names(requirements)), name
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
        assert "-e '.[tf-cpu,dev]'" in f.read()  # what make test installs (make demo: the core alone)


def test_the_readme_lists_every_extra_as_installed_from_a_clone(project):
    """h5stream is installed from a clone: `pip install 'h5stream[x]'` names nothing an index has."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    listed = set(re.findall(r"^\| `\[([a-z-]+)\]` \|", readme, re.MULTILINE))
    assert listed == set(project["project"]["optional-dependencies"])
    assert "install 'h5stream[" not in readme and 'install "h5stream[' not in readme
    assert "pip install -e '.[remote]'" in readme
    assert "--index-url https://download.pytorch.org/whl/cpu" in readme  # torch without its CUDA libraries
