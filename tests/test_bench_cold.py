"""Smoke test of the larger-than-RAM benchmark: --quick runs every measurement on a small store (figures, not speed)."""

from __future__ import annotations

import json

import pytest

from benchmarks import cold

pytestmark = pytest.mark.usefixtures("no_leaks")  # the measurements start processes and shared memory


@pytest.mark.slow
def test_quick_run_measures_everything_in_one_round(tmp_path, capsys):
    assert cold.main(["--quick", "--json", "--data", str(tmp_path)]) == 0
    result = json.loads(capsys.readouterr().out)
    runs = result["runs"]
    assert set(runs) == {"disk", "h5py", "stream", "stream_aug_w2", "warm_aug_w2", "warm_w0"}
    assert all(r["mb_per_s"] > 0 for r in runs.values())
    for key in ("stream", "stream_aug_w2", "warm_aug_w2", "warm_w0"):
        r = runs[key]
        assert r["rows_per_s"] > 0 and r["first_batch_s"] > 0 and r["peak_mem_bytes"] > 0
        assert r["user_cores"] >= 0 and r["kernel_cores"] >= 0
    # --quick forces O_DIRECT on the cold streams; the warm small store keeps the page cache ("auto").
    assert runs["stream"]["direct_io"] and runs["stream_aug_w2"]["direct_io"]
    assert not runs["warm_w0"]["direct_io"] and not runs["warm_aug_w2"]["direct_io"]
    assert set(result["ratios"]) == {"stream_vs_disk", "stream_vs_h5py", "aug_cold_vs_warm"}
    assert [t["name"] for t in result["targets"]][:3] == [
        "stream (workers 0) >= 0.9x the disk's O_DIRECT rate", "stream (workers 0) >= 1.0x h5py read_direct",
        "augmenting stream, 2 workers, > RAM >= 0.85x its warm small-store rate"]
    assert "| disk limit" in cold.format_text(result)


def test_the_large_store_is_sized_from_ram_and_refused_without_room(tmp_path):
    rows = cold.large_rows(1.3)
    assert rows * cold.ROW_BYTES >= 1.3 * cold.mem_total_bytes() and rows % 1024 == 0
    with pytest.raises(SystemExit, match="GB are free on that disk"):
        cold.ensure_store(str(tmp_path / "huge.h5"), 10**12)
    assert not (tmp_path / "huge.h5").exists()


@pytest.mark.parametrize("budget", [pytest.param(cold.BUDGET, marks=pytest.mark.slow), "1GiB"])
def test_the_random_disk_pattern_reads_the_stream_s_own_unit(tmp_path, budget):
    """disk_random's piece is the unit the stream itself plans (h5stream's rule, from the fill), not a fixed
    1 MiB: the two sizes in the table are the same."""
    import h5stream
    from benchmarks.data import make_bench_file

    path = make_bench_file(str(tmp_path / "s.h5"), rows=4096, size=cold.SIZE, channels=cold.CHANNELS, progress=False)
    with h5stream.open(path, batch_size=cold.BATCH_SIZE, memory_budget=budget, seed=0) as stream:
        want = stream.plan.unit_rows * stream.meta.row_bytes
    assert cold.stream_unit_bytes(path, budget) == want

