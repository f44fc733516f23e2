"""The stream checks what it reads against the store's block checksums (verify_reads), on every read path.

Each test that takes ``store`` runs on both layouts: ``rows`` (a digest per row, each row checked against its own,
nothing read twice) and ``blocks`` (a store written before row digests: a block's first read reads the rest of it).

Damage is made the way it happens to real files: bytes of a chunk overwritten on disk, two chunks' bytes
swapped (what a chunk address redirected by bit rot serves), a compressed chunk replaced by another valid one.
Each read path (page cache, O_DIRECT, HTTP and S3, worker processes reading rows themselves or through shared
slots) must raise ChecksumError before it yields a wrong batch; every batch it yields before is the clean one.
"""

from __future__ import annotations

import os
import shutil
import zlib

import h5py
import numpy as np
import pytest

import h5stream
from conftest import direct_io_folder, drop_row_digests, pinned_in_page_cache
from h5stream.errors import ChecksumError, ReaderError, WorkerError
from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")

ROWS, SIDE, BLOCK = 640, 16, 16
ROW_BYTES = SIDE * SIDE * 3
# A read moves a quarter of a block and a fill holds 64 rows: most reads hold part of a block, as by default.
KW = dict(batch_size=16, seed=3, read_unit=4 * ROW_BYTES, rows_per_fill=64)
AUG = h5stream.Augment(horizontal_flip=True)


def make(path, rows=ROWS, side=SIDE, block_rows=BLOCK, compression=None, seed=0, storage_order="sorted",
         layout="rows"):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (rows, side, side, 3), dtype=np.uint8)
    labels = rng.integers(0, 7, rows)
    write_arrays(path, images, labels, block_rows=block_rows, compression=compression, storage_order=storage_order)
    if layout == "blocks":
        drop_row_digests(path)
    return path


def names(layout, block_rows_text, row):
    """What an error names: the damaged row (checked by row) or its block's rows."""
    return f"row {row}" if layout == "rows" else block_rows_text


def batches(path, epochs=1, **kw):
    with h5stream.open(path, **{**KW, **kw}) as s:
        return [(x.copy(), y.copy()) for _ in range(epochs) for x, y in s]


def chunk(path, name, index):
    """``(byte offset, size)`` of chunk ``index`` of ``/name``."""
    with h5py.File(path, "r") as f:
        info = f[name].id.get_chunk_info(index)
        return info.byte_offset, info.size


def overwrite(path, offset, n, value=0xA5):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(bytes([value]) * n)


def swap_chunks(path, a, b):
    """Swap the bytes of image chunks ``a`` and ``b``: each address now serves the other block."""
    (oa, size), (ob, _) = chunk(path, "images", a), chunk(path, "images", b)
    with open(path, "r+b") as fh:
        fh.seek(oa)
        da = fh.read(size)
        fh.seek(ob)
        db = fh.read(size)
        fh.seek(oa)
        fh.write(db)
        fh.seek(ob)
        fh.write(da)


def served_until_error(path, reference, epochs=1, **kw):
    """Stream ``path`` comparing every batch with ``reference``; return (batches served, the ChecksumError)."""
    served = 0
    with pytest.raises(ChecksumError) as info, h5stream.open(path, **{**KW, **kw}) as s:
        for _ in range(epochs):
            for x, y in s:
                assert np.array_equal(x, reference[served][0]) and np.array_equal(y, reference[served][1])
                served += 1
    return served, info.value


def assert_names_the_fix(err, path, rows):
    msg = str(err)
    assert msg.startswith(f"{path}: ") and rows in msg and f"h5stream verify {path}" in msg
    assert "re-ingest" in msg and "verify_reads=False" in msg and "\n" not in msg


@pytest.fixture(params=["rows", "blocks"])
def layout(request):
    return request.param


@pytest.fixture
def store(tmp_path, layout):
    return make(tmp_path / "s.h5", layout=layout)


