"""SIGKILL an ingest mid-run (a real process), then `--append` finishes it: the full set, once, in the same order."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import psutil
import pytest

from h5stream.ingest.pack import storage_permutation
from h5stream.samples import make_class_folder, nearest_class
from h5stream.memory.shm import segment_names
from h5stream.store import read_meta
from h5stream.store.handle import mark_flushing
from h5stream.store.schema import flushing_path
from h5stream.store import pathrows, rowdigest
from conftest import committed_rows


N_CLASSES, PER_CLASS = 3, 400
DEADLINE_S = 120.0



def append_finishes_the_set(cmd, out, written) -> None:
    """An interrupted ingest kept some committed rows; ``cmd --append`` adds exactly the rest."""
    rows = read_meta(out).rows
    assert 0 < rows < N_CLASSES * PER_CLASS
    resumed = subprocess.run(cmd + ["--append"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and f"already stored {rows}" in resumed.stdout, resumed.stderr
    with h5py.File(out, "r") as f:
        paths = [p.decode() for p in pathrows.stored_bytes(f, 0, int(f.attrs["committed_rows"]))]
    assert sorted(paths) == sorted(rel for rel, _ in written)


@pytest.fixture(scope="module")
def big_src(tmp_path_factory):
    root = tmp_path_factory.mktemp("crash") / "src"
    written = make_class_folder(root, classes=N_CLASSES, per_class=PER_CLASS, size=(96, 128), fmt="jpg", seed=3)
    return str(root), written


def test_sigkill_then_append_gives_exactly_the_full_set(big_src, tmp_path):
    root, written = big_src
    out = tmp_path / "crash.h5"
    cmd = [sys.executable, "-m", "h5stream", "ingest", root, str(out), "--size", "64", "--workers", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + DEADLINE_S
        seen = 0
        while proc.poll() is None and time.monotonic() < deadline:
            seen = committed_rows(out)
            if seen > 0:
                break
            time.sleep(0.005)  # polling interval, bounded by the deadline; not a synchronisation sleep
        assert proc.poll() is None, f"ingest ended before it could be killed: {proc.stderr.read().decode()}"
        assert seen > 0, "no rows committed before the deadline"
        workers = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    # Decode workers notice their parent died and exit on their own; then the resource tracker (also among
    # the children) unlinks the decode result slots the killed process could not.
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert alive == [], f"orphaned workers: {alive}"
    assert segment_names(f"h5s_{proc.pid}_") == [], "the killed ingest's shared memory was left in /dev/shm"

    total = N_CLASSES * PER_CLASS
    meta = read_meta(out)  # the killed file opens and is consistent up to its committed count
    assert 0 < meta.rows < total
    with h5py.File(out, "r") as f:
        labels = f["labels"][: meta.rows]
        images = f["images"][: meta.rows]
    assert all(nearest_class(img, N_CLASSES) == lab for img, lab in zip(images, labels))

    resumed = subprocess.run(cmd + ["--append"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"already stored {meta.rows}" in resumed.stdout
    assert read_meta(out).appended_from is None  # the same listing: one storage order, validation_split takes it

    expected = dict(written)
    walk = sorted(expected)
    with h5py.File(out, "r") as f:
        n = int(f.attrs["committed_rows"])
        assert n == total and f["images"].shape[0] == total and f["labels"].shape[0] == total
        paths = [p.decode() for p in pathrows.stored_bytes(f, 0, n)]
        labels = f["labels"][:n]
        images = f["images"][:n]
    assert len(set(paths)) == total and set(paths) == set(expected)  # every file exactly once
    # ... in exactly the order an uninterrupted run writes.
    assert paths == [walk[i] for i in storage_permutation(total, "shuffled", 0)]
    assert np.array_equal(labels, [expected[p] for p in paths])
    assert all(nearest_class(img, N_CLASSES) == lab for img, lab in zip(images, labels))


def test_ctrl_c_commits_exits_130_in_one_line_and_append_finishes(big_src, tmp_path):
    root, written = big_src
    out = tmp_path / "int.h5"
    # Commits every 64 rows: the first comes long before the last, so Ctrl-C after it lands mid-ingest even on a
    # loaded machine (with the default 1,024 the poll could miss that commit and see only the last, 1,200).
    cmd = [sys.executable, "-m", "h5stream", "ingest", root, str(out), "--size", "32", "--block-rows", "64",
           "--workers", "2", "--commit-rows", "64"]
    # Its own process group, like a shell job: Ctrl-C reaches the ingest and its workers together.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while proc.poll() is None and time.monotonic() < deadline and committed_rows(out) == 0:
            time.sleep(0.005)  # polling interval, bounded by the deadline
        assert proc.poll() is None, "ingest ended before it could be interrupted"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    # One line: how far it got and the command that finishes it (tests/test_unfinished.py checks the words).
    assert err.count("\n") == 1 and err.startswith("h5stream: interrupted: ") and err.endswith(" --append`\n"), err
    assert segment_names(f"h5s_{proc.pid}_") == []  # closed on the way out, not left to a tracker
    append_finishes_the_set(cmd, out, written)


def test_a_killed_decode_worker_is_one_line_keeps_committed_rows_and_append_finishes(big_src, tmp_path):
    root, written = big_src
    out = tmp_path / "worker.h5"
    cmd = [sys.executable, "-m", "h5stream", "ingest", root, str(out), "--size", "64", "--workers", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while proc.poll() is None and time.monotonic() < deadline and committed_rows(out) == 0:
            time.sleep(0.005)  # polling interval, bounded by the deadline
        assert proc.poll() is None, "ingest ended before a worker could be killed"
        children = psutil.Process(proc.pid).children(recursive=True)
        workers = [p for p in children if not any("resource_tracker" in part for part in p.cmdline())]
        assert len(workers) == 2, children
        workers[0].send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode not in (0, None)
    assert err.count("\n") == 1 and "decode worker died" in err and "--append" in err, err
    _, alive = psutil.wait_procs(children, timeout=30)  # the other worker and the resource tracker end too
    assert alive == [], alive
    assert segment_names(f"h5s_{proc.pid}_") == []
    append_finishes_the_set(cmd, out, written)  # the committed rows were kept and consistent


@pytest.mark.usefixtures("no_leaks")
def test_a_decode_worker_dying_between_results_is_a_worker_error_not_a_traceback(big_src):
    # A worker killed while the parent is between two results: the next wait sees its process end and
    # reads it as the same one-line WorkerError as a death mid-task (the CLI test above hits either by timing).
    from h5stream.errors import WorkerError
    from h5stream.ingest.decode import DecodeSpec
    from h5stream.ingest.pool import DecodePool

    root, _ = big_src
    rels = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
    spec = DecodeSpec(size=(16, 16))
    chunks = [rels[i:i + 4] for i in range(0, 4 * 8, 4)]
    pool = DecodePool(1, spec.shape, rows_per_task=4)
    try:
        pool.start()
        items = pool.imap(root, chunks, spec)
        next(items)
        (worker,) = [psutil.Process(pid) for pid in pool.pids]
        worker.kill()
        worker.wait(timeout=30)
        with pytest.raises(WorkerError, match="decode worker died.*--append"):
            for _ in items:
                pass
    finally:
        pool.close()


# -- a kill at every step of creating a store ------------------------------------------------------------------

SHIM_SOURCE = os.path.join(os.path.dirname(__file__), "kill_after_op.c")


@pytest.fixture(scope="module")
def kill_shim(tmp_path_factory):
    """The LD_PRELOAD library that SIGKILLs a process right after its K-th change to a file (see its source)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not sys.platform.startswith("linux") or cc is None:
        pytest.skip("needs Linux and a C compiler to build the LD_PRELOAD kill shim")
    lib = tmp_path_factory.mktemp("shim") / "kill_after_op.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), SHIM_SOURCE, "-ldl"], check=True,
                   capture_output=True, timeout=120)
    return str(lib)


