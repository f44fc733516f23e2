"""A process forked after ``open`` leaves the parent's stream exactly as it was, and cannot use it itself.

Each scenario runs in a script of its own (``python -c``): its forked children
end the way a user's do (``sys.exit``, an uncaught exception, ``os._exit``,
garbage collection and ``atexit``), which must end that script's child, never
pytest.  A child reports over a pipe; the script waits for it with
``os.waitpid`` before it goes on, then saves the batches its stream gave, which
the test compares with an unforked stream of the same options.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import psutil
import pytest

import h5stream
from h5stream.memory.shm import segment_names
from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = 200
SAFETY_S = 60.0
OPTIONS = dict(batch_size=32, seed=7, memory_budget="300MiB")
MODES = {"inline": {}, "pool": {"workers": 2}, "feeder": {"workers": 2, "feeder": True}}

SCRIPT = r"""
import gc, json, os, sys
import numpy as np
import h5stream

path, out, mode = sys.argv[1:4]
kw = {"inline": {}, "pool": {"workers": 2}, "feeder": {"workers": 2, "feeder": True}}[mode]
AUG = h5stream.Augment.preset("standard", rescale=1 / 255)
OPTIONS = dict(batch_size=32, seed=7, memory_budget="300MiB", augment=AUG, **kw)

def use_all(s, it):
    # Every use of the stream in the child, each reported as (exception type, message) or None.
    ops = {"next": lambda: next(it), "iter": lambda: iter(s), "state": s.state, "stats": s.stats,
           "restore": lambda: s.restore(state_at_fork)}
    got = {}
    for name, op in ops.items():
        try:
            op()
            got[name] = None
        except Exception as exc:
            got[name] = [type(exc).__name__, str(exc)]
    return got

def fork(ending, s, it):
    # Fork; the child reports over a pipe and ends by ``ending``; the parent waits for it.  Returns what it said.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        report = {"pid": os.getpid()}
        try:
            if ending == "use":
                report["uses"] = use_all(s, it)
                s.close()  # the child's copy only
                report["closed"] = s.closed
                report["after_close"] = use_all(s, it)["next"]
            elif ending == "own stream":
                with h5stream.open(path, **OPTIONS) as own:
                    report["own"] = [float(x.sum()) for x, _ in own]
                    stats = own.stats()
                    report["own_pids"] = list(stats.get("worker_pids", [])) + [stats.get("feeder_pid") or os.getpid()]
                    report["own_segments"] = [n for n in os.listdir("/dev/shm")
                                              if any(n.startswith(f"h5s_{p}_") for p in report["own_pids"])]
        finally:
            os.write(w, json.dumps(report).encode())
            os.close(w)
        if ending == "exception":
            raise RuntimeError("the forked child fails")
        if ending == "os._exit":
            os._exit(3)
        if ending == "garbage":
            del s, it
            gc.collect()
        sys.exit(0)  # atexit and weakref finalizers run here, in the child
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    report = json.loads(data)
    report["exit"] = os.waitstatus_to_exitcode(status)
    return report

s = h5stream.open(path, **OPTIONS)
stats = s.stats()
pids = list(stats.get("worker_pids", [])) + ([stats["feeder_pid"]] if stats.get("feeder_pid") else [])
it = iter(s)
held = []  # batches the parent still holds across each fork (lent slots), and a new batch between forks
reports = []
for ending in ("exit", "exception", "use", "os._exit", "garbage", "own stream"):
    x, y = next(it)
    held.append((x, y))
    if ending == "use":
        state_at_fork = s.state()
    reports.append(fork(ending, s, it))
batches = held + [(x.copy(), y.copy()) for x, y in it]  # the rest of the epoch ...
batches += [(x.copy(), y.copy()) for x, y in s]  # ... and the next one
np.savez(out, x=np.concatenate([x for x, _ in batches]), y=np.concatenate([y for _, y in batches]),
         sizes=[len(x) for x, _ in batches])
