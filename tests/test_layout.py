"""A new store's layout (h5stream.store.layout): chunks on pages, a chunk index found in a few reads, label chunks
of about 512 KiB; plain h5py and PyTables read it; a store laid out the default way is appended to as it is."""

from __future__ import annotations

import contextlib
import io

import h5py
import numpy as np
import pytest
import tables

from conftest import direct_io_folder
from h5stream.memory.rawio import aligned_empty
from h5stream.store import layout, schema
from h5stream.store.meta import read_meta
from h5stream.store.writer import StoreWriter, write_arrays

BLOCK = 128 << 10  # the remote file object's cache block


class CountingFile(io.RawIOBase):
    """A read-only file that records every read HDF5 makes through it."""

    def __init__(self, path):
        self._f = open(path, "rb")
        self.reads: list[tuple[int, int]] = []

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=0):
        return self._f.seek(offset, whence)

    def tell(self):
        return self._f.tell()

    def readinto(self, b):
        pos = self._f.tell()
        n = self._f.readinto(b)
        self.reads.append((pos, n))
        return n

    def close(self):
        self._f.close()
        super().close()


def _blocks_to_find_chunks(path) -> tuple[int, np.ndarray]:
    """How many 128 KiB blocks HDF5 reads to open the store and list every /images chunk, and the offsets."""
    fh = CountingFile(path)
    try:
        with h5py.File(fh, "r") as f:
            offsets = []
            f[schema.IMAGES].id.chunk_iter(lambda info: offsets.append(info.byte_offset))
    finally:
        fh.close()
    blocks = {b for pos, n in fh.reads for b in range(pos // BLOCK, (pos + max(n, 1) - 1) // BLOCK + 1)}
    return len(blocks), np.array(offsets)


def _default_layout(monkeypatch):
    """Stores created as HDF5 lays files out by default (as stores made before the layout module were)."""
    monkeypatch.setattr(layout, "create_empty_file", lambda name: h5py.File(name, "w").close())
    monkeypatch.setattr(layout, "EARLY_PIXEL_CHUNKS", False)
    monkeypatch.setattr(layout, "label_chunk_rows", lambda label_row_bytes, block_rows: max(1024, block_rows))


def _store(path, rows=24000, block_rows=8):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (rows, 16, 16, 3), dtype=np.uint8)
    write_arrays(str(path), images, np.arange(rows) % 7, block_rows=block_rows)
    return images


def test_a_new_stores_chunks_start_on_pages_and_are_found_in_a_few_reads(tmp_path, monkeypatch):
    images = _store(tmp_path / "new.h5")  # 3,000 chunks of 6 KiB
    new_blocks, new_offsets = _blocks_to_find_chunks(tmp_path / "new.h5")
    with monkeypatch.context() as m:
        _default_layout(m)
        _store(tmp_path / "old.h5")
    old_blocks, old_offsets = _blocks_to_find_chunks(tmp_path / "old.h5")
    assert len(new_offsets) == len(old_offsets) == 3000
    assert (new_offsets % layout.PAGE_BYTES == 0).all() and not (old_offsets % layout.PAGE_BYTES == 0).all()
    if layout._h5py_hdf5() is None:
        pytest.skip("h5py's HDF5 library is not reachable here: the default fanout is kept")
    # The default index has a node per 32-64 chunks, each read on its own; the layout's holds 1,024-2,048.
    assert old_blocks >= 40 and new_blocks <= 12, (old_blocks, new_blocks)
    with h5py.File(tmp_path / "new.h5", "r") as f, tables.open_file(tmp_path / "new.h5") as t:
        assert np.array_equal(f[schema.IMAGES][:], images) and t.root.images.nrows == 24000
        assert f.id.get_create_plist().get_file_space_strategy()[0] == h5py.h5f.FSPACE_STRATEGY_PAGE


def test_label_chunks_hold_about_512_kib():
    assert layout.label_chunk_rows(8, 64) == 65536  # int64 class labels
    assert layout.label_chunk_rows(4 * 200, 64) == 1024  # wide regression targets: at least 1,024 rows
    assert layout.label_chunk_rows(8, 131072) == 131072  # never less than an image block


def test_a_store_with_the_default_layout_is_appended_to_as_it_is(tmp_path, monkeypatch):
    path = tmp_path / "old.h5"
    with monkeypatch.context() as m:
        _default_layout(m)
        first = _store(path, rows=300, block_rows=16)
    with h5py.File(path, "r") as f:
        label_chunks = f[schema.LABELS].chunks
    more = np.full((100, 16, 16, 3), 9, np.uint8)
    with StoreWriter.open_append(path) as w:
        w.append(more, np.zeros(100, np.int64), [f"more/{i}" for i in range(100)])
    assert read_meta(str(path)).rows == 400
    with h5py.File(path, "r") as f:
        assert f[schema.LABELS].chunks == label_chunks == (1024,)
        assert np.array_equal(f[schema.IMAGES][:300], first) and np.array_equal(f[schema.IMAGES][300:], more)
        assert f.id.get_create_plist().get_file_space_strategy()[0] != h5py.h5f.FSPACE_STRATEGY_PAGE


def _direct_writes(monkeypatch) -> list[int]:
    """Record the file offset of every block written straight to the disk (RawChunks.write that wrote)."""
    from h5stream.store.rawchunks import RawChunks

    done, real = [], RawChunks.write

    def write(self, chunk, offset):
        wrote = real(self, chunk, offset)
        if wrote:
            done.append(offset)
        return wrote

    monkeypatch.setattr(RawChunks, "write", write)
    return done


def test_a_new_stores_pixel_blocks_are_placed_by_hdf5_and_written_straight_to_the_disk(tmp_path, monkeypatch):
    """A new store's /images chunks are allocated as the array grows and never filled; whole blocks are then
    written direct at the offsets HDF5 gave them from page-aligned memory (a decode slot; no copy through HDF5 or
    the page cache), the partial last one through HDF5, and h5py, PyTables and verify read the same rows."""
    from h5stream.store.checksum import verify_store

    direct = _direct_writes(monkeypatch)
    with direct_io_folder(str(tmp_path)) as folder:
        path = f"{folder}/new.h5"
        images = aligned_empty((1000, 16, 16, 3))  # rows of 768 bytes from a page: 12 pages a block; 15 whole
        images[:] = np.random.default_rng(0).integers(0, 256, images.shape, dtype=np.uint8)
        write_arrays(path, images, np.arange(1000) % 7, block_rows=64)
        with h5py.File(path, "r") as f, tables.open_file(path) as t:
            ds = f[schema.IMAGES]
            dcpl = ds.id.get_create_plist()
            assert dcpl.get_alloc_time() == h5py.h5d.ALLOC_TIME_EARLY
            assert dcpl.get_fill_time() == h5py.h5d.FILL_TIME_NEVER
            blocks = [ds.id.get_chunk_info_by_coord((64 * k, 0, 0, 0)).byte_offset for k in range(16)]
            assert direct == blocks[:15] and all(at % layout.PAGE_BYTES == 0 for at in direct)
            assert np.array_equal(ds[:], images)
            assert isinstance(t.root.images, tables.EArray) and np.array_equal(t.root.images[:], images)
        assert verify_store(path).ok


def test_a_store_whose_pixel_chunks_are_allocated_as_written_is_appended_to_through_hdf5(tmp_path, monkeypatch):
    with direct_io_folder(str(tmp_path)) as folder:
        path = f"{folder}/old.h5"
        with monkeypatch.context() as m:
            m.setattr(layout, "EARLY_PIXEL_CHUNKS", False)
            first = _store(path, rows=300, block_rows=64)
        direct = _direct_writes(monkeypatch)
        more = np.random.default_rng(1).integers(0, 256, (256, 16, 16, 3), dtype=np.uint8)
        with StoreWriter.open_append(path) as w:
            w.append(more, np.zeros(256, np.int64), [f"more/{i}" for i in range(256)])
        assert direct == []  # HDF5 allocates this store's chunks when they are written: it writes them
        with h5py.File(path, "r") as f:
            assert f[schema.IMAGES].id.get_create_plist().get_alloc_time() != h5py.h5d.ALLOC_TIME_EARLY
            assert np.array_equal(f[schema.IMAGES][:300], first) and np.array_equal(f[schema.IMAGES][300:], more)


def test_a_disk_that_refuses_a_direct_write_as_misaligned_gets_every_block_through_hdf5(tmp_path, monkeypatch):
    """A disk whose block is larger than rawchunks assumes answers EINVAL before writing: the block, and every
    later one, is written through HDF5 instead, and the store is whole."""
    import errno
    import os

    from h5stream.store import rawchunks
    from h5stream.store.checksum import verify_store

    tried = []

    def refuse(fd, data, offset):
        tried.append(offset)
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))

    import types

    monkeypatch.setattr(rawchunks, "os", types.SimpleNamespace(**{**vars(os), "pwrite": refuse}))
    with direct_io_folder(str(tmp_path)) as folder:
        path = f"{folder}/refused.h5"
        images = aligned_empty((1000, 16, 16, 3))
        images[:] = np.random.default_rng(2).integers(0, 256, images.shape, dtype=np.uint8)
        write_arrays(path, images, np.arange(1000) % 7, block_rows=64)
        assert len(tried) == 1  # refused once: the writer stops trying
        with h5py.File(path, "r") as f:
            assert np.array_equal(f[schema.IMAGES][:], images)
        assert verify_store(path).ok


