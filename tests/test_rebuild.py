"""A store whose writer stopped while HDF5 rewrote it in place: readers refuse it, `repair` or the next `--append`
rebuilds it from its committed rows, and a rebuild that cannot be done leaves it as it was.

The torn files themselves come from real kills in ``test_crash_resume.py`` (a SIGKILL after every file write of
an ingest); here the marker is put beside whole stores, to show what the rebuild checks and what it keeps.
"""

from __future__ import annotations

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
import tables

from h5stream.errors import StoreFormatError
from h5stream.store import read_meta, schema
from h5stream.store.checksum import verify_store
from h5stream.store.handle import creating_path, mark_flushing
from h5stream.store.schema import flushing_path
from h5stream.store.lock import StoreLock, is_held, lock_path
from h5stream.store.rebuild import copy_rows
from h5stream.store import pathrows

pytestmark = pytest.mark.usefixtures("no_leaks")

ARGS = ("--size", "16", "--block-rows", "4", "--workers", "0")


def _rows(path):
    with h5py.File(path, "r", locking=False) as f:
        n = int(f.attrs[schema.ATTR_COMMITTED])
        rows = {k: f[k][:] for k in (schema.IMAGES, schema.LABELS)}
        return {**rows, "paths": pathrows.stored_bytes(f, 0, len(rows[schema.IMAGES]))}, n, dict(f.attrs)


@pytest.fixture
def store(class_src, tmp_path, h5cli):
    root, _ = class_src
    out = tmp_path / "s.h5"
    assert h5cli("ingest", root, out, *ARGS)[0] == 0
    return out


def test_copy_steps_are_whole_blocks_of_about_64_mib():
    assert copy_rows(4, 768) == (64 << 20) // (4 * 768) * 4
    assert copy_rows(64, 49152) == 64 * 21 and copy_rows(8192, 1 << 20) == 8192  # at least one block


def test_readers_refuse_a_store_left_mid_update_until_repair_rebuilds_it_whole(store, h5cli):
    before, n, attrs = _rows(store)
    mark_flushing(str(store))
    code, out, err = h5cli("info", store)
    assert code == 1 and err.count("\n") == 1 and f"h5stream repair {store}" in err and "--append" in err, err
    with pytest.raises(StoreFormatError, match="rewrote the file's structure in place"):
        read_meta(store)
    inode = os.stat(store).st_ino
    code, out, err = h5cli("repair", store)
    assert code == 0 and out == f"{store}: rebuilt from its {n} committed rows\n", (out, err)
    assert os.stat(store).st_ino != inode  # a fresh file took the name
    assert not os.path.exists(flushing_path(store)) and not os.path.exists(creating_path(store))
    assert not os.path.exists(lock_path(store))
    after, n_after, attrs_after = _rows(store)
    assert n_after == n and all(np.array_equal(after[k], before[k]) for k in before)
    for name in (schema.ATTR_CLASS_NAMES, schema.ATTR_BLOCK_ROWS, schema.ATTR_SKIPPED, schema.ATTR_ORDER,
                 schema.ATTR_ORDER_SEED, schema.ATTR_BACKGROUND, schema.ATTR_CHECKSUM_TAIL):
        assert attrs_after[name] == attrs[name], name
    assert verify_store(store).ok
    nothing = (f"{store}: nothing to repair (no writer was stopped while it rewrote the file, and its {n} committed "
               "rows match their checksums)\n")
    assert h5cli("repair", store)[1] == nothing


@pytest.mark.parametrize("compression", ["zlib", "blosc"])
def test_a_rebuild_keeps_the_stores_compression(class_src, tmp_path, h5cli, compression):
    root, _ = class_src
    out = tmp_path / "c.h5"
    assert h5cli("ingest", root, out, *ARGS, "--compression", compression)[0] == 0

    def rows():  # through PyTables: plain h5py has no blosc
        with tables.open_file(out, "r") as f:
            rows = {k: f.root._f_get_child(k).read() for k in (schema.IMAGES, schema.LABELS)}
            return {**rows, "paths": pathrows.read_tables(f.root, 0, len(rows[schema.IMAGES])).to_bytes()}

    before, was = rows(), read_meta(out).compression
    mark_flushing(str(out))
    code, stdout, err = h5cli("repair", out)
    assert code == 0, err
    after = rows()
    assert read_meta(out).compression == was and all(np.array_equal(after[k], before[k]) for k in before)
    assert verify_store(out).ok