state = s.state()
s.close()
print(json.dumps({"reports": reports, "pids": pids, "me": os.getpid(), "state": state}))
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(3)
    images = rng.integers(0, 255, (ROWS, 16, 16, 3), dtype=np.uint8)
    path = tmp_path_factory.mktemp("fork") / "f.h5"
    write_arrays(path, images, np.arange(ROWS) % 5, block_rows=16)
    return str(path)


def _unforked(store):
    """Two epochs of an unforked stream of the same options (workers=0: the batches do not depend on workers)."""
    aug = h5stream.Augment.preset("standard", rescale=1 / 255)
    with h5stream.open(store, augment=aug, **OPTIONS) as s:
        xs = [(x.copy(), y.copy()) for _ in range(2) for x, y in s]
        return xs, s.state()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("mode", list(MODES))
def test_a_forked_child_leaves_the_parents_stream_as_it_was_and_cannot_use_it(store, tmp_path, mode):
    out = tmp_path / "batches.npz"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, store, str(out), mode], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    reports = {r_end: r for r_end, r in zip(("exit", "exception", "use", "os._exit", "garbage", "own stream"),
                                            result["reports"])}
    # Each child ended the way it was told to, and nothing of the parent's went with it.
    assert [r["exit"] for r in result["reports"]] == [0, 1, 0, 3, 0, 0]
    assert proc.stderr.count("Traceback") == 1 and "RuntimeError: the forked child fails" in proc.stderr, proc.stderr

    # The parent's batches: exactly those of an unforked stream, the rest of the epoch and the next epoch.
    expected, expected_state = _unforked(store)
    with np.load(out) as saved:
        sizes, x, y = saved["sizes"].tolist(), saved["x"], saved["y"]
    assert sizes == [len(b) for b, _ in expected]
    assert np.array_equal(x, np.concatenate([b for b, _ in expected]))
    assert np.array_equal(y, np.concatenate([labels for _, labels in expected]))
    assert result["state"] == expected_state
    n = len(expected) // 2  # batches per epoch

    # In the child, every use of the stream is one line naming both processes; close() releases nothing.
    used = reports["use"]
    for op in ("next", "iter", "state", "stats", "restore"):
        assert used["uses"][op] is not None, f"{op} in the forked child raised nothing"
        kind, message = used["uses"][op]
        assert kind == "ForkedStreamError", (op, kind, message)
        assert "\n" not in message
        assert f"opened in process {result['me']}, used in forked child {used['pid']}: open a stream in the child" \
            in message
    assert used["closed"] is True and used["after_close"][0] == "ForkedStreamError"

    # A stream the child opens itself works, and is its own: its segments and workers ended with the child.
    own = reports["own stream"]
    assert len(own["own"]) == n and own["own"] == pytest.approx([float(x.sum()) for x, _ in expected[:n]])
    if mode != "inline":
        assert own["own_segments"]  # it made segments of its own (the check below is not vacuous)
    assert all(_gone(pid) for pid in own["own_pids"])
    # Nothing of the script's own stream is left either.
    for pid in [result["me"], *result["pids"], *(r["pid"] for r in result["reports"]), *own["own_pids"]]:
        assert segment_names(f"h5s_{pid}_") == [], pid
    assert result["pids"] or mode == "inline"
    assert all(_gone(pid) for pid in result["pids"])


