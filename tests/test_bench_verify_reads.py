"""benchmarks.verify_reads: both settings run in every round, in alternating order, and the table gives the ratio."""

from __future__ import annotations

import pytest

from benchmarks import verify_reads
from benchmarks.data import make_bench_file

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_every_round_runs_both_settings_alternating_and_the_ratio_is_the_rounds_median(tmp_path, monkeypatch):
    path = make_bench_file(str(tmp_path / "b.h5"), rows=300, size=16, progress=False)
    calls = []
    rates = iter([100.0, 50.0, 80.0, 100.0, 90.0, 100.0])  # on/off per round, in the order they are asked for

    def fake_rate(p, workload, verify):
        calls.append(verify)
        return next(rates)

    monkeypatch.setattr(verify_reads, "rate", fake_rate)
    out = verify_reads.run(path, 3, ("warm, epochs 2-3",))
    assert calls == [True, False, False, True, True, False]
    r = out["results"]["warm, epochs 2-3"]
    assert r["round_ratios"] == [2.0, 1.25, 0.9] and r["ratio"] == 1.25 and r["off_rounds"] == [50.0, 80.0, 100.0]
    text = verify_reads.table(out)
    assert "| warm, epochs 2-3 |" in text and "1.250 (2.000, 1.250, 0.900)" in text


def test_a_real_workload_streams_with_and_without_checks(tmp_path):
    path = make_bench_file(str(tmp_path / "b.h5"), rows=300, size=16, progress=False)
    assert verify_reads.rate(path, "warm, epochs 2-3", True) > 0
    assert verify_reads.rate(path, "warm, epoch 1", False) > 0
