"""A store whose ingest did not finish never looks finished: real ingests stopped by SIGINT, SIGTERM and SIGKILL,
then `info`, `verify` and `h5stream.open` say so with the counts and the command, and that command finishes it."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import warnings

import h5py
import pytest

import h5stream
from h5stream.commands.verify import EXIT_UNFINISHED
from h5stream.errors import ConfigError, StoreFormatError
from h5stream.samples import make_class_folder
from h5stream.store import read_meta
from h5stream.store.handle import mark_flushing
from h5stream.store.schema import flushing_path
from h5stream.store.progress import IngestProgress, continue_command, progress_text
from h5stream.store.writer import write_arrays
from h5stream.store import pathrows
from conftest import committed_rows

pytestmark = pytest.mark.usefixtures("no_leaks")

N_CLASSES, PER_CLASS = 3, 400
TOTAL = N_CLASSES * PER_CLASS
DEADLINE_S = 120.0
INTERRUPTED = re.compile(r"h5stream: interrupted(?: \(SIGTERM\))?: ([\d,]+) of ([\d,]+) files stored; "
                         r"finish with `([^`]+)`")



@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = tmp_path_factory.mktemp("unfinished") / "src"
    written = make_class_folder(root, classes=N_CLASSES, per_class=PER_CLASS, size=(96, 128), fmt="jpg", seed=5)
    return str(root), written


def ingest_cmd(root, out) -> list[str]:
    # One file per commit's worth of blocks, in this process (no decode workers): the run commits early and often.
    return [sys.executable, "-m", "h5stream", "ingest", root, str(out), "--size", "32", "--block-rows", "8",
            "--commit-rows", "8", "--workers", "0"]


def stop_after_first_commit(cmd, out, send) -> subprocess.Popen:
    """Start ``cmd`` in its own session, wait until its store has committed rows, then ``send(proc)``; returns the
    finished process (its stderr read)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while proc.poll() is None and time.monotonic() < deadline and committed_rows(out) == 0:
            time.sleep(0.005)  # polling interval, bounded by the deadline; the committed rows are the signal
        assert proc.poll() is None, f"ingest ended before it could be stopped: {proc.stderr.read()}"
        send(proc)
        proc.stderr_text = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc


def shown_command(out) -> str:
    """The command the store's recorded progress gives to finish it."""
    progress = read_meta(out).ingest
    return continue_command(progress, str(out))


def assert_says_unfinished(out, h5cli, stored: int, *, clean: bool = True) -> str:
    """info, verify and open all say the store is unfinished, with the counts and the command; returns it.
    ``clean``: the run stopped between commits, so verify checked every row it holds."""
    command = shown_command(out)
    said = f"unfinished: {stored:,} of {TOTAL:,} files stored; finish with `{command}`"
    code, text, _ = h5cli("info", out)
    assert code == 0 and said in text, text
    code, text, _ = h5cli("info", out, "--json")
    ingest = json.loads(text)["ingest"]
    assert ingest == {"files": TOTAL, "stored": stored, "skipped": 0, "finished": False, "unfinished": said,
                      "command": command}
    code, _, err = h5cli("verify", out)
    assert code == EXIT_UNFINISHED == 4 and said in err, err
    assert not clean or f"{stored} rows match their checksums" in err, err
    code, _, err = h5cli("preview", out, "--out", os.path.join(os.path.dirname(out), "preview.png"))
    lines = [line for line in err.splitlines() if "unfinished" in line]
    assert code == 0 and lines and all(line.startswith(f"h5stream: warning: {out}: {said}") for line in lines), err
    assert "UserWarning" not in err and ".py:" not in err, err
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        training, validation = h5stream.open(out, batch_size=16, validation_split=0.25, subset="both")
        training.close()
        validation.close()
    unfinished = [w for w in caught if issubclass(w.category, UserWarning) and "unfinished" in str(w.message)]
    assert len(unfinished) == 1 and said in str(unfinished[0].message), [str(w.message) for w in caught]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with h5stream.open(out, batch_size=16, allow_unfinished=True) as stream:
            assert sum(len(y) for _, y in stream) == stored
    return command