ADAPTER_SCRIPT = r"""
import gc, json, os, sys
import numpy as np
import torch
from torch.utils.data import DataLoader
import h5stream

path, out = sys.argv[1:3]
s = h5stream.open(path, batch_size=32, seed=7, memory_budget="300MiB")
ds = s.torch()
dev = s.torch(device="cpu")  # uploads issued ahead at the fork: its ring and pass are the parent's
it = iter(dev)
held = [next(it), next(it)]

r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    uses = {}
    for name, op in (("next of the parent's pass", lambda: next(it)), ("iter(torch dataset)", lambda: iter(ds)),
                     ("iter(device dataset)", lambda: iter(dev)), ("a new adapter", lambda: iter(s.torch()))):
        try:
            op()
            uses[name] = None
        except Exception as exc:
            uses[name] = [type(exc).__name__, str(exc)]
    os.write(w, json.dumps({"pid": os.getpid(), "uses": uses}).encode())
    os.close(w)
    del it, held, ds, dev, s
    gc.collect()
    sys.exit(0)  # the adapters' finalizers, then the stream's, run here
os.close(w)
report = json.loads(os.read(r, 1 << 16))
_, status = os.waitpid(pid, 0)
report["exit"] = os.waitstatus_to_exitcode(status)

# A DataLoader forked from this process: its worker cannot iterate the stream, and this one is unaffected.
try:
    next(iter(DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="fork")))
    report["loader"] = None
except Exception as exc:
    report["loader"] = type(exc).__name__

batches = held + list(it) + list(iter(dev))  # the rest of the pass (one epoch), then the next one
np.savez(out, x=np.concatenate([x.numpy() for x, _ in batches]), y=np.concatenate([y.numpy() for _, y in batches]))
dev.close()
s.close()
report["me"] = os.getpid()
print(json.dumps(report))
"""


