"""Rows read by address (one ``struct iovec`` a row, laid out once a fill): every row lands exactly where a
``memoryview`` of its batch row puts it, short reads and reads of more than ``IOV_MAX`` rows go on where they
stopped, the end of the file is an error, and streams give the same batches either way (with checks, shards,
workers), the checks still catching a flipped byte."""

from __future__ import annotations

import ctypes
import errno
import os

import h5py
import numpy as np
import pytest

import h5stream
from h5stream.errors import ChecksumError
from h5stream.memory import rawio
from h5stream.memory.lend import ArrayArena
from h5stream.memory.rawio import IOVEC, aligned_empty
from h5stream.read.fill import Batch, Pending
from h5stream.read.iovec import fill_iovecs
from h5stream.read.source import LocalFile
from h5stream.store.writer import write_arrays

from conftest import drop_row_digests

pytestmark = pytest.mark.usefixtures("no_leaks")

ROW = (20, 20, 3)  # 1,200 bytes: above SMALL_ROW_BYTES, so rows are read in place (not placed by numpy)
ROW_BYTES = int(np.prod(ROW))


def _pending(images) -> Pending:
    n = 0 if images is None else len(images)
    return Pending(Batch(0, 0, images, np.empty(n, np.int64), np.empty(n, np.int64)), n)


@pytest.fixture
def raw_file(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, 400 * ROW_BYTES, dtype=np.uint8)
    path = tmp_path / "rows.bin"
    path.write_bytes(data.tobytes())
    return str(path), data


def _fill(rng, first):
    """A fill's buffer positions over 12 batches (arena buffers, one-off arrays past the arena's 8, one batch
    without images) in a random order, with positions read past (-1)."""
    batch_rows, n_batches = 6, 12
    arena = ArrayArena(batch_rows, ROW, np.uint8, max_sets=8)
    targets = {first + j: _pending(arena(batch_rows if j < n_batches - 1 else 4)) for j in range(n_batches)}
    targets[first + 5] = _pending(None)  # a batch without images: its rows are read by its receiver
    slots = [(b, k) for b, t in targets.items() if t.batch.images is not None for k in range(len(t.batch.images))]
    slots += [(first + 5, k) for k in range(batch_rows)] + [(-1, 0)] * 9
    order = rng.permutation(len(slots))
    return targets, np.array([slots[i][0] for i in order], np.int64), np.array([slots[i][1] for i in order],
                                                                               np.int64)


def test_every_row_lands_at_its_batch_row(raw_file):
    path, data = raw_file
    rng = np.random.default_rng(4)
    first = 3
    targets, batch, offset = _fill(rng, first)
    scratch = aligned_empty(ROW_BYTES)
    iovecs = fill_iovecs(batch, offset, targets, first, ROW_BYTES, scratch)
    assert iovecs is not None and len(iovecs) == len(batch)
    # Runs of any length over the buffer positions, each from its own place in the file.
    cut = np.sort(rng.choice(np.arange(1, len(batch)), 15, replace=False))
    source = LocalFile(path)
    try:
        assert source.reads_rows
        want = {}
        for a, b in zip([0, *cut.tolist()], [*cut.tolist(), len(batch)]):
            src = int(rng.integers(0, 400 - (b - a)))
            source.readinto_rows(src * ROW_BYTES, iovecs, a, b - a, ROW_BYTES, iovecs.ctypes.data)
            want.update({p: src + p - a for p in range(a, b)})
    finally:
        source.close()
    rows = data.reshape(400, *ROW)
    for p, (b, k) in enumerate(zip(batch.tolist(), offset.tolist())):
        if b >= 0 and targets[b].batch.images is not None:
            np.testing.assert_array_equal(targets[b].batch.images[k], rows[want[p]])
        else:
            assert iovecs["base"][p] == scratch.ctypes.data  # read past: into the scratch row, nowhere else


def test_batches_that_are_not_writable_whole_rows_are_read_through_memoryviews():
    images = np.zeros((8, *ROW), np.uint8)
    images.flags.writeable = False
    scratch = aligned_empty(ROW_BYTES)
    assert fill_iovecs(np.zeros(8, np.int64), np.arange(8), {0: _pending(images)}, 0, ROW_BYTES, scratch) is None
    strided = np.zeros((8, 20, 40, 3), np.uint8)[:, :, ::2]  # rows not contiguous in their array
    assert fill_iovecs(np.zeros(8, np.int64), np.arange(8), {0: _pending(strided)}, 0, ROW_BYTES, scratch) is None
    fine = np.zeros((8, *ROW), np.uint8)
    stray = np.array([0, 1, 2, 3], np.int64)  # position 3 goes to batch 3, which is not among the fill's batches
    assert fill_iovecs(stray, np.zeros(4, np.int64), {0: _pending(fine)}, 0, ROW_BYTES, scratch) is None


def _iovecs_of(out: np.ndarray) -> np.ndarray:
    iovecs = np.empty(len(out), IOVEC)
    iovecs["base"] = out.ctypes.data + np.arange(len(out), dtype=np.uint64) * ROW_BYTES
    iovecs["len"] = ROW_BYTES
    return iovecs


