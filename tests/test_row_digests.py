"""A digest per row (/row_digests): written with the rows, checked by the stream on the bytes it reads, by verify.

The first epoch under ``verify_reads="once"`` reads each row once (no second read of a block to check it), a
flipped byte in a row is named by its row, a flipped byte in a digest is found by ``verify``, and stores written
before row digests stream and verify as they did.
"""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest

import h5stream
from conftest import drop_row_digests, pinned_in_page_cache
from h5stream import cli
from h5stream.errors import ChecksumError, StoreFormatError
from h5stream.store import rowdigest, schema
from h5stream.store.checksum import verify_store
from h5stream.store.encoded import EncodedRows
from h5stream.store.meta import read_meta
from h5stream.store.writer import StoreWriter, write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")

ROWS, SIDE, BLOCK = 640, 16, 16
ROW_BYTES = SIDE * SIDE * 3
KW = dict(batch_size=16, seed=3, read_unit=4 * ROW_BYTES, rows_per_fill=64)  # reads of a quarter block
AUG = h5stream.Augment(horizontal_flip=True)


def images_and_labels(rows=ROWS, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (rows, SIDE, SIDE, 3), dtype=np.uint8), rng.integers(0, 7, rows)


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "s.h5"
    write_arrays(path, *images_and_labels(), block_rows=BLOCK)
    return path


def flip_row_byte(path, row, at=10):
    with h5py.File(path, "r") as f:
        offset = f["images"].id.get_chunk_info(row // BLOCK).byte_offset + (row % BLOCK) * ROW_BYTES + at
    with open(path, "r+b") as fh:
        fh.seek(offset)
        value = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([value ^ 0x10]))


def first_epoch(path, **kw):
    with h5stream.open(path, **{**KW, **kw}) as s:
        batches = [(x.copy(), y.copy()) for x, y in s]
        return batches, s.stats()


def test_a_new_store_keeps_each_rows_digest_readable_by_plain_h5py(store):
    images, _ = images_and_labels()
    with h5py.File(store, "r") as f:
        assert f.attrs[schema.ATTR_FORMAT] == schema.ROW_DIGESTS_FORMAT_VERSION == schema.FORMAT_VERSION
        assert f[schema.ROW_DIGESTS].dtype == np.uint64 and f[schema.ROW_DIGESTS].chunks == (BLOCK,)
        assert np.array_equal(f[schema.ROW_DIGESTS][:], rowdigest.of_rows(images))
    assert read_meta(store).rows == ROWS


@pytest.mark.parametrize("workers", [0, 2])
def test_the_first_epoch_under_once_reads_each_row_once(store, workers):
    """Checked by row, nothing is read again: no block bytes to learn, 8 bytes of digest a row; the old layout
    reads the rest of each block once more (reads hold a quarter of a block)."""
    aug = AUG if workers else None
    with pinned_in_page_cache(store):  # workers=2: the workers read the rows by offset and check them
        got, stats = first_epoch(store, workers=workers, augment=aug)
        unchecked, _ = first_epoch(store, workers=workers, augment=aug, verify_reads=False)
    assert stats["verify_learn_bytes"] == 0 and stats["verify_digest_bytes"] == ROWS * 8
    assert (stats["deferred_bytes"] > 0) == bool(workers)  # with workers, they read and checked the rows
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(got, unchecked))
    drop_row_digests(store)
    _, old = first_epoch(store, workers=workers, augment=aug)
    assert old["verify_learn_bytes"] > 0 and old["verify_digest_bytes"] == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_a_flipped_row_byte_is_named_by_the_stream_and_by_verify(store, workers, h5cli):
    aug = AUG if workers else None
    with pinned_in_page_cache(store):
        reference, _ = first_epoch(store, workers=workers, augment=aug)
    flip_row_byte(store, 83)
    with pytest.raises(ChecksumError, match=r"row 83\b"), h5stream.open(store, workers=workers, augment=aug,
                                                                         **KW) as s:
        for i, (x, _) in enumerate(s):
            assert np.array_equal(x, reference[i][0])  # every batch before the error is the clean one
    result = verify_store(store)
    assert [(b.start, b.stop, b.parts, b.rows) for b in result.bad] == [(80, 96, ("images",), (83,))]
    code, _, err = h5cli("verify", store)
    assert code != 0 and "rows 80-95 do not match their checksum (images: row 83)" in err