def finish(command, out, h5cli, stored: int, written) -> None:
    """Run ``command`` (``h5stream ...``) as the user would: afterwards the store holds every file, once, and
    nothing says it is unfinished."""
    argv = shlex.split(command)
    assert argv[0] == "h5stream" and argv[-1] == "--append"
    done = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and f"already stored {stored}" in done.stdout, done.stderr
    assert read_meta(out).ingest.finished
    code, text, _ = h5cli("info", out)
    assert code == 0 and "unfinished" not in text
    code, text, err = h5cli("verify", out)
    assert code == 0 and f"OK, {TOTAL} rows" in text, err
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        h5stream.open(out, batch_size=16).close()
    with h5py.File(out, "r") as f:
        paths = sorted(p.decode() for p in pathrows.stored_bytes(f, 0, int(f.attrs["committed_rows"])))
    assert paths == sorted(rel for rel, _ in written)


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupted_ingest_says_how_far_it_got_and_the_store_says_unfinished_until_finished(src, tmp_path,
                                                                                               h5cli, how):
    root, written = src
    out = tmp_path / "big.h5"
    if how == "ctrl-c":  # a terminal's Ctrl-C reaches the whole job
        proc = stop_after_first_commit(ingest_cmd(root, out), out, lambda p: os.killpg(p.pid, signal.SIGINT))
        assert proc.returncode == 130
    else:  # a service manager stops the process
        proc = stop_after_first_commit(ingest_cmd(root, out), out, lambda p: p.send_signal(signal.SIGTERM))
        assert proc.returncode == 128 + signal.SIGTERM
    err = proc.stderr_text.strip()
    match = INTERRUPTED.fullmatch(err)
    assert match, err
    stored = read_meta(out).rows
    assert 0 < stored < TOTAL
    assert match.group(1) == f"{stored:,}" and match.group(2) == f"{TOTAL:,}"
    assert match.group(3) == shlex.join(["h5stream", "ingest", root, str(out), "--size", "32", "--block-rows", "8",
                                         "--append"])
    command = assert_says_unfinished(out, h5cli, stored)
    assert command == match.group(3)
    finish(command, out, h5cli, stored, written)


def test_a_killed_ingest_leaves_a_store_that_says_unfinished_even_repaired_until_append_finishes(src, tmp_path,
                                                                                                h5cli):
    root, written = src
    out = tmp_path / "big.h5"
    proc = stop_after_first_commit(ingest_cmd(root, out), out, lambda p: os.killpg(p.pid, signal.SIGKILL))
    assert proc.returncode == -signal.SIGKILL
    # Killed while HDF5 rewrote the file, or between writing rows and committing them (a loaded machine makes the
    # window wider): what a user then runs first, as the readers' message says.
    if os.path.exists(flushing_path(out)) or read_meta(out).uncommitted_rows:
        assert h5cli("repair", out)[0] == 0
    stored = read_meta(out).rows
    assert 0 < stored < TOTAL and read_meta(out).uncommitted_rows == 0
    command = assert_says_unfinished(out, h5cli, stored, clean=False)
    # Other files are not appended over an unfinished ingest: that would forget the files it still misses.
    other = tmp_path / "other"
    make_class_folder(other, classes=N_CLASSES, per_class=2, size=(8, 8), fmt="png", seed=6)
    code, _, err = h5cli("ingest", other, out, "--append", "--workers", "0")
    assert code == 1 and f"unfinished ({stored:,} of {TOTAL:,} files stored)" in err and command in err, err
    # A store rebuilt after its writer was killed mid-flush is still unfinished.
    mark_flushing(str(out))
    code, _, err = h5cli("repair", out)
    assert code == 0, err
    assert read_meta(out).ingest == IngestProgress(TOTAL, stored, 0, root, None, ("--size", "32", "--block-rows", "8"))
    assert_says_unfinished(out, h5cli, stored, clean=False)
    finish(command, out, h5cli, stored, written)


def test_a_finished_ingest_with_skipped_files_reports_nothing_unfinished(class_src_copy, tmp_path, h5cli):
    root, written = class_src_copy
    with open(os.path.join(root, "cat", "broken.png"), "wb") as fh:
        fh.write(b"not a png")
    out = tmp_path / "done.h5"
    code, _, err = h5cli("ingest", root, out, "--size", "16", "--workers", "0")
    assert code == 0, err
    progress = read_meta(out).ingest  # every file stored, or skipped and listed in the report
    assert (progress.files, progress.stored, progress.skipped, progress.finished) == (len(written) + 1,
                                                                                      len(written), 1, True)
    code, text, _ = h5cli("info", out)
    assert code == 0 and "unfinished" not in text
    assert json.loads(h5cli("info", out, "--json")[1])["ingest"]["finished"] is True
    code, text, err = h5cli("verify", out)
    assert code == 0 and "OK" in text, err
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        h5stream.open(out, batch_size=4).close()
    with pytest.raises(ConfigError, match="allow_unfinished must be True or False"):
        h5stream.open(out, allow_unfinished="yes")


