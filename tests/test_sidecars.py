"""Nothing is written through a file someone else put beside a store.

A writer makes ``OUT.h5.creating``, ``OUT.h5.lock``, ``OUT.h5.skipped.csv`` and ``OUT.h5.flushing`` beside the
store.  Something planted at one of those names (a symbolic link to a victim file, a folder, a FIFO, a hard
link, another user's file) is refused in one line naming it, with a non-zero exit: the victim keeps its bytes,
what was planted stays, a store that was there keeps its rows and verifies, and once the thing is removed the
same command succeeds.  Real files and the CLI in-process.
"""

from __future__ import annotations

import hashlib
import os
import shutil

import h5py
import numpy as np
import pytest

from h5stream.store import schema
from h5stream.store.checksum import verify_store
from h5stream.store.handle import mark_flushing, open_for_writing
from h5stream.store.lock import lock_path
from h5stream.store.writer import write_arrays
from h5stream.store import pathrows

pytestmark = pytest.mark.usefixtures("no_leaks")

ARGS = ("--size", "8", "--block-rows", "4", "--workers", "0")
SUFFIXES = {"creating": ".creating", "lock": ".lock", "report": ".skipped.csv", "flushing": ".flushing"}
PRECIOUS = b"precious\n"


def plant(at: str, victim: str, kind: str) -> None:
    """Put a ``kind`` of thing that h5stream did not make at ``at``; ``victim`` is a file it must not write."""
    if kind == "symlink":
        os.symlink(os.path.basename(victim), at)  # relative, as `ln -s victim.txt out.h5.creating` makes it
    elif kind == "folder":
        os.mkdir(at)
    elif kind == "fifo":
        os.mkfifo(at)
    elif kind == "hardlink":
        os.link(victim, at)
    elif kind == "foreign":
        if os.geteuid() != 0:
            pytest.skip("giving a file to another user needs root")
        with open(at, "wb") as fh:
            fh.write(PRECIOUS)
        os.chown(at, 65534, 65534)
    else:
        raise ValueError(kind)


def still_there(at: str, kind: str) -> bool:
    """Whether what :func:`plant` put at ``at`` is still there as it was put."""
    checks = {"symlink": os.path.islink, "folder": os.path.isdir, "fifo": lambda p: not os.path.isfile(p),
              "hardlink": lambda p: os.stat(p).st_nlink == 2, "foreign": lambda p: os.stat(p).st_uid == 65534}
    return os.path.lexists(at) and checks[kind](at)


def assert_refused(code: int, err: str, at: str) -> None:
    assert code == 1, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"h5stream: error: {at}: ") and "remove it" in err, err


def fingerprint(path) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def rows_of(path):
    with h5py.File(path, "r", locking=False) as f:
        n = int(f.attrs[schema.ATTR_COMMITTED])
        return n, [f[k][:n] for k in (schema.IMAGES, schema.LABELS)] + [pathrows.stored_bytes(f, 0, n)]


def same_rows(a, b) -> bool:
    return a[0] == b[0] and all(np.array_equal(x, y) for x, y in zip(a[1], b[1]))


def sidecar_at(out, name: str) -> str:
    """Where the sidecar ``name`` of the store ``out`` lies (the lock beside the resolved path)."""
    return lock_path(out) if name == "lock" else str(out) + SUFFIXES[name]


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim.txt"
    path.write_bytes(PRECIOUS)
    return str(path)


@pytest.fixture
def src_with_a_bad_file(class_src_copy):
    """A source folder; ``add_bad()`` adds a file that the next ingest skips (so it writes the skip report)."""
    root, _ = class_src_copy

    def add_bad(name="bad.png"):
        with open(os.path.join(root, "cat", name), "wb") as fh:
            fh.write(b"not an image")

    return root, add_bad