def flip_digest_byte(path, row, block=BLOCK, at=3):
    with h5py.File(path, "r") as f:
        offset = f[schema.ROW_DIGESTS].id.get_chunk_info(row // block).byte_offset + (row % block) * 8 + at
    with open(path, "r+b") as fh:
        fh.seek(offset)
        value = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([value ^ 0x01]))


def test_a_flipped_digest_is_found_by_verify_and_fails_the_stream_on_its_row(store, h5cli):
    flip_digest_byte(store, 200)
    result = verify_store(store)
    assert [(b.start, b.stop, b.parts, b.rows) for b in result.bad] == [(192, 208, ("row digests",), (200,))]
    code, _, err = h5cli("verify", store)
    assert code != 0 and "rows 192-207 do not match their checksum (row digests: row 200)" in err
    with pytest.raises(ChecksumError, match=r"row 200\b"), h5stream.open(store, **KW) as s:
        list(s)


def flip_block_digest_byte(path, block, part):
    """One byte flipped in the digest of ``part`` (images, labels, paths) of ``block`` in /checksums."""
    with h5py.File(path, "r") as f:
        offset = f[schema.CHECKSUMS].id.get_chunk_info(0).byte_offset + (block * 3 + ("images", "labels",
                                                                                        "paths").index(part)) * 8
    with open(path, "r+b") as fh:
        fh.seek(offset)
        value = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([value ^ 0x01]))


@pytest.mark.parametrize("part", ["images", "labels", "paths"])
def test_a_flipped_byte_of_the_checksum_table_is_found_and_an_images_one_is_told_from_damaged_rows(store, h5cli,
                                                                                                  part):
    flip_block_digest_byte(store, 12, part)
    result = verify_store(store)
    assert [(b.start, b.stop, b.parts, b.rows) for b in result.bad] == [(192, 208, (part,), ())]
    code, _, err = h5cli("verify", store)
    assert code != 0 and f"rows 192-207 do not match their checksum ({part}" in err
    intact = "every row matches its own digest, so the block's images checksum is what is damaged"
    # Every row matching its own digest while the block's images do not: the rows are intact, the table is not.
    assert (intact in err) == (part == "images") and "\n" not in err.strip()
    if part == "images":  # the stream checks each row against its own digest: the rows it yields are the written
        images, _ = images_and_labels()
        with h5stream.open(store, **{**KW, "shuffle": False}) as s:
            assert np.array_equal(np.concatenate([x for x, _ in s]), images)
        # repair writes the digest the rows give over the damaged one (8 bytes in place), as it does a row digest
        code, out, err = h5cli("repair", store)
        assert code == 0 and "wrote again the images checksums of 1 blocks whose rows match their own digests" in out
        assert verify_store(store).ok and h5cli("verify", store)[0] == 0
        with h5stream.open(store, **{**KW, "shuffle": False, "verify_reads": True}) as s:
            assert np.array_equal(np.concatenate([x for x, _ in s]), images)
    else:  # a damaged labels or paths digest cannot be told from damaged labels or paths: left, and said so
        code, out, err = h5cli("repair", store)
        assert code != 0 and intact not in err


def test_a_store_written_before_row_digests_streams_verifies_and_appends_as_before(store, h5cli):
    drop_row_digests(store)
    images, labels = images_and_labels()
    with h5stream.open(store, **KW) as s:
        list(s)
        assert s.stats()["verify_learn_bytes"] > 0  # checked by blocks, as before
    assert verify_store(store).ok and h5cli("verify", store)[0] == 0
    more, more_labels = images_and_labels(40, seed=1)
    with StoreWriter.open_append(store) as w:
        w.append(more, more_labels, [f"m{i}" for i in range(40)])
    with h5py.File(store, "r") as f:
        assert schema.ROW_DIGESTS not in f and f.attrs[schema.ATTR_FORMAT] == 2
    assert verify_store(store).ok
    flip_row_byte(store, 83)
    with pytest.raises(ChecksumError, match=r"rows 80-95 \(block 5\)"), h5stream.open(store, **KW) as s:
        list(s)