def _pwrite_patched(monkeypatch, pwrite):
    """Direct writes go through ``pwrite(fd, data, offset)``."""
    import os
    import types

    from h5stream.store import rawchunks

    monkeypatch.setattr(rawchunks, "os", types.SimpleNamespace(**{**vars(os), "pwrite": pwrite}))


@contextlib.contextmanager
def _direct_file(tmp_path, pages: int):
    """``(path, blocks, raw)``: a file of ``pages`` pages on a file system that takes ``O_DIRECT``, page-aligned
    memory of as many pages, and the file's :class:`~h5stream.store.rawchunks.RawChunks` (closed afterwards)."""
    from h5stream.store.rawchunks import RawChunks

    with direct_io_folder(str(tmp_path)) as folder:
        path = f"{folder}/f"
        with open(path, "wb") as fh:
            fh.truncate(pages * 4096)
        raw = RawChunks.open(path)
        try:
            yield path, aligned_empty((pages, 4096)), raw
        finally:
            raw.close()


def test_direct_writes_are_made_in_order_by_a_thread_of_their_own_while_the_caller_goes_on(tmp_path, monkeypatch):
    """The first write is made at once; later ones are queued: write() returns while the disk is still busy
    with an earlier one, wait(upto) returns once that many are done, wait() once all are, in order."""
    import os
    import threading

    calls, busy, go = [], threading.Event(), threading.Event()

    def pwrite(fd, data, offset):
        calls.append((offset, threading.current_thread().name))
        if len(calls) == 2:  # the disk is slow with the second block
            busy.set()
            go.wait()
        return os.pwrite(fd, data, offset)

    _pwrite_patched(monkeypatch, pwrite)
    with _direct_file(tmp_path, 4) as (path, blocks, raw):
        for k in range(4):
            blocks[k] = k + 1
        try:
            assert raw.write(blocks[0], 0)  # at once, in this thread
            assert calls == [(0, threading.current_thread().name)]
            assert raw.write(blocks[1], 4096) and raw.write(blocks[2], 8192) and raw.write(blocks[3], 12288)
            busy.wait()  # the second is under way and held; the caller went on regardless
            assert raw.submitted == 4
            raw.wait(1)  # the first is done
            go.set()
            raw.wait()
        finally:
            go.set()
        assert [offset for offset, _ in calls] == [0, 4096, 8192, 12288]
        assert {name for _, name in calls[1:]} == {"h5stream-direct-writes"}
        with open(path, "rb") as fh:
            assert fh.read() == blocks.tobytes()