def _store_state(out):
    """Committed rows and how many rows are stored (past the count: rows a killed writer left, which a torn
    flush may point beyond the file's end, so they are not read), the committed rows and the skip report's
    bytes."""
    with h5py.File(out, "r", locking=False) as f:
        n = int(f.attrs["committed_rows"])
        state = {"rows": n, "stored": [len(f[k]) for k in ("images", "labels", pathrows.row_node(f))],
                 "images": f["images"][:n], "labels": f["labels"][:n], "paths": pathrows.stored_bytes(f, 0, n),
                 "skipped": int(f.attrs["skipped_files"])}
        # Every committed row has its digest, and it is the digest of the row (past the count: anything).
        digests = f["row_digests"]
        state["digested"] = len(digests) >= n and np.array_equal(digests[:n], rowdigest.of_rows(state["images"]))
    report = str(out) + ".skipped.csv"
    state["report"] = open(report, "rb").read() if os.path.exists(report) else None
    return state


#: How the store is written, three commits of 8 rows each time (every commit after the first rewrites the published
#: file in place): through HDF5 alone (no worker), or whole pixel blocks (4 rows of 64x64x3, 12 pages) written with
#: O_DIRECT by the writer's I/O thread from a decode worker's slots while the main thread goes on.
WRITES = {"hdf5": ["--size", "8", "--commit-rows", "8", "--workers", "0"],
          "direct": ["--size", "64", "--block-rows", "4", "--commit-rows", "8", "--workers", "1"]}