@pytest.mark.parametrize("kind", ["symlink", "folder", "fifo", "hardlink", "foreign"])
@pytest.mark.parametrize("name", list(SUFFIXES))
def test_a_fresh_ingest_refuses_what_it_did_not_make_beside_the_store(src_with_a_bad_file, tmp_path, h5cli, victim,
                                                                      name, kind):
    root, add_bad = src_with_a_bad_file
    add_bad()  # so that an ingest that went on would write the skip report too
    out = tmp_path / "out.h5"
    at = sidecar_at(out, name)
    plant(at, victim, kind)
    code, _, err = h5cli("ingest", root, out, *ARGS)
    assert_refused(code, err, at)
    assert open(victim, "rb").read() == PRECIOUS
    assert still_there(at, kind)
    assert sorted(os.listdir(os.path.dirname(at))) == sorted(["src", "victim.txt", os.path.basename(at)])
    if kind in ("symlink", "fifo", "folder"):
        (shutil.rmtree if kind == "folder" else os.unlink)(at)
        assert h5cli("ingest", root, out, *ARGS)[0] == 0
        assert verify_store(out).ok and open(victim, "rb").read() == PRECIOUS


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
@pytest.mark.parametrize("name", list(SUFFIXES))
def test_an_append_refuses_what_it_did_not_make_beside_the_store_and_keeps_it(src_with_a_bad_file, tmp_path, h5cli,
                                                                               victim, name, kind):
    root, add_bad = src_with_a_bad_file
    out = tmp_path / "out.h5"
    add_bad("first.png")
    assert h5cli("ingest", root, out, *ARGS)[0] == 0
    report = schema.skipped_report_path(out)
    before, report_before = rows_of(out), fingerprint(report)
    add_bad()  # a file the --append skips: it would append to the report
    at = sidecar_at(out, name)
    if name == "report":
        os.unlink(report)
    plant(at, victim, kind)
    code, _, err = h5cli("ingest", root, out, *ARGS, "--append")
    assert_refused(code, err, at)
    assert open(victim, "rb").read() == PRECIOUS
    assert still_there(at, kind)
    assert same_rows(rows_of(out), before)
    if name != "report":
        assert fingerprint(report) == report_before
    os.unlink(at)
    assert verify_store(out).ok  # (a link at the flushing marker's name makes readers refuse the store until then)
    assert h5cli("ingest", root, out, *ARGS, "--append")[0] == 0
    assert verify_store(out).ok and open(victim, "rb").read() == PRECIOUS
    with open(report, encoding="utf-8") as fh:
        assert "cat/bad.png" in fh.read()


@pytest.mark.parametrize("name", ["creating", "lock"])
def test_repair_refuses_a_link_where_it_writes_its_copy_and_leaves_the_store_to_repair(class_src, tmp_path, h5cli,
                                                                                       victim, name):
    root, _ = class_src
    out = tmp_path / "out.h5"
    assert h5cli("ingest", root, out, *ARGS)[0] == 0
    before, inode = rows_of(out), os.stat(out).st_ino
    mark_flushing(str(out))
    at = sidecar_at(out, name)
    plant(at, victim, "symlink")
    code, _, err = h5cli("repair", out)
    assert_refused(code, err, at)
    assert open(victim, "rb").read() == PRECIOUS and os.path.islink(at)
    assert os.stat(out).st_ino == inode and os.path.exists(schema.flushing_path(out))  # still to repair
    assert same_rows(rows_of(out), before)
    os.unlink(at)
    code, stdout, err = h5cli("repair", out)
    assert code == 0 and "rebuilt" in stdout, err
    assert same_rows(rows_of(out), before) and verify_store(out).ok and open(victim, "rb").read() == PRECIOUS


def test_a_new_store_is_not_made_where_a_symlink_lies(class_src, tmp_path, h5cli, victim):
    # A link at OUT itself: the new file would replace the link, so the name would no longer mean what the user
    # made it mean.  Refused whether it points nowhere (a fresh ingest) or at a file (--overwrite).
    root, _ = class_src
    dangling, elsewhere = tmp_path / "new.h5", tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere / "new.h5", dangling)
    code, _, err = h5cli("ingest", root, dangling, *ARGS)
    assert_refused(code, err, str(dangling))
    assert "symbolic link" in err and os.path.islink(dangling) and os.listdir(elsewhere) == []
    nowhere = tmp_path / "nowhere.h5"
    os.symlink(tmp_path / "missing" / "nowhere.h5", nowhere)  # the lock's folder (the link resolved) is missing
    code, _, err = h5cli("ingest", root, nowhere, *ARGS)
    assert code == 1 and err.count("\n") == 1 and "does not exist" in err and "free some space" not in err, err
    linked = tmp_path / "linked.h5"
    os.symlink(os.path.basename(victim), linked)
    code, _, err = h5cli("ingest", root, linked, *ARGS, "--overwrite")
    assert_refused(code, err, str(linked))
    assert os.path.islink(linked) and open(victim, "rb").read() == PRECIOUS
    assert not os.path.lexists(str(linked) + ".creating")


