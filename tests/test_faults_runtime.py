"""Runtime faults with real processes and files: readers beside a writer, the user's own HDF5 handles, Ctrl-C
anywhere, a process group killed by SIGKILL, an unreadable store, odd labels, a missing plotting library, a
closed output pipe.

Processes report where they are through stdout lines and wait on stdin where a test must act at a known point;
timeouts are safety nets, never the assertion.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import textwrap

import h5py
import numpy as np
import psutil
import pytest
import tables

import h5stream
from conftest import unprivileged_argv
from h5stream.errors import StoreBusyError, StorePermissionError
from h5stream.memory.shm import segment_names
from h5stream.store import read_meta
from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")

SAFETY_S = 120.0
ROWS = 128


def pattern(row_ids) -> np.ndarray:
    """The pixel value every test store holds at each row: a function of the row id."""
    return (np.asarray(row_ids) % 251).astype(np.uint8)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """128 rows of 8x8x3, pixels ``pattern(row)``, labels ``row % 3``, blocks of 16 rows, uncompressed."""
    path = tmp_path_factory.mktemp("faults") / "s.h5"
    ids = np.arange(ROWS)
    images = np.broadcast_to(pattern(ids)[:, None, None, None], (ROWS, 8, 8, 3))
    write_arrays(path, images, ids % 3, block_rows=16)
    return str(path)


def check_epoch(stream) -> int:
    """Stream one ``iter(stream)`` (the rest of a restored epoch, else a whole one); every batch holds the rows
    ``epoch_order`` names, with their pixels and labels.  Returns the rows of the whole epoch."""
    it = iter(stream)  # from here on state() and epoch_order() describe what this iterator serves
    order = stream.epoch_order()
    seen = stream.state()["batch"] * stream.batch_size
    for x, y in it:
        ids = order[seen:seen + len(x)]
        assert (x == pattern(ids)[:, None, None, None]).all()
        assert np.array_equal(y, ids % 3)
        seen += len(x)
    assert seen == stream.meta.rows
    return seen


_pending: dict[int, bytes] = {}  # what was read from a subprocess's stdout past its last full line, by pid


def readline(proc, what: str) -> str:
    """The next stdout line of ``proc``; fails (with its stderr) if none comes within the safety net.

    Reads the pipe with ``os.read``, never through Python's buffered reader, so a line already read from
    the pipe cannot sit in a buffer while ``select`` waits for more.
    """
    fd = proc.stdout.fileno()
    buf = _pending.pop(proc.pid, b"")
    while b"\n" not in buf:
        if not select.select([fd], [], [], SAFETY_S)[0]:
            proc.kill()
            pytest.fail(f"no '{what}' line from the subprocess: {proc.communicate()[1]}")
        chunk = os.read(fd, 65536)
        if not chunk:
            pytest.fail(f"the subprocess ended before '{what}': {proc.communicate()[1]}")
        buf += chunk
    line, _, rest = buf.partition(b"\n")
    _pending[proc.pid] = rest
    return line.decode().strip()


# -- the user's own handles in the same process -----------------------------------------------------------------


def _user_open(lib, path):
    return h5py.File(path) if lib == "h5py" else tables.open_file(path)


def _user_labels(lib, handle):
    return handle["labels"][:5] if lib == "h5py" else handle.root.labels[:5]


@pytest.mark.parametrize("lib", ["h5py", "tables"])
@pytest.mark.parametrize("user_first", [True, False], ids=["user-first", "stream-first"])
def test_default_h5py_and_pytables_handles_work_beside_an_open_stream(store, lib, user_first):
    if user_first:
        with _user_open(lib, store) as handle, h5stream.open(store, batch_size=16) as s:
            check_epoch(s)
            assert np.array_equal(_user_labels(lib, handle), np.arange(5) % 3)
    else:
        with h5stream.open(store, batch_size=16) as s:
            next(iter(s))
            with _user_open(lib, store) as handle:
                assert np.array_equal(_user_labels(lib, handle), np.arange(5) % 3)
                check_epoch(s)  # after the peek, a whole epoch (the next one), then another
                check_epoch(s)


def test_info_runs_while_the_user_holds_a_default_h5py_handle(store, h5cli):
    with h5py.File(store) as handle:
        code, out, err = h5cli("info", store, "--json")
        assert handle["labels"].shape == (ROWS,)
    assert code == 0 and json.loads(out)["rows"] == ROWS, err


@pytest.mark.parametrize("kind", ["class", "regression"])
def test_labels_not_cached_are_read_by_byte_offset_across_label_chunks(tmp_path, kind):
    from h5stream.streaming.planning import plan_stream
    from h5stream.read.plan import parse_bytes
    from h5stream.read.reader import Reader
    from h5stream.streaming.config import layout_function

    rows = 2500  # labels are chunked by 1024 rows: runs cross chunk boundaries
    ids = np.arange(rows)
    labels = ids % 7 if kind == "class" else np.stack([ids * 0.5, -ids], axis=1).astype(np.float32)
    path = tmp_path / f"{kind}.h5"
    meta = write_arrays(path, np.broadcast_to(pattern(ids)[:, None, None, None], (rows, 2, 2, 1)), labels,
                        block_rows=64)
    plan = plan_stream(meta, parse_bytes("16MiB"), 50)
    layout = layout_function(meta.rows, plan, seed=5)

    def allocate(n, images=True):
        return np.empty((n, *meta.image_shape), np.uint8), np.empty((n, *meta.label_shape), meta.label_dtype), None

    reader = Reader(meta, layout, queue_depth=4, allocate=allocate, cache_labels=False)
    try:
        seen = []
        for _ in range(2 * layout(0).n_batches):  # two epochs
            batch = reader.get()
            assert np.array_equal(batch.labels, labels[batch.row_ids])
            assert (batch.images == pattern(batch.row_ids)[:, None, None, None]).all()
            seen.append(batch.row_ids)
        assert reader._rows._label_offsets is not None and reader.all_labels is None  # the path under test
    finally:
        reader.close()
    assert sorted(np.concatenate(seen).tolist()) == sorted(2 * ids.tolist())


# -- readers while another process writes ------------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import select, sys
    import numpy as np
    from h5stream.store.writer import StoreWriter

    path, compression, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    w = StoreWriter.create(path, image_shape=(8, 8, 3), class_names=["a", "b", "c"], block_rows=16,
                           compression=None if compression == "none" else compression, overwrite=True)

    def append(n):
        ids = np.arange(w.images.nrows, w.images.nrows + n)
        images = np.broadcast_to((ids % 251).astype(np.uint8)[:, None, None, None], (n, 8, 8, 3))
        w.append(images, ids % 3, [f"r{i}" for i in ids])

    append(64)
    w.commit()
    if mode == "hold":  # committed rows, then more appended but not committed, the lock held meanwhile
        append(16)
        print("holding", flush=True)
        sys.stdin.readline()
    else:  # commit 16 rows after 16 rows until told to stop
        print("writing", flush=True)
        while not select.select([sys.stdin], [], [], 0)[0]:
            append(16)
            w.commit()
    w.close()
    print("done", w.committed_rows, flush=True)
    """
)


