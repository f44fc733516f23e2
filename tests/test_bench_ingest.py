"""Smoke test of the ingest benchmark on a tiny generated folder (its figures and ratios, not speed)."""

from __future__ import annotations

import json

import pytest

from benchmarks import ingest as bench_ingest

pytestmark = pytest.mark.usefixtures("no_leaks")  # decode workers and their shared-memory slots


def test_bench_ingest_reports_every_row_and_paired_ratios(tmp_path, capsys):
    assert bench_ingest.main(["--n", "24", "--size", "32", "--rounds", "2", "--no-keras", "--json",
                              "--data", str(tmp_path)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["images"] == 24 and result["rounds"] == 2
    rows = result["images_per_s"]
    for name in ("decode floor (1 proc, h5stream decoder)", "ingest --workers 1", "ingest --workers 2"):
        assert rows[name] > 0, name
    paired = result["paired_ratios"]["ingest w2 / ingest w1"]
    assert paired["min"] <= paired["median"] <= paired["max"] and paired["min"] > 0
    assert "ingest w2 / keras" not in result["paired_ratios"]  # no baseline was run