def test_a_symlinked_store_is_appended_to_and_rebuilt_where_it_points(class_src, tmp_path, h5cli):
    root, _ = class_src
    real, link = tmp_path / "real.h5", tmp_path / "link.h5"
    assert h5cli("ingest", root, real, *ARGS)[0] == 0
    before = rows_of(real)
    os.symlink(real.name, link)
    mark_flushing(str(link))  # a writer appending through the link was stopped mid-flush
    code, stdout, err = h5cli("repair", link)
    assert code == 0 and "rebuilt" in stdout, err
    assert os.path.islink(link) and os.readlink(link) == real.name  # the link stays a link to the rebuilt file
    assert same_rows(rows_of(real), before) and verify_store(real).ok
    mark_flushing(str(link))
    code, _, err = h5cli("ingest", root, link, *ARGS, "--append")  # rebuilds first, then adds (nothing new here)
    assert code == 0, err
    assert os.path.islink(link) and same_rows(rows_of(real), before) and verify_store(real).ok
    assert sorted(os.listdir(tmp_path)) == ["link.h5", "real.h5"]


def test_stale_files_of_ours_beside_a_new_store_are_replaced(class_src, tmp_path, h5cli):
    root, _ = class_src
    out = tmp_path / "out.h5"
    with open(str(out) + ".creating", "wb") as fh:
        fh.write(b"half a store from a killed run")
    with open(lock_path(out), "w") as fh:
        fh.write("999999999\n")  # a dead writer's
    assert h5cli("ingest", root, out, *ARGS)[0] == 0
    assert verify_store(out).ok
    assert sorted(os.listdir(tmp_path)) == ["out.h5"]


def test_hdf5_creates_the_temporary_file_exclusively_and_the_writer_checks_it_opened_that_file(tmp_path, victim):
    from h5stream.errors import StoreExistsError
    from h5stream.store import layout

    link = str(tmp_path / "x.h5.creating")
    os.symlink(victim, link)
    with pytest.raises(FileExistsError):  # O_CREAT | O_EXCL: a link there fails the create
        layout.create_empty_file(link)
    assert open(victim, "rb").read() == PRECIOUS
    # A file replaced at the name between its creation and the writer's open by name: refused, and the file
    # that took the name is not written.
    a, b = str(tmp_path / "a.h5"), str(tmp_path / "b.h5")
    for path in (a, b):
        write_arrays(path, np.zeros((4, 2, 2, 1), np.uint8), np.zeros(4, np.int64))
    made = (os.stat(a).st_dev, os.stat(a).st_ino)
    b_before = fingerprint(b)
    os.replace(b, a)
    with pytest.raises(StoreExistsError, match="something replaced it"):
        open_for_writing(a, made)
    assert fingerprint(a) == b_before  # refused before HDF5 opened it (opening for writing writes to it)


def test_the_skip_report_is_never_read_through_a_link(tmp_path, victim):
    from h5stream.errors import StoreExistsError
    from h5stream.ingest.report import read_report

    at = str(tmp_path / "out.h5.skipped.csv")
    with open(victim, "w") as fh:
        fh.write("path,reason\nsecret.png,a line of another file\n")
    os.symlink(victim, at)
    with pytest.raises(StoreExistsError, match="symbolic link"):
        read_report(at)



def test_direct_writes_go_only_to_the_file_hdf5_has_open(tmp_path):
    from h5stream.store.rawchunks import RawChunks

    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    a.write_bytes(b"a" * 4096)
    b.write_bytes(b"b" * 4096)
    fd = os.open(a, os.O_RDONLY)
    try:
        raw = RawChunks.open(str(a), fd)
        if raw is None:
            pytest.skip("this file system refuses O_DIRECT")
        raw.close()
        assert RawChunks.open(str(b), fd) is None  # another file at the name: HDF5 writes every block itself
    finally:
        os.close(fd)