def start_writer(path, mode, compression="none"):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), compression, mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert readline(proc, mode) in ("holding", "writing")
    return proc


def stop_writer(proc) -> int:
    proc.stdin.write("stop\n")
    proc.stdin.flush()
    out, err = proc.communicate(timeout=SAFETY_S)
    assert proc.returncode == 0, err
    return int(out.split()[-1])


def test_info_bench_preview_and_open_read_the_committed_rows_while_a_writer_holds_the_file(tmp_path, h5cli):
    path = tmp_path / "w.h5"
    writer = start_writer(path, "hold")
    try:
        with h5py.File(path, "r") as f:  # the writer shares HDF5's lock with readers: a default open works
            assert int(f.attrs["committed_rows"]) == 64
        code, out, err = h5cli("info", path, "--json")
        assert code == 0 and json.loads(out)["rows"] == 64, err
        code, out, err = h5cli("bench", path, "--json", "--batch-size", "16", "--random-seconds", "0.05")
        assert code == 0, err
        assert json.loads(out)["rows_streamed"] == 64
        code, out, err = h5cli("preview", path, "--out", tmp_path / "p.png", "--rows", "2", "--cols", "2")
        assert code == 0 and (tmp_path / "p.png").exists(), err
        with h5stream.open(path, batch_size=16) as s:
            assert check_epoch(s) == 64
        with h5stream.open(path, batch_size=16, augment=h5stream.Augment(horizontal_flip=False), workers=1) as s:
            assert check_epoch(s) == 64
    finally:
        rows = stop_writer(writer)
    assert rows == 80 and read_meta(path).rows == 80


