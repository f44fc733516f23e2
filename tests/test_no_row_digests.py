"""`h5stream ingest --no-row-digests`: a store without `/row_digests` (its 8 bytes a row are 17% of a 4x4x3 row),
checked by whole blocks; verify, the stream and --append work on it, and --append keeps the store's choice.  Real
image folders, the real CLI in-process."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

import h5stream
from h5stream.errors import ChecksumError
from h5stream.samples import make_class_folder
from h5stream.store import schema
from h5stream.store.checksum import verify_store
from h5stream.store.meta import read_meta


def _flip_row_byte(path, row: int) -> None:
    with h5py.File(path, "r") as f:
        block_rows = f[schema.IMAGES].chunks[0]
        row_bytes = int(np.prod(f[schema.IMAGES].shape[1:]))
        info = f[schema.IMAGES].id.get_chunk_info(row // block_rows)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + (row % block_rows) * row_bytes + 1)
        value = fh.read(1)[0]
        fh.seek(-1, 1)
        fh.write(bytes([value ^ 0x40]))


def test_a_store_ingested_without_row_digests_verifies_streams_and_appends(tmp_path, h5cli):
    src = tmp_path / "src"
    make_class_folder(src, classes=("a", "b"), per_class=(6, 6), size=(12, 12), seed=4)
    out = tmp_path / "o.h5"
    code, _out, err = h5cli("ingest", src, out, "--size", "4", "--block-rows", "4", "--workers", "0",
                            "--no-row-digests")
    assert code == 0, err
    with h5py.File(out, "r") as f:
        assert schema.ROW_DIGESTS not in f and schema.CHECKSUMS in f
    with_digests = tmp_path / "d.h5"
    assert h5cli("ingest", src, with_digests, "--size", "4", "--block-rows", "4", "--workers", "0")[0] == 0
    assert out.stat().st_size < with_digests.stat().st_size
    assert h5cli("verify", out)[0] == 0 and verify_store(str(out)).ok
    with h5stream.open(str(out), batch_size=4, shuffle=False, memory_budget="64MiB") as s:
        assert sum(len(x) for x, _ in s) == 12

    make_class_folder(src, classes=("a", "b"), per_class=(9, 9), size=(12, 12), seed=4)  # 6 more files
    code, _out, err = h5cli("ingest", src, out, "--workers", "0", "--append")  # the store's choice is kept
    assert code == 0, err
    assert read_meta(str(out)).rows == 18
    with h5py.File(out, "r") as f:
        assert schema.ROW_DIGESTS not in f
    assert h5cli("verify", out)[0] == 0

    _flip_row_byte(out, 13)  # damage is still found, by its block
    assert h5cli("verify", out)[0] == 1
    with pytest.raises(ChecksumError, match=r"rows 12-15 \(block 3\)"):
        with h5stream.open(str(out), batch_size=4, shuffle=False, memory_budget="64MiB") as s:
            list(s)


def test_no_row_digests_on_an_append_to_a_store_that_has_them_is_refused_and_changes_nothing(tmp_path, h5cli):
    src = tmp_path / "src"
    make_class_folder(src, classes=("a",), per_class=(3,), size=(12, 12), seed=4)
    out = tmp_path / "o.h5"
    assert h5cli("ingest", src, out, "--size", "4", "--workers", "0")[0] == 0
    before = out.read_bytes()
    make_class_folder(src, classes=("a",), per_class=(5,), size=(12, 12), seed=4)
    code, _out, err = h5cli("ingest", src, out, "--workers", "0", "--append", "--no-row-digests")
    assert code == 1 and err.count("\n") == 1, err
    assert "store keeps a digest per row" in err and "drop --no-row-digests" in err, err
    assert out.read_bytes() == before


def test_write_from_python_with_row_digests_false_leaves_them_out_and_checks_by_blocks(tmp_path):
    """``h5stream.write(..., row_digests=False)`` is the flag's Python form: taken as an option, never ignored."""
    rng = np.random.default_rng(3)
    images, labels = rng.integers(0, 256, (40, 4, 4, 3), dtype=np.uint8), np.arange(40) % 3
    out, full = tmp_path / "w.h5", tmp_path / "full.h5"
    h5stream.write(out, (images, labels), row_digests=False, block_rows=8, order="sorted")
    h5stream.write(full, (images, labels), block_rows=8, order="sorted")
    with h5py.File(out, "r") as f, h5py.File(full, "r") as g:
        assert schema.ROW_DIGESTS not in f and schema.CHECKSUMS in f and schema.ROW_DIGESTS in g
    with h5stream.open(out, batch_size=40, shuffle=False) as s:
        x, y = next(iter(s))
    assert np.array_equal(x, images) and np.array_equal(y, labels)
    assert verify_store(str(out)).ok
    _flip_row_byte(out, 13)
    assert not verify_store(str(out)).ok
    with pytest.raises(ChecksumError, match=r"rows 8-15 \(block 1\)"):
        with h5stream.open(out, batch_size=40, shuffle=False) as s:
            list(s)
