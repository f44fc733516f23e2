"""SharedArray: creator-owned POSIX shared memory, attach without resource-tracker registration."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from h5stream.memory.shm import SharedArray, SharedSpec, new_prefix, segment_names
from h5stream.errors import ConfigError, WorkerError
from conftest import collect

MY_SEGMENTS = f"h5s_{os.getpid()}_"  # other sessions on this machine create h5s_* too


pytestmark = pytest.mark.usefixtures("no_leaks")


def test_create_attach_share_memory_and_close_unlinks():
    owner = SharedArray.create((4, 3, 2), np.float32, new_prefix())
    assert owner.array.shape == (4, 3, 2) and owner.array.dtype == np.float32
    assert not owner.array.any()  # zero-filled
    spec = pickle.loads(pickle.dumps(owner.spec))
    assert spec == owner.spec and spec.nbytes == 4 * 3 * 2 * 4
    other = SharedArray.attach(spec)
    other.array[1] = 7.5
    assert owner.array[1].tolist() == [[7.5, 7.5]] * 3
    assert owner.name in segment_names(MY_SEGMENTS)
    other.close()
    assert owner.name in segment_names(MY_SEGMENTS), "an attacher must never unlink"
    owner.close()
    owner.close()  # idempotent
    assert owner.closed and owner.array is None
    assert owner.name not in segment_names(MY_SEGMENTS)
    with pytest.raises(WorkerError, match="does not exist"):
        SharedArray.attach(spec)


def test_view_outlives_close():
    arr = SharedArray.create((8,), np.int64, new_prefix())
    view = arr.array[2:5]
    view[:] = [1, 2, 3]
    arr.close()  # unlinks the name; the mapping stays for the view
    assert arr.name not in segment_names(MY_SEGMENTS)
    assert view.tolist() == [1, 2, 3]


def test_names_unique_and_prefixed():
    prefix = new_prefix()
    assert prefix.startswith(MY_SEGMENTS)
    assert new_prefix() != prefix
    a = SharedArray.create((2,), np.uint8, prefix)
    b = SharedArray.create((2,), np.uint8, prefix)
    try:
        assert a.name != b.name and a.name.startswith(prefix) and b.name.startswith(prefix)
    finally:
        a.close()
        b.close()


def test_garbage_collection_unlinks():
    arr = SharedArray.create((16,), np.uint8, new_prefix())
    name = arr.name
    del arr
    collect(lambda: name not in segment_names(MY_SEGMENTS))
    assert name not in segment_names(MY_SEGMENTS)


def test_attach_in_unrelated_process_neither_unlinks_nor_warns():
    # A process that is not our child has its own resource tracker: had attach
    # registered the segment, that tracker would unlink it at the process's exit
    # and print a "leaked shared_memory" warning.
    with SharedArray.create((3,), np.uint8, new_prefix()) as arr:
        code = (
            "import pickle, sys; from h5stream.memory.shm import SharedArray;"
            "a = SharedArray.attach(pickle.loads(bytes.fromhex(sys.argv[1]))); a.array[:] = [5, 6, 7]"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, pickle.dumps(arr.spec).hex()], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert "resource_tracker" not in done.stderr and "leaked" not in done.stderr, done.stderr
        assert arr.name in segment_names(MY_SEGMENTS)
        assert arr.array.tolist() == [5, 6, 7]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_does_not_unlink_owners_segment():
    with SharedArray.create((2,), np.uint8, new_prefix()) as arr:
        pid = os.fork()
        if pid == 0:  # child: close() and exit handlers must leave the parent's segment alone
            arr.close()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert arr.name in segment_names(MY_SEGMENTS)


@pytest.mark.parametrize("shape, dtype", [((), np.uint8), ((0, 3), np.uint8), ((2, -1), np.uint8), ((2,), object)])
def test_invalid_shape_or_dtype(shape, dtype):
    with pytest.raises(ConfigError):
        SharedArray.create(shape, dtype, new_prefix())


def test_attach_rejects_spec_larger_than_segment():
    with SharedArray.create((4,), np.uint8, new_prefix()) as arr:
        with pytest.raises(WorkerError, match="has 4 bytes"):
            SharedArray.attach(SharedSpec(arr.name, (8,), "|u1"))


def test_more_than_dev_shm_holds_is_refused_before_allocating():
    from h5stream.errors import BudgetError
    from h5stream.memory.shm import shm_free_bytes

    free = shm_free_bytes()
    if free is None:
        pytest.skip("no /dev/shm mount")
    with pytest.raises(BudgetError, match="free"):
        SharedArray.create((free + (1 << 20),), np.uint8, new_prefix())
    # (no_leaks checks that no segment of this process was left behind)


def _raw_segment(name: str) -> None:
    """A segment made the way a killed process leaves one: named, never registered with our resource tracker."""
    import _posixshmem

    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    os.close(fd)


def _exited_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          timeout=120)
    return int(done.stdout)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_sweep_unlinks_segments_of_dead_or_replaced_creators_only(own_shm_namespace):
    # In a namespace of this test's own: no other h5stream process on the machine sweeps these names first.
    from h5stream.memory.shm import _start_ticks, sweep_stale_segments

    ns, me, mine = own_shm_namespace, os.getpid(), _start_ticks(os.getpid())
    dead = _exited_pid()
    names = {
        f"{ns}_{dead}_s{mine:x}_aaaain__0": False,  # creator exited
        f"{ns}_{dead}_0123abcdout__0": False,  # older name without a start time, creator exited
        f"{ns}_{me}_s{mine + 1:x}_bbbbin__0": False,  # this pid, but a process that started at another time
        f"{ns}_{me}_s{mine:x}_ccccin__0": True,  # this very process
        f"{ns}_{me}_0123abcdout__0": True,  # this pid, no start time to tell: kept
        f"{ns}_not_a_pid_{dead}": True,  # not a name h5stream makes
    }
    for name in names:
        _raw_segment(name)
    try:
        removed = set(sweep_stale_segments())
        assert {n for n, kept in names.items() if not kept} <= removed
        assert not {n for n, kept in names.items() if kept} & removed
        present = set(segment_names(f"{ns}_"))
        assert {n for n, kept in names.items() if kept} <= present
        assert not {n for n, kept in names.items() if not kept} & present
    finally:
        _unlink_all(names)


def test_a_sweep_leaves_the_segments_of_other_namespaces_alone(own_shm_namespace, monkeypatch):
    from h5stream.memory.shm import NAMESPACE_ENV, _start_ticks, new_prefix, sweep_stale_segments

    other = own_shm_namespace + "b"  # a namespace this one's name starts: still another one
    dead, start = _exited_pid(), _start_ticks(os.getpid())
    ours, theirs = f"{own_shm_namespace}_{dead}_s{start:x}_aaaain__0", f"{other}_{dead}_s{start:x}_aaaain__0"
    assert new_prefix().startswith(f"{own_shm_namespace}_{os.getpid()}_")
    for name in (ours, theirs):
        _raw_segment(name)
    try:
        assert sweep_stale_segments() == [ours]  # the other namespace's dead segment is not this process's to sweep
        assert os.path.exists(f"/dev/shm/{theirs}")
        monkeypatch.setenv(NAMESPACE_ENV, other)
        assert sweep_stale_segments() == [theirs]
    finally:
        _unlink_all((ours, theirs))


@pytest.mark.parametrize("value", ["a_b", "x" * 17, "../x", "h5s "])
def test_a_namespace_that_is_not_a_name_is_one_line_from_every_command(value, monkeypatch, h5cli, tmp_path):
    from h5stream.memory.shm import NAMESPACE_ENV

    monkeypatch.setenv(NAMESPACE_ENV, value)
    code, _, err = h5cli("info", tmp_path / "missing.h5")
    assert code == 1 and err.count("\n") == 1 and f"{NAMESPACE_ENV}={value!r}" in err and "letters or digits" in err


def _unlink_all(names) -> None:
    import _posixshmem

    for name in names:
        try:
            _posixshmem.shm_unlink("/" + name)
        except FileNotFoundError:
            pass


def test_new_prefix_carries_pid_and_start_time():
    from h5stream.memory.shm import _NAME, _start_ticks

    prefix = new_prefix()
    m = _NAME.match(prefix + "in__0")
    assert m is not None and int(m.group(1)) == os.getpid()
    start = _start_ticks(os.getpid())
    assert (m.group(2) is None) if start is None else int(m.group(2), 16) == start


def test_a_segment_over_the_file_size_limit_names_that_limit_not_dev_shm():
    # ulimit -f binds /dev/shm's files too: the tmpfs refuses with EFBIG, which is not a short /dev/shm
    code = (
        "import resource, numpy as np\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))\n"
        "from h5stream.errors import ResourceLimitError\n"
        "from h5stream.memory.shm import SharedArray, new_prefix, segment_limit_bytes, segment_names\n"
        "assert segment_limit_bytes() == 1 << 20\n"
        "with SharedArray.create((1 << 20,), np.uint8, new_prefix()) as ok:\n"
        "    ok.array[-1] = 1\n"
        "try:\n"
        "    SharedArray.create(((1 << 20) + 1,), np.uint8, new_prefix())\n"
        "except ResourceLimitError as exc:\n"
        "    print(exc.errno, exc)\n"
        "import os; print(len(segment_names(f'h5s_{os.getpid()}_')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    raised, left = done.stdout.splitlines()
    assert raised.startswith("27 cannot create a shared-memory segment of 1.0 MiB"), raised  # EFBIG
    assert "file size limit (1.0 MiB)" in raised and "ulimit -f unlimited" in raised and "free" not in raised
    assert left == "0"  # the refused segment was unlinked