def test_append_writes_the_digests_of_the_new_rows_and_drops_uncommitted_ones(store):
    images, labels = images_and_labels()
    more, more_labels = images_and_labels(100, seed=2)
    w = StoreWriter.open_append(store)
    w.append(more[:60], more_labels[:60], [f"m{i}" for i in range(60)])
    w.commit()
    w.append(more[60:], more_labels[60:], [f"m{i}" for i in range(60, 100)])
    w._write_pending()  # digests written past the count, never committed: what a kill here leaves
    w._f.flush()
    w._f.close()  # no commit: as a killed writer leaves it
    w._release_lock()
    with h5py.File(store, "r") as f:
        assert f[schema.ROW_DIGESTS].shape[0] == ROWS + 100 and f.attrs[schema.ATTR_COMMITTED] == ROWS + 60
    assert verify_store(store).ok
    with StoreWriter.open_append(store) as w:  # drops the 40 uncommitted rows and their digests
        w.append(more[60:80], more_labels[60:80], [f"n{i}" for i in range(20)])
    want = np.concatenate([images, more[:80]])
    with h5py.File(store, "r") as f:
        assert np.array_equal(f[schema.ROW_DIGESTS][:], rowdigest.of_rows(want))
    assert verify_store(store).ok


def test_committed_rows_without_their_digests_are_refused_by_append_and_verify(store):
    with h5py.File(store, "r+") as f:
        f[schema.ROW_DIGESTS].resize((ROWS - 5,))
    with pytest.raises(StoreFormatError, match=r"rows 635-639 are committed without a row digest"):
        StoreWriter.open_append(store)
    with pytest.raises(StoreFormatError, match=r"rows 635-639 are committed without a row digest"):
        verify_store(store)


def test_an_encoded_store_is_checked_by_row(tmp_path, h5cli):
    from h5stream.samples import make_class_folder

    src = tmp_path / "src"
    make_class_folder(src, classes=2, per_class=12, size=(40, 48), seed=4)
    path = str(tmp_path / "j.h5")
    assert cli.main(["ingest", str(src), path, "--size", "32", "--encoding", "jpeg", "--block-rows", "8",
                     "--workers", "0"]) == 0
    with h5py.File(path, "r") as f:
        ends = f[schema.IMAGE_ENDS][:]
        data = f[schema.IMAGE_BYTES][:int(ends[-1])]
        assert np.array_equal(f[schema.ROW_DIGESTS][:], rowdigest.of_rows(EncodedRows(data, ends)))
    with h5stream.open(path, batch_size=4, seed=0, read_unit=2 * 32 * 32 * 3) as s:
        list(s)
        stats = s.stats()
    assert stats["verify_learn_bytes"] == 0 and stats["verify_digest_bytes"] == len(ends) * 8
    with h5py.File(path, "r+") as f:
        f[schema.IMAGE_BYTES][int(ends[13]) - 30] ^= 0x01  # row 13, block 1
    with pytest.raises(ChecksumError, match=r"row 13\b"), h5stream.open(path, batch_size=4, seed=0) as s:
        list(s)
    assert [(b.start, b.stop, b.parts, b.rows) for b in verify_store(path).bad] == [(8, 16, ("images",), (13,))]
    with h5py.File(path, "r+") as f:  # the row mended, block 2's images digest in /checksums damaged instead
        f[schema.IMAGE_BYTES][int(ends[13]) - 30] ^= 0x01
        f[schema.CHECKSUMS][2, 0] ^= np.uint64(1 << 40)
    bad = verify_store(path).bad
    assert [(b.start, b.stop, b.parts, b.rows) for b in bad] == [(16, 24, ("images",), ())]
    assert "the block's images checksum is what is damaged" in bad[0].detail
    code, out, err = h5cli("repair", path)
    assert code == 0 and "wrote again the images checksums of 1 blocks" in out, err
    assert verify_store(path).ok


@pytest.mark.parametrize("layout", ["rows", "blocks"])
def test_repair_rebuilds_a_store_with_the_digest_of_every_row(store, layout, h5cli):
    if layout == "blocks":
        drop_row_digests(store)
    open(schema.flushing_path(str(store)), "w").close()  # a writer stopped while HDF5 rewrote the file in place
    code, _, err = h5cli("repair", store)
    assert code == 0, err
    images, _ = images_and_labels()
    with h5py.File(store, "r") as f:
        assert np.array_equal(f[schema.ROW_DIGESTS][:], rowdigest.of_rows(images))
        assert f.attrs[schema.ATTR_FORMAT] == schema.ROW_DIGESTS_FORMAT_VERSION
    assert verify_store(store).ok