# A real `h5stream ingest`, held right after its first commit: PyTables' lock held, the decode workers up.
HELD_INGEST = textwrap.dedent(
    """
    import sys
    from h5stream.store.writer import StoreWriter

    commit = StoreWriter.commit

    def commit_and_hold(self):
        rows = commit(self)
        if rows and not getattr(self, "held", False):
            self.held = True
            print("committed", rows, flush=True)
            sys.stdin.readline()
        return rows

    StoreWriter.commit = commit_and_hold
    if __name__ == "__main__":
        from h5stream import cli
        sys.exit(cli.main(sys.argv[1:]))
    """
)


def test_info_and_open_work_while_a_real_ingest_holds_the_file(tmp_path, class_src, h5cli):
    root, written = class_src
    out = tmp_path / "ingesting.h5"
    script = tmp_path / "ingest.py"
    script.write_text(HELD_INGEST)
    proc = subprocess.Popen([sys.executable, str(script), "ingest", root, str(out), "--size", "8", "--workers", "1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        rows = int(readline(proc, "committed").split()[1])
        code, info, err = h5cli("info", out, "--json")
        assert code == 0 and json.loads(info)["rows"] == rows, err
        with h5stream.open(out, batch_size=4) as s:
            assert sum(len(x) for x, _ in s) == rows
    finally:
        proc.stdin.write("go\n")
        proc.stdin.flush()
        _, err = proc.communicate(timeout=SAFETY_S)
    assert proc.returncode == 0, err
    assert read_meta(out).rows == len(written)


def test_a_compressed_store_being_written_cannot_be_streamed_and_says_so_in_one_line(tmp_path, h5cli):
    path = tmp_path / "z.h5"
    writer = start_writer(path, "hold", compression="zlib")
    try:
        assert read_meta(path).rows == 64  # its metadata reads fine
        with pytest.raises(StoreBusyError, match=rf"process {writer.pid} is writing this file"):
            with h5stream.open(path, batch_size=16) as s:
                next(iter(s))
        code, _, err = h5cli("preview", path, "--out", tmp_path / "p.png")
        assert code == 1 and err.count("\n") == 1 and f"process {writer.pid} is writing" in err, err
    finally:
        stop_writer(writer)
    with h5stream.open(path, batch_size=16) as s:  # once the writer is done, it streams
        assert check_epoch(s) == 80


def test_readers_racing_a_committing_writer_get_consistent_rows_or_a_busy_error(tmp_path, capsys):
    from h5stream import cli

    path = tmp_path / "race.h5"
    writer = start_writer(path, "loop")
    outcomes = []
    try:
        for _ in range(6):
            try:
                rows = read_meta(path).rows
                with h5stream.open(path, batch_size=16, seed=len(outcomes)) as s:
                    assert check_epoch(s) >= rows
                assert cli.main(["info", str(path), "--json"]) == 0
                assert json.loads(capsys.readouterr().out)["rows"] >= rows
                outcomes.append("read")
            except StoreBusyError:
                outcomes.append("busy")
    finally:
        final = stop_writer(writer)
    assert "read" in outcomes, outcomes
    assert read_meta(path).rows == final


# -- Ctrl-C -------------------------------------------------------------------------------------------------------

LOOP = textwrap.dedent(
    """
    import sys
    import threading
    import h5stream

    def say(*words):
        print(*words, flush=True)

    if __name__ == "__main__":
        path, workers = sys.argv[1], int(sys.argv[2])
        augment = h5stream.Augment(horizontal_flip=True)
        while True:
            try:
                say("opening")
                with h5stream.open(path, batch_size=8, seed=0, augment=augment, workers=workers) as s:
                    say("opened")
                    n = 0
                    while s.epoch < 3:
                        for _ in s:
                            n += 1
                            say("batch", n)
                        say("epoch", s.epoch)
                    say("closing")
                say("closed")
            except KeyboardInterrupt:
                say("threads", threading.active_count())  # the stream's threads all ended
                say("interrupted")
                if sys.stdin.readline() != "again\\n":
                    raise
    """
)

# (line, occurrence) after which SIGINT is sent: in open, mid-batch, at epoch boundaries (16 batches an epoch),
# in close, between streams.
CTRL_C_POINTS = [("opening", 1), ("opened", 1), ("batch", 3), ("batch", 16), ("epoch", 1), ("batch", 17),
                 ("epoch", 2), ("closing", 1), ("closed", 1)]


def _group_leftovers(proc) -> tuple[list, list]:
    """Children of ``proc`` other than its resource tracker, and its segments."""
    children = [p for p in psutil.Process(proc.pid).children(recursive=True)
                if not any("resource_tracker" in part for part in p.cmdline())
                and p.status() != psutil.STATUS_ZOMBIE]
    return children, segment_names(f"h5s_{proc.pid}_")


@pytest.mark.parametrize("workers", [2, 0], ids=["workers2", "inline"])
def test_ctrl_c_anywhere_in_a_short_epoch_loop_raises_keyboard_interrupt_and_leaves_nothing(tmp_path, store, workers):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    proc = subprocess.Popen([sys.executable, str(script), store, str(workers)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    err, _ = ctrl_c_everywhere(proc)
    assert proc.returncode != 0 and err.rstrip().endswith("KeyboardInterrupt"), err
    assert "leaked" not in err and "h5stream-augment" not in err, err  # workers ignored SIGINT, nothing for the tracker
    assert segment_names(f"h5s_{proc.pid}_") == []


def ctrl_c_everywhere(proc) -> tuple[str, set[int]]:
    """Ctrl-C (SIGINT to the whole group) at each of :data:`CTRL_C_POINTS` of a :data:`LOOP` script ``proc``
    (started in a session of its own), checking after each that one thread is left and no process or segment of
    the group; then "stop".  Returns its stderr and the pids of feeder processes its "opened PID" lines named
    (their segments are checked too)."""
    feeders: set[int] = set()
    try:
        for k, (where, count) in enumerate(CTRL_C_POINTS):
            seen = 0
            while seen < count:
                words = readline(proc, where).split()
                seen += words[0] == where
                if words[0] == "opened" and len(words) > 1:
                    feeders.add(int(words[1]))
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group, workers included
            threads = None
            while not (line := readline(proc, f"interrupted after {where} {count}")).endswith("interrupted"):
                # A KeyboardInterrupt inside the script's own print() can leave "batch 16" without its newline,
                # so "threads N" may end a line that starts with something else.
                found = re.search(r"threads (\d+)$", line)
                if found:
                    threads = int(found.group(1))
                if line.startswith("opened ") and len(line.split()) > 1:
                    feeders.add(int(line.split()[1]))
            assert threads == 1, (where, count, threads)
            children, segments = _group_leftovers(proc)
            segments += [n for pid in feeders for n in segment_names(f"h5s_{pid}_")]
            assert children == [] and segments == [], (where, count, children, segments)
            proc.stdin.write("again\n" if k < len(CTRL_C_POINTS) - 1 else "stop\n")
            proc.stdin.flush()
        _, err = proc.communicate(timeout=SAFETY_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return err, feeders


# -- a process group killed by SIGKILL ----------------------------------------------------------------------------

STREAM_VICTIM = textwrap.dedent(
    """
    import sys
    import h5stream

    if __name__ == "__main__":
        s = h5stream.open(sys.argv[1], batch_size=8, augment=h5stream.Augment(horizontal_flip=True), workers=2)
        next(iter(s))
        print("streaming", flush=True)
        while True:
            for _ in s:
                pass
    """
)

# An ingest held after its first decoded chunk: workers up, slots in /dev/shm, rows still to come.
INGEST_VICTIM = textwrap.dedent(
    """
    import sys
    from h5stream.ingest import pool

    decoded = pool.DecodePool.imap

    def imap(self, *args, **kwargs):
        for k, item in enumerate(decoded(self, *args, **kwargs)):
            yield item
            if k == 0:
                print("ingesting", flush=True)
                sys.stdin.readline()

    pool.DecodePool.imap = imap
    if __name__ == "__main__":
        from h5stream import cli
        sys.exit(cli.main(sys.argv[1:]))
    """
)


def _dev_shm_mapped(pids) -> set[str]:
    """Files under /dev/shm that any of ``pids`` has mapped and that still have a name (shared-memory segments,
    named semaphores; one already unlinked, as a fork-context semaphore is at once, cannot outlive anyone)."""
    found = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as fh:
                fields = [line.split(None, 5) for line in fh]
        except OSError:
            continue
        found.update(f[5].strip() for f in fields
                     if len(f) == 6 and f[5].startswith("/dev/shm/") and not f[5].rstrip().endswith("(deleted)"))
    return found


def _kill_group(proc) -> set[str]:
    """SIGKILL ``proc``'s whole process group (tracker included); return the /dev/shm files the group had mapped."""
    group = [proc.pid] + [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    mapped = _dev_shm_mapped(group)
    members = [psutil.Process(pid) for pid in group[1:]]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=SAFETY_S)
    _, alive = psutil.wait_procs(members, timeout=SAFETY_S)
    assert alive == [], alive
    return mapped


# The killed group's processes and the next one share a namespace of their own (own_shm_namespace): no other
# h5stream process on the machine sweeps the killed group's segments before the next one here does.
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_group_sigkill_mid_stream_leaves_nothing_once_the_next_stream_opens(tmp_path, store, own_shm_namespace):
    script = tmp_path / "victim.py"
    script.write_text(STREAM_VICTIM)
    proc = subprocess.Popen([sys.executable, str(script), store], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    assert readline(proc, "streaming") == "streaming"
    mapped = _kill_group(proc)
    left = segment_names(f"{own_shm_namespace}_{proc.pid}_")
    assert left, "nothing was left to clean: the test would prove nothing"
    assert not [m for m in mapped if m.startswith("/dev/shm/sem.")], mapped
    opened = subprocess.run([sys.executable, "-c", "import h5stream, sys; h5stream.open(sys.argv[1]).close()", store],
                            capture_output=True, text=True, timeout=SAFETY_S)
    assert opened.returncode == 0, opened.stderr
    assert segment_names(f"{own_shm_namespace}_{proc.pid}_") == []
    assert [m for m in mapped if os.path.exists(m)] == []


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_group_sigkill_mid_ingest_leaves_nothing_once_the_next_ingest_runs(tmp_path, class_src, own_shm_namespace):
    root, _ = class_src
    script = tmp_path / "victim.py"
    script.write_text(INGEST_VICTIM)
    cmd = [sys.executable, str(script), "ingest", root, str(tmp_path / "v.h5"), "--size", "16", "--workers", "2"]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert readline(proc, "ingesting") == "ingesting"
    mapped = _kill_group(proc)
    assert segment_names(f"{own_shm_namespace}_{proc.pid}_"), "nothing was left to clean: the test would prove nothing"
    assert not [m for m in mapped if m.startswith("/dev/shm/sem.")], f"named semaphores could leak: {mapped}"
    again = subprocess.run([sys.executable, "-m", "h5stream", "ingest", root, str(tmp_path / "next.h5"), "--size", "16",
                            "--workers", "0"], capture_output=True, text=True, timeout=SAFETY_S)
    assert again.returncode == 0, again.stderr
    assert segment_names(f"{own_shm_namespace}_{proc.pid}_") == []
    assert [m for m in mapped if os.path.exists(m)] == []


# -- an unreadable store ------------------------------------------------------------------------------------------

UNREADABLE = textwrap.dedent(
    """
    import io, json, os, sys
    from contextlib import redirect_stderr
    import h5stream
    from h5stream import cli
    from h5stream.errors import StorePermissionError
    import h5stream.memory.shm, h5stream.order.quality, h5stream.read.plan  # noqa: F401
    import h5stream.streaming.feeds, h5stream.streaming.stream  # noqa: F401

    path, out = sys.argv[1], sys.argv[2]
    if os.access(path, os.R_OK):
        print(json.dumps({"denied": False}))
        sys.exit(0)
    try:
        h5stream.open(path)
        error = None
    except StorePermissionError as exc:
        error = [isinstance(exc, PermissionError), str(exc)]
    results = {}
    for args in (["info", path], ["bench", path], ["preview", path, "--out", out]):
        err = io.StringIO()
        with redirect_stderr(err):
            code = cli.main(args)
        results[args[0]] = [code, err.getvalue()]
    print(json.dumps({"denied": True, "open": error, "cli": results}))
    """
)


@pytest.mark.skipif(unprivileged_argv() is None, reason="running as root without setpriv: every file is readable")
def test_an_unreadable_store_is_a_permission_error_and_one_line_in_every_command(store):
    unprivileged = unprivileged_argv()
    folder = tempfile.mkdtemp(prefix="h5stream-perm-")  # not under pytest's 0700 folders: only the file denies
    try:
        os.chmod(folder, 0o755)
        path = os.path.join(folder, "secret.h5")
        with open(store, "rb") as src, open(path, "wb") as dst:
            dst.write(src.read())
        os.chmod(path, 0o000)
        done = subprocess.run(unprivileged + [sys.executable, "-c", UNREADABLE, path, os.path.join(folder, "p.png")],
                              capture_output=True, text=True, timeout=SAFETY_S)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout.strip().splitlines()[-1])
        if not result["denied"]:
            pytest.skip("this user reads the file despite its permissions")
        is_permission_error, message = result["open"]
        assert is_permission_error and "permission denied" in message and path in message
        for command, (code, err) in result["cli"].items():
            assert code == 1 and err.count("\n") == 1 and err.startswith("h5stream: error:"), (command, err)
            assert "permission denied" in err, (command, err)
    finally:
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)


def test_store_permission_error_is_both_ours_and_the_builtin():
    from h5stream.errors import H5StreamError

    assert issubclass(StorePermissionError, PermissionError) and issubclass(StorePermissionError, H5StreamError)
    assert issubclass(StoreBusyError, OSError) and issubclass(StoreBusyError, H5StreamError)


# -- bench inputs, and the output pipe ----------------------------------------------------------------------------


def test_bench_on_negative_class_labels_is_one_line(tmp_path, h5cli):
    path = tmp_path / "neg.h5"
    labels = np.arange(40) % 3 - 1  # -1, 0, 1
    write_arrays(path, np.zeros((40, 4, 4, 3), np.uint8), labels, class_names=["a", "b", "c"], block_rows=8)
    for args in (["bench", path, "--no-baselines"], ["info", path, "--shuffle-report"]):
        code, out, err = h5cli(*args)
        assert code == 1 and out == "" and err.count("\n") == 1, err
        assert "row 0 has class label -1" in err and "0..2" in err, err


NO_MATPLOTLIB = textwrap.dedent(
    """
    import sys
    sys.modules["matplotlib"] = None  # as if it were not installed
    import h5stream.commands.bench as bench

    def measured(*args, **kwargs):
        raise SystemExit("measured before checking --plot")

    bench.run_bench = measured
    from h5stream import cli
    sys.exit(cli.main(["bench", sys.argv[1], "--plot", sys.argv[2]]))
    """
)


def test_bench_plot_without_matplotlib_fails_in_one_line_before_measuring(store, tmp_path):
    done = subprocess.run([sys.executable, "-c", NO_MATPLOTLIB, store, str(tmp_path / "p.png")],
                          capture_output=True, text=True, timeout=SAFETY_S)
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and "needs matplotlib" in done.stderr, done.stderr


def test_info_into_a_closed_pipe_exits_quietly(store):
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head -1` that has already exited
    try:
        done = subprocess.run([sys.executable, "-m", "h5stream", "info", store], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=SAFETY_S)
    finally:
        os.close(write_end)
    assert done.stderr == "" and done.returncode == 141
