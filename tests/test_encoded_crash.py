"""An encoded (JPEG) store's ingest SIGKILLed after each of its changes to files in turn (a sample holding every
kind of change): the store is absent, whole up to its committed rows, or refused until rebuilt; `--append` then
finishes it to exactly the bytes of an uninterrupted run, with nothing past the committed rows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest

from h5stream.samples import make_class_folder
from h5stream.store import pathrows, rowdigest, schema
from h5stream.store.encoded import EncodedRows
from h5stream.store.schema import flushing_path
from test_crash_resume import sampled_steps
from test_crash_resume import kill_shim as _kill_shim_fixture

kill_shim = _kill_shim_fixture  # the LD_PRELOAD library that SIGKILLs after the K-th change (a module fixture)

ARGS = ["--size", "16", "--encoding", "jpeg", "--block-rows", "4", "--commit-rows", "8", "--workers", "0"]


def encoded_state(out) -> dict:
    """The committed rows (their JPEG bytes, ends, labels, paths) and what is stored, past them included."""
    with h5py.File(out, "r", locking=False) as f:
        n = int(f.attrs[schema.ATTR_ENCODED_COMMITTED])
        ends = f[schema.IMAGE_ENDS][:n]
        end = int(ends[-1]) if n else 0
        data = f[schema.IMAGE_BYTES][:end]
        digests = f[schema.ROW_DIGESTS]  # every committed row has the digest of its encoded bytes
        digested = len(digests) >= n and np.array_equal(digests[:n], rowdigest.of_rows(EncodedRows(data, ends)))
        return {"rows": n, "ends": ends, "bytes": data, "labels": f[schema.LABELS][:n],
                "paths": pathrows.stored_bytes(f, 0, n),
                "stored": [len(f[k]) for k in (schema.IMAGE_ENDS, schema.LABELS, pathrows.row_node(f))],
                "stored_bytes": len(f[schema.IMAGE_BYTES]), "digested": digested}


@pytest.mark.slow
@pytest.mark.usefixtures("no_leaks")
def test_a_kill_at_every_kind_of_step_of_an_encoded_ingest_leaves_it_absent_whole_or_to_rebuild(kill_shim, tmp_path,
                                                                                              h5cli):
    src = tmp_path / "src"
    make_class_folder(src, classes=2, per_class=10, size=(20, 24), fmt="png", seed=3)

    def killed_run(folder, after, log=None):
        env = dict(os.environ, LD_PRELOAD=kill_shim, KILL_DIR=str(folder), KILL_AFTER=str(after))
        if log is not None:
            env["KILL_LOG"] = str(log)
        cmd = [sys.executable, "-m", "h5stream", "ingest", str(src), str(folder / "o.h5"), *ARGS]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)

    ref, log = tmp_path / "ref", tmp_path / "steps.log"
    ref.mkdir()
    whole = killed_run(ref, 0, log)
    assert whole.returncode == 0, whole.stderr
    steps = log.read_text().splitlines()
    want = encoded_state(ref / "o.h5")
    assert want["rows"] == 20 and want["stored"] == [20, 20, 20] and want["stored_bytes"] == want["ends"][-1]
    assert want["digested"]
    keys = ("ends", "bytes", "labels", "paths")
    for k in sorted(sampled_steps(steps)):
        folder = tmp_path / f"k{k}"
        folder.mkdir()
        out = folder / "o.h5"
        killed = killed_run(folder, k)
        step = steps[k - 1]
        assert killed.returncode == -signal.SIGKILL, (step, killed.stderr)
        if os.path.exists(flushing_path(out)):
            code, _, err = h5cli("info", out)
            assert code == 1 and "h5stream repair" in err, (step, err)
        elif out.exists():
            assert h5cli("info", out)[0] == 0, step
            kept = encoded_state(out)
            n = kept["rows"]
            assert kept["digested"], step
            for key in keys:
                assert np.array_equal(kept[key], want[key][:n] if key != "bytes" else
                                      want["bytes"][:len(kept["bytes"])]), (step, key)
        code, _, err = h5cli("ingest", src, out, *ARGS, "--append")
        assert code == 0, f"killed after step {step}: --append fails: {err}"
        got = encoded_state(out)
        assert got["digested"], step
        for key in keys:
            assert np.array_equal(got[key], want[key]), (step, key)
        assert got["stored"] == want["stored"] and got["stored_bytes"] == want["stored_bytes"], step
        assert h5cli("verify", out)[0] == 0, step