def test_short_reads_and_more_rows_than_one_call_takes_go_on_where_they_stopped(raw_file, monkeypatch):
    path, data = raw_file
    real = rawio._libc_preadv()
    calls = []

    def short(fd, address, count, offset):  # the real call, on at most 2 buffers and 1,000 bytes of the first
        calls.append(count)
        first = np.frombuffer((ctypes.c_char * IOVEC.itemsize).from_address(address), IOVEC).copy()
        if first["len"][0] > 1000:
            first["len"] = 1000
            return real(fd, first.ctypes.data, 1, offset)
        return real(fd, address, min(count, 2), offset)

    monkeypatch.setattr(rawio, "_preadv", short)
    monkeypatch.setattr(rawio, "IOV_MAX", 3)
    out = np.zeros((7, ROW_BYTES), np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        rawio.preadv_rows(fd, _iovecs_of(out), 0, 7, ROW_BYTES, 11 * ROW_BYTES, path)
    finally:
        os.close(fd)
    np.testing.assert_array_equal(out, data.reshape(400, ROW_BYTES)[11:18])
    assert max(calls) <= 3 and len(calls) > 7  # cut at IOV_MAX, and each short read went on


def test_a_read_interrupted_by_a_signal_is_made_again_and_other_failures_raise(raw_file, monkeypatch):
    path, data = raw_file
    real = rawio._libc_preadv()
    failures = [errno.EINTR, errno.EINTR, errno.EIO]

    def failing(fd, address, count, offset):  # fails as a read interrupted by a signal would, then as a bad disk
        if failures and failures[0] == errno.EINTR:
            ctypes.set_errno(failures.pop(0))
            return -1
        return real(fd, address, count, offset)

    monkeypatch.setattr(rawio, "_preadv", failing)
    out = np.zeros((3, ROW_BYTES), np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        rawio.preadv_rows(fd, _iovecs_of(out), 0, 3, ROW_BYTES, 5 * ROW_BYTES, path)
        np.testing.assert_array_equal(out, data.reshape(400, ROW_BYTES)[5:8])
        assert failures == [errno.EIO]

        def broken(fd, address, count, offset):
            ctypes.set_errno(errno.EIO)
            return -1

        monkeypatch.setattr(rawio, "_preadv", broken)
        with pytest.raises(OSError) as info:
            rawio.preadv_rows(fd, _iovecs_of(out), 0, 3, ROW_BYTES, 0, path)
        assert info.value.errno == errno.EIO and info.value.filename == path
    finally:
        os.close(fd)


def test_a_read_past_the_end_of_the_file_is_an_error(raw_file):
    path, _ = raw_file
    out = np.zeros((4, ROW_BYTES), np.uint8)
    source = LocalFile(path)
    try:
        with pytest.raises(OSError, match="unexpected end of file"):
            source.readinto_rows(398 * ROW_BYTES, _iovecs_of(out), 0, 4, ROW_BYTES, None)
    finally:
        source.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(2)
    path = tmp_path_factory.mktemp("iovec") / "s.h5"
    write_arrays(path, rng.integers(0, 256, (3000, *ROW), dtype=np.uint8), np.arange(3000) % 7, block_rows=64)
    return str(path)


def _epochs(path, epochs=2, **kw):
    with h5stream.open(path, **{"batch_size": 32, "seed": 9, "read_unit": "16KiB", "memory_budget": "8MiB", **kw}) as s:
        return [(x.copy(), y.copy()) for _ in range(epochs) for x, y in s]


def _count_reads_by_address(monkeypatch) -> list:
    calls = []
    real = LocalFile.readinto_rows

    def counted(self, *args):
        calls.append(args[3])
        return real(self, *args)

    monkeypatch.setattr(LocalFile, "readinto_rows", counted)
    return calls


@pytest.mark.parametrize("kw", [dict(verify_reads=False), dict(verify_reads="once"), dict(verify_reads=True),
                                dict(workers=2, verify_reads="once", memory_budget=None), dict(shard=(1, 3))])
def test_a_stream_gives_the_same_batches_as_reading_through_memoryviews(store, monkeypatch, kw):
    calls = _count_reads_by_address(monkeypatch)
    by_address = _epochs(store, **kw)
    if kw.get("verify_reads") is not True and "workers" not in kw:
        assert sum(calls) > 0  # the new path read rows (checked every read: never, the checks need views)
    monkeypatch.setattr(LocalFile, "reads_rows", property(lambda self: False))  # every row through a memoryview
    calls.clear()
    by_views = _epochs(store, **kw)
    assert not calls
    assert len(by_address) == len(by_views) > 0
    for (xa, ya), (xb, yb) in zip(by_address, by_views):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


def _flip(path, row):
    with h5py.File(path, "r") as f:
        offset = f["images"].id.get_chunk_info(row // 64).byte_offset + (row % 64) * ROW_BYTES + 10
    with open(path, "r+b") as fh:
        fh.seek(offset)
        value = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([value ^ 0x10]))


@pytest.mark.parametrize("row_digests", [True, False])
def test_checks_still_catch_a_flipped_byte(tmp_path, monkeypatch, row_digests):
    rng = np.random.default_rng(5)
    path = str(tmp_path / "s.h5")
    write_arrays(path, rng.integers(0, 256, (3000, *ROW), dtype=np.uint8), np.arange(3000) % 7, block_rows=64)
    if not row_digests:
        drop_row_digests(path)  # a store of before /row_digests: blocks learned whole
    calls = _count_reads_by_address(monkeypatch)
    with h5stream.open(path, batch_size=32, seed=9, read_unit="16KiB", memory_budget="8MiB", verify_reads=True) as s:
        for _x, _y in s:  # a clean first epoch
            pass
        _flip(path, 700)
        with pytest.raises(ChecksumError):  # every read is checked, so none is read by address
            for _x, _y in s:
                pass
    assert not calls
    with pytest.raises(ChecksumError):  # "once": the first read of every block is checked, not read by address
        _epochs(path, epochs=1, verify_reads="once")
    assert not calls