# -- clean stores ------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_a_clean_store_streams_the_same_batches_checked_or_not(store, layout, workers):
    aug = AUG if workers else None
    checked = batches(store, epochs=2, workers=workers, augment=aug)
    unchecked = batches(store, epochs=2, workers=workers, augment=aug, verify_reads=False)
    assert len(checked) == len(unchecked) == 2 * ROWS // 16
    for (x1, y1), (x2, y2) in zip(checked, unchecked):
        assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    with h5stream.open(store, **KW) as s:
        list(s)
        stats = s.stats()
    if layout == "rows":  # nothing read twice: each row checked against its digest, 8 bytes a row read more
        assert stats["verify_learn_bytes"] == 0 and stats["verify_digest_bytes"] == ROWS * 8
    else:  # reads hold quarter blocks: blocks were read whole once more to be checked, each once
        assert 0 < stats["verify_learn_bytes"] <= ROWS * ROW_BYTES and stats["verify_digest_bytes"] == 0


@pytest.mark.parametrize("options", [dict(shard=(1, 3)), dict(validation_split=0.3, subset="training"),
                                     dict(validation_split=0.3, subset="validation")])
def test_parts_of_a_store_that_cut_blocks_stream_the_same_checked_or_not(tmp_path, options):
    """A shard or a split owns part of a block at its edges: that block is learned from all its rows, its own ones
    are served."""
    path = make(tmp_path / "p.h5", rows=650, storage_order="shuffled")  # 40 blocks and a partial one
    checked = batches(path, epochs=2, **options)
    unchecked = batches(path, epochs=2, verify_reads=False, **options)
    assert len(checked) == len(unchecked) > 0
    for (x1, y1), (x2, y2) in zip(checked, unchecked):
        assert np.array_equal(x1, x2) and np.array_equal(y1, y2)


def test_damage_in_the_partial_last_block_raises(tmp_path, layout):
    """The last block, partial, is checked against the digests the store keeps for it (checksum_tail)."""
    path = make(tmp_path / "t.h5", rows=650, layout=layout)
    reference = batches(path)
    overwrite(path, chunk(path, "images", 40)[0] + 5 * ROW_BYTES + 7, 4)  # row 645
    served, err = served_until_error(path, reference)
    assert served < len(reference)
    assert_names_the_fix(err, path, names(layout, "rows 640-649 (block 40)", 645))


def test_a_store_without_checksums_streams_unchecked(store):
    reference = batches(store)
    with h5py.File(store, "r+") as f:
        del f["checksums"]
        del f.attrs["checksum"], f.attrs["checksum_tail"]
    overwrite(store, chunk(store, "images", 3)[0] + 100, 8)
    got = batches(store)
    assert len(got) == len(reference)
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(got, reference))  # nothing to check it against


def test_verify_reads_is_checked(store):
    for bad in ("yes", 1, None, "ONCE"):
        with pytest.raises(h5stream.ConfigError, match="verify_reads must be True, 'once' or False"):
            h5stream.open(store, verify_reads=bad)


# -- damage before the stream opens ------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_overwritten_pixel_bytes_raise_before_a_wrong_batch(store, layout, workers):
    aug = AUG if workers else None
    reference = batches(store, workers=workers, augment=aug)
    overwrite(store, chunk(store, "images", 5)[0] + 3 * ROW_BYTES + 10, 8)  # row 83
    served, err = served_until_error(store, reference, workers=workers, augment=aug)
    assert served < len(reference)
    assert_names_the_fix(err, store, names(layout, "rows 80-95 (block 5)", 83))
    # The off switch: the same file streams as it is, the damaged row included.
    got = batches(store, workers=workers, augment=aug, verify_reads=False)
    assert len(got) == len(reference)
    assert sum(not np.array_equal(a[0], b[0]) for a, b in zip(got, reference)) == 1


