"""Committed rows without a checksum are damage, a torn commit's last block is still checked, a checksum table
HDF5 cannot read is named in one line, and `repair` names the damaged rows and their files.

Every store here is real and damaged with h5py (datasets shortened or deleted, attributes removed or edited)
or by flipping bytes at offsets h5py's chunk index gives.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
import sys

import h5py
import numpy as np
import pytest

import h5stream
from h5stream.errors import ChecksumError, ReaderError, StoreFormatError
from h5stream.store import checksum
from h5stream.store.writer import StoreWriter, write_arrays
from h5stream.store import pathrows
from test_crash_resume import kill_shim  # noqa: F401 - a fixture: the LD_PRELOAD library that SIGKILLs

pytestmark = pytest.mark.usefixtures("no_leaks")

ROWS, BLOCK = 600, 64  # blocks 0-8 complete (rows 0-575) and a partial block 9 (rows 576-599)
ROW_BYTES = 8 * 8 * 3


def make_store(path):
    rng = np.random.default_rng(3)
    write_arrays(path, rng.integers(0, 256, (ROWS, 8, 8, 3), dtype=np.uint8), rng.integers(0, 3, ROWS),
                 block_rows=BLOCK)
    return path


def flip_pixel(path, row):
    """Invert one byte of the pixels of ``row``, where h5py's chunk index says they lie."""
    with h5py.File(path, "r") as f:
        info = f["images"].id.get_chunk_info_by_coord((row // BLOCK * BLOCK, 0, 0, 0))
    at = info.byte_offset + (row % BLOCK) * ROW_BYTES + 5
    with open(path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0xFF]))


def stream_all(path, **kw):
    with h5stream.open(path, batch_size=50, shuffle=False, memory_budget="8MiB", **kw) as s:
        return sum(len(x) for x, _ in s)


def shorten_table(f):
    f["checksums"].resize((5, 3))


def delete_table(f):
    del f["checksums"]


def delete_tail(f):
    del f.attrs["checksum_tail"]


# (damage, a row it leaves without a checksum, the rows verify names)
MISSING = [(shorten_table, 400, "rows 320-575 have no checksum"),
           (delete_table, 400, "rows 0-599 have no checksum"),
           (delete_tail, 590, "rows 576-599 have no checksum")]


@pytest.mark.parametrize("damage,row,named", MISSING, ids=[m[0].__name__ for m in MISSING])
def test_committed_rows_without_a_checksum_are_damage_not_streamed_unchecked(tmp_path, h5cli, damage, row, named):
    path = make_store(tmp_path / "m.h5")
    with h5py.File(path, "r+") as f:
        damage(f)
    flip_pixel(path, row)
    code, out, err = h5cli("verify", path)
    assert code == 1 and out == "" and err.count("\n") == 1 and err.startswith("h5stream: error: "), err
    assert named in err and "damage" in err and "restore the file from a copy or re-ingest it" in err
    assert f"checksums       DAMAGED: {named}" in h5cli("info", path)[1]
    with pytest.raises(StoreFormatError, match=named) as info:
        h5stream.open(path, batch_size=50)
    assert "\n" not in str(info.value) and "verify_reads=False" in str(info.value)
    assert stream_all(path, verify_reads=False) == ROWS  # asked for unchecked: streamed as before
    # Appending would hash the damaged rows anew and so hide the damage: refused, the file left as it was.
    with pytest.raises(StoreFormatError, match="nothing can be appended"):
        StoreWriter.open_append(path)
    assert h5cli("verify", path)[0] == 1
    code, out, err = h5cli("repair", path)
    assert code == 1 and named in err and err.count("\n") == 1


def test_a_store_from_before_checksums_is_still_read_unchecked(tmp_path, h5cli):
    path = make_store(tmp_path / "old.h5")
    with h5py.File(path, "r+") as f:  # what a store written before checksums existed looks like
        del f["checksums"]
        del f.attrs["checksum"], f.attrs["checksum_tail"]
    assert h5cli("verify", path)[0] == 3
    assert stream_all(path) == ROWS


def lower_count(path, rows=500, cut_arrays=False):
    with h5py.File(path, "r+") as f:
        f.attrs["committed_rows"] = np.int64(rows)
        if cut_arrays:
            for name in ("images", "labels", "path_ends"):
                f[name].resize(rows, axis=0)