def test_adapters_in_a_forked_child_raise_the_one_line_and_the_parents_passes_go_on(store, tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "batches.npz"
    proc = subprocess.run([sys.executable, "-c", ADAPTER_SCRIPT, store, str(out)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["exit"] == 0, proc.stderr
    for name, raised in report["uses"].items():
        assert raised is not None, f"{name} in the forked child raised nothing"
        kind, message = raised
        assert kind == "ForkedStreamError" and "\n" not in message, (name, kind, message)
        assert f"opened in process {report['me']}, used in forked child {report['pid']}" in message
    assert report["loader"] == "ConfigError"  # the loader's worker is told to use num_workers=0

    with h5stream.open(store, **OPTIONS) as s:
        expected = [(x.copy(), y.copy()) for _ in range(2) for x, y in s]
    with np.load(out) as saved:
        assert np.array_equal(saved["x"], np.concatenate([x for x, _ in expected]))
        assert np.array_equal(saved["y"], np.concatenate([y for _, y in expected]))


ORPHAN_SCRIPT = r"""
import json, os, signal, sys
import h5stream

path, mode = sys.argv[1:3]
kw = {"pool": {"workers": 2}, "feeder": {"workers": 2, "feeder": True}}[mode]
s = h5stream.open(path, batch_size=32, seed=7, memory_budget="300MiB",
                  augment=h5stream.Augment.preset("standard", rescale=1 / 255), **kw)
it = iter(s)
next(it)
stats = s.stats()
pid = os.fork()
if pid == 0:
    sys.stdin.read()  # lives on until the test closes its stdin
    os._exit(0)
print(json.dumps({"me": os.getpid(), "child": pid, "worker_pids": stats["worker_pids"],
                  "feeder_pid": stats.get("feeder_pid")}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the parent dies, its forked child lives on
"""


@pytest.mark.parametrize("mode", ["pool", "feeder"])
def test_workers_and_feeder_of_a_killed_parent_exit_while_its_forked_child_lives_on(store, mode):
    from h5stream.memory.shm import sweep_stale_segments

    proc = subprocess.Popen([sys.executable, "-c", ORPHAN_SCRIPT, store, mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": REPO})
    child = None
    try:
        info = json.loads(proc.stdout.readline())
        child = psutil.Process(info["child"])
        assert proc.wait(timeout=SAFETY_S) == -9
        ours = [psutil.Process(p) for p in info["worker_pids"] + [info["feeder_pid"]] if p is not None and
                not _gone(p)]
        _, alive = psutil.wait_procs(ours, timeout=SAFETY_S)  # a safety net: they exit as soon as they see the end
        assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE  # the fork still holds its copies
        assert alive == [], f"the killed parent's processes still run beside its forked child: {alive}"
    finally:
        proc.stdin.close()
        if child is not None:
            psutil.wait_procs([child], timeout=SAFETY_S)
        proc.stdout.close()
        proc.stderr.close()
    sweep_stale_segments()  # what the killed parent created (the next stream does the same)
    assert segment_names(f"h5s_{info['me']}_") == [] and segment_names(f"h5s_{info['feeder_pid']}_") == []


CTRL_C_SCRIPT = r"""
import json, os, signal, sys, threading
import h5stream

inside, release_r, release_w = threading.Event(), *os.pipe()

def blocking(x):  # runs in the main thread, inside next() (Ctrl-C is held back there), once per image
    inside.set()
    os.read(release_r, 1)
    return x

def fork_meanwhile(report):
    inside.wait()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # this thread is the child's main (and only) thread, inside no h5stream call
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
            got = "nothing"
        except KeyboardInterrupt:
            got = "KeyboardInterrupt"
        os.write(w, got.encode())
        os._exit(0)
    os.close(w)
    report["child"] = os.read(r, 100).decode()
    os.waitpid(pid, 0)
    os.close(release_w)  # every later image goes through at once

report = {}
with h5stream.open(sys.argv[1], batch_size=32, seed=7, augment=h5stream.Augment(preprocessing_function=blocking)) as s:
    t = threading.Thread(target=fork_meanwhile, args=(report,))
    t.start()
    x, y = next(iter(s))
    t.join()
    report["parent_batch"] = len(x)
print(json.dumps(report))
"""


def test_ctrl_c_reaches_a_child_forked_by_another_thread_while_the_main_thread_waits_in_the_stream(store):
    proc = subprocess.run([sys.executable, "-c", CTRL_C_SCRIPT, store], capture_output=True, text=True,
                          timeout=SAFETY_S, env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"child": "KeyboardInterrupt", "parent_batch": 32}


WRITER_SCRIPT = r"""
import gc, json, os, sys
import numpy as np
from PIL import Image
from h5stream.ingest.decode import DecodeSpec
from h5stream.ingest.pool import DecodePool
from h5stream.store.lock import StoreLock, lock_holders, lock_path

folder, store = sys.argv[1:3]
names = [f"{i}.png" for i in range(8)]
for i, name in enumerate(names):
    Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(os.path.join(folder, name))
lock = StoreLock.acquire(store)
pool = DecodePool(1, DecodeSpec(size=(8, 8)).shape, rows_per_task=2)
pool.start()
pid = os.fork()
if pid == 0:
    lock.release()  # the child's copy: a no-op
    pool.close()
    del lock, pool
    gc.collect()
    sys.exit(0)  # and the finalizers at exit
_, status = os.waitpid(pid, 0)
report = {"child_exit": os.waitstatus_to_exitcode(status), "sidecar": os.path.exists(lock_path(store)),
          "holders": lock_holders(lock_path(store)), "me": os.getpid()}
chunks = [names[i:i + 2] for i in range(0, 8, 2)]
report["pixels"] = [int(images[k, 0, 0, 0]) for images, reasons, _ in pool.imap(folder, chunks, DecodeSpec(size=(8, 8)))
                    for k in range(len(reasons))]
pool.close()
lock.release()
report["sidecar_after_release"] = os.path.exists(lock_path(store))
print(json.dumps(report))
"""


def test_a_child_forked_during_a_write_leaves_the_lock_and_the_decode_workers_to_the_parent(tmp_path):
    folder = tmp_path / "src"
    folder.mkdir()
    proc = subprocess.run([sys.executable, "-c", WRITER_SCRIPT, str(folder), str(tmp_path / "out.h5")],
                          capture_output=True, text=True, timeout=SAFETY_S, env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["child_exit"] == 0
    assert report["sidecar"] and report["holders"] == [report["me"]]  # still the parent's, and only its
    assert report["pixels"] == list(range(8))  # its decode worker still serves it
    assert report["sidecar_after_release"] is False