def test_a_failed_direct_write_is_raised_by_the_next_wait_and_the_writes_after_it_are_not_made(tmp_path,
                                                                                               monkeypatch):
    import errno
    import os
    import threading

    calls, go = [], threading.Event()

    def pwrite(fd, data, offset):
        calls.append(offset)
        if len(calls) == 2:
            go.wait()  # fails only once the third block is queued behind it
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return os.pwrite(fd, data, offset)

    _pwrite_patched(monkeypatch, pwrite)
    with _direct_file(tmp_path, 3) as (path, blocks, raw):
        blocks[:] = 5
        try:
            assert raw.write(blocks[0], 0) and raw.write(blocks[1], 4096) and raw.write(blocks[2], 8192)
            go.set()
            with pytest.raises(OSError) as info:
                raw.wait()
            assert info.value.errno == errno.EIO and calls == [0, 4096]  # the third was dropped, not written
            with pytest.raises(OSError):
                raw.write(blocks[0], 0)  # and every later call says so
        finally:
            go.set()
        with open(path, "rb") as fh:
            assert fh.read(4096) == blocks[0].tobytes() and fh.read() == bytes(2 * 4096)


def test_a_store_whose_direct_write_fails_after_the_append_returned_keeps_its_last_commit(tmp_path, monkeypatch):
    """append(wait=False) returns before its blocks are on the disk; the failure of one comes with the next
    commit as a StoreWriteError, before any count names those rows, and the file is its last commit."""
    import errno
    import os

    from h5stream.errors import StoreWriteError

    calls = []

    def pwrite(fd, data, offset):
        calls.append(offset)
        if len(calls) == 2:  # the second block of the second append
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return os.pwrite(fd, data, offset)

    with direct_io_folder(str(tmp_path)) as folder:
        path = f"{folder}/s.h5"
        images = aligned_empty((320, 16, 16, 3))
        images[:] = np.random.default_rng(3).integers(0, 256, images.shape, dtype=np.uint8)
        writer = StoreWriter.create(path, image_shape=(16, 16, 3), class_names=["a"], block_rows=64)
        try:
            writer.append(images[:128], np.zeros(128, np.int64), [f"{i}" for i in range(128)])
            writer.commit()
            _pwrite_patched(monkeypatch, pwrite)
            with pytest.raises(StoreWriteError) as info:  # from the commit (or the append, if it was that late)
                writer.append(images[128:], np.zeros(192, np.int64), [f"{i}" for i in range(128, 320)], wait=False)
                writer.commit()
        finally:
            writer.discard()
        assert info.value.errno == errno.EIO and info.value.rows_committed == 128
        assert len(calls) == 2  # the second block's write failed; the third was not tried
        assert read_meta(path).rows == 128
        with h5py.File(path, "r") as f:
            assert np.array_equal(f[schema.IMAGES][:128], images[:128])
