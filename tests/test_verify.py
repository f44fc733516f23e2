"""Block checksums: written by ingest, write_arrays and --append; `h5stream verify` finds damage in real files."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys

import h5py
import numpy as np
import pytest
import xxhash

from h5stream.store import checksum
from h5stream.store.writer import StoreWriter, write_arrays


def recomputed(path):
    """(complete-block digests, tail digests or None) of the committed rows, hashed here from plain h5py reads."""
    with h5py.File(path, "r") as f:
        rows, block_rows = int(f.attrs["committed_rows"]), int(f.attrs["block_rows"])
        arrays = [f[name][:rows] for name in ("images", "labels")]
        ends = f["path_ends"][:rows].astype("<i8")
        data = f["path_bytes"][:int(ends[-1]) if rows else 0]

    def paths_digest(s):  # as the schema says: xxh3 of the digests of the rows' path lengths and of their bytes
        e = ends[s:s + block_rows]
        first = int(ends[s - 1]) if s else 0
        lengths = np.diff(e, prepend=np.int64(first)).astype("<i8")
        return xxhash.xxh3_64_intdigest(struct.pack("<QQ", xxhash.xxh3_64_intdigest(lengths),
                                                     xxhash.xxh3_64_intdigest(data[first:int(e[-1])])))

    blocks = [tuple(xxhash.xxh3_64_intdigest(np.ascontiguousarray(a[s:s + block_rows])) for a in arrays)
              + (paths_digest(s),) for s in range(0, rows, block_rows)]
    if rows % block_rows:
        return blocks[:-1], blocks[-1]
    return blocks, None


def stored(path):
    """(``/checksums`` rows, tail digests or None, tail row count) as plain h5py reads them."""
    with h5py.File(path, "r") as f:
        table = [tuple(int(v) for v in row) for row in f["checksums"][:]]
        tail = json.loads(f.attrs["checksum_tail"])
        assert f.attrs["checksum"] in (b"xxh3_64", "xxh3_64")
    digests = tuple(int(tail[p], 16) for p in checksum.PARTS) if "images" in tail else None
    return table, digests, tail["rows"]


def assert_checksums_match(path):
    blocks, tail = recomputed(path)
    table, tail_stored, tail_rows = stored(path)
    with h5py.File(path, "r") as f:
        assert tail_rows == int(f.attrs["committed_rows"])
    assert table == blocks
    assert tail_stored == tail


def make_store(path, rows=40, block_rows=8, compression=None, seed=0, rows_per_write=4096):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (rows, 8, 8, 3), dtype=np.uint8)
    labels = rng.integers(0, 3, rows)
    write_arrays(path, images, labels, block_rows=block_rows, compression=compression, rows_per_write=rows_per_write)
    return images, labels


def flip_bytes(path, offset, n=8):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        data = bytearray(fh.read(n))
        fh.seek(offset)
        fh.write(bytes(b ^ 0xFF for b in data))


def chunk_offset(path, name, row):
    """File offset of the HDF5 chunk of ``/name`` holding ``row`` (h5py's chunk index)."""
    with h5py.File(path, "r") as f:
        ds = f[name]
        info = ds.id.get_chunk_info_by_coord((row // ds.chunks[0] * ds.chunks[0],) + (0,) * (ds.ndim - 1))
        return info.byte_offset, info.size


# -- what is written ------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_hasher_gives_the_same_digests_however_the_rows_arrive(seed):
    rng = np.random.default_rng(seed)
    rows, block_rows = int(rng.integers(1, 60)), int(rng.integers(1, 9))
    images = rng.integers(0, 256, (rows, 2, 3, 1), dtype=np.uint8)
    labels = rng.normal(size=(rows, 2)).astype(np.float32)
    paths = np.array([f"p{i}".encode() for i in range(rows)], dtype="S16")
    hasher = checksum.BlockHasher(block_rows)
    cuts = np.sort(rng.integers(0, rows + 1, 4))
    for a, b in zip([0, *cuts], [*cuts, rows]):
        hasher.add(images[a:b], labels[a:b], paths[a:b])
    whole = [checksum.block_digests(images[s:s + block_rows], labels[s:s + block_rows], paths[s:s + block_rows])
             for s in range(0, rows, block_rows)]
    done = hasher.take_complete()
    assert hasher.rows == rows
    assert done == whole[:rows // block_rows]
    assert hasher.tail() == (whole[-1] if rows % block_rows else None)
    assert checksum.digest(np.zeros(0, np.uint8)) == 0x2D06800538D394C2  # xxh3-64 of no bytes, seed 0


def test_write_arrays_writes_checksums_whatever_the_write_size(tmp_path):
    path = tmp_path / "s.h5"
    make_store(path, rows=37, block_rows=8, rows_per_write=5)
    assert_checksums_match(path)
    assert len(stored(path)[0]) == 4


def test_ingest_writes_checksums_and_append_recomputes_the_partial_block(class_src_copy, tmp_path, h5cli):
    root, _ = class_src_copy
    out = tmp_path / "c.h5"
    shutil.move(os.path.join(root, "dog"), tmp_path / "dog")  # 12 images first, then 6 more
    code, _, err = h5cli("ingest", root, out, "--size", "8", "--block-rows", "5", "--workers", "0")
    assert code == 0, err
    assert_checksums_match(out)
    assert stored(out)[2] == 12 and stored(out)[1] is not None  # 5 + 5 + a partial block of 2
    before = stored(out)
    shutil.move(tmp_path / "dog", os.path.join(root, "dog"))
    code, _, err = h5cli("ingest", root, out, "--append", "--workers", "0")
    assert code == 0, err
    assert_checksums_match(out)
    after = stored(out)
    assert after[2] == 18 and len(after[0]) == 3 and after[0][:2] == before[0]
    assert after[0][2] != before[1]  # the block of rows 10-14 grew from 2 rows to 5: hashed again
    code, out_text, err = h5cli("verify", out)
    assert code == 0 and err == "" and "18 rows in 4 blocks" in out_text


def test_rollback_rehashes_the_block_it_cuts(tmp_path):
    path = tmp_path / "r.h5"
    make_store(path, rows=20, block_rows=8)
    with StoreWriter.open_append(path) as w:
        w.append(np.ones((7, 8, 8, 3), np.uint8), np.zeros(7, np.int64), [f"more{i}" for i in range(7)])
        w.commit()
        w.rollback(13)
    assert_checksums_match(path)
    assert stored(path)[2] == 13
    assert checksum.verify_store(path).ok


CRASH_SCRIPT = r"""
import os, sys
import numpy as np
from h5stream.store.writer import StoreWriter
w = StoreWriter.open_append(sys.argv[1])
w.append(np.full((9, 8, 8, 3), 7, np.uint8), np.zeros(9, np.int64), [f"x{i}" for i in range(9)])
w._write_pending(checksums=True)  # what commit() does first: labels, paths and their digests ...
w._flush()  # ... made durable ...
os._exit(0)  # ... and the process dies before committed_rows is raised
"""


def test_a_crash_between_digests_and_count_is_checked_and_reported_until_append(tmp_path, h5cli):
    path = tmp_path / "k.h5"
    make_store(path, rows=20, block_rows=8)
    proc = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, str(path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr
    assert stored(path)[2] == 29  # the tail names 29 rows; 20 are committed
    code, _, err = h5cli("verify", path)
    assert code == 3
    assert err.count("\n") == 1 and "the 20 committed rows match" in err and "rows 20-28 were written and not " \
        "committed" in err and "--append" in err
    result = checksum.verify_store(path)
    # rows 16-19 are checked against block 2's digest, which covers rows 16-23 (on disk, not committed)
    assert result.bad == () and result.unchecked == () and result.checked_rows == 20
    assert result.uncommitted == (20, 29)
    with StoreWriter.open_append(path):  # drops the 9 leftover rows and their digests, re-hashes rows 16-19
        pass
    assert_checksums_match(path)
    assert h5cli("verify", path)[0] == 0


# -- verify ----------------------------------------------------------------------------


@pytest.mark.parametrize("compression", [None, "zlib", "blosc"])
def test_verify_passes_on_a_good_store(tmp_path, h5cli, compression):
    path = tmp_path / "g.h5"
    make_store(path, rows=40, block_rows=8, compression=compression)
    result = checksum.verify_store(path, slice_bytes=1)  # one block per slice
    assert result.ok and result.rows == 40 and result.blocks == 5 and result.checked_rows == 40
    code, out, err = h5cli("verify", path)
    assert code == 0 and err == ""
    assert out.count("\n") == 1 and "OK, 40 rows in 5 blocks" in out


def test_overwritten_image_bytes_are_found_with_their_rows(tmp_path, h5cli):
    path = tmp_path / "d.h5"
    make_store(path, rows=40, block_rows=8)
    for row in (16, 35):  # blocks 2 and 4 (the last one partial)
        offset, _ = chunk_offset(path, "images", row)
        flip_bytes(path, offset + 100)
    code, out, err = h5cli("verify", path)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("h5stream: error: ")
    assert "rows 16-23 do not match their checksum (images: row 16)" in err and "2 of 5 blocks damaged" in err
    result = checksum.verify_store(path, slice_bytes=1 << 20)
    assert [(b.start, b.stop, b.parts) for b in result.bad] == [(16, 24, ("images",)), (32, 40, ("images",))]


@pytest.mark.parametrize("name,row,block", [("labels", 9, (8, 16)), ("paths", 30, (24, 32))])
def test_overwritten_labels_or_paths_are_found(tmp_path, name, row, block):
    path = tmp_path / "d.h5"
    make_store(path, rows=40, block_rows=8)
    if name == "labels":
        offset, _ = chunk_offset(path, name, row)
        at = offset + row * 8
    else:  # the first byte of the row's path in /path_bytes (its chunk holds every path of this store)
        with h5py.File(path, "r") as f:
            first = int(f["path_ends"][row - 1])
        offset, _ = chunk_offset(path, "path_bytes", 0)
        at = offset + first
    flip_bytes(path, at, 2)
    result = checksum.verify_store(path)
    assert [(b.start, b.stop, b.parts) for b in result.bad] == [(*block, (name,))]


def test_a_damaged_compressed_chunk_marks_only_its_block(tmp_path, h5cli):
    path = tmp_path / "z.h5"
    make_store(path, rows=40, block_rows=8, compression="zlib")
    offset, size = chunk_offset(path, "images", 8)
    flip_bytes(path, offset + size // 2, 16)
    result = checksum.verify_store(path)  # one slice: its read fails, then each block is read alone
    assert [(b.start, b.stop) for b in result.bad] == [(8, 16)]
    code, _, err = h5cli("verify", path)
    assert code == 1 and "rows 8-15" in err and "1 of 5 blocks damaged" in err


def strip_checksums(path):
    with h5py.File(path, "r+") as f:
        del f["checksums"]
        del f.attrs["checksum"], f.attrs["checksum_tail"]


def test_a_store_without_checksums_says_so_in_one_line(tmp_path, h5cli):
    old = tmp_path / "old.h5"
    make_store(old, rows=20, block_rows=8)
    strip_checksums(old)
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["images"] = np.zeros((4, 2, 2, 3), np.uint8)
        f["labels"] = np.zeros(4, np.int64)
    for path in (old, foreign):
        code, out, err = h5cli("verify", path)
        assert code == 3 and out == ""
        assert err.count("\n") == 1 and "no checksums stored, nothing verified" in err and "h5stream ingest" in err
    assert "checksums       none" in h5cli("info", old)[1]
    assert json.loads(h5cli("info", old, "--json")[1])["checksums"] is None
    with StoreWriter.open_append(old) as w:  # appending keeps a store without checksums as it is
        w.append(np.zeros((3, 8, 8, 3), np.uint8), np.zeros(3, np.int64), ["a", "b", "c"])
    assert not checksum.verify_store(old).has_checksums


def test_info_names_the_checksums(tmp_path, h5cli):
    path = tmp_path / "i.h5"
    make_store(path, rows=10)
    assert "checksums       xxh3_64 per block" in h5cli("info", path)[1]
    assert json.loads(h5cli("info", path, "--json")[1])["checksums"] == "xxh3_64"


def test_verify_of_a_missing_file_is_one_line(tmp_path, h5cli):
    code, out, err = h5cli("verify", tmp_path / "nope.h5")
    assert code == 1 and out == "" and err.count("\n") == 1 and "no such file" in err