def test_swapped_chunks_raise_before_a_wrong_batch(store):
    """What a redirected chunk address serves: another block's bytes, each intact."""
    reference = batches(store)
    swap_chunks(store, 2, 7)
    served, err = served_until_error(store, reference)
    assert served < len(reference)
    assert "(block 2)" in str(err) or "(block 7)" in str(err)
    got = batches(store, verify_reads=False)
    assert sum(not np.array_equal(a[0], b[0]) for a, b in zip(got, reference)) > 0


def test_a_replaced_compressed_chunk_raises(tmp_path, layout):
    """A compressed store is read through HDF5; a chunk that decodes cleanly to another block's rows is caught."""
    path = make(tmp_path / "z.h5", compression="zlib", layout=layout)
    reference = batches(path)
    with h5py.File(path, "r+") as f:
        other = f["images"][6 * BLOCK:7 * BLOCK]
        f["images"].id.write_direct_chunk((3 * BLOCK, 0, 0, 0), zlib.compress(other.tobytes()))
    served, err = served_until_error(path, reference)
    assert served < len(reference)
    assert_names_the_fix(err, path, names(layout, "rows 48-63 (block 3)", 48))


def test_damaged_labels_raise(store):
    """Labels are checked too: all at once where the stream keeps them in memory, else read by read."""
    from h5stream.streaming.planning import plan_stream
    from h5stream.read.reader import Reader
    from h5stream.store.meta import read_meta
    from h5stream.streaming.config import layout_function

    reference = batches(store)
    offset, _ = chunk(store, "labels", 0)
    overwrite(store, offset + 200 * 8, 8, 0x7F)  # row 200's label, block 12
    served, err = served_until_error(store, reference)
    assert served == 0  # the label cache is checked before the first batch
    assert_names_the_fix(err, store, "rows 192-207 (block 12)")
    assert "labels" in str(err)

    meta = read_meta(store)
    plan = plan_stream(meta, 16 << 20, 16, rows_per_fill=64, unit_bytes=4 * ROW_BYTES)
    layout = layout_function(meta.rows, plan, seed=3)

    def allocate(n, want_images=True):
        return np.empty((n, *meta.image_shape), np.uint8), np.empty((n, *meta.label_shape), meta.label_dtype), None

    reader = Reader(meta, layout, queue_depth=4, allocate=allocate, cache_labels=False)
    try:
        with pytest.raises(ChecksumError, match=r"rows 192-207 \(block 12\): the labels"):
            for _ in range(layout(0).n_batches):
                b = reader.get()
                assert 200 not in b.row_ids.tolist()
    finally:
        reader.close()


@pytest.fixture
def direct_dir(tmp_path):
    """A folder on a file system that takes O_DIRECT reads: pytest's, else /var/tmp; skip where none does."""
    with direct_io_folder(str(tmp_path)) as folder:
        yield folder


def test_overwritten_pixel_bytes_raise_with_direct_io(direct_dir, layout):
    # Rows of 12 KiB, reads of 8 rows (96 KiB): large enough to go past the page cache.
    path = make(os.path.join(direct_dir, "d.h5"), rows=256, side=64, block_rows=32, layout=layout)
    kw = dict(read_unit=8 * 64 * 64 * 3, rows_per_fill=64)
    reference = batches(path, direct_io=True, **kw)
    overwrite(path, chunk(path, "images", 4)[0] + 5 * 64 * 64 * 3, 16)  # row 133
    served, err = served_until_error(path, reference, direct_io=True, **kw)
    assert served < len(reference)
    assert_names_the_fix(err, path, names(layout, "rows 128-159 (block 4)", 133))
    with h5stream.open(path, direct_io=True, **{**KW, **kw}) as s:
        assert s.direct_io


