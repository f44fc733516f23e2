"""`import h5stream`, `h5stream ingest` and `h5stream info` never import a deep-learning framework."""

from __future__ import annotations

import json
import subprocess
import sys

FRAMEWORKS = ("tensorflow", "keras", "torch", "jax")

SCRIPT = r"""
import json, sys
import h5stream
from h5stream import cli
after_import = sorted(m for m in sys.modules if m.split(".")[0] in {fw})
from h5stream.samples import make_class_folder
make_class_folder(sys.argv[1] + "/src", classes=2, per_class=3, size=(8, 8))
rc_ingest = cli.main(["ingest", sys.argv[1] + "/src", sys.argv[1] + "/o.h5", "--size", "8", "--workers", "1"])
rc_info = cli.main(["info", sys.argv[1] + "/o.h5", "--json"])
after_cli = sorted(m for m in sys.modules if m.split(".")[0] in {fw})
print(json.dumps({{"rc": [rc_ingest, rc_info], "after_import": after_import, "after_cli": after_cli}}))
""".format(fw=set(FRAMEWORKS))


def test_no_framework_is_imported(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rc"] == [0, 0]
    assert result["after_import"] == [] and result["after_cli"] == []


PIN_SCRIPT = r"""
import json, os, sys
import h5stream.cli as cli
numpy_before = "numpy" in sys.modules  # the pin only works while numpy (and OpenBLAS) is not loaded yet
seen = {}
def fake_main():
    import numpy  # noqa: F401 - what a command does first
    seen["env"] = os.environ.get("OPENBLAS_NUM_THREADS")
    return 0
cli.main = fake_main
rc = cli.run()
print(json.dumps({"rc": rc, "numpy_before": numpy_before, "env": seen["env"]}))
"""


def _run_pin(env_value):
    import os

    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if env_value is not None:
        env["OPENBLAS_NUM_THREADS"] = env_value
    proc = subprocess.run([sys.executable, "-c", PIN_SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_command_pins_openblas_to_one_thread_before_numpy_loads_unless_the_user_chose():
    pinned = _run_pin(None)
    assert pinned == {"rc": 0, "numpy_before": False, "env": "1"}
    assert _run_pin("3")["env"] == "3"  # the user's choice stands


def test_main_in_a_callers_process_leaves_the_environment_alone(tmp_path, monkeypatch):
    import os

    from h5stream import cli

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert cli.main(["info", str(tmp_path / "missing.h5")]) != 0
    assert "OPENBLAS_NUM_THREADS" not in os.environ