def test_a_count_below_the_checksums_checks_its_last_block_against_the_wider_checksum(tmp_path, h5cli):
    # Checksums for 600 rows, committed_rows 500: what a writer stopped between its two flushes leaves (and a
    # count lowered by hand).  Block 7 (rows 448-511) holds the last committed rows; its checksum covers 64 rows.
    path = make_store(tmp_path / "t.h5")
    lower_count(path)
    code, out, err = h5cli("verify", path)
    assert code == 3 and err.count("\n") == 1
    assert "the 500 committed rows match" in err and "rows 500-599 were written and not committed" in err
    with pytest.warns(UserWarning, match="rows 500-599 were written and never committed") as caught:
        assert stream_all(path) == 500
    assert len(caught) == 1 and "h5stream repair" in str(caught[0].message)
    flip_pixel(path, 470)
    code, out, err = h5cli("verify", path)
    assert code == 1 and "rows 448-499 do not match their checksum (images: row 470)" in err, err
    with pytest.raises(ReaderError) as info, pytest.warns(UserWarning, match="never committed"):
        stream_all(path)  # the damaged committed row is never handed out
    assert isinstance(info.value, ChecksumError) or isinstance(info.value.__cause__, ChecksumError), info.value
    assert "row 470 (block 7)" in str(info.value)  # checked by row: the damaged row itself
    with pytest.raises(StoreFormatError, match="rows 448-499 do not match their checksum"):
        StoreWriter.open_append(path)  # would hash rows 448-499 anew
    assert h5cli("verify", path)[0] == 1


def test_repair_drops_the_rows_of_a_torn_commit(tmp_path, h5cli):
    path = make_store(tmp_path / "t.h5")
    lower_count(path)
    code, out, err = h5cli("repair", path)
    assert code == 0 and "dropped rows 500-599" in out and "500 committed rows match" in out, (out, err)
    code, out, _ = h5cli("verify", path)
    assert code == 0 and "OK, 500 rows" in out


def test_checksums_for_rows_the_arrays_do_not_hold_are_damage(tmp_path, h5cli):
    path = make_store(tmp_path / "c.h5")
    lower_count(path, cut_arrays=True)  # rows are written before their checksums: this never happens by itself
    code, out, err = h5cli("verify", path)
    assert code == 1 and err.count("\n") == 1 and "checksums cover 600 rows but only 500 are stored" in err, err
    with pytest.raises(StoreFormatError, match="only 500 are stored"):
        h5stream.open(path, batch_size=50)


