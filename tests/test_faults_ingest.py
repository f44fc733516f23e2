"""Faults an ingest meets on real machines, injected for real: a file size limit (EFBIG) or a full tmpfs (ENOSPC)
at any point of the write, a second writer racing for the same store, a writer killed while it holds it, and
hostile input (file names that are not UTF-8, unreadable folders, hidden and unlisted files).

Every write failure must leave the store as its last commit (no row published that did not reach the file), print
one line saying what failed, how many rows are kept and how to continue, exit non-zero; `--append` afterwards must
end byte-identical to an ingest that was never interrupted.
"""

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
from PIL import Image

from conftest import unprivileged_argv
from h5stream.ingest.decode import DecodeSpec, decode_file
from h5stream.samples import make_class_folder
from h5stream.store import read_meta, schema
from h5stream.store.checksum import verify_store
from h5stream.store.lock import lock_path
from h5stream.store import pathrows

pytestmark = pytest.mark.usefixtures("no_leaks")

# 7.4 MB of pixels (well past the fixed overhead) in 600 rows: commits every 256, so a fault mid-run keeps some
ARGS = ["--size", "64", "--block-rows", "32", "--commit-rows", "256", "--workers", "0"]
DEADLINE_S = 120.0
LIMITED = (
    "import resource, sys; n = int(sys.argv.pop(1)); resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); "
    "from h5stream.cli import run; sys.exit(run())"
)  # Python ignores SIGXFSZ, so a write past the limit fails with EFBIG instead of killing the process


def ingest_cmd(src, out, *extra, limit=None):
    head = [sys.executable, "-c", LIMITED, str(limit)] if limit is not None else [sys.executable, "-m", "h5stream"]
    return [*head, "ingest", str(src), str(out), *ARGS, *extra]


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def store_state(out):
    """Everything an ingest is judged by: committed rows, the three arrays (all stored rows, not only the committed
    ones: there must be no junk past the count), the skipped count and the skip report's text."""
    with h5py.File(out, "r", locking=False) as f:  # a stopped writer may still hold HDF5's own lock
        state = {
            "rows": int(f.attrs[schema.ATTR_COMMITTED]),
            "images": f[schema.IMAGES][:],
            "labels": f[schema.LABELS][:],
            "paths": pathrows.stored_bytes(f, 0, f["images"].shape[0]),
            "skipped": int(f.attrs[schema.ATTR_SKIPPED]),
            "checksums": f[schema.CHECKSUMS][:],
            "checksum_tail": f.attrs[schema.ATTR_CHECKSUM_TAIL],
        }
    report = schema.skipped_report_path(str(out))
    state["report"] = open(report, "rb").read() if os.path.exists(report) else None
    return state


def assert_same(got, want):
    assert got["rows"] == want["rows"]
    for key in ("images", "labels", "paths"):
        assert np.array_equal(got[key], want[key]), key
    assert got["skipped"] == want["skipped"] and got["report"] == want["report"]
    # The block checksums a recovered store ends with are the uninterrupted store's, and they check out.
    assert np.array_equal(got["checksums"], want["checksums"]) and got["checksum_tail"] == want["checksum_tail"]


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    """600 images in 3 classes, one bad file (so the skip report has a row) and one hidden file."""
    root = tmp_path_factory.mktemp("faults") / "src"
    make_class_folder(root, classes=3, per_class=200, size=(20, 24), fmt="png", seed=4)
    first = sorted(os.listdir(root))[0]
    (root / first / "broken.png").write_bytes(b"not a png")
    (root / first / ".DS_Store").write_bytes(b"\0")
    return root


@pytest.fixture(scope="module")
def reference(src, tmp_path_factory):
    """The uninterrupted ingest every interrupted one must end up equal to, and its file size."""
    out = tmp_path_factory.mktemp("ref") / "ref.h5"
    done = run(ingest_cmd(src, out))
    assert done.returncode == 0, done.stderr
    return store_state(out), os.path.getsize(out)


# (limit in bytes or as a fraction of the reference file, what the interrupted run keeps)
LIMITS = {
    "in the header": (1000, "nothing"),  # the empty store is ~12 kB: it is never created
    # The empty store fits, its first 256 rows (~3 MB) do not: a new store takes its name with its first rows.
    "first block": (100_000, "nothing"),
    "mid-run": (0.7, "some rows"),
    "at the end": (-1, "some rows"),  # one byte short of the uninterrupted file
}


