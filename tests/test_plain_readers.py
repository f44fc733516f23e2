"""Plain HDF5 readers (h5py, PyTables, default arguments) beside a real ingest: they open the store while it is
written, and reading the rows below ``committed_rows`` gives exactly the rows the finished store holds there.

The ingest is a real ``h5stream ingest`` (fresh, or ``--append``) in a process of its own, stopped with SIGSTOP
inside a commit: its new rows and the arrays' new extents are on disk, the count that publishes them is not.
So the file holds more rows than ``committed_rows``, and only the documented rule keeps a reader off them.
The process reports the stop on stdout and the test waits for the stop itself (``waitpid(WUNTRACED)``).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest
import tables

from h5stream.store import read_meta
from h5stream.store.access import writer_pids

pytestmark = pytest.mark.usefixtures("no_leaks")

SAFETY_S = 120.0

# `h5stream ingest` whose writer stops itself (SIGSTOP) the first time a flush leaves rows on disk past the
# count (inside a commit of a published store: data and extents flushed, `committed_rows` not raised yet).
PAUSED_INGEST = textwrap.dedent(
    """
    import os, signal, sys
    from h5stream.store.writer import StoreWriter

    flush = StoreWriter._flush

    def flush_and_stop(self):
        flush(self)
        on_disk, count = int(self.images.nrows), int(self.attrs["committed_rows"])
        if self.published and count == self.committed_rows < on_disk and not getattr(self, "stopped", False):
            self.stopped = True
            print("stopped", count, on_disk, flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)

    StoreWriter._flush = flush_and_stop
    if __name__ == "__main__":
        from h5stream import cli
        sys.exit(cli.main(sys.argv[1:]))
    """
)

ARGS = ["--size", "8", "--block-rows", "4", "--commit-rows", "4", "--workers", "0", "--order", "sorted"]


def plain_paths(ends, path_bytes) -> list[bytes]:
    """The rows' paths as docs/design.md tells a plain reader to read them: bytes up to each row's end."""
    data = path_bytes[:int(ends[-1])].tobytes() if len(ends) else b""
    return [data[a:b] for a, b in zip([0, *ends[:-1].tolist()], ends.tolist())]


def _stopped(proc) -> tuple[int, int]:
    """Wait for the ingest's stop line and for the stop itself; (committed rows, rows on disk)."""
    fd = proc.stdout.fileno()
    if not select.select([fd], [], [], SAFETY_S)[0]:
        proc.kill()
        pytest.fail(f"the ingest never stopped mid-commit: {proc.communicate()[1]}")
    line = proc.stdout.readline().split()
    assert line and line[0] == "stopped", (line, proc.communicate()[1])
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), status
    return int(line[1]), int(line[2])


@pytest.mark.parametrize("mode", ["fresh", "append"])
def test_default_h5py_and_pytables_read_exactly_the_committed_rows_while_an_ingest_is_stopped_mid_commit(
        tmp_path, class_src, h5cli, mode):
    root, written = class_src
    out = tmp_path / "out.h5"
    if mode == "append":  # a store of two classes first; the third comes with --append
        src = tmp_path / "src"
        shutil.copytree(root, src)
        shutil.move(src / "dog", tmp_path / "dog")
        code, _, err = h5cli("ingest", src, out, *ARGS)
        assert code == 0, err
        shutil.move(tmp_path / "dog", src / "dog")
        root = str(src)
    script = tmp_path / "paused_ingest.py"
    script.write_text(PAUSED_INGEST)
    cmd = [sys.executable, str(script), "ingest", root, str(out), *ARGS] + (["--append"] if mode == "append" else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        committed, on_disk = _stopped(proc)
        assert 0 < committed < on_disk  # rows past the count are in the file: only the rule keeps readers off them

        # The documented rule: read committed_rows, then only the rows below it.
        with h5py.File(out, "r") as f:  # default arguments: HDF5's own file locking
            assert f["images"].shape[0] == on_disk
            n = int(f.attrs["committed_rows"])
            by_h5py = f["images"][:n], f["labels"][:n], plain_paths(f["path_ends"][:n], f["path_bytes"])
        with tables.open_file(str(out), "r") as t:  # default arguments too
            assert t.root.images.nrows == on_disk
            n_tables = int(t.root._v_attrs.committed_rows)
            by_tables = (t.root.images[:n_tables], t.root.labels[:n_tables],
                         plain_paths(t.root.path_ends[:n_tables], t.root.path_bytes))
        assert n == n_tables == committed
        for a, b in zip(by_h5py, by_tables):
            np.testing.assert_array_equal(a, b)

        with pytest.raises(OSError, match="unable to lock file"):  # another writer is still kept out
            h5py.File(out, "a")
        assert writer_pids(out) == [proc.pid]  # h5stream's own readers still see a writer at work
        assert read_meta(out).rows == committed
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        _, err = proc.communicate(timeout=SAFETY_S)
    assert proc.returncode == 0, err

    # What the readers got is what the finished store holds in those rows.
    with h5py.File(out, "r") as f:
        assert int(f.attrs["committed_rows"]) == len(written)
        np.testing.assert_array_equal(f["images"][:committed], by_h5py[0])
        np.testing.assert_array_equal(f["labels"][:committed], by_h5py[1])
        assert plain_paths(f["path_ends"][:committed], f["path_bytes"]) == by_h5py[2]
    code, _, err = h5cli("verify", out)
    assert code == 0, err
    with h5py.File(out, "r"):  # a reader holding the file keeps the next writer out, in one line
        code, _, err = h5cli("ingest", root, out, *ARGS, "--append")
    assert code == 1 and err.count("\n") == 1 and "another program has it open" in err, err
    assert read_meta(out).rows == len(written)
