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