def test_a_store_without_progress_attributes_counts_as_finished(tmp_path, h5cli):
    import numpy as np

    out = tmp_path / "old.h5"
    write_arrays(out, np.zeros((20, 4, 4, 3), np.uint8), np.arange(20) % 2)  # no ingest: nothing recorded
    with h5py.File(out, "r") as f:
        assert not any(name.startswith("ingest_") for name in f.attrs)
    assert read_meta(out).ingest is None
    code, text, _ = h5cli("info", out, "--json")
    assert code == 0 and json.loads(text)["ingest"] is None
    code, text, _ = h5cli("info", out)
    assert code == 0 and "unfinished" not in text
    code, text, err = h5cli("verify", out)
    assert code == 0 and "OK, 20 rows" in text, err
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        h5stream.open(out, batch_size=4).close()


def test_progress_is_said_in_counts_with_a_command_the_shell_reads_back(tmp_path):
    spaced = str(tmp_path / "my images")
    p = IngestProgress(files=19200, stored=1270, skipped=10, src=spaced, labels=str(tmp_path / "l.csv"),
                       options=("--size", "64"))
    assert progress_text(p) == "1,280 of 19,200 files done (1,270 stored, 10 skipped)"
    assert progress_text(IngestProgress(19200, 1280, 0, spaced, None, ())) == "1,280 of 19,200 files stored"
    command = continue_command(p, "out dir/big.h5")
    assert shlex.split(command) == ["h5stream", "ingest", spaced, "out dir/big.h5", "--labels",
                                    str(tmp_path / "l.csv"), "--size", "64", "--append"]
    assert not p.finished and IngestProgress(10, 7, 3, spaced, None, ()).finished


def test_damaged_progress_attributes_are_one_line_errors(tmp_path):
    import numpy as np

    out = tmp_path / "bad.h5"
    write_arrays(out, np.zeros((4, 4, 4, 3), np.uint8), np.arange(4) % 2)
    with h5py.File(out, "r+") as f:
        f.attrs["ingest_files"] = np.int64(8)
        f.attrs["ingest_rows_before"] = np.int64(0)
        f.attrs["ingest_source"] = "{not json"
    with pytest.raises(StoreFormatError, match="ingest_source"):
        read_meta(out)
    with h5py.File(out, "r+") as f:
        f.attrs["ingest_source"] = json.dumps({"src": "/x", "labels": None, "options": []})
        f.attrs["ingest_rows_before"] = np.int64(5)  # more than the 4 committed rows
    with pytest.raises(StoreFormatError, match="ingest_rows_before"):
        read_meta(out)


def test_an_append_records_what_it_sets_out_to_store_same_source_or_another(class_src_copy, tmp_path, h5cli):
    root, written = class_src_copy
    out = tmp_path / "grow.h5"
    assert h5cli("ingest", root, out, "--size", "8", "--workers", "0")[0] == 0
    make_class_folder(os.path.join(root, "more"), classes=["cat"], per_class=3, size=(8, 8), fmt="png", seed=7)
    os.rename(os.path.join(root, "more", "cat"), os.path.join(root, "cat", "more"))  # 3 new files of class cat
    code, _, err = h5cli("ingest", root, out, "--append", "--workers", "0")
    assert code == 0, err
    n = len(written) + 3
    assert read_meta(out).ingest == IngestProgress(n, n, 0, root, None, ())
    other = tmp_path / "other"
    for rel, _ in make_class_folder(other, classes=["cat", "dog"], per_class=2, size=(8, 8), fmt="png", seed=8):
        folder, name = os.path.split(rel)  # names of their own: --append takes a stored relative path as stored
        os.rename(other / rel, other / folder / ("other_" + name))
    code, _, err = h5cli("ingest", other, out, "--append", "--workers", "0", "--classes", "dog,cat")
    assert code == 1 and "--classes must start with the store's classes" in err, err
    code, _, err = h5cli("ingest", other, out, "--append", "--workers", "0")  # a finished store takes other files
    assert code == 0, err
    progress = read_meta(out).ingest
    assert progress == IngestProgress(4, 4, 0, str(other), None, ()) and read_meta(out).rows == n + 4


def test_an_ingest_interrupted_after_its_last_commit_is_said_to_be_complete(class_src, tmp_path, h5cli):
    from h5stream.commands.ingest import _how_far

    root, written = class_src
    out = tmp_path / "done.h5"
    assert h5cli("ingest", root, out, "--size", "8", "--workers", "0")[0] == 0
    said = _how_far(str(out))  # what Ctrl-C after the last commit prints
    assert said == f"{out} was complete before the interruption ({len(written)} of {len(written)} files stored); " \
                   "nothing is left to do", said