def sampled_steps(steps: list[str], stride: int = 12) -> set[int]:
    """The steps (1-based) a kill sweep in `make test` takes: the first change of every kind (the call and the file
    it changes: the lock, the skip report, HDF5's writes to the temporary or the published store, the flushing
    marker, the rename, ...), the last change of the published store (the final flush) and every ``stride``-th
    step.  `make test-all` takes the rest too, so every step is killed at."""
    first, published = {}, []
    for k, line in enumerate(steps, start=1):
        _, call, path = line.split(" ", 2)
        first.setdefault((call, os.path.basename(path)), k)
        if not os.path.basename(path).endswith((".lock", ".creating", ".flushing", ".csv")):
            published.append(k)
    return set(first.values()) | set(published[-1:]) | set(range(stride, len(steps) + 1, stride))


def test_the_sample_of_a_kill_sweep_takes_every_kind_of_change_and_the_last_of_the_store():
    steps = ["1 open /d/o.h5.lock", "2 pwrite /d/o.h5.creating", "3 pwrite /d/o.h5.creating",
             "4 pwrite /d/o.h5.creating", "5 rename /d/o.h5", "6 pwrite /d/o.h5", "7 fsync /d/o.h5",
             "8 pwrite /d/o.h5", "9 pwrite /d/o.h5", "10 unlink /d/o.h5.lock"]
    assert sampled_steps(steps, stride=4) == {1, 2, 5, 6, 7, 9, 4, 8, 10}


#: Which steps a sweep kills at: a sample of every kind of change in `make test`, the rest in `make test-all`.
PARTS = ["sample", pytest.param("rest", marks=pytest.mark.slow)]


