"""A URL store under the stream's defaults: every byte fetched is checked, and the same options give the local
file's batches, whatever memory the remote client takes.  Real HTTP server on 127.0.0.1 (:mod:`remote_servers`)."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest

import h5stream
from h5stream.errors import ChecksumError
from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")
pytest.importorskip("obstore")

ROWS, SIDE, BLOCK = 640, 16, 16
# Reads of a quarter block, fills of 64 rows: ten fills an epoch, so most of epoch 2 is read after epoch 1 ends.
KW = dict(batch_size=16, seed=3, read_unit=4 * SIDE * SIDE * 3, rows_per_fill=64, remote={"timeout_s": 10})


def make(path, rows=ROWS, side=SIDE, block_rows=BLOCK):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (rows, side, side, 3), dtype=np.uint8)
    write_arrays(path, images, rng.integers(0, 7, rows), block_rows=block_rows, storage_order="sorted")
    return str(path)


def invert_pixels_keeping_the_etag(path):
    """Invert every pixel byte of ``path`` in place and put its mtime back: the server's ETag (mtime and size) and
    Last-Modified stay what they were, as for a proxy or a server serving other bytes under the same ETag."""
    before = os.stat(path)
    with h5py.File(path, "r") as f:
        chunks = [f["images"].id.get_chunk_info(i) for i in range(f["images"].id.get_num_chunks())]
    with open(path, "r+b") as fh:
        for info in chunks:
            fh.seek(info.byte_offset)
            data = np.frombuffer(fh.read(info.size), np.uint8)
            fh.seek(info.byte_offset)
            fh.write((~data).tobytes())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_mtime_ns, after.st_size) == (before.st_mtime_ns, before.st_size)


def test_bytes_a_server_changes_under_the_same_etag_after_the_first_epoch_raise_by_default(range_server):
    """verify_reads="once" (the default) over a URL: epoch 1 checks every block; the server then serves other
    bytes under the same ETag.  Epoch 2 fetches the rows again and raises ChecksumError before a wrong batch."""
    path = make(range_server.root / "ids.h5")
    url = range_server.url + "ids.h5"
    with h5stream.open(path, **{**KW, "remote": None}) as s:
        reference = [[(x.copy(), y.copy()) for x, y in s] for _ in range(2)]
    served = 0
    with h5stream.open(url, **KW) as s:
        first = [(x.copy(), y.copy()) for x, y in s]
        invert_pixels_keeping_the_etag(path)
        with pytest.raises(ChecksumError) as info:
            for x, y in s:
                assert np.array_equal(x, reference[1][served][0]) and np.array_equal(y, reference[1][served][1])
                served += 1
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(first, reference[0])) and len(first) == len(reference[0])
    assert served < len(reference[1])
    msg = str(info.value)
    assert msg.startswith(f"{url}: ") and "(block " in msg and "\n" not in msg