@pytest.mark.parametrize("kind", ["http", "s3"])
def test_overwritten_pixel_bytes_raise_from_a_url(request, kind, layout, remote_store_file, tmp_path):
    from h5stream.remote.config import RemoteOptions

    kw = dict(read_unit="256KiB", rows_per_fill=512, remote=RemoteOptions(timeout_s=10))  # reads of a quarter block
    reference = batches(remote_store_file, **{**kw, "remote": None})
    if kind == "http":
        server = request.getfixturevalue("range_server")
        damaged = server.root / "store.h5"
        url = server.url + "store.h5"
    else:
        request.getfixturevalue("aws_env")
        seaweed = request.getfixturevalue("seaweed")
        damaged = tmp_path / "store.h5"
        shutil.copyfile(remote_store_file, damaged)
        url = f"s3://{seaweed.bucket}/damaged/store.h5"
    if layout == "blocks":
        drop_row_digests(damaged)
    with h5py.File(damaged, "r") as f:
        block_rows = f["images"].chunks[0]
        row = block_rows + 1000 // int(np.prod(f["images"].shape[1:]))
    overwrite(damaged, chunk(damaged, "images", 1)[0] + 1000, 8)
    if kind == "s3":
        seaweed.put("damaged/store.h5", damaged)
    served, err = served_until_error(url, reference, **kw)
    assert served < len(reference)
    assert_names_the_fix(err, url, names(layout, f"rows {block_rows}-{2 * block_rows - 1} (block 1)", row))
    got = batches(url, **kw, verify_reads=False)
    assert sum(not np.array_equal(a[0], b[0]) for a, b in zip(got, reference)) == 1


# -- damage after the blocks were checked once -------------------------------------------


def invert_every_block(path, blocks):
    for b in range(blocks):
        offset, size = chunk(path, "images", b)
        with open(path, "r+b") as fh:
            fh.seek(offset)
            data = np.frombuffer(fh.read(size), np.uint8)
            fh.seek(offset)
            fh.write((~data).tobytes())


