"""A URL store under the stream's defaults: every byte fetched is checked, and the same options give the local
file's batches, whatever memory the remote client takes.  Real HTTP server on 127.0.0.1 (:mod:`remote_servers`)."""

from __future__ import annotations

import os
import re

import h5py
import numpy as np
import pytest

import h5stream
from h5stream.errors import BudgetError, ChecksumError
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
    """Invert every pixel byte of ``path`` and put its mtime back: the server's ETag (mtime and size) and
    Last-Modified stay what they were, as for a proxy or a server serving other bytes under the same ETag.  The
    inverted copy gets the old mtime before it takes the name, so a request the stream's read-ahead makes meanwhile
    sees the old bytes or the new ones, always under the same ETag (in place, one could land between the write and
    the mtime put back, and see another ETag)."""
    before = os.stat(path)
    with h5py.File(path, "r") as f:
        chunks = [f["images"].id.get_chunk_info(i) for i in range(f["images"].id.get_num_chunks())]
    copy = str(path) + ".inverted"
    with open(path, "rb") as fh:
        data = bytearray(fh.read())
    for info in chunks:
        a, b = info.byte_offset, info.byte_offset + info.size
        data[a:b] = (~np.frombuffer(bytes(data[a:b]), np.uint8)).tobytes()
    with open(copy, "wb") as fh:
        fh.write(data)
    os.utime(copy, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(copy, path)
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
    with h5stream.open(url, **KW, cache_dir=None) as s:  # uncached: epoch 2 fetches from the server again
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


@pytest.mark.parametrize("budget", ["64MiB", "96MiB", "160MiB"])
def test_a_url_gives_its_local_files_batches_under_a_given_budget_or_says_what_to_pass(range_server, budget):
    """16000 rows of 3 KiB (47 MiB) in 64-row blocks: under 64 and 96 MiB the local file's fill leaves no room
    for the remote client (36 MiB), under 160 MiB it does (the whole epoch).  The URL gives the local file's
    batches, or a BudgetError naming the rows_per_fill that fits, with which the URL and the local file give the
    same batches again; never other batches in silence."""
    path = make(range_server.root / "big.h5", rows=16000, side=32, block_rows=64)
    url = range_server.url + "big.h5"
    kw = dict(batch_size=64, memory_budget=budget, seed=5)

    def epoch(where, **extra):
        with h5stream.open(where, **kw, **extra) as s:
            return s.plan, [np.column_stack([x.reshape(len(x), -1)[:, :8], y]) for x, y in s]

    here_plan, here = epoch(path)
    try:
        there_plan, there = epoch(url, remote={"timeout_s": 10})
    except BudgetError as exc:
        msg = str(exc)
        assert msg.startswith(f"{url}: ") and f"hold {here_plan.rows_per_fill} rows" in msg and "\n" not in msg
        assert budget != "160MiB", msg  # the client fits beside the whole epoch
        fits = int(re.search(r"rows_per_fill=(\d+)", msg).group(1))
        assert fits < here_plan.rows_per_fill
        here_plan, here = epoch(path, rows_per_fill=fits)
        there_plan, there = epoch(url, rows_per_fill=fits, remote={"timeout_s": 10})
        assert there_plan.total_bytes <= there_plan.budget_bytes
    assert (there_plan.rows_per_fill, there_plan.unit_rows) == (here_plan.rows_per_fill, here_plan.unit_rows)
    assert len(there) == len(here) == 250 and all(np.array_equal(a, b) for a, b in zip(here, there))
