"""Source paths of any length (/path_bytes + /path_ends), and stores with the fixed-width /paths of format 1."""

from __future__ import annotations

import os
import shutil

import h5py
import numpy as np
import pytest

import h5stream
from h5stream.samples import make_class_folder
from h5stream.store import checksum, create, pathrows, schema
from h5stream.store.meta import read_meta, read_paths
from h5stream.store.writer import StoreWriter

ARGS = ("--size", "8", "--block-rows", "4", "--workers", "0")


def deep_folder(root, depth: int = 12) -> str:
    """A relative folder of ``depth`` components of 60 characters (over 700 bytes), made under ``root``."""
    rel = "/".join(f"{i:02d}" + "d" * 58 for i in range(depth))
    os.makedirs(os.path.join(root, rel))
    return rel


@pytest.fixture
def deep_src(tmp_path):
    """Three classes of images, one of them moved into a folder over 512 bytes deep (a path > 512 bytes)."""
    src = tmp_path / "src"
    made = make_class_folder(src, classes=3, per_class=3, size=(12, 12), fmt="png")
    rel, _ = made[0]
    cls = rel.split("/")[0]
    deep = deep_folder(src / cls)
    shutil.move(src / rel, src / cls / deep / os.path.basename(rel))
    long_rel = f"{cls}/{deep}/{os.path.basename(rel)}"
    assert len(long_rel.encode()) > schema.PATH_BYTES
    return src, long_rel


def test_a_path_over_512_bytes_is_stored_and_read_back(deep_src, tmp_path, h5cli):
    src, long_rel = deep_src
    out = tmp_path / "s.h5"
    code, _, err = h5cli("ingest", src, out, *ARGS)
    assert code == 0, err
    meta = read_meta(out)
    assert meta.rows == 9 and meta.skipped_files == 0
    paths = read_paths(out, 0, meta.rows)
    assert long_rel in paths
    with h5stream.open(out, batch_size=4) as stream:
        assert stream.file_paths == paths
    with h5py.File(out, "r") as f:  # the plain reader's recipe of pathrows' docstring
        ends = f["path_ends"][:meta.rows]
        data = f["path_bytes"][:ends[-1]].tobytes()
        plain = [data[a:b].decode("utf-8", "surrogateescape") for a, b in zip([0, *ends[:-1]], ends)]
    assert plain == paths
    assert checksum.verify_store(out).ok


def test_a_30000_row_store_pays_about_the_bytes_of_its_paths(tmp_path):
    rows = 30_000
    names = [f"class_{i % 10}/img_{i:06d}.png" for i in range(rows)]
    out = tmp_path / "p.h5"
    with StoreWriter.create(out, image_shape=(8, 8, 3), class_names=[f"class_{k}" for k in range(10)],
                            expected_rows=rows) as writer:
        for start in range(0, rows, 4096):
            stop = min(rows, start + 4096)
            writer.append(np.zeros((stop - start, 8, 8, 3), np.uint8), np.arange(start, stop) % 10,
                          names[start:stop])
    path_bytes = sum(len(n) for n in names)
    with h5py.File(out, "r") as f:
        stored = sum(f[n].id.get_storage_size() for n in (schema.PATH_BYTES_NODE, schema.PATH_ENDS))
        assert schema.PATHS not in f
    # Each path's bytes and its end (8 bytes), and at most the unfilled rest of each array's last chunk: not 512
    assert stored <= path_bytes + 8 * rows + 2 * pathrows.BYTES_CHUNK, (stored, path_bytes)
    assert read_paths(out, 0, rows) == names
    assert checksum.verify_store(out).ok


def test_a_flipped_byte_of_path_ends_is_found(tmp_path):
    out = tmp_path / "e.h5"
    with StoreWriter.create(out, image_shape=(4, 4, 3), class_names=["a"], block_rows=8) as writer:
        writer.append(np.zeros((40, 4, 4, 3), np.uint8), np.zeros(40, np.int64), [f"a/{i}.png" for i in range(40)])
    with h5py.File(out, "r") as f:
        info = f["path_ends"].id.get_chunk_info_by_coord((0,))
    with open(out, "r+b") as fh:  # row 17's end, one byte flipped (little-endian int64)
        fh.seek(info.byte_offset + 17 * 8)
        byte = fh.read(1)
        fh.seek(info.byte_offset + 17 * 8)
        fh.write(bytes([byte[0] ^ 0x01]))
    result = checksum.verify_store(out)
    assert [(b.start, b.stop, b.parts) for b in result.bad] == [(16, 24, ("paths",))]