def test_rows_that_change_after_their_block_was_checked_raise(store, layout):
    """Each read is checked, not just the first of a block: rows read again (next epoch) are checked row by row."""
    reference = batches(store, epochs=2)
    n = len(reference) // 2
    with h5stream.open(store, verify_reads=True, **KW) as s:
        for i, (x, y) in enumerate(s):
            assert np.array_equal(x, reference[i][0]) and np.array_equal(y, reference[i][1])
        assert s.stats()["verify_learn_bytes" if layout == "blocks" else "verify_digest_bytes"] > 0
        invert_every_block(store, ROWS // BLOCK)
        served = 0
        with pytest.raises(ChecksumError, match="the images read from the file do not match"):
            for x, y in s:  # a fill or two was read ahead before the damage: those are clean
                assert np.array_equal(x, reference[n + served][0]) and np.array_equal(y, reference[n + served][1])
                served += 1
    assert served < n


def test_workers_reading_rows_themselves_check_them(store):
    """Pooled, with the store in the page cache: the workers read the rows by byte offset and check each one."""
    reference = batches(store, epochs=2, workers=2, augment=AUG)
    n = len(reference) // 2
    with pinned_in_page_cache(store), h5stream.open(store, workers=2, augment=AUG, verify_reads=True,
                                                    **KW) as s:
        assert s._feed.direct
        for i, (x, y) in enumerate(s):
            assert np.array_equal(x, reference[i][0]) and np.array_equal(y, reference[i][1])
        assert s.stats()["deferred_bytes"] > 0
        invert_every_block(store, ROWS // BLOCK)
        served = 0
        with pytest.raises(ChecksumError, match="the images read from the file do not match") as info:
            for x, y in s:
                assert np.array_equal(x, reference[n + served][0]) and np.array_equal(y, reference[n + served][1])
                served += 1
    assert served < n
    assert isinstance(info.value.__cause__, WorkerError) and info.value.__cause__.stage == "read"
    assert isinstance(info.value, ReaderError)
    assert_names_the_fix(info.value, store, "row ")


@pytest.mark.parametrize("workers", [0, 2])
def test_once_checks_each_block_on_its_first_read_only(store, layout, workers):
    """verify_reads="once": damage already in the file is caught on the first read of its block; rows that change
    after their block was checked are served as read (the per-read check is what catches those)."""
    aug = AUG if workers else None
    reference = batches(store, epochs=2, workers=workers, augment=aug)
    n = len(reference) // 2
    damaged = tmp_copy = store.with_name("once.h5")
    shutil.copyfile(store, tmp_copy)
    overwrite(damaged, chunk(damaged, "images", 5)[0] + 3 * ROW_BYTES + 10, 8)  # row 83
    served, err = served_until_error(damaged, reference, workers=workers, augment=aug, verify_reads="once")
    assert served < n
    assert_names_the_fix(err, damaged, names(layout, "rows 80-95 (block 5)", 83))
    with pinned_in_page_cache(store), h5stream.open(store, workers=workers, augment=aug, verify_reads="once",
                                                    **KW) as s:
        first = [(x.copy(), y.copy()) for x, y in s]
        invert_every_block(store, ROWS // BLOCK)
        second = [(x.copy(), y.copy()) for x, y in s]
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(first, reference[:n]))
    assert len(second) == n and any(not np.array_equal(a[0], b[0]) for a, b in zip(second, reference[n:]))


def test_the_checks_memory_is_counted_in_the_budget(store, layout):
    """The check's memory is a share of the plan: on top of the default budget (the order does not change), out
    of a given one; nothing when the check is off or there is nothing to check.  Checked once by row, a flag a
    row; by blocks, a digest a row and the block buffers (it charged both, 9 bytes a row, either way)."""
    from h5stream.read.verify import check_memory_bytes

    with h5stream.open(store, **KW) as on, h5stream.open(store, verify_reads=False, **KW) as off:
        blocks = ROWS // BLOCK * 19
        want = ROWS + blocks if layout == "rows" else ROWS * 8 + blocks + 2 * (BLOCK * ROW_BYTES + 4096)
        assert on.plan.verify_bytes == want == check_memory_bytes(ROWS, BLOCK, ROW_BYTES, 2,
                                                                  by_row=layout == "rows", every_read=False)
        assert off.plan.verify_bytes == 0
        assert on.plan.budget_bytes == off.plan.budget_bytes + on.plan.verify_bytes
        assert "for checksums" in on.plan.describe() and "checksums" in on.plan.allocations()
        assert on.epoch_order(0).tolist() == off.epoch_order(0).tolist()
    given = {**KW, "memory_budget": "8MiB"}
    del given["rows_per_fill"]
    with h5stream.open(store, **given) as on, h5stream.open(store, verify_reads=False, **given) as off:
        assert on.plan.total_bytes <= on.plan.budget_bytes == off.plan.budget_bytes
        assert on.plan.verify_bytes > 0 and off.plan.verify_bytes == 0
    with h5py.File(store, "r+") as f:
        del f["checksums"]
        del f.attrs["checksum"], f.attrs["checksum_tail"]
    with h5stream.open(store, **KW) as s:
        assert s.plan.verify_bytes == 0


@pytest.mark.parametrize("by_row, every_read", [(True, False), (True, True), (False, False), (False, True)])
def test_the_memory_the_plan_counts_for_the_check_is_what_the_check_holds(by_row, every_read):
    """check_memory_bytes against a real BlockCheck: the arrays it makes, and the block buffers it may make."""
    from h5stream.read.verify import BlockCheck, check_buffers, check_memory_bytes

    rows, block, row_bytes, n_blocks = 1000, 16, 48, 63
    check = BlockCheck("s.h5", rows, block, row_bytes, np.zeros(n_blocks, np.uint64), np.zeros(n_blocks, np.uint64),
                       np.ones(n_blocks, bool), max_buffers=check_buffers(2), every_read=every_read,
                       row_digests=(lambda a, b: np.zeros(b - a, np.uint64)) if by_row else None)
    arrays = (check._images, check._labels, check.trusted, check._learned, check._done, check.row_digests,
              check._checked)
    held = sum(a.nbytes for a in arrays if a is not None)
    buffers = 0 if by_row else check_buffers(2) * (block * row_bytes + 4096)  # made on first use, at most these
    assert held + buffers == check_memory_bytes(rows, block, row_bytes, 2, by_row=by_row, every_read=every_read)
