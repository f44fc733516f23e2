"""Smoke test of benchmarks/ab.py: both versions really run their own h5stream, and the table is made (not speed)."""

from __future__ import annotations

import pytest

from benchmarks import ab

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_ab_runs_a_workload_on_both_versions_from_their_own_package(tmp_path):
    result = ab.measure("HEAD", str(tmp_path), rounds=1, gb=0.005, photos=8, workloads=("stream warm",))
    row = result["workloads"]["stream warm"]
    assert row["base"] > 0 and row["head"] > 0 and row["head/base"]["median"] > 0
    assert (tmp_path / "ab").is_dir() and any((tmp_path / "ab").glob("*/h5stream/__init__.py"))
    assert "stream warm" in ab.format_table(result)
