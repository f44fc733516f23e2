"""Whatever a store file holds, reading it never changes it and a bad one gets one line.

* Every attribute and dataset h5stream reads, set to a wrong type, a wrong shape, a negative, zero, huge or NaN
  value, bad JSON, or left out: ``h5stream info``, ``h5stream verify`` and ``h5stream.open`` either work or say
  what is wrong in one line (an :class:`H5StreamError` from the API), and the file's bytes and mtime stay as
  they were.
* Featurewise statistics come from the training rows, are never written into the store, and reach workers.
* Every command sweeps the shared memory a killed stream left behind.
* A batch that cannot be allocated is a :class:`BudgetError` naming the batch size that fits; an I/O error
  reading the file says so rather than calling the file damaged.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import signal
import stat
import subprocess
import sys

import h5py
import numpy as np
import pytest

import h5stream
from h5stream.errors import BudgetError, H5StreamError, StoreFormatError, StoreReadError
from h5stream.store import schema
from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")

ROWS, BLOCK = 40, 8
SHAPE = (8, 6, 3)


@pytest.fixture(scope="module")
def base_store(tmp_path_factory):
    """A valid class store (shuffled order, checksums) that each test copies before changing."""
    path = tmp_path_factory.mktemp("inputs") / "base.h5"
    rs = np.random.RandomState(0)
    write_arrays(path, rs.randint(0, 256, (ROWS, *SHAPE), dtype=np.uint8), rs.randint(0, 3, ROWS),
                 class_names=["a", "b", "c"], block_rows=BLOCK, storage_order="shuffled")
    return path


def fingerprint(path) -> tuple[str, int, int]:
    """What "unchanged" means: the same bytes, size and modification time."""
    st = os.stat(path)
    return hashlib.sha256(open(path, "rb").read()).hexdigest(), st.st_size, st.st_mtime_ns


# -- crafted files ---------------------------------------------------------------------------------------------

def _set(name, value):
    def change(f):
        f.attrs[name] = value
    return change


def _delete(name):
    def change(f):
        del f.attrs[name]
    return change


def _replace(name, make):
    def change(f):
        del f[name]
        make(f)
    return change


def _remove(name):
    def change(f):
        del f[name]
    return change


INT_ATTRS = (schema.ATTR_COMMITTED, schema.ATTR_BLOCK_ROWS, schema.ATTR_ORDER_SEED, schema.ATTR_SKIPPED,
             schema.ATTR_FORMAT)
TEXT_ATTRS = (schema.ATTR_LABEL_KIND, schema.ATTR_ORDER, schema.ATTR_RESIZE, schema.ATTR_CHECKSUM,
              schema.ATTR_CHECKSUM_TAIL)
JSON_ATTRS = (schema.ATTR_CLASS_NAMES, schema.ATTR_LABEL_COLUMNS)
VALUES = {
    "text": "x",
    "number": 5,
    "array": np.array([1, 2]),
    "text array": np.array([b"a", b"b"]),
    "negative": -5,
    "zero": 0,
    "huge": 2 ** 62,
    "nan": np.float64("nan"),
    "fraction": 2.5,
    "bad json": "[bad",
    "json object": '{"a": 1}',
    "json numbers": "[1, 2]",
    "not utf-8": np.bytes_(b"\xff\xfe"),
}
ATTR_CASES = {f"{name}={kind}": _set(name, value)
              for name in INT_ATTRS + TEXT_ATTRS + JSON_ATTRS for kind, value in VALUES.items()}
ATTR_CASES.update({f"{name} missing": _delete(name) for name in INT_ATTRS + TEXT_ATTRS + JSON_ATTRS})

IMG = "images"
DATASET_CASES = {
    "images float": _replace(IMG, lambda f: f.create_dataset(IMG, data=np.zeros((ROWS, *SHAPE), np.float32),
                                                            chunks=(BLOCK, *SHAPE))),
    "images 3-d": _replace(IMG, lambda f: f.create_dataset(IMG, data=np.zeros((ROWS, 8, 6), np.uint8),
                                                          chunks=(BLOCK, 8, 6))),
    "images zero width": _replace(IMG, lambda f: f.create_dataset(IMG, shape=(ROWS, 8, 0, 3), dtype=np.uint8)),
    "images short": _replace(IMG, lambda f: f.create_dataset(IMG, data=np.zeros((ROWS // 2, *SHAPE), np.uint8),
                                                            chunks=(BLOCK, *SHAPE))),
    "images never written": _replace(IMG, lambda f: f.create_dataset(IMG, shape=(ROWS, *SHAPE), dtype=np.uint8,
                                                                    chunks=(BLOCK, *SHAPE))),
    "images huge and empty": _replace(IMG, lambda f: f.create_dataset(IMG, shape=(2 ** 40, *SHAPE), dtype=np.uint8,
                                                                     chunks=(BLOCK, *SHAPE))),
    "images a group": _replace(IMG, lambda f: f.create_group(IMG)),
    "images missing": _remove(IMG),
    "labels text": _replace("labels", lambda f: f.create_dataset("labels", data=np.array([b"x"] * ROWS))),
    "labels float in a class store": _replace("labels", lambda f: f.create_dataset("labels",
                                                                                   data=np.zeros(ROWS, np.float32))),
    "labels 3-d": _replace("labels", lambda f: f.create_dataset("labels", data=np.zeros((ROWS, 2, 2), np.int64))),
    "labels no columns": _replace("labels", lambda f: f.create_dataset("labels", shape=(ROWS, 0), dtype=np.int64)),
    "labels short": _replace("labels", lambda f: f.create_dataset("labels", data=np.zeros(ROWS // 2, np.int64))),
    "labels out of range": _replace("labels", lambda f: f.create_dataset("labels", data=np.full(ROWS, 7, np.int64))),
    "labels missing": _remove("labels"),
    "checksums 2 columns": _replace("checksums", lambda f: f.create_dataset("checksums",
                                                                            data=np.zeros((5, 2), np.uint64))),
    "checksums float": _replace("checksums", lambda f: f.create_dataset("checksums",
                                                                        data=np.zeros((5, 3), np.float32))),
    "checksums 1-d": _replace("checksums", lambda f: f.create_dataset("checksums", data=np.zeros(5, np.uint64))),
    "checksums missing": _remove("checksums"),
    "path_ends text": _replace("path_ends", lambda f: f.create_dataset("path_ends", data=np.array([b"x"] * ROWS))),
    "path_ends short": _replace("path_ends", lambda f: f.create_dataset("path_ends", data=np.arange(3))),
    "path_bytes float": _replace("path_bytes", lambda f: f.create_dataset("path_bytes", data=np.zeros(99, np.float32))),
    "path_bytes missing": _remove("path_bytes"),
    "path_ends missing": _remove("path_ends"),  # then neither layout's paths are there
}
CASES = {**ATTR_CASES, **DATASET_CASES}


def _in_the_quick_run(name: str) -> bool:
    """Every dataset case and every missing attribute; of the attribute x value crossing, a third, rotated so
    that each attribute meets four or five kinds of value and each kind of value several attributes.  The whole
    crossing runs with the slow tests (``make test-all``)."""
    if "=" not in name:
        return True
    attr, kind = name.split("=", 1)
    attrs = list(INT_ATTRS + TEXT_ATTRS + JSON_ATTRS)
    return (attrs.index(attr) + list(VALUES).index(kind)) % 3 == 0


CRAFTED = [pytest.param(name, marks=() if _in_the_quick_run(name) else pytest.mark.slow) for name in CASES]

#: Crafted files that are not usable stores: each must be refused (the others may work or be refused).
MUST_FAIL = (
    {f"{schema.ATTR_COMMITTED}={kind}" for kind in VALUES if kind not in ("zero", "number")}
    | {f"{schema.ATTR_BLOCK_ROWS}={kind}" for kind in VALUES}
    | {f"{name}={kind}" for name in JSON_ATTRS
       for kind in ("number", "array", "text array", "bad json", "json object", "json numbers", "not utf-8", "text")}
    | {f"{schema.ATTR_FORMAT}={kind}" for kind in ("huge", "negative", "nan", "text", "array")}
    | {f"{schema.ATTR_SKIPPED}={kind}" for kind in ("negative", "nan", "text", "array")}
    | {f"{schema.ATTR_LABEL_KIND}={kind}" for kind in ("text", "number", "array", "not utf-8")}
    | set(DATASET_CASES) - {"checksums missing", "labels out of range", "images short", "labels short"}
)


@pytest.fixture
def crafted(base_store, tmp_path, request):
    name = request.param
    path = tmp_path / "crafted.h5"
    shutil.copyfile(base_store, path)
    with h5py.File(path, "a") as f:
        CASES[name](f)
    return name, path


def one_line(err: str) -> bool:
    return err.count("\n") == 1 and err.startswith("h5stream: error: ") and "Traceback" not in err


@pytest.mark.parametrize("crafted", CRAFTED, indirect=True)
def test_every_crafted_store_works_or_gets_one_line_and_is_never_changed(crafted, h5cli):
    name, path = crafted
    before = fingerprint(path)
    failed = []
    for command in ("info", "verify"):
        code, out, err = h5cli(command, path)
        if code != 0:
            # verify's 3 is "nothing (or not everything) could be checked", also one line
            assert one_line(err), f"{name}: `h5stream {command}` exited {code} with {err!r}"
            failed.append(command)
        else:
            assert err == "" and out, f"{name}: `h5stream {command}` exited 0 with {err!r}"
    try:
        with h5stream.open(path, batch_size=16, seed=0, label_mode="categorical") as stream:
            for _ in stream:
                pass
    except H5StreamError as exc:
        assert "\n" not in str(exc), f"{name}: {exc!r}"
        failed.append("open")
    if name in MUST_FAIL:
        assert failed == ["info", "verify", "open"], f"{name}: only {failed} refused it"
    assert fingerprint(path) == before, f"{name}: the file changed"


@pytest.mark.parametrize("crafted", [f"{schema.ATTR_COMMITTED}=array", f"{schema.ATTR_CLASS_NAMES}=bad json",
                                     f"{schema.ATTR_BLOCK_ROWS}=zero", f"{schema.ATTR_BLOCK_ROWS}=huge",
                                     f"{schema.ATTR_COMMITTED}=negative"], indirect=True)
def test_the_reported_inputs_name_the_attribute(crafted, h5cli):
    name, path = crafted
    attribute = name.split("=")[0]
    for command in ("info", "verify"):
        code, _out, err = h5cli(command, path)
        assert code == 1 and one_line(err) and repr(attribute) in err
    with pytest.raises(StoreFormatError, match=attribute):
        h5stream.open(path, batch_size=16)


# -- featurewise statistics ------------------------------------------------------------------------------------

FEATUREWISE = dict(featurewise_center=True, featurewise_std_normalization=True)
SPLIT = 0.25


@pytest.mark.parametrize("read_only", [False, True], ids=["writable", "read-only"])
def test_featurewise_streams_never_change_the_store(base_store, tmp_path, read_only):
    path = tmp_path / "s.h5"
    shutil.copyfile(base_store, path)
    if read_only:
        os.chmod(path, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    before = fingerprint(path)
    for kwargs in (dict(validation_split=SPLIT, subset="training"), dict(validation_split=SPLIT, subset="validation"),
                   {}):
        for augment in (h5stream.Augment(**FEATUREWISE), h5stream.Augment(featurewise_center=True)):
            with h5stream.open(path, batch_size=16, augment=augment, **kwargs) as stream:
                for _ in stream:
                    pass
    assert fingerprint(path) == before
    with h5py.File(path, "r") as f:
        assert not any(name.startswith("feature") for name in f.attrs)


@pytest.mark.parametrize("workers", [0, 2])
def test_featurewise_statistics_are_the_training_rows_for_both_subsets(base_store, workers):
    with h5py.File(base_store, "r") as f:
        images = f["images"][:].astype(np.float64)
    boundary = ROWS - int(SPLIT * ROWS)
    train = images[:boundary].reshape(-1, SHAPE[-1])
    mean, std = train.mean(axis=0), train.std(axis=0)  # Keras' fit: over the training data given
    for subset in ("training", "validation"):
        with h5stream.open(base_store, batch_size=16, augment=h5stream.Augment(**FEATUREWISE), seed=3,
                           validation_split=SPLIT, subset=subset, workers=workers) as stream:
            order = stream.epoch_order(0)
            got = np.concatenate([x for x, _ in stream])
        want = (images[order] - mean) / (std + 1e-6)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=subset)


# -- every command sweeps what killed streams left in /dev/shm -------------------------------------------------

_KILLED_CREATOR = """
import sys
import numpy as np
from h5stream.memory.shm import SharedArray, new_prefix
segment = SharedArray.create((4096,), np.uint8, new_prefix())  # registered with this process's resource tracker
print(segment.name, flush=True)
sys.stdin.read()  # until killed
"""


def killed_stream_segment() -> str:
    """A segment left the way a stream killed with its whole process group leaves one: its creator and the
    creator's resource tracker both SIGKILLed, so nobody unlinked it."""
    child = subprocess.Popen([sys.executable, "-c", _KILLED_CREATOR], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        name = child.stdout.readline().strip()
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the creator and its resource tracker
        child.wait(timeout=60)
        child.stdin.close()
        child.stdout.close()
    assert name and os.path.exists(f"/dev/shm/{name}"), "the killed creator left no segment"
    return name


COMMANDS = {
    "info": lambda store, tmp: ["info", store],
    "info failing": lambda store, tmp: ["info", tmp / "missing.h5"],
    "verify": lambda store, tmp: ["verify", store],
    "preview": lambda store, tmp: ["preview", store, "--out", tmp / "grid.png", "--rows", "2", "--cols", "2"],
    "bench failing": lambda store, tmp: ["bench", tmp / "missing.h5"],
    "ingest failing": lambda store, tmp: ["ingest", tmp / "no-such-folder", tmp / "out.h5"],
}


# The killed creator and the command share a namespace of their own (own_shm_namespace): no other h5stream
# process on the machine sweeps the segment before the command does.
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_sweeps_segments_of_killed_streams(base_store, tmp_path, h5cli, command, own_shm_namespace):
    name = killed_stream_segment()
    assert name.startswith(f"{own_shm_namespace}_")
    try:
        h5cli(*COMMANDS[command](base_store, tmp_path))
        assert not os.path.exists(f"/dev/shm/{name}"), f"`h5stream {command}` left {name}"
    finally:
        if os.path.exists(f"/dev/shm/{name}"):
            os.unlink(f"/dev/shm/{name}")


# -- what cannot be allocated is refused up front -------------------------------------------------------------

def test_a_batch_this_machine_cannot_hold_is_a_budget_error_naming_a_batch_size_that_fits(base_store):
    import psutil

    batch = 4 * psutil.virtual_memory().total // int(np.prod(SHAPE))  # one batch array: 4x the machine's memory
    with pytest.raises(BudgetError, match=r"memory available: lower batch_size to \d+") as caught:
        with h5stream.open(base_store, batch_size=batch) as stream:
            next(iter(stream))  # (without the check: a ReaderError from allocating, once reading starts)
    assert "\n" not in str(caught.value)


def test_the_plan_is_refused_beyond_the_available_memory_and_the_named_fixes_fit(base_store):
    import dataclasses
    import re

    from h5stream.streaming.planning import plan_stream
    from h5stream.read.plan import parse_bytes
    from h5stream.store.meta import read_meta

    meta = read_meta(base_store)
    available = 1 << 30
    with pytest.raises(BudgetError, match="lower batch_size to") as caught:
        plan_stream(meta, None, 10 ** 8, available_bytes=available)
    fits = int(re.search(r"lower batch_size to (\d+)", str(caught.value)).group(1))
    assert plan_stream(meta, None, fits, available_bytes=available).total_bytes <= available
    # a budget larger than the machine, over a store large enough to fill it
    big = dataclasses.replace(meta, rows=10 ** 8)
    with pytest.raises(BudgetError, match="set memory_budget to") as caught:
        plan_stream(big, 8 << 30, 32, available_bytes=available)
    budget = parse_bytes(re.search(r"set memory_budget to '(\w+)'", str(caught.value)).group(1))
    assert plan_stream(big, budget, 32, available_bytes=available).total_bytes <= available
    assert plan_stream(big, 8 << 30, 32, available_bytes=None).total_bytes > available  # reported, not refused


# -- an I/O error is not damage ---------------------------------------------------------------------------------

@pytest.fixture
def mount_failing(tmp_path):
    """``mount_failing(source, bad)``: the path of ``source`` served by a real (FUSE) file system whose reads
    touching a byte range in ``bad`` fail with EIO."""
    from faulty_fs import failing_mount, fuse_available

    if not fuse_available():
        pytest.skip("needs /dev/fuse and root to mount a file system that fails reads")
    with contextlib.ExitStack() as stack:
        def mount(source, bad):
            try:
                return stack.enter_context(failing_mount(tmp_path / "mnt", source, bad))
            except OSError as exc:
                pytest.skip(f"cannot mount a FUSE file system here: {exc}")
        yield mount


def test_an_io_error_opening_the_store_is_reported_as_one_not_as_damage(base_store, mount_failing, h5cli):
    path = mount_failing(base_store, bad=[(0, 4096)])  # the superblock's sector is unreadable
    for command in ("info", "verify"):
        code, _out, err = h5cli(command, path)
        assert code == 1 and one_line(err), err
        assert "I/O error reading" in err and "check the disk" in err and "damaged" not in err, err
    with pytest.raises(StoreReadError, match="I/O error reading") as caught:
        h5stream.open(path, batch_size=16)
    assert caught.value.errno == errno.EIO and isinstance(caught.value, OSError)
    # Left uncaught (kept as sys.last_value to the end), the error must not hold HDF5 objects that HDF5's exit
    # handler would free after the interpreter is gone: one line and exit 1, not a crash at exit.
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(h5stream.__file__))}
    done = subprocess.run([sys.executable, "-c", f"import h5stream; h5stream.open({path!r})"], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 1 and "StoreReadError" in done.stderr.strip().splitlines()[-1], done


def test_an_io_error_reading_the_labels_names_the_byte(base_store, mount_failing, h5cli):
    with h5py.File(base_store, "r") as f:
        offset = f["labels"].id.get_chunk_info(0).byte_offset
    path = mount_failing(base_store, bad=[(offset, offset + 8)])
    code, _out, err = h5cli("info", path)
    assert code == 1 and one_line(err), err
    assert f"I/O error reading the file at byte {offset}" in err and "damaged" not in err, err


_FEW_FILES = """
import resource, sys
import h5stream
resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))
with h5stream.open(sys.argv[1], batch_size=32, workers=2, augment=h5stream.Augment(horizontal_flip=True),
                   feeder=sys.argv[2] == "feeder") as s:
    print(sum(len(x) for x, _ in s))
"""


@pytest.mark.parametrize("how", ["pooled", "feeder"])
def test_a_stream_out_of_file_descriptors_is_one_line_naming_the_limit(tmp_path, how):
    """``ulimit -n 16`` leaves too few descriptors for two workers' pipes: a ResourceLimitError naming the limit,
    the fix and the worker count, not an OSError from deep inside multiprocessing; nothing left behind.  The same
    with the feeder process, where the workers' pipes run out in the feeder."""
    path = tmp_path / "s.h5"
    rng = np.random.default_rng(0)
    write_arrays(path, rng.integers(0, 255, (256, 16, 16, 3), dtype=np.uint8), np.arange(256) % 3, block_rows=16)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(h5stream.__file__))}
    done = subprocess.run([sys.executable, "-c", _FEW_FILES, str(path), how], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("h5stream.errors.ResourceLimitError: ") and "ulimit -n is 16" in last, done.stderr
    assert "workers=0" in last and "raise it" in last
