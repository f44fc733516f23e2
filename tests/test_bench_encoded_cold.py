"""benchmarks.encoded_cold: the reader's per-epoch rates and disk bytes, the cgroup lookup, the refusal, the summary."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from benchmarks import encoded_cold
from benchmarks.harness import child_command, child_env
from h5stream.store.writer import write_arrays

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_the_summary_takes_medians_per_epoch_and_same_round_ratios():
    def run(raw, jpeg):
        return {"raw": {"epochs": [{"images_per_s": v, "read_bytes": 10} for v in raw]},
                "jpeg q90": {"epochs": [{"images_per_s": v, "read_bytes": 0} for v in jpeg]}}

    rounds = [run([100, 200], [50, 400]), run([200, 100], [200, 300]), run([100, 100], [100, 100])]
    s = encoded_cold.summarise(rounds, 2)
    assert [e["images_per_s"] for e in s["raw"]] == [100, 100]
    assert [e["images_per_s"] for e in s["jpeg q90"]] == [100, 300]
    assert s["jpeg_vs_raw"] == [1.0, 2.0]  # medians of (0.5, 1, 1) and (2, 3, 1)
    assert s["raw"][0]["read_bytes"] == 10 and s["jpeg q90"][1]["read_bytes"] == 0


def test_the_reader_evicting_each_epoch_reads_the_store_from_disk_every_epoch(tmp_path):
    path = str(tmp_path / "s.h5")
    rng = np.random.default_rng(0)
    rows = 3000  # 37 MB: over twice the stream's 16 MiB budget, so no epoch is kept in its buffers
    write_arrays(path, rng.integers(0, 256, (rows, 64, 64, 3), dtype=np.uint8), np.arange(rows) % 4, block_rows=32)
    proc = subprocess.run(child_command("benchmarks.encoded_cold:reader", path, 2, 0, "none", "16MiB", "-", "1"),
                          capture_output=True, text=True, env=child_env(), check=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [e["images"] for e in out["epochs"]] == [rows, rows], out
    # No epoch from the page cache: most of each is read from the disk (the stream may have read the next epoch's
    # first buffers ahead, before the eviction, and counted them in the epoch before).
    assert all(e["read_bytes"] >= rows * 64 * 64 * 3 * 3 // 4 for e in out["epochs"]), out


def test_a_limit_outside_the_two_stores_is_refused_with_their_sizes(tmp_path):
    with pytest.raises(SystemExit, match=r"--cold-limit 1,073,741,824 B must lie between the JPEG store"):
        encoded_cold.main(["--photos", "8", "--size", "32", "--cold-limit", "1GiB", "--data", str(tmp_path)])