def test_the_python_writer_and_its_resume_write_every_rows_digest(tmp_path):
    images, labels = images_and_labels(100)
    path = tmp_path / "w.h5"
    h5stream.write(path, (images, labels), block_rows=BLOCK, commit_rows=32, order="sorted")
    with h5stream.Writer(path, resume=True) as w:
        more, more_labels = images_and_labels(20, seed=5)
        for x, y in zip(more, more_labels):
            w.add(x, int(y))
    with h5py.File(path, "r") as f:
        assert np.array_equal(f[schema.ROW_DIGESTS][:], rowdigest.of_rows(f["images"][:]))
        assert f[schema.ROW_DIGESTS].shape == (120,)
    assert verify_store(path).ok


def test_a_set_of_parts_is_checked_by_row_and_names_the_damaged_part_and_row(tmp_path):
    parts = []
    for k, n in enumerate((100, 70)):
        images, labels = images_and_labels(n, seed=10 + k)
        parts.append(str(tmp_path / f"part-{k}.h5"))
        write_arrays(parts[-1], images, labels, block_rows=BLOCK, class_names=[str(i) for i in range(7)])
    with h5stream.open(parts, **KW) as s:
        clean = [x.copy() for x, _ in s]
        stats = s.stats()
    assert stats["verify_learn_bytes"] == 0 and stats["verify_digest_bytes"] == 170 * 8
    flip_row_byte(parts[1], 37)
    with pytest.raises(ChecksumError, match=rf"{parts[1]}: row 37\b"), h5stream.open(parts, **KW) as s:
        for i, (x, _) in enumerate(s):
            assert np.array_equal(x, clean[i])


def test_repair_writes_damaged_digests_again_from_rows_that_match_their_block_checksums(store, h5cli):
    good = store.read_bytes()
    flip_digest_byte(store, 200)
    flip_digest_byte(store, 613, at=7)
    flip_row_byte(store, 83)  # an image byte: its block is not known good, so its digests are not written
    code, out, err = h5cli("repair", store)
    assert code == 1 and "rows 80-95 do not match their checksum (images: row 83)" in err, err
    assert "wrote again the digests of 32 rows whose images match their block checksums" in err, err
    assert [(b.start, b.stop, b.parts) for b in verify_store(store).bad] == [(80, 96, ("images",))]
    flip_row_byte(store, 83)  # the byte put back: the digests are the ones the writer took, nothing else moved
    assert store.read_bytes() == good
    flip_digest_byte(store, 3)
    code, out, err = h5cli("repair", store)
    assert code == 0 and err == "" and "wrote again the digests of 16 rows" in out, err
    assert "640 committed rows match their checksums" in out and store.read_bytes() == good
    with h5stream.open(store, **KW) as s:
        assert sum(len(y) for _, y in s) == ROWS


def test_repair_writes_an_encoded_stores_damaged_digest_again(tmp_path, h5cli):
    from h5stream.samples import make_class_folder

    src = tmp_path / "src"
    make_class_folder(src, classes=2, per_class=12, size=(40, 48), seed=4)
    path = tmp_path / "j.h5"
    assert cli.main(["ingest", str(src), str(path), "--size", "32", "--encoding", "jpeg", "--block-rows", "8",
                     "--workers", "0"]) == 0
    good = path.read_bytes()
    flip_digest_byte(path, 13, block=8)
    assert [(b.start, b.parts) for b in verify_store(path).bad] == [(8, ("row digests",))]
    code, out, err = h5cli("repair", path)
    assert code == 0 and "wrote again the digests of 8 rows" in out, err
    assert path.read_bytes() == good and verify_store(path).ok


def test_repair_from_the_source_restores_a_block_then_writes_its_damaged_digest(class_src, tmp_path, h5cli):
    root, _ = class_src
    src = tmp_path / "src"
    shutil.copytree(root, src)
    path = tmp_path / "dmg.h5"
    assert h5cli("ingest", src, path, "--size", "8", "--block-rows", "4", "--workers", "0")[0] == 0
    good = path.read_bytes()
    with h5py.File(path, "r") as f:
        offset = f[schema.IMAGES].id.get_chunk_info(1).byte_offset + 8 * 8 * 3 + 5  # row 5, block 1
    with open(path, "r+b") as fh:
        fh.seek(offset)
        value = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([value ^ 0x10]))
    flip_digest_byte(path, 6, block=4)  # the same block: its images differ, so the digest is judged after
    assert [(b.start, b.parts) for b in verify_store(path).bad] == [(4, ("images",))]
    code, out, err = h5cli("repair", path, "--source", src)
    assert code == 0 and err == "", err
    assert "restored 4 damaged rows in 1 blocks" in out and "wrote again the digests of 4 rows" in out, out
    assert path.read_bytes() == good
