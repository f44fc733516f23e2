"""A URL stream on a slow but healthy link never trips ``timeout_s``: the bytes of a response count as progress as
they arrive, so a request that takes longer than ``timeout_s`` while its body keeps coming is slow, not stuck.

The link here is really slow: the test server sends every large body half a MiB at a time, ``PAUSE_S`` apart, so
one request of the stream takes several times ``TIMEOUT_S`` while no gap between two parts comes near it.
"""

from __future__ import annotations

import numpy as np
import pytest

import h5stream
from h5stream.store.writer import write_arrays

pytest.importorskip("obstore")

pytestmark = pytest.mark.usefixtures("no_leaks")

CHUNK = 512 << 10
PAUSE_S = 0.5
TIMEOUT_S = 2.0  # four pauses: a gap between two parts of a body stays far below it, even on a busy machine


@pytest.fixture
def slow_server(tmp_path):
    from remote_servers import RangeServer

    root = tmp_path / "www"
    root.mkdir()
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (1000, 32, 32, 3), dtype=np.uint8)  # 3 MiB of pixels in one 1000-row block
    write_arrays(str(root / "s.h5"), images, np.arange(1000) % 4, block_rows=1000)
    local = str(root / "s.h5")
    server = RangeServer(root)
    try:
        yield server, local
    finally:
        server.stop()


def _batches(stream):
    with stream:
        return [(x.copy(), y.copy()) for x, y in stream]


@pytest.mark.parametrize("cache", ["cached", "uncached"])
def test_a_request_longer_than_timeout_s_on_a_slow_link_gives_the_local_files_batches(slow_server, tmp_path, cache):
    server, local = slow_server
    want = _batches(h5stream.open(local, batch_size=100, seed=1, shuffle=False))
    # Bodies of 2 MiB or more (the cache's piece of the whole file, or the stream's run of it) drip: such a
    # request takes 3 s or more, longer than TIMEOUT_S, with a part every PAUSE_S.
    server.drip(2 << 20, CHUNK, PAUSE_S)
    cache_dir = str(tmp_path / "cache") if cache == "cached" else None
    got = _batches(h5stream.open(server.url + "s.h5", batch_size=100, seed=1, shuffle=False, timeout_s=TIMEOUT_S,
                                 cache_dir=cache_dir, remote={"timeout_s": 60}))  # the client waits for a whole request
    assert max(e - s for s, e in server.ranges) >= 2 << 20  # a dripped request was made, and was waited for
    assert len(got) == len(want) == 10
    for (gx, gy), (wx, wy) in zip(got, want):
        np.testing.assert_array_equal(gx, wx)
        np.testing.assert_array_equal(gy, wy)


def test_a_first_fill_longer_than_timeout_s_does_not_trip_a_feeder_whose_reader_keeps_reading(slow_server, tmp_path,
                                                                                             monkeypatch):
    # The feeder's reader fetches the first fill for several times timeout_s, a part every PAUSE_S: the training
    # process's wait for the feeder's answer follows the feeder's reads (a counter the feeder raises while its
    # reader moves), as the feeder's own wait does, instead of giving up after a fixed timeout_s plus grace (here
    # no grace: that wait would be TIMEOUT_S).
    from h5stream.streaming import process_feed

    server, local = slow_server
    monkeypatch.setattr(process_feed, "ANSWER_GRACE_S", 0.0)
    want = _batches(h5stream.open(local, batch_size=100, seed=1, shuffle=False))
    server.drip(2 << 20, CHUNK, PAUSE_S)
    got = _batches(h5stream.open(server.url + "s.h5", batch_size=100, seed=1, shuffle=False, timeout_s=TIMEOUT_S,
                                 feeder=True, workers=1, cache_dir=str(tmp_path / "cache"), remote={"timeout_s": 60}))
    assert max(e - s for s, e in server.ranges) >= 2 << 20  # a dripped request was made, and was waited for
    assert len(got) == len(want) == 10
    for (gx, gy), (wx, wy) in zip(got, want):
        np.testing.assert_array_equal(gx, wx)
        np.testing.assert_array_equal(gy, wy)