# With decode workers the rows' blocks go straight to the disk (O_DIRECT, where the file system takes it) from
# the writer's I/O thread while the next ones are taken: the limit is met when the space for the next rows is
# reserved, with direct writes still in flight, and what the store keeps must not depend on them.
CASES = [(where, "0") for where in LIMITS] + [("mid-run", "2"), ("at the end", "2")]


@pytest.mark.parametrize("where, workers", CASES)
def test_a_file_size_limit_anywhere_keeps_the_last_commit_and_append_finishes_identically(src, reference, tmp_path,
                                                                                            where, workers):
    want, full_size = reference
    limit, keeps = LIMITS[where]
    limit = full_size - 1 if limit == -1 else int(limit * full_size) if isinstance(limit, float) else limit
    out = tmp_path / "o.h5"
    cmd = ingest_cmd(src, out, "--workers", workers)
    failed = run(ingest_cmd(src, out, "--workers", workers, limit=limit))
    err = failed.stderr
    assert failed.returncode == 1 and failed.stdout == "", (failed.stdout, err)
    assert err.count("\n") == 1 and err.startswith("h5stream: error: ") and "Traceback" not in err, err
    assert "File too large" in err and "ulimit -f" in err and "--append" in err, err
    assert not os.path.exists(str(out) + ".creating") and not os.path.exists(lock_path(out))
    if keeps == "nothing":
        assert not out.exists() and "nothing was written" in err
    else:
        kept = store_state(out)  # opens, and is exactly a prefix of the uninterrupted store: no junk rows
        n = kept["rows"]
        assert 0 < n < want["rows"], n
        assert f"{n} complete rows" in err, err
        for key in ("images", "labels", "paths"):
            assert len(kept[key]) == n and np.array_equal(kept[key], want[key][:n]), key
        assert os.path.getsize(out) <= limit
    resumed = run(cmd + ["--append"])
    assert resumed.returncode == 0, resumed.stderr
    assert_same(store_state(out), want)
    assert verify_store(out).ok


def test_a_file_size_limit_below_the_decode_slots_names_that_limit(src, tmp_path):
    # The decode workers' slots are one file of /dev/shm, which ulimit -f binds too: under a 100 kB limit even
    # the smallest layout (3 slots of 16 rows of 12 KiB) does not fit, and that is what the one line says
    out = tmp_path / "o.h5"
    failed = run(ingest_cmd(src, out, "--workers", "2", limit=100_000))
    err = failed.stderr
    assert failed.returncode == 1 and failed.stdout == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("h5stream: error: --workers 2 needs a shared-memory segment of 0.6 MiB"), err
    assert "file size limit (ulimit -f: 0.1 MiB)" in err and "--workers 0" in err and "/dev/shm free" not in err
    assert not out.exists() and not os.path.exists(lock_path(out))
    # under a limit the slots can shrink to, they do, and the ingest goes on until the store meets the limit
    failed = run(ingest_cmd(src, out, "--workers", "2", limit=2_000_000))
    assert failed.returncode == 1 and "cannot write (File too large)" in failed.stderr, failed.stderr


def test_failures_during_an_append_are_kept_apart_too(src, reference, tmp_path):
    # A run cut short, an --append cut short further on (with decode workers), then an --append that finishes.
    want, full_size = reference
    out = tmp_path / "o.h5"
    first = run(ingest_cmd(src, out, limit=int(0.6 * full_size)))
    rows_first = read_meta(out).rows
    second = run(ingest_cmd(src, out, "--append", "--workers", "1", limit=full_size - 1))
    assert first.returncode == second.returncode == 1, (first.stderr, second.stderr)
    assert 0 < rows_first < read_meta(out).rows < want["rows"], second.stderr
    assert f"{read_meta(out).rows} complete rows" in second.stderr
    resumed = run(ingest_cmd(src, out, "--append"))
    assert resumed.returncode == 0, resumed.stderr
    assert_same(store_state(out), want)


