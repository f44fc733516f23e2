"""Sets of many small stores at URLs (a real HTTP server on 127.0.0.1): the remote clients' memory is counted once
for what they share, not once per part; and on a far server (answering every request a quarter of a second late)
the reader opens every part (several requests each) before its first read, which takes several times
``timeout_s`` in all while each part opens well within it: slow, not stuck."""

from __future__ import annotations

import numpy as np
import pytest

import h5stream
from h5stream.remote.config import (
    CLIENT_BASE_BYTES,
    CLIENT_PER_READ_BYTES,
    RemoteOptions,
    client_memory_bytes,
    parts_client_memory_bytes,
)
from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")
pytest.importorskip("obstore")

PARTS = 8
DELAY_S = 0.25
TIMEOUT_S = 5.0  # each part's few requests take about a second and a half, all of them together several times this


@pytest.mark.slow
@pytest.mark.parametrize("feeder", [False, True])
def test_opening_many_url_parts_longer_than_timeout_s_is_progress_and_gives_the_local_files_batches(tmp_path,
                                                                                                   feeder):
    from remote_servers import RangeServerProcess

    root = tmp_path / "www"
    root.mkdir()
    rng = np.random.default_rng(8)
    for i in range(PARTS):
        write_arrays(str(root / f"p{i}.h5"), rng.integers(0, 256, (30, 8, 8, 3), dtype=np.uint8),
                     np.arange(30) % 3, block_rows=10)
    names = [f"p{i}.h5" for i in range(PARTS)]
    with h5stream.open([str(root / n) for n in names], batch_size=40, seed=6) as local:
        want = [(x.copy(), y.copy()) for x, y in local]
    with RangeServerProcess(root) as server:
        server.delay_each(DELAY_S)
        with h5stream.open([server.url + n for n in names], batch_size=40, seed=6, cache_dir=None,
                           timeout_s=TIMEOUT_S, feeder=feeder, workers=1 if feeder else 0) as remote:
            got = [(x.copy(), y.copy()) for x, y in remote]
        sent = sum(server.requests.values())
    assert sent * DELAY_S > 2 * TIMEOUT_S  # the server's answers took longer than timeout_s, many times over
    assert len(got) == len(want) == 6
    for (gx, gy), (wx, wy) in zip(got, want):
        np.testing.assert_array_equal(gx, wx)
        np.testing.assert_array_equal(gy, wy)


class _Part:
    def __init__(self, remote, file_bytes):
        self.remote, self.file_bytes = remote, file_bytes


def test_the_clients_of_many_url_parts_are_counted_once_for_what_they_share():
    cached, plain = RemoteOptions(cache_dir="/c"), RemoteOptions()
    small = [_Part(cached, 1 << 20) for _ in range(100)]  # one piece each: its prefetcher fetches one at a time
    per_part = sum(client_memory_bytes(p.remote, p.file_bytes) for p in small)  # each part counted as one URL
    assert parts_client_memory_bytes(small) < 512 << 20 < per_part
    assert parts_client_memory_bytes([_Part(plain, 1 << 20) for _ in range(100)]) < 160 << 20
    # One URL, or a local part beside it: as before.
    assert parts_client_memory_bytes([_Part(cached, 10**9)]) == client_memory_bytes(cached, 10**9)
    assert parts_client_memory_bytes([_Part(None, 10**9), _Part(plain, 10**9)]) == client_memory_bytes(plain)
    assert parts_client_memory_bytes([_Part(None, 10**9)]) == 0
    # Large cached parts: every part's prefetcher may have its max_in_flight out, as counted per part.
    big = [_Part(cached, 10**10) for _ in range(3)]
    assert parts_client_memory_bytes(big) >= CLIENT_BASE_BYTES + 3 * cached.max_in_flight * CLIENT_PER_READ_BYTES
    assert parts_client_memory_bytes(big) <= sum(client_memory_bytes(p.remote, p.file_bytes) for p in big)


def test_a_stream_over_thirty_small_url_parts_fits_a_budget_that_thirty_clients_did_not(range_server):
    root = range_server.root
    rng = np.random.default_rng(9)
    names = [f"s{i}.h5" for i in range(30)]
    for name in names:
        write_arrays(str(root / name), rng.integers(0, 256, (20, 8, 8, 3), dtype=np.uint8), np.arange(20) % 3,
                     block_rows=10)
    opts = dict(batch_size=50, seed=2, memory_budget="1GB")  # 30 clients counted whole were 1.1 GB
    with h5stream.open([str(root / n) for n in names], **opts) as local:
        want = [(x.copy(), y.copy()) for x, y in local]
    with h5stream.open([range_server.url + n for n in names], cache_dir=None, timeout_s=30, **opts) as remote:
        got = [(x.copy(), y.copy()) for x, y in remote]
    assert len(got) == len(want) == 12
    for (gx, gy), (wx, wy) in zip(got, want):
        np.testing.assert_array_equal(gx, wx)
        np.testing.assert_array_equal(gy, wy)
