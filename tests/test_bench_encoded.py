"""benchmarks.encoded: every store kind ingested from the same photos, streamed in every round, the table and JSON."""

from __future__ import annotations

import json

import pytest

from benchmarks import encoded

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_a_smoke_run_measures_every_kind_against_raw(tmp_path, capsys):
    assert encoded.main(["--photos", "24", "--size", "48", "--rounds", "1", "--data", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    stores = out["stores"]
    assert {"raw", "zlib", "jpeg q75", "jpeg q90", "jpeg q95"} <= set(stores)
    assert stores["raw"]["bytes_per_image"] == 48 * 48 * 3
    assert stores["jpeg q75"]["bytes_per_image"] < stores["jpeg q90"]["bytes_per_image"] \
        < stores["jpeg q95"]["bytes_per_image"] < stores["raw"]["bytes_per_image"] / 2
    for s in stores.values():
        for workload in encoded.WORKLOADS:
            assert s[workload]["images_per_s"] > 0 and len(s[workload]["rounds"]) == 1
    assert stores["raw"]["loader"]["per_core_vs_raw"] == 1.0
    text = encoded.table(out)
    assert "| jpeg q90 |" in text and "(1.00x)" in text
