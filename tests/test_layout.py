"""A new store's layout (h5stream.store.layout): chunks on pages, a chunk index found in a few reads, label chunks
of about 512 KiB; plain h5py and PyTables read it; a store laid out the default way is appended to as it is."""

from __future__ import annotations

import io

import h5py
import numpy as np
import pytest
import tables

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