def _in_part(k: int, part: str, sample: set[int]) -> bool:
    return (k in sample) == (part == "sample")


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("writes", list(WRITES))
@pytest.mark.parametrize("part", PARTS)
def test_a_kill_at_every_step_of_creating_a_store_leaves_it_absent_or_whole(kill_shim, tmp_path, h5cli, part,
                                                                            writes):
    # A real ingest process SIGKILLs itself right after each of its changes to files in OUT's folder in turn (HDF5's
    # writes one by one, truncations, fallocates, fsyncs, renames, the lock and the skip report): every state a kill
    # can leave while a store is created and gets its first rows.  OUT must be absent, or a store `h5stream info`
    # opens, holding a prefix of the full run, or (killed while HDF5 rewrote the published store in place: later
    # commits rewrite headers and attributes, several writes each) one that readers refuse until it is rebuilt;
    # `--append` must finish it exactly, leaving no temporary file or marker.  (HDF5 rewrites headers in place and
    # the superblock last: a store visible under its name during its first flush of rows could be left
    # unreadable, "addr overflow ... eoa = 8192".)  make test kills at a sample of the steps that holds every kind
    # of change (sampled_steps), the slow tests at the rest.
    src = tmp_path / "src"
    make_class_folder(src, classes=2, per_class=10, size=(20, 24), fmt="png", seed=3)
    (src / "class_0" / "broken.png").write_bytes(b"not a png")  # the skip report is written too
    args = WRITES[writes]

    def killed_run(folder, after, log=None):
        env = dict(os.environ, LD_PRELOAD=kill_shim, KILL_DIR=str(folder), KILL_AFTER=str(after))
        if log is not None:
            env["KILL_LOG"] = str(log)
        cmd = [sys.executable, "-m", "h5stream", "ingest", str(src), str(folder / "o.h5"), *args]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)

    ref, log = tmp_path / "ref", tmp_path / "steps.log"
    ref.mkdir()
    whole = killed_run(ref, 0, log)
    assert whole.returncode == 0, whole.stderr
    steps = log.read_text().splitlines()
    assert any(" pwrite " in s and s.endswith("o.h5") for s in steps), steps  # the shim sees HDF5's own writes
    if writes == "direct":  # and the I/O thread's, with the main thread's steps between them
        assert any(" thread-pwrite " in s for s in steps), steps
    want = _store_state(ref / "o.h5")
    assert want["rows"] == 20 and want["stored"] == [20, 20, 20] and want["digested"]

    sample = sampled_steps(steps)
    for k, step in enumerate(steps, start=1):
        if not _in_part(k, part, sample):
            continue
        folder = tmp_path / f"k{k}"
        folder.mkdir()
        out = folder / "o.h5"
        killed = killed_run(folder, k)
        assert killed.returncode == -signal.SIGKILL, (step, killed.stderr)
        if os.path.exists(flushing_path(out)):
            # Killed while HDF5 rewrote the published store in place: readers refuse it until it is rebuilt,
            # by `repair` or by the next --append (every other case each).
            code, stdout, err = h5cli("info", out)
            assert code == 1 and "h5stream repair" in err and err.count("\n") == 1, (step, err)
            if k % 2:
                code, stdout, err = h5cli("repair", out)
                assert code == 0 and "rebuilt from its" in stdout, (step, err)
                assert not os.path.exists(flushing_path(out)) and h5cli("info", out)[0] == 0, step
                kept = _store_state(out)  # the committed rows, and nothing past them
                assert kept["stored"] == [kept["rows"]] * 3, step
                for key in ("images", "labels", "paths"):
                    assert np.array_equal(kept[key], want[key][:kept["rows"]]), (step, key)
        elif out.exists():
            code, stdout, err = h5cli("info", out)
            assert code == 0, f"killed after step {step}: `h5stream info` fails: {err}"
            kept = _store_state(out)
            n = kept["rows"]
            assert kept["digested"], step
            for key in ("images", "labels", "paths"):
                assert np.array_equal(kept[key][:n], want[key][:n]), (step, key)
        code, stdout, err = h5cli("ingest", src, out, *args, "--append")
        assert code == 0, f"killed after step {step}: --append fails: {err}"
        got = _store_state(out)
        assert got["digested"], step
        for key in ("images", "labels", "paths"):
            assert np.array_equal(got[key], want[key]), (step, key)
        assert [got[k] for k in ("rows", "stored", "skipped", "report")] == [
            want[k] for k in ("rows", "stored", "skipped", "report")], step  # no junk past the count either
        assert sorted(os.listdir(folder)) == ["o.h5", "o.h5.skipped.csv"], (step, os.listdir(folder))


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("part", PARTS)
def test_a_kill_at_every_step_of_a_repair_leaves_the_store_to_repair_again(kill_shim, tmp_path, h5cli, part):
    # `h5stream repair` killed after each of its file changes in turn (a sample of every kind in make test): the
    # store is the old one still marked (readers refuse it) or the rebuilt one, and the next repair ends with
    # exactly the committed rows, no temporary file and no marker.
    src = tmp_path / "src"
    make_class_folder(src, classes=2, per_class=10, size=(20, 24), fmt="png", seed=3)
    ref = tmp_path / "ref"
    ref.mkdir()
    assert h5cli("ingest", src, ref / "o.h5", "--size", "8", "--block-rows", "4", "--workers", "0")[0] == 0
    want = _store_state(ref / "o.h5")
    mark_flushing(str(ref / "o.h5"))

    def killed_repair(folder, after, log=None):
        env = dict(os.environ, LD_PRELOAD=kill_shim, KILL_DIR=str(folder), KILL_AFTER=str(after))
        if log is not None:
            env["KILL_LOG"] = str(log)
        return subprocess.run([sys.executable, "-m", "h5stream", "repair", str(folder / "o.h5")], env=env,
                              capture_output=True, text=True, timeout=300)

    whole, log = tmp_path / "whole", tmp_path / "steps.log"
    shutil.copytree(ref, whole)
    assert killed_repair(whole, 0, log).returncode == 0
    steps = log.read_text().splitlines()
    assert any(s.endswith("o.h5.creating") for s in steps) and any(" rename" in s for s in steps), steps
    sample = sampled_steps(steps)
    for k, step in enumerate(steps, start=1):
        if not _in_part(k, part, sample):
            continue
        folder = tmp_path / f"k{k}"
        shutil.copytree(ref, folder)
        out = folder / "o.h5"
        assert killed_repair(folder, k).returncode == -signal.SIGKILL, step
        if os.path.exists(flushing_path(out)):
            assert h5cli("info", out)[0] == 1, step  # refused until repaired
        else:
            got = _store_state(out)
            assert all(np.array_equal(got[key], want[key]) for key in ("images", "labels", "paths")), step
        code, stdout, err = h5cli("repair", out)
        assert code == 0, (step, err)
        got = _store_state(out)
        assert got["digested"], step
        for key in ("images", "labels", "paths"):
            assert np.array_equal(got[key], want[key]), (step, key)
        assert [got[key] for key in ("rows", "stored", "skipped")] == [want[key] for key in ("rows", "stored",
                                                                                             "skipped")], step
        assert sorted(os.listdir(folder)) == ["o.h5"], (step, os.listdir(folder))


def test_append_removes_what_a_killed_overwrite_left_beside_a_store(class_src, tmp_path, h5cli):
    # `--overwrite` writes the new store under a temporary name; killed there, the old store stays whole and
    # the next writer removes the leftover (the store's lock makes it ours).
    root, _ = class_src
    out = tmp_path / "o.h5"
    assert h5cli("ingest", root, out, "--size", "8", "--workers", "0")[0] == 0
    leftover = str(out) + ".creating"
    with open(leftover, "wb") as fh:
        fh.write(b"\x89HDF\r\n\x1a\n" + bytes(100))  # what a kill inside HDF5's first writes leaves
    code, stdout, err = h5cli("ingest", root, out, "--append", "--workers", "0")
    assert code == 0 and "already stored 18" in stdout, err
    assert not os.path.exists(leftover) and read_meta(out).rows == 18
