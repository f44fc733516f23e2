"""The two entry points of a fresh clone: `make demo` installs the core alone and runs on it; `make test` adds the
test stack."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRAMEWORKS = ("tensorflow", "keras", "tf_keras", "torch", "jax", "matplotlib", "sklearn", "obstore", "pytest")

pytestmark = pytest.mark.usefixtures("no_leaks")


def _planned(target: str, venv: str) -> list[str]:
    """The commands `make TARGET` would run on a machine without the venv (make -n runs none)."""
    proc = subprocess.run(["make", "-n", "-C", ROOT, target, f"VENV={venv}"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_make_demo_installs_the_core_dependencies_alone(tmp_path):
    installs = [c for c in _planned("demo", str(tmp_path / "venv")) if " pip install " in c]
    assert any(re.search(r"pip install (--quiet )?-e \.$", c) for c in installs), installs
    assert not any("[" in c or "tf-keras" in c for c in installs), installs  # no extra: no framework, no test tools


def test_make_test_installs_the_test_stack_over_the_core(tmp_path):
    planned = _planned("test", str(tmp_path / "venv"))
    core = next(i for i, c in enumerate(planned) if re.search(r"pip install (--quiet )?-e \.$", c))
    stack = next(i for i, c in enumerate(planned) if "-e '.[tf-cpu,dev]'" in c)
    run = next(i for i, c in enumerate(planned) if "-m pytest" in c)
    assert core < stack < run


def test_the_demo_runs_with_no_framework_importable(tmp_path):
    """Each framework (and test tool) importable here is made to fail to import, in the demo's process and in every
    process it starts, as in a venv of the core dependencies alone."""
    blocked = tmp_path / "blocked"
    for name in FRAMEWORKS:
        (blocked / name).mkdir(parents=True)
        (blocked / name / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{name}'\")\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocked), ROOT]))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "demo.py"), "--out", str(tmp_path / "demo"),
                           "--classes", "2", "--per-class", "12", "--size", "16"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "augmented epoch" in proc.stdout and proc.stdout.rstrip().splitlines()[-1].startswith("done.")
