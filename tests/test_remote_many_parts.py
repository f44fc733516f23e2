"""A set of many small stores at URLs on a far server (a real HTTP server on 127.0.0.1 answering every request a
quarter of a second late): the reader opens every part (several requests each) before its first read, which takes
several times ``timeout_s`` in all while each part opens well within it; slow, not stuck."""

from __future__ import annotations

import numpy as np
import pytest

import h5stream
from h5stream.store.writer import write_arrays

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.slow]
pytest.importorskip("obstore")

PARTS = 8
DELAY_S = 0.25
TIMEOUT_S = 5.0  # each part's few requests take about a second and a half, all of them together several times this


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
