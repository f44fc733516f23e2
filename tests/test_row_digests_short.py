"""A store whose `/row_digests` falls short of its committed rows: `verify`, `--append` and a verifying stream refuse
it alike (the stream used to fall back to block checks without a word), and `repair` rebuilds it, its rows checked
against their block checksums, with the digest of every row.  Real stores, the real CLI in-process."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

import h5stream
from h5stream.errors import StoreFormatError
from h5stream.samples import make_class_folder
from h5stream.store import rowdigest, schema
from h5stream.store.checksum import verify_store

from test_ingest_keras_parity import read_store


def _store(tmp_path, h5cli):
    src = tmp_path / "src"
    make_class_folder(src, classes=("a", "b"), per_class=(10, 10), size=(12, 12), seed=2)
    out = tmp_path / "o.h5"
    assert h5cli("ingest", src, out, "--size", "6", "--block-rows", "4", "--workers", "0")[0] == 0
    return src, out


def _cut_digests(out, keep: int) -> None:
    with h5py.File(out, "r+") as f:
        f[schema.ROW_DIGESTS].resize((keep,))


def test_short_row_digests_are_refused_alike_and_repair_rebuilds_them(tmp_path, h5cli):
    src, out = _store(tmp_path, h5cli)
    images, labels, paths, _ = read_store(out)
    _cut_digests(out, 9)
    code, _out, err = h5cli("verify", out)
    assert code == 1 and "rows 9-19 are committed without a row digest" in err, err
    line = err.strip().removeprefix("h5stream: error: ")
    with pytest.raises(StoreFormatError) as refused, h5stream.open(str(out), batch_size=4, memory_budget="64MiB") as s:
        list(s)
    assert str(refused.value) == f"{line} (verify_reads=False streams it unchecked)"
    with h5stream.open(str(out), batch_size=4, memory_budget="64MiB", verify_reads=False, shuffle=False) as s:
        assert sum(len(x) for x, _ in s) == 20
    code, _out, err = h5cli("ingest", src, out, "--workers", "0", "--append")
    assert code == 1 and "rows 9-19 are committed without a row digest" in err and "repair" in err, err

    code, stdout, err = h5cli("repair", out)
    assert code == 0 and err == "", err
    assert "rebuilt from its 20 committed rows" in stdout and "rows 9-19 are committed without" in stdout, stdout
    assert h5cli("verify", out)[0] == 0 and verify_store(str(out)).ok
    again, again_labels, again_paths, _ = read_store(out)
    assert np.array_equal(again, images) and np.array_equal(again_labels, labels) and again_paths == paths
    with h5py.File(out, "r") as f:
        assert np.array_equal(f[schema.ROW_DIGESTS][:], rowdigest.of_rows(images))
    with h5stream.open(str(out), batch_size=4, memory_budget="64MiB") as s:
        assert sum(len(x) for x, _ in s) == 20


def test_repair_does_not_give_damaged_rows_a_digest(tmp_path, h5cli):
    """Rows that no longer match their block checksum never get digests taken of their damaged bytes."""
    _src, out = _store(tmp_path, h5cli)
    _cut_digests(out, 9)
    with h5py.File(out, "r") as f:
        offset = f[schema.IMAGES].id.get_chunk_info(3).byte_offset + 7  # block 3: rows 12-15, past the digests
    with open(out, "r+b") as fh:
        fh.seek(offset)
        value = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([value ^ 0x20]))
    before = out.read_bytes()
    code, _stdout, err = h5cli("repair", out)
    assert code == 1 and err.count("\n") == 1 and "rows 12-15 no longer match their checksums" in err, err
    assert out.read_bytes() == before


def test_a_set_of_parts_with_a_part_short_of_row_digests_is_refused_as_that_part_is(tmp_path):
    from h5stream.store.writer import write_arrays

    parts = []
    for k, n in enumerate((12, 10)):
        rng = np.random.default_rng(k)
        parts.append(str(tmp_path / f"part-{k}.h5"))
        write_arrays(parts[-1], rng.integers(0, 256, (n, 4, 4, 3), np.uint8), rng.integers(0, 3, n), block_rows=4,
                     class_names=["0", "1", "2"])
    _cut_digests(parts[1], 5)
    with pytest.raises(StoreFormatError, match=rf"{parts[1]}: rows 5-9 are committed without a row digest"):
        with h5stream.open(parts, batch_size=4, memory_budget="64MiB") as s:
            list(s)