@pytest.fixture
def old_store(tmp_path, monkeypatch):
    """A store with format 1's fixed-width /paths, written by the code path that wrote them."""
    monkeypatch.setattr(create, "FIXED_WIDTH_PATHS", True)
    out = tmp_path / "old.h5"
    rng = np.random.default_rng(0)
    with StoreWriter.create(out, image_shape=(8, 8, 3), class_names=["a", "b", "c"], block_rows=4,
                            resize_mode="stretch") as writer:
        writer.append(rng.integers(0, 256, (10, 8, 8, 3), dtype=np.uint8), np.arange(10) % 3,
                      [f"a/{i}.png" for i in range(10)])
    monkeypatch.setattr(create, "FIXED_WIDTH_PATHS", False)
    with h5py.File(out, "r") as f:
        assert f["paths"].dtype == np.dtype("S512") and schema.PATH_ENDS not in f
        assert int(f.attrs[schema.ATTR_FORMAT]) == 1
    return out


def test_a_store_of_fixed_width_paths_reads_verifies_and_appends_in_its_layout(old_store, deep_src, h5cli):
    assert read_paths(old_store, 0, 10) == [f"a/{i}.png" for i in range(10)]
    assert checksum.verify_store(old_store).ok
    code, out, err = h5cli("info", old_store)
    assert code == 0 and "/paths" in out, err
    with h5stream.open(old_store, batch_size=4, seed=0) as stream:
        assert sum(len(y) for _, y in stream) == 10
    src, long_rel = deep_src
    code, out, err = h5cli("ingest", src, old_store, *ARGS, "--append")
    assert code == 0, err
    meta = read_meta(old_store)
    assert meta.rows == 10 + 8 and meta.skipped_files == 1  # the long path cannot go in: skipped with its reason
    report = open(schema.skipped_report_path(old_store), encoding="utf-8").read()
    assert long_rel in report and "fixed-width" in report
    with h5py.File(old_store, "r") as f:
        assert f["paths"].shape == (18,) and schema.PATH_ENDS not in f
    assert checksum.verify_store(old_store).ok
    assert h5cli("verify", old_store)[0] == 0


def test_a_flipped_byte_of_fixed_width_paths_is_found_and_repair_names_the_files(old_store, h5cli):
    with h5py.File(old_store, "r") as f:
        info = f["paths"].id.get_chunk_info_by_coord((0,))
        images = f["images"].id.get_chunk_info_by_coord((4, 0, 0, 0))
    with open(old_store, "r+b") as fh:
        for at in (info.byte_offset + 9 * 512, images.byte_offset + 5):
            fh.seek(at)
            byte = fh.read(1)
            fh.seek(at)
            fh.write(bytes([byte[0] ^ 0xFF]))
    result = checksum.verify_store(old_store)
    assert [(b.start, b.stop, b.parts) for b in result.bad] == [(4, 8, ("images",)), (8, 10, ("paths",))]
    code, out, err = h5cli("repair", old_store)
    assert code != 0 and out.split() == [f"a/{i}.png" for i in range(4, 8)], err


def test_paths_of_any_length_read_and_verify_from_a_url(deep_src, tmp_path, h5cli, range_server):
    src, long_rel = deep_src
    out = range_server.root / "deep.h5"
    assert h5cli("ingest", src, out, *ARGS)[0] == 0
    url = range_server.url + "deep.h5"
    assert read_paths(url, 0, 9, remote={"timeout_s": 10}) == read_paths(out, 0, 9)
    with h5stream.open(url, batch_size=4, remote={"timeout_s": 10}) as stream:
        assert long_rel in stream.file_paths
    code, _, err = h5cli("verify", url)
    assert code == 0, err


def test_repair_rebuilds_a_store_of_fixed_width_paths_with_its_rows(old_store, h5cli):
    from h5stream.store.handle import mark_flushing

    with h5py.File(old_store, "r") as f:
        images, labels = f["images"][:10], f["labels"][:10]
    mark_flushing(str(old_store))  # a writer stopped while HDF5 rewrote it in place
    code, out, err = h5cli("repair", old_store)
    assert code == 0 and "rebuilt from its" in out, err
    assert read_paths(old_store, 0, 10) == [f"a/{i}.png" for i in range(10)]
    with h5py.File(old_store, "r") as f:  # rebuilt as a new store is written: paths of any length from now on
        np.testing.assert_array_equal(f["images"][:], images)
        np.testing.assert_array_equal(f["labels"][:], labels)
        assert schema.PATH_ENDS in f and int(f.attrs[schema.ATTR_FORMAT]) == schema.FORMAT_VERSION
    assert checksum.verify_store(old_store).ok
