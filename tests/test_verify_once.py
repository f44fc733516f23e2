"""Checking each block once (``verify_reads="once"`` on a local file): a block learned around a read's rows is
checked with one digest of the whole and keeps no row digests; a read whose own rows differ from the file is
still named row by row, and checking every read still keeps them."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash

from h5stream.errors import ChecksumError
from h5stream.read.verify import BlockCheck

BLOCK_ROWS, ROW_BYTES, BLOCKS = 64, 12, 3


def _check(every_read: bool):
    rng = np.random.default_rng(5)
    data = rng.integers(0, 256, (BLOCKS * BLOCK_ROWS, ROW_BYTES), dtype=np.uint8)
    digests = [xxhash.xxh3_64_intdigest(data[b * BLOCK_ROWS:(b + 1) * BLOCK_ROWS].tobytes()) for b in range(BLOCKS)]
    check = BlockCheck("s.h5", len(data), BLOCK_ROWS, ROW_BYTES, np.array(digests, np.uint64),
                       np.zeros(BLOCKS, np.uint64), np.ones(BLOCKS, bool), every_read=every_read)

    def read_block(start, stop, out):
        out[:] = data[start:stop].tobytes()

    return check, data, read_block


def _views(rows: np.ndarray) -> list[memoryview]:
    return [memoryview(r.tobytes()) for r in rows]


def test_once_learns_a_block_around_a_read_with_one_digest_and_keeps_no_row_digests():
    check, data, read_block = _check(every_read=False)
    src = BLOCK_ROWS + 10  # rows 10..29 of block 1
    check.images(src, _views(data[src:src + 20]), read_block)
    assert not check.row_digests.any()  # the block was checked whole, no step per row
    check.images(src + 30, _views(data[src + 30:src + 40]), read_block)  # a learned block: trusted
    damaged = data[src:src + 20].copy()
    damaged[7, 3] ^= 0xFF
    check.images(src, _views(damaged), read_block)  # checked once: a later read of it is served as read


def test_once_names_the_rows_of_a_read_that_differ_from_the_file():
    check, data, read_block = _check(every_read=False)
    src = 2 * BLOCK_ROWS + 5
    rows = data[src:src + 20].copy()
    rows[7, 3] ^= 0xFF
    with pytest.raises(ChecksumError, match=f"row {src + 7}"):
        check.images(src, _views(rows), read_block)


def test_every_read_keeps_the_row_digests_and_checks_every_later_read():
    check, data, read_block = _check(every_read=True)
    src = BLOCK_ROWS + 10
    check.images(src, _views(data[src:src + 20]), read_block)
    block = slice(BLOCK_ROWS, 2 * BLOCK_ROWS)
    want = [xxhash.xxh3_64_intdigest(r.tobytes()) for r in data[block]]
    assert check.row_digests[block].tolist() == want
    damaged = data[src:src + 20].copy()
    damaged[7, 3] ^= 0xFF
    with pytest.raises(ChecksumError, match=f"row {src + 7}"):
        check.images(src, _views(damaged), read_block)
