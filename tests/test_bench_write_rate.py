"""Smoke test of the write-rate benchmark on a tiny run: every writer is measured or named as skipped."""

from __future__ import annotations

import json

import pytest

from benchmarks import write_rate

pytestmark = pytest.mark.usefixtures("no_leaks")  # the ingest child


def test_bench_write_rate_measures_or_names_every_writer(tmp_path, capsys):
    assert write_rate.main(["--n", "48", "--size", "8", "--rounds", "1", "--json", "--data", str(tmp_path)]) == 0
    result = json.loads(capsys.readouterr().out)  # stdout is the JSON alone
    rates, skipped = result["rows_per_s"], result["skipped"]
    for name in (write_rate.WRITE, write_rate.WRITE_SHUFFLED, write_rate.INGEST):
        assert rates[name] > 0, name
    for name, module in write_rate.PEERS.items():
        assert (name in rates) != (name in skipped), name
        if name in skipped:
            assert f"{module} is not importable" in skipped[name]
    assert set(result["ratios_to_write"]) == set(rates) - {write_rate.WRITE}