def test_an_ingest_that_fits_no_row_is_an_error_not_a_success(tmp_path):
    # Many tiny rows into little room: the whole run used to print "created ...: ingested N" and exit 0 while the
    # file on disk held committed_rows = 0 and no longer opened.
    root = tmp_path / "tiny"
    make_class_folder(root, classes=2, per_class=150, size=(8, 8), fmt="png", seed=5)
    out = tmp_path / "t.h5"
    failed = run([sys.executable, "-c", LIMITED, "200000", "ingest", str(root), str(out), "--size", "8",
                  "--workers", "0"])
    assert failed.returncode == 1 and failed.stdout == "" and "cannot write" in failed.stderr, failed.stderr
    assert "nothing was written" in failed.stderr and not out.exists()  # no store that holds no row


def _tmpfs_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _tmpfs_available(),
                    reason="needs unshare and user namespaces to mount a small tmpfs without root")
def test_a_full_disk_keeps_the_last_commit_and_append_finishes_identically(src, reference, tmp_path):
    # A real ENOSPC: the ingest writes into a 5 MiB tmpfs mounted in a user namespace of its own; what it left
    # there is copied out, then finished with --append where there is room.
    want, _ = reference
    mnt, saved = tmp_path / "mnt", tmp_path / "saved"
    mnt.mkdir()
    saved.mkdir()
    inner = " ".join(
        [f"mount -t tmpfs -o size=5m tmpfs {mnt} &&"]
        + [f"'{a}'" for a in ingest_cmd(src, mnt / "o.h5")]
        + [f"2> {tmp_path / 'err'}; echo $? > {tmp_path / 'rc'}; cp -a {mnt}/. {saved}/"]
    )
    subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", inner], check=True, timeout=300)
    err = (tmp_path / "err").read_text()
    assert (tmp_path / "rc").read_text().strip() == "1"
    assert err.count("\n") == 1 and "No space left on device" in err and "free some space" in err, err
    assert set(os.listdir(saved)) <= {"o.h5", "o.h5.skipped.csv"}  # no lock file, no temp file
    out = saved / "o.h5"
    kept = store_state(out)
    if kept["report"] is not None:  # as of its last flush: whole lines of the reference report
        assert want["report"].startswith(kept["report"]) and kept["report"].endswith(b"\n")
    n = kept["rows"]
    assert 0 < n < want["rows"] and f"{n} complete rows" in err, err
    for key in ("images", "labels", "paths"):
        assert len(kept[key]) == n and np.array_equal(kept[key], want[key][:n]), key
    resumed = run(ingest_cmd(src, out, "--append"))
    assert resumed.returncode == 0, resumed.stderr
    assert_same(store_state(out), want)


# -- one writer -------------------------------------------------------------------


def _wait_until(predicate, proc, what):
    """Poll ``predicate`` until it holds; fails if ``proc`` ends first or the deadline passes."""
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert proc.poll() is None, f"the ingest ended before {what}: {proc.stderr.read()}"
        assert time.monotonic() < deadline, f"no {what} before the deadline"
        time.sleep(0.005)  # polling interval, bounded by the deadline; not a synchronisation sleep


def _holds_lock(out, pid) -> bool:
    try:
        return open(lock_path(out)).read().strip() == str(pid)
    except FileNotFoundError:
        return False


def _committed(out) -> int:
    try:
        with h5py.File(out, "r", locking=False) as f:
            return int(f.attrs.get(schema.ATTR_COMMITTED, 0))
    except (OSError, KeyError):
        return 0


