"""benchmarks.encoded: every store kind ingested from the same photos, streamed in every round, the table and JSON."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks import encoded
from benchmarks.data import ensure_photos
from benchmarks.encoded_crop import DEFAULT_DALI_PYTHON, dali_rates

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_a_smoke_run_measures_every_kind_against_raw(tmp_path, capsys):
    assert encoded.main(["--photos", "24", "--size", "48", "--rounds", "1", "--data", str(tmp_path), "--json",
                         "--crop", "0"]) == 0
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


def test_the_crop_comparison_measures_h5stream_and_says_when_ffcv_is_missing(tmp_path, capsys):
    missing, no_dali = str(tmp_path / "no-ffcv" / "python"), str(tmp_path / "no-dali" / "python")
    assert encoded.main(["--photos", "12", "--size", "48", "--rounds", "1", "--data", str(tmp_path), "--json",
                         "--ffcv-python", missing, "--dali-python", no_dali]) == 0
    captured = capsys.readouterr()
    crop = json.loads(captured.out)["crop"]
    assert crop["output"] == 42  # 7/8 of the stored size by default
    assert crop["h5stream"]["images_per_cpu_s"] > 0 and len(crop["h5stream"]["rounds"]) == 1
    assert crop["ffcv"] == {"skipped": f"no FFCV venv at {missing} (--ffcv-python): FFCV not measured"}
    assert crop["dali"] == {"skipped": f"no DALI venv at {no_dali} (--dali-python): DALI not measured"}
    assert f"no FFCV venv at {missing}" in captured.err and f"no DALI venv at {no_dali}" in captured.err
    text = encoded.table(json.loads(captured.out))
    assert "Decode + random resized crop to 42x42 + flip" in text and "| FFCV 1.0.2 | skipped: no FFCV venv" in text
    assert "| DALI CPU pipeline | skipped: no DALI venv" in text


@pytest.mark.skipif(not os.path.exists(DEFAULT_DALI_PYTHON), reason=f"no DALI venv at {DEFAULT_DALI_PYTHON}")
def test_dali_decodes_the_jpeg_stores_own_bytes_to_the_crop_size_on_the_cpu(tmp_path):
    photos = ensure_photos(str(tmp_path), 12)
    store = encoded.ensure_kind(str(tmp_path), photos, 48, "jpeg q90")
    got = dali_rates(store, 40, 1, str(tmp_path), DEFAULT_DALI_PYTHON)
    assert "skipped" not in got, got
    assert got["shape"] == [40, 40, 3] and [r["images"] for r in got["rounds"]] == [12]
    assert got["rounds"][0]["images_per_cpu_s"] > 0 and not os.path.exists(tmp_path / "dali-jpegs.npz")
