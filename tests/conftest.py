"""Shared fixtures: tiny real image folders (session-scoped, never modified) and a CLI runner."""

from __future__ import annotations

import os
import shutil
import signal

import psutil
import pytest

from h5stream import cli
from h5stream.samples import make_class_folder, make_regression_folder

CLASS_NAMES = ("bird", "cat", "dog")  # sorted: label index = position
PER_CLASS = (5, 7, 6)
SRC_SIZE = (30, 40)  # (height, width) of the generated files
REG_N = 12

# A test run started as a background job of a non-interactive shell (`make test &`) inherits SIGINT ignored, and
# so would every process it starts: Python then installs no KeyboardInterrupt handler and the Ctrl-C tests would
# send a signal nobody hears.  Give the suite, and through it its subprocesses, the default a terminal job has.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def class_src(tmp_path_factory):
    """A folder-per-class set: bird/5, cat/7, dog/6, mixed JPEG/PNG, 30x40.  Returns (root, [(relpath, label)])."""
    root = tmp_path_factory.mktemp("classes") / "src"
    written = make_class_folder(root, classes=CLASS_NAMES, per_class=PER_CLASS, size=SRC_SIZE, fmt="mixed", seed=1)
    return str(root), written


@pytest.fixture(scope="session")
def regression_src(tmp_path_factory):
    """Folder + labels.csv with K=2 targets.  Returns (root, csv_path, [(relpath, (t0, t1))])."""
    root = tmp_path_factory.mktemp("regression") / "src"
    csv_path, rows = make_regression_folder(root, REG_N, targets=2, size=SRC_SIZE, fmt="png", seed=2)
    return str(root), csv_path, rows


@pytest.fixture
def class_src_copy(class_src, tmp_path):
    """A private, writable copy of ``class_src`` (for tests that add or break files)."""
    root, written = class_src
    dst = tmp_path / "src"
    shutil.copytree(root, dst)
    return str(dst), list(written)


@pytest.fixture
def h5cli(capsys):
    """Run ``h5stream ARGS...`` in-process; returns (exit code, stdout, stderr)."""

    def run(*args):
        code = cli.main([os.fspath(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


MY_SEGMENTS = f"h5s_{os.getpid()}_"
"""Prefix of the shared-memory segments this test process creates (other sessions on the machine make h5s_* too)."""


def _my_segments() -> set[str]:
    from h5stream.shm import segment_names

    return set(segment_names(MY_SEGMENTS))


def _is_tracker(proc: psutil.Process) -> bool:
    """multiprocessing's resource tracker: one per interpreter, started on first use, by design."""
    try:
        return any("resource_tracker" in part for part in proc.cmdline())
    except psutil.Error:
        return False


def new_children(before: set[int]) -> list[psutil.Process]:
    """This process's children whose pids are not in ``before``, the resource tracker left out (new workers)."""
    return [p for p in psutil.Process().children() if p.pid not in before and not _is_tracker(p)]


@pytest.fixture
def no_leaks():
    """Fail a test that leaves a child process or a /dev/shm segment of this process behind.

    Modules that start processes use it for every test: ``pytestmark = pytest.mark.usefixtures("no_leaks")``.
    """
    import gc

    me = psutil.Process()
    children_before = {p.pid for p in me.children(recursive=True)}
    shm_before = _my_segments()
    yield
    gc.collect()  # an unclosed stream or pool is cleaned up by its finalizer
    leaked = [
        p for p in me.children(recursive=True)
        if p.pid not in children_before and not _is_tracker(p) and p.status() != psutil.STATUS_ZOMBIE
    ]
    assert not leaked, f"child processes left behind: {leaked}"
    assert _my_segments() - shm_before == set(), "shared-memory segments left behind"
