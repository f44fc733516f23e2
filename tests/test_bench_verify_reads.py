"""benchmarks.verify_reads: every setting runs in every round, in rotating order, and the table gives the ratios."""

from __future__ import annotations

import pytest

from benchmarks import verify_reads
from benchmarks.data import make_bench_file

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_every_round_runs_every_setting_in_rotating_order_and_the_ratios_are_the_rounds_medians(tmp_path,
                                                                                               monkeypatch):
    path = make_bench_file(str(tmp_path / "b.h5"), rows=300, size=16, progress=False)
    calls = []
    # Per round, in the order asked for: (on, once, off), (once, off, on), (off, on, once).
    rates = iter([100.0, 100.0, 50.0, 80.0, 100.0, 80.0, 100.0, 90.0, 100.0])

    def fake_rate(p, workload, verify):
        calls.append(verify)
        return next(rates)

    monkeypatch.setattr(verify_reads, "rate", fake_rate)
    out = verify_reads.run(path, 3, ("warm, epochs 2-3",))
    assert calls == [True, "once", False, "once", False, True, False, True, "once"]
    r = out["results"]["warm, epochs 2-3"]
    assert r["off_rounds"] == [50.0, 100.0, 100.0] and r["on_rounds"] == [100.0, 80.0, 90.0]
    assert r["on_round_ratios"] == [2.0, 0.8, 0.9] and r["on_ratio"] == 0.9
    assert r["once_round_ratios"] == [2.0, 0.8, 1.0] and r["once_ratio"] == 1.0
    text = verify_reads.table(out)
    assert "| warm, epochs 2-3 |" in text and "0.900 (2.000, 0.800, 0.900)" in text
    assert "1.000 (2.000, 0.800, 1.000)" in text


def test_a_real_workload_streams_with_and_without_checks(tmp_path):
    path = make_bench_file(str(tmp_path / "b.h5"), rows=300, size=16, progress=False)
    assert verify_reads.rate(path, "warm, epochs 2-3", True) > 0
    assert verify_reads.rate(path, "warm, epoch 1", False) > 0
    assert verify_reads.rate(path, "warm, epoch 1", "once") > 0


def test_the_old_layout_runs_beside_the_store_with_what_epoch_1_read_besides_the_rows(tmp_path, monkeypatch):
    path = make_bench_file(str(tmp_path / "b.h5"), rows=300, size=16, progress=False)
    files = []

    def fake_rate(p, workload, verify):
        files.append(p)
        return 100.0

    monkeypatch.setattr(verify_reads, "rate", fake_rate)
    out = verify_reads.run(path, 1, ("warm, epoch 1", "warm, epochs 2-3"), ("rows", "blocks"))
    old = str(tmp_path / "b.blocks.h5")
    assert set(files) == {path, old} and files.count(old) == 3  # its first epoch only, each setting
    results = out["results"]
    assert list(results) == ["warm, epoch 1", "warm, epochs 2-3", "warm, epoch 1" + verify_reads.OLD]
    assert results["warm, epoch 1"]["once_read_again_share"] == 8 / (16 * 16 * 3)  # the row digests alone
    assert results["warm, epoch 1" + verify_reads.OLD]["once_read_again_share"] >= 0
    assert "read besides the rows in epoch 1" in verify_reads.table(out)