@pytest.mark.parametrize("mode", [[], ["--append"], ["--overwrite"]])
def test_a_second_writer_is_refused_at_once_naming_the_first(src, reference, tmp_path, h5cli, mode):
    want, _ = reference
    out = tmp_path / "o.h5"
    first = subprocess.Popen(ingest_cmd(src, out, "--workers", "1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        _wait_until(lambda: _holds_lock(out, first.pid) and _committed(out) > 0, first, "the first commit")
        first.send_signal(signal.SIGSTOP)  # frozen while it holds the store
        assert _holds_lock(out, first.pid), "the ingest finished before it could be stopped"
        before = store_state(out)
        code, stdout, err = h5cli("ingest", src, out, *ARGS, *mode)
        assert code == 1 and stdout == "", err
        assert err.count("\n") == 1 and f"another process (pid {first.pid}) is writing it" in err, err
        assert_same(store_state(out), before)  # the refused run touched nothing
        assert read_meta(out).rows == before["rows"]  # readers are not blocked by the writer's lock
        first.send_signal(signal.SIGCONT)
        _, first_err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGCONT)
            first.kill()
            first.wait()
    assert first.returncode == 0, first_err
    assert_same(store_state(out), want)
    assert not os.path.exists(lock_path(out))


def test_a_killed_writer_leaves_no_lock_that_blocks_the_next_run(src, reference, tmp_path):
    want, _ = reference
    out = tmp_path / "o.h5"
    cmd = ingest_cmd(src, out, "--workers", "1")
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_until(lambda: _holds_lock(out, first.pid) and _committed(out) > 0, first, "the first commit")
        workers = psutil.Process(first.pid).children(recursive=True)
        first.kill()
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    psutil.wait_procs(workers, timeout=30)
    assert _holds_lock(out, first.pid)  # its sidecar is still there, naming a dead process ...
    resumed = run(cmd + ["--append"])  # ... and blocks nobody
    assert resumed.returncode == 0, resumed.stderr
    assert_same(store_state(out), want)
    assert not os.path.exists(lock_path(out))


def test_two_writers_in_one_process_are_refused_too(tmp_path):
    from h5stream.errors import StoreBusyError
    from h5stream.store.writer import StoreWriter, write_arrays

    path = tmp_path / "s.h5"
    write_arrays(path, np.zeros((4, 2, 2, 3), np.uint8), np.arange(4))
    with StoreWriter.open_append(path) as w:
        with pytest.raises(StoreBusyError, match=f"this process \\(pid {os.getpid()}\\)"):
            StoreWriter.open_append(path)
        w.append(np.ones((2, 2, 2, 3), np.uint8), np.zeros(2), ["a", "b"])
    assert read_meta(path).rows == 6 and not os.path.exists(lock_path(path))
    with StoreWriter.open_append(path):  # released by close: taken again
        pass


CONTENDER = r"""
import os, sys
from h5stream.errors import StoreBusyError
from h5stream.store.lock import StoreLock
store, marker, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
held = 0
while held < rounds:
    try:
        lock = StoreLock.acquire(store)
    except StoreBusyError as exc:
        assert exc.pid is None or exc.pid != os.getpid(), exc
        continue
    fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # fails if another holder is inside too
    os.close(fd)
    os.unlink(marker)
    lock.release()
    held += 1
print(held)
"""


def test_racing_writers_hold_the_lock_one_at_a_time(tmp_path):
    # The sidecar is removed on release while others wait on it: a contender that opened the old file must not
    # think it holds the lock on the new one.
    store, marker = tmp_path / "s.h5", tmp_path / "inside"
    procs = [subprocess.Popen([sys.executable, "-c", CONTENDER, str(store), str(marker), "200"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in results]
    assert [out.strip() for out, _ in results] == ["200"] * 4
    assert not os.path.exists(lock_path(store))


# -- hostile input -----------------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="file names are bytes on Linux")
def test_a_file_name_that_is_not_utf8_is_ingested_and_kept_byte_for_byte(class_src_copy, tmp_path, h5cli):
    root, written = class_src_copy
    raw = b"cat/caf\xe9 \xff.png"  # Latin-1 bytes: not valid UTF-8
    name = os.fsdecode(os.path.join(os.fsencode(root), raw))
    Image.new("RGB", (30, 40), (40, 200, 40)).save(name, format="PNG")
    out = tmp_path / "u.h5"
    code, stdout, err = h5cli("ingest", root, out, "--size", "8", "--workers", "1")
    assert code == 0 and "ingested 19, skipped 0" in stdout, err
    with h5py.File(out, "r") as f:
        stored = pathrows.stored_bytes(f, 0, 19)
        row = stored.index(raw)  # the original bytes, not a replacement character
        image = f[schema.IMAGES][row]
    rel = schema.decode_path(stored[row])
    assert schema.encode_path(rel) == raw and os.path.exists(os.path.join(root, rel))  # round-trips, opens
    np.testing.assert_array_equal(image, decode_file(name, DecodeSpec(size=(8, 8))))
    code, stdout, _ = h5cli("ingest", root, out, "--append", "--workers", "0")
    assert code == 0 and "ingested 0" in stdout and "already stored 19" in stdout  # recognised as stored


def test_what_is_left_out_on_purpose_is_counted_and_listed(class_src_copy, tmp_path, h5cli):
    root, _ = class_src_copy
    os.makedirs(os.path.join(root, ".ipynb_checkpoints"))
    open(os.path.join(root, "cat", ".DS_Store"), "wb").close()
    shutil.copy(os.path.join(root, "cat", sorted(os.listdir(os.path.join(root, "cat")))[1]),
                os.path.join(root, "stray.png"))
    out = tmp_path / "h.h5"
    code, stdout, err = h5cli("ingest", root, out, "--size", "8", "--workers", "0")
    assert code == 0, err
    assert "ingested 18, skipped 0, left out 3 (2 hidden, 1 not in a class folder)" in stdout, stdout
    report = _report(out)
    assert set(report) == {".ipynb_checkpoints/", "cat/.DS_Store", "stray.png"}
    assert report["cat/.DS_Store"] == "left out: hidden file (name starts with '.')"
    assert report["stray.png"].startswith("left out: ") and "class subfolders" in report["stray.png"]
    assert read_meta(out).skipped_files == 0  # what is left out on purpose is not a skipped file


def test_files_the_labels_csv_does_not_list_are_counted_and_listed(regression_src, tmp_path, h5cli):
    root, csv_path, rows = regression_src
    lines = open(csv_path).read().splitlines()
    part = tmp_path / "part.csv"
    part.write_text("\n".join(lines[:-2]) + "\n")  # the last two images are not listed
    out = tmp_path / "r.h5"
    code, stdout, err = h5cli("ingest", root, out, "--labels", part, "--size", "8", "--workers", "0")
    assert code == 0, err
    assert f"ingested {len(rows) - 2}, skipped 0, left out 2 (2 not in the labels CSV)" in stdout, stdout
    unlisted = {line.split(",")[0] for line in lines[-2:]}
    report = _report(out)
    assert set(report) == unlisted and set(report.values()) == {"left out: image file not listed in part.csv"}
    assert read_meta(out).skipped_files == 0


def _report(out):
    import csv

    with open(schema.skipped_report_path(str(out)), newline="") as fh:
        return {r[0]: r[1] for r in list(csv.reader(fh))[1:]}


@pytest.mark.skipif(unprivileged_argv() is None, reason="running as root without setpriv: every folder is readable")
def test_an_unreadable_folder_is_counted_listed_and_the_rest_ingested(class_src_copy, tmp_path):
    root, written = class_src_copy
    locked = os.path.join(root, "dog", "locked")
    os.makedirs(locked)
    shutil.copy(os.path.join(root, "dog", sorted(os.listdir(os.path.join(root, "dog")))[0]), locked)
    os.chmod(locked, 0)
    out = tmp_path / "p.h5"
    try:
        done = subprocess.run(unprivileged_argv() + [sys.executable, "-m", "h5stream", "ingest", root, str(out),
                                                 "--size", "8", "--workers", "0"],
                              capture_output=True, text=True, timeout=300)
        strict = subprocess.run(unprivileged_argv() + [sys.executable, "-m", "h5stream", "ingest", root,
                                                   str(tmp_path / "s.h5"), "--strict", "--workers", "0"],
                                capture_output=True, text=True, timeout=300)
    finally:
        os.chmod(locked, 0o755)
    assert done.returncode == 0, done.stderr
    assert "ingested 18, skipped 1 (1 unreadable folder)" in done.stdout, done.stdout
    assert _report(out) == {"dog/locked/": "folder not readable (Permission denied); its files were not seen"}
    assert read_meta(out).skipped_files == 1
    assert strict.returncode == 1 and "dog/locked" in strict.stderr and "--strict" in strict.stderr, strict.stderr


@pytest.mark.skipif(unprivileged_argv() is None, reason="running as root without setpriv: every file is writable")
def test_a_skip_report_that_cannot_be_written_stops_the_run_keeping_the_last_commit(class_src_copy, tmp_path):
    root, _ = class_src_copy
    out = tmp_path / "r.h5"
    cmd = [sys.executable, "-m", "h5stream", "ingest", root, str(out), "--size", "8", "--workers", "0"]
    open(os.path.join(root, "cat", "empty.png"), "wb").close()
    assert run(cmd).returncode == 0
    before = store_state(out)
    make_class_folder(tmp_path / "more", classes=["emu"], per_class=3, size=(30, 40), seed=6)
    shutil.move(str(tmp_path / "more" / "emu"), os.path.join(root, "emu"))
    open(os.path.join(root, "emu", "empty.png"), "wb").close()  # a new skip: the report must grow
    report = schema.skipped_report_path(str(out))
    os.chmod(report, 0o444)
    try:
        failed = subprocess.run(unprivileged_argv() + cmd + ["--append"], capture_output=True, text=True, timeout=300)
    finally:
        os.chmod(report, 0o644)
    err = failed.stderr
    assert failed.returncode == 1 and err.count("\n") == 1, err
    assert "cannot write the skip report (Permission denied)" in err and "18 complete rows" in err, err
    assert_same(store_state(out), before)
    assert run(cmd + ["--append"]).returncode == 0
    assert read_meta(out).rows == 21 and len(_report(out)) == 2


def test_too_many_workers_are_capped_with_a_line_saying_so(class_src, tmp_path, h5cli):
    from h5stream.ingest.pack import max_workers

    root, _ = class_src
    code, stdout, err = h5cli("ingest", root, tmp_path / "w.h5", "--size", "8", "--workers", "1000")
    assert code == 0 and "ingested 18" in stdout, err
    assert err == f"h5stream: --workers 1000 is more than this machine can use; decoding with {max_workers()} " \
                  f"(2 per CPU available)\n"


def test_a_symlink_to_a_store_shares_its_lock(tmp_path):
    from h5stream.errors import StoreBusyError
    from h5stream.store.lock import StoreLock

    real, link = tmp_path / "real.h5", tmp_path / "link.h5"
    real.write_bytes(b"")
    link.symlink_to(real)
    with StoreLock.acquire(real):
        with pytest.raises(StoreBusyError, match="this process"):
            StoreLock.acquire(link)
    assert sorted(os.listdir(tmp_path)) == ["link.h5", "real.h5"]


# -- process limits --------------------------------------------------------------------


def _open_files_limit(n):
    """preexec_fn: at most ``n`` file descriptors in the child (``ulimit -n n``)."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))


def test_too_many_open_files_is_one_line_and_keeps_what_was_committed(src, reference, tmp_path):
    # `ulimit -n 16` with decode workers: their pipes cannot all be opened.  One line naming the limit and the two
    # ways out, the store exactly as before, and `--append` with room finishes it.
    want, full_size = reference
    out = tmp_path / "o.h5"
    cmd = ingest_cmd(src, out)
    assert run(ingest_cmd(src, out, limit=int(0.6 * full_size))).returncode == 1  # a store holding some rows
    before = store_state(out)
    assert 0 < before["rows"] < want["rows"]
    failed = subprocess.run(cmd + ["--append", "--workers", "4"], capture_output=True, text=True, timeout=300,
                            preexec_fn=_open_files_limit(16))
    err = failed.stderr
    assert failed.returncode == 1 and failed.stdout == "", err
    assert err.count("\n") == 1 and err.startswith("h5stream: error: ") and "Traceback" not in err, err
    assert "too many open files" in err and "ulimit -n is 16" in err and "--workers" in err and "--append" in err
    assert_same(store_state(out), before)
    assert not os.path.exists(lock_path(out))
    resumed = run(cmd + ["--append"])
    assert resumed.returncode == 0, resumed.stderr
    assert_same(store_state(out), want)


DECODE_WITHOUT_DESCRIPTORS = r"""
import os, sys
from h5stream.ingest.decode import DecodeSpec, SkipFile, decode_file
spec = DecodeSpec(size=(8, 8))
decode_file(sys.argv[1], spec)  # Pillow's plugins are loaded: nothing left to import
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass  # every descriptor the limit allows is taken
try:
    decode_file(sys.argv[1], spec)
except SkipFile as exc:
    print("skipped:", exc)
except OSError as exc:
    print("raised:", exc.errno)
"""


def test_running_out_of_descriptors_is_not_a_bad_image(src):
    # A good image that cannot be opened because the process has no descriptor left is not skipped (it would be
    # reported bad and the run would succeed without it): the OSError goes up to become the one-line error.
    import errno

    image = next(os.path.join(src, d, f) for d in sorted(os.listdir(src)) for f in sorted(os.listdir(src / d))
                 if f.endswith(".png") and f != "broken.png")
    done = subprocess.run([sys.executable, "-c", DECODE_WITHOUT_DESCRIPTORS, image], capture_output=True, text=True,
                          timeout=120, preexec_fn=_open_files_limit(64))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"raised: {errno.EMFILE}", done.stdout
