"""A job scheduler's SIGTERM to the whole process group (SLURM at the time limit, Kubernetes, a terminal closing):
the augment workers die with it, and the trainer's own SIGTERM handler still saves ``stream.state()`` and exits
cleanly; the saved state resumes to exactly the batches that came next, and no process of the group is left.
Real processes, a real signal to the group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import psutil
import pytest

import h5stream
from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")

TRAINER = textwrap.dedent("""
    import json, signal, sys
    import h5stream

    path, out = sys.argv[1], sys.argv[2]
    stream = h5stream.open(path, batch_size=32, workers=2, augment=h5stream.Augment(horizontal_flip=True), seed=5)
    taken = 0

    def on_sigterm(signum, frame):  # what a trainer does: save its position (and its weights), then leave
        with open(out, "w") as f:
            json.dump({"state": stream.state(), "taken": taken}, f)
        stream.close()
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)
    it = iter(stream)
    for _ in range(7):
        next(it)
        taken += 1
    print("ready", flush=True)
    sys.stdin.read()  # training goes on here until the scheduler's signal
""")


def test_a_sigterm_to_the_whole_group_leaves_the_trainer_a_state_that_resumes_exactly(tmp_path):
    path = str(tmp_path / "s.h5")
    rng = np.random.default_rng(0)
    write_arrays(path, rng.integers(0, 256, (1000, 8, 8, 3), dtype=np.uint8), np.arange(1000), block_rows=64)
    out = tmp_path / "state.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(h5stream.__file__)),
                                                      os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, path, str(out)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=env)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        group = psutil.Process(proc.pid).children(recursive=True)
        assert len(group) >= 2  # its two workers at least
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    _, alive = psutil.wait_procs(group, timeout=60)  # each dies of the signal or exits with the trainer
    assert alive == []
    saved = json.loads(out.read_text())
    assert saved["taken"] == 7 and (saved["state"]["epoch"], saved["state"]["batch"]) == (0, 7)
    aug = h5stream.Augment(horizontal_flip=True)
    with h5stream.open(path, batch_size=32, workers=0, augment=aug, seed=5) as ref:
        want = [(x.copy(), y.copy()) for x, y in ref][7:]
    with h5stream.open(path, batch_size=32, workers=0, augment=aug, seed=5, resume=saved["state"]) as resumed:
        got = [(x.copy(), y.copy()) for x, y in resumed]
    assert len(got) == len(want) > 0
    for (gx, gy), (wx, wy) in zip(got, want):
        np.testing.assert_array_equal(gy, wy)
        np.testing.assert_array_equal(gx, wx)