def test_looking_for_the_marker_keeps_readers_off_pytables(store):
    # Every read_meta looks for the marker: naming it must not load PyTables (the writer's library) in a reader.
    code = ("import sys; from h5stream.store import read_meta; read_meta(sys.argv[1]); "
            "print('tables' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(store)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", (done.stdout, done.stderr)


def test_a_writer_at_work_is_not_taken_for_a_stopped_one(store):
    # Mid-flush, a live writer's marker is there: readers go on (the flush settles), it is not torn.
    assert is_held(store) is False
    with StoreLock.acquire(store):
        mark_flushing(str(store))
        assert is_held(store) is True
        assert read_meta(store).rows > 0
    assert is_held(store) is False
    with pytest.raises(StoreFormatError):
        read_meta(store)


def test_append_rebuilds_first_then_adds(class_src_copy, tmp_path, h5cli):
    root, _ = class_src_copy
    moved = tmp_path / "later"
    os.rename(os.path.join(root, "dog"), moved)  # the first run ingests bird and cat
    out = tmp_path / "s.h5"
    assert h5cli("ingest", root, out, *ARGS)[0] == 0
    first, n, _ = _rows(out)
    mark_flushing(str(out))
    os.rename(moved, os.path.join(root, "dog"))
    code, stdout, err = h5cli("ingest", root, out, *ARGS, "--append")
    assert code == 0, err
    after, total, _ = _rows(out)
    assert total > n and all(np.array_equal(after[k][:n], first[k]) for k in first)
    assert not os.path.exists(flushing_path(out)) and verify_store(out).ok


def test_rows_that_no_longer_match_their_checksums_are_not_rebuilt_and_nothing_changes(class_src, store, h5cli):
    with h5py.File(store, "r", locking=False) as f:
        offset = f[schema.IMAGES].id.get_chunk_info(0).byte_offset
    with open(store, "r+b") as fh:
        fh.seek(offset + 5)
        byte = fh.read(1)
        fh.seek(offset + 5)
        fh.write(bytes([byte[0] ^ 0xFF]))
    mark_flushing(str(store))
    saved = store.read_bytes()
    for cmd in (("repair", store), ("ingest", class_src[0], store, *ARGS, "--append")):
        code, out, err = h5cli(*cmd)
        assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
        assert "rows 0-3 no longer match their checksums (images)" in err and "--overwrite" in err, err
    assert store.read_bytes() == saved and os.path.exists(flushing_path(store))
    assert not os.path.exists(creating_path(store))


def test_a_rebuild_that_cannot_be_written_leaves_the_store_and_its_marker(store):
    # The copy is written under the temporary name: a file size limit below the store stops it there.
    before, n, _ = _rows(store)
    mark_flushing(str(store))
    limit = os.path.getsize(store) // 2
    code = ("import resource, sys; n = int(sys.argv.pop(1)); resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); "
            "from h5stream.cli import run; sys.exit(run())")
    done = subprocess.run([sys.executable, "-c", code, str(limit), "repair", str(store)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "File too large" in done.stderr, done.stderr
    assert os.path.exists(flushing_path(store)) and not os.path.exists(creating_path(store))
    assert not os.path.exists(lock_path(store))
    done = subprocess.run([sys.executable, "-m", "h5stream", "repair", str(store)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    after, n_after, _ = _rows(store)
    assert n_after == n and all(np.array_equal(after[k], before[k]) for k in before)


def test_the_writer_refuses_to_append_to_a_marked_store_and_leaves_the_rebuild_to_its_caller(store):
    # "Rebuild before append" is the callers' policy (`ingest --append`, `repair`); StoreWriter only refuses, so
    # nothing is ever appended to a structure that may be torn.
    from h5stream.store.writer import StoreWriter

    mark_flushing(str(store))
    saved = store.read_bytes()
    with pytest.raises(StoreFormatError, match="h5stream repair") as info:
        StoreWriter.open_append(store)
    assert "\n" not in str(info.value) and "rewrote the file's structure in place" in str(info.value)
    assert store.read_bytes() == saved and os.path.exists(flushing_path(store))
    assert not os.path.exists(lock_path(store)) and not os.path.exists(creating_path(store))


def test_a_marked_store_without_checksums_is_one_line_not_a_traceback(class_src, store, h5cli):
    """A store written before checksums existed has nothing to check a rebuild's rows against: repair and
    --append refuse it in one line (they raised an IndexError), and nothing changes."""
    with h5py.File(store, "r+", locking=False) as f:
        del f[schema.CHECKSUMS]
        for name in (schema.ATTR_CHECKSUM, schema.ATTR_CHECKSUM_TAIL):
            if name in f.attrs:
                del f.attrs[name]
    mark_flushing(str(store))
    saved = store.read_bytes()
    for cmd in (("repair", store), ("ingest", class_src[0], store, *ARGS, "--append")):
        code, out, err = h5cli(*cmd)
        assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
        assert "no checksums to check its rows against" in err and "--overwrite" in err, err
    assert store.read_bytes() == saved and os.path.exists(flushing_path(store))