def test_problem_is_none_for_every_state_a_commit_passes_through():
    # Pure: the states of StoreWriter.commit (digests staged and flushed with their rows, then the count raised).
    from h5stream.store import coverage

    d = (1, 2, 3)
    for committed, tail_rows in [(0, 0), (100, 100), (128, 128), (100, 130), (100, 200), (128, 256)]:
        tail = (tail_rows, d if tail_rows % 64 else None)
        assert coverage.problem(committed, tail_rows, 64, tail_rows // 64, tail, has_checksum_attrs=True) is None
    assert coverage.problem(100, 100, 64, None, None, has_checksum_attrs=False) is None  # before checksums
    assert coverage.problem(128, 128, 64, 2, None, has_checksum_attrs=True) is None  # a lost tail covered nothing
    assert "rows 64-99" in coverage.problem(100, 100, 64, 1, (64, None), has_checksum_attrs=True)
    assert "rows 64-99" in coverage.problem(100, 100, 64, 1, None, has_checksum_attrs=True)
    assert "rows 64-99" in coverage.problem(100, 100, 64, 2, (130, d), has_checksum_attrs=True)  # arrays cut
    assert coverage.partial_source(100, 64, 2, (130, d), 130) == ("table", 128)
    assert coverage.partial_source(100, 64, 1, (120, d), 120) == ("tail", 120)
    assert coverage.partial_source(100, 64, 1, (100, d), 100) == ("tail", 100)
    assert coverage.partial_source(100, 64, 1, (120, d), 110) is None


# -- a damaged checksum table -----------------------------------------------------------------------------------


def break_table_index(path):
    """Overwrite the signature of the B-tree that indexes ``/checksums``: the v1 B-tree node ("TREE") whose
    child address is the table's one chunk, as h5py's chunk info gives it."""
    with h5py.File(path, "r") as f:
        at = f["checksums"].id.get_chunk_info(0).byte_offset
    data = path.read_bytes()
    key = struct.pack("<Q", at)
    nodes = [m.start() for m in re.finditer(b"TREE", data) if key in data[m.start():m.start() + 2048]]
    assert len(nodes) == 1, nodes
    with open(path, "r+b") as fh:
        fh.seek(nodes[0])
        fh.write(b"EERT")
    with h5py.File(path, "r") as f, pytest.raises(OSError):
        f["checksums"][:]  # HDF5 itself now fails on it


def test_a_checksum_table_hdf5_cannot_read_is_one_line(tmp_path, h5cli):
    path = make_store(tmp_path / "b.h5")
    break_table_index(path)
    code, out, err = h5cli("verify", path)
    assert code == 1 and out == "" and err.count("\n") == 1, err
    assert "the block checksum table /checksums cannot be read" in err and "damaged" in err
    with pytest.raises(StoreFormatError, match="/checksums cannot be read") as info:
        h5stream.open(path, batch_size=50)
    assert "\n" not in str(info.value)
    assert stream_all(path, verify_reads=False) == ROWS


def test_a_checksum_table_hdf5_cannot_read_is_one_line_over_http(range_server, h5cli):
    path = range_server.root / "store.h5"
    break_table_index(path)
    url = range_server.url + "store.h5"
    code, out, err = h5cli("verify", url)
    assert code == 1 and out == "" and err.count("\n") == 1 and "/checksums cannot be read" in err, err
    with pytest.raises(StoreFormatError, match="/checksums cannot be read"):
        h5stream.open(url, batch_size=50)


# -- repair of damaged rows ---------------------------------------------------------------------------------------


def test_repair_names_damaged_rows_and_lists_their_source_files(class_src, tmp_path, h5cli):
    root, _ = class_src
    path = tmp_path / "dmg.h5"
    assert h5cli("ingest", root, path, "--size", "8", "--block-rows", "4", "--workers", "0")[0] == 0
    with h5py.File(path, "r") as f:
        stored = pathrows.stored_bytes(f, 0, f["images"].shape[0])
    flip_pixel_at(path, 5, block_rows=4, row_bytes=8 * 8 * 3)
    damaged = path.read_bytes()
    code, out, err = h5cli("repair", path)
    assert code == 1 and err.count("\n") == 1 and err.startswith("h5stream: error: "), err
    assert "rows 4-7 do not match their checksum (images: row 5)" in err and "cannot restore" in err
    assert "restore the file from a copy" in err and "4 source files listed on stdout" in err
    assert out.encode().splitlines() == stored[4:8]
    for rel in out.splitlines():  # the very files to ingest again
        assert os.path.isfile(os.path.join(root, rel))
    assert path.read_bytes() == damaged  # nothing was written


def flip_pixel_at(path, row, block_rows, row_bytes):
    with h5py.File(path, "r") as f:
        info = f["images"].id.get_chunk_info_by_coord((row // block_rows * block_rows, 0, 0, 0))
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + (row % block_rows) * row_bytes)
        b = fh.read(1)
        fh.seek(info.byte_offset + (row % block_rows) * row_bytes)
        fh.write(bytes([b[0] ^ 0xFF]))


def test_repair_of_a_sound_store_says_nothing_to_repair(tmp_path, h5cli):
    path = make_store(tmp_path / "ok.h5")
    code, out, err = h5cli("repair", path)
    assert code == 0 and err == "" and "nothing to repair" in out and "600 committed rows match" in out


def test_verify_result_of_a_sound_store_has_no_leftovers(tmp_path, recwarn):
    path = make_store(tmp_path / "ok.h5")
    result = checksum.verify_store(path)
    assert result.ok and result.uncommitted is None and result.checked_rows == ROWS
    assert stream_all(path) == ROWS and not [w for w in recwarn if issubclass(w.category, UserWarning)]


# -- repair --source: damaged pixel blocks decoded again from their files -----------------------------------------


def ingested(class_src, tmp_path, h5cli, *extra):
    root, _ = class_src
    src = tmp_path / "src"
    shutil.copytree(root, src)
    path = tmp_path / "dmg.h5"
    assert h5cli("ingest", src, path, "--size", "8", "--block-rows", "4", "--workers", "0", *extra)[0] == 0
    return src, path


def test_repair_from_the_source_restores_damaged_blocks_to_their_ingested_bytes(class_src, tmp_path, h5cli):
    src, path = ingested(class_src, tmp_path, h5cli)
    good = path.read_bytes()
    flip_pixel_at(path, 5, block_rows=4, row_bytes=8 * 8 * 3)
    flip_pixel_at(path, 17, block_rows=4, row_bytes=8 * 8 * 3)  # block 4: rows 16-17 of 18, the partial last one
    assert path.read_bytes() != good
    code, out, err = h5cli("repair", path, "--source", src)
    assert code == 0 and err == "", err
    assert "restored 6 damaged rows in 2 blocks" in out and "18 committed rows match their checksums" in out
    assert path.read_bytes() == good  # exactly the bytes that were ingested, nothing else written
    assert h5cli("verify", path)[0] == 0


def test_repair_from_a_changed_source_restores_nothing_and_says_why(class_src, tmp_path, h5cli):
    src, path = ingested(class_src, tmp_path, h5cli)
    with h5py.File(path, "r") as f:
        rel = pathrows.stored_bytes(f, 6, 7)[0].decode()
    from PIL import Image

    Image.new("RGB", (30, 40), (1, 2, 3)).save(src / rel, format="PNG" if rel.endswith(".png") else "JPEG")
    flip_pixel_at(path, 5, block_rows=4, row_bytes=8 * 8 * 3)
    damaged = path.read_bytes()
    code, out, err = h5cli("repair", path, "--source", src)
    assert code == 1 and err.count("\n") == 1 and "rows 4-7 do not match their checksum" in err, err
    assert "--source restored 0 of 1 damaged blocks" in err and "other bytes than were ingested" in err
    assert len(out.splitlines()) == 4  # the files to ingest again are still listed
    assert path.read_bytes() == damaged


def test_repair_from_the_source_leaves_a_compressed_store_as_it_is(class_src, tmp_path, h5cli):
    src, path = ingested(class_src, tmp_path, h5cli, "--compression", "zlib")
    with h5py.File(path, "r") as f:
        info = f["images"].id.get_chunk_info_by_coord((4, 0, 0, 0))
    with open(path, "r+b") as fh:  # a byte inside the deflate stream
        fh.seek(info.byte_offset + info.size // 2)
        b = fh.read(1)
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(bytes([b[0] ^ 0xFF]))
    damaged = path.read_bytes()
    code, out, err = h5cli("repair", path, "--source", src)
    assert code == 1 and err.count("\n") == 1 and "rows 4-7" in err and "--source restored 0 of 1" in err, err
    assert path.read_bytes() == damaged


def test_repair_from_the_source_killed_after_each_of_its_writes_is_finished_by_the_next(class_src, tmp_path, h5cli,
                                                                                        request):
    shim = request.getfixturevalue("kill_shim")
    src, path = ingested(class_src, tmp_path, h5cli)
    good = path.read_bytes()
    flip_pixel_at(path, 5, block_rows=4, row_bytes=8 * 8 * 3)
    flip_pixel_at(path, 9, block_rows=4, row_bytes=8 * 8 * 3)
    damaged = path.read_bytes()

    def killed_repair(after, log=None):
        env = dict(os.environ, LD_PRELOAD=shim, KILL_DIR=str(tmp_path), KILL_AFTER=str(after))
        if log is not None:
            env["KILL_LOG"] = str(log)
        return subprocess.run([sys.executable, "-m", "h5stream", "repair", str(path), "--source", str(src)],
                              env=env, capture_output=True, text=True, timeout=300)

    log = tmp_path / "steps.log"
    assert killed_repair(0, log).returncode == 0 and path.read_bytes() == good
    steps = [s for s in log.read_text().splitlines() if s.endswith("dmg.h5")]
    assert sum(" pwrite" in s for s in steps) == 2, steps  # one write per damaged block, and its sync
    for k in range(1, len(steps) + 1):
        path.write_bytes(damaged)
        assert killed_repair(k).returncode == -signal.SIGKILL, k
        assert h5cli("verify", path)[0] in (0, 1)  # restored or still damaged, never anything else
        code, out, err = h5cli("repair", path, "--source", src)
        assert code == 0 and path.read_bytes() == good, (k, err)
    # A block killed half-way through its write: part restored, part not; it still fails, and is restored.
    with h5py.File(path, "r") as f:
        at = f["images"].id.get_chunk_info_by_coord((4, 0, 0, 0)).byte_offset
    half = bytearray(damaged)
    half[at:at + 2 * ROW_BYTES] = good[at:at + 2 * ROW_BYTES]
    path.write_bytes(bytes(half))
    assert h5cli("verify", path)[0] == 1
    assert h5cli("repair", path, "--source", src)[0] == 0 and path.read_bytes() == good
