"""Smoke test of the scaling benchmark on a tiny generated folder (its columns, caps and --json, not speed); the
pure helpers of its figures.  make test runs the benchmark with one worker count, make test-all with two."""

from __future__ import annotations

import json

import pytest

from benchmarks import scaling
from benchmarks.harness import by_name

pytestmark = pytest.mark.usefixtures("no_leaks")  # decode and augment workers, their shared-memory slots


def test_default_workers_double_up_to_the_cores_and_end_on_them():
    assert scaling.default_workers(1) == [1]
    assert scaling.default_workers(2) == [1, 2]
    assert scaling.default_workers(6) == [1, 2, 4, 6]
    assert scaling.default_workers(16) == [1, 2, 4, 8, 16]


def assert_rate_of_cost(rate: float, per: float, cost: float) -> None:
    """``rate`` is ``per / cost``, up to the JSON's rounding of both to 3 places (±0.0005 each)."""
    slack = per * 0.0005 / (cost * (cost - 0.0005)) + 0.0005 + 1e-9
    assert rate == pytest.approx(per / cost, abs=slack)


@pytest.mark.parametrize("workers", [[1], pytest.param([1, 2], marks=pytest.mark.slow)], ids=["1", "1,2"])
def test_bench_scaling_reports_rates_parent_costs_and_caps_per_worker_count(tmp_path, capsys, workers):
    partial = tmp_path / "partial.json"
    assert scaling.main(["--n", "40", "--source", "24", "--size", "16", "--workers", ",".join(map(str, workers)),
                         "--epochs", "1",
                         "--epochs-per-worker", "--rounds", "1", "--machine-seconds", "0.2", "--json",
                         "--data", str(tmp_path), "--partial", str(partial)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["complete"] is True and json.loads(partial.read_text()) == result  # the last one written
    assert result["images"] == 40 and result["short_images"] == 10
    assert result["batch_size"] == 256 and result["rounds"] == 1 and result["epochs_per_worker"] is True
    assert [row["workers"] for row in result["rows"]] == workers
    for row in result["rows"]:
        assert row["stream_images"] == 40 * row["workers"]  # one epoch of the 40 rows per worker
        assert row["ingest_images_per_s"] > 0 and row["stream_images_per_s"] > 0
        assert row["ingest_parent_us_per_row"] > 0 and row["stream_parent_ms_per_batch"] > 0
        # the cap is the rate the parent's cost allows: 1 / cost
        assert_rate_of_cost(row["ingest_cap_rows_per_s"], 1e6, row["ingest_parent_us_per_row"])
        # past start-up: from a second ingest of a quarter as many (10) photos
        if row["ingest_parent_us_per_row_past_startup"] is not None:
            assert_rate_of_cost(row["ingest_cap_past_startup_rows_per_s"], 1e6,
                                row["ingest_parent_us_per_row_past_startup"])
        assert_rate_of_cost(row["stream_cap_images_per_s"], 256e3, row["stream_parent_ms_per_batch"])
        # the machine's own scaling: the same work in that many bare processes, and h5stream's share of it
        assert row["machine_decode_images_per_s"] > 0 and row["machine_augment_images_per_s"] > 0
        # the JSON rounds each of the three to 3 places (±0.0005): the quotient of the rounded two is off by at
        # most that over the divisor, for the dividend and the divisor each, plus the rounding of the result
        a, b = row["stream_x_linear"], row["machine_augment_x_linear"]
        rounding = 0.0005 * (1 + (1 + a / b) / (b - 0.0005)) + 1e-9
        assert row["stream_x_machine"] == pytest.approx(a / b, abs=rounding)
        assert "ingest_steady_images_per_s" in row  # past start-up; None where noise made the long run no slower
        # the ingest's own stages, of its run of least parent CPU: they add up to no more than that run
        stages = row["ingest_stages_ms"]
        assert list(stages) == ["find", "create", "write", "finish"]
        assert all(v["wall"] >= 0 and v["cpu"] >= 0 for v in stages.values())
        assert sum(v["cpu"] for v in stages.values()) <= 1e-3 * row["ingest_parent_us_per_row"] * 40 * 1.01 + 1
        # its wait for the disk's direct writes lies within the write and finish stages
        assert 0 <= row["ingest_disk_wait_ms"] <= stages["write"]["wall"] + stages["finish"]["wall"] + 1
    assert result["rows"][0]["ingest_x_linear"] == 1.0 and result["rows"][0]["machine_decode_x_linear"] == 1.0


def test_bench_scaling_table_has_every_column(tmp_path, capsys):
    result = {"images": 40, "source": "24x24 JPEG", "out_size": 16, "batch_size": 256, "epochs": 1, "rounds": 1,
              "cpus": 2, "targets": {"ingest_parent_us_per_row": 25.0, "stream_parent_ms_per_batch": 0.5},
              "rows": [scaling.summarise(2, [{"rows": 40, "seconds": 0.5, "parent_cpu_s": 0.002}],
                                         [{"images": 40, "batches": 1, "seconds": 0.1, "parent_cpu_s": 0.001}])]}
    text = scaling.format_table(result)
    header, line = text.splitlines()[1:3]
    for heading in ("workers", "ingest img/s", "parent us/row", "cap rows/s", "past start-up us/row", "start-up ms",
                    "stream img/s", "parent ms/batch", "cap img/s", "x linear", "machine"):
        assert heading in header
    assert line.split() == ["2", "80", "50.0", "20,000", "-", "-", "-", "-", "-", "-", "-", "400", "1.00", "256,000",
                            "-", "-"]
    assert "by stage" not in text  # runs without stages: no second table
    phases = {"find": [0.01, 0.009], "create": [0.2, 0.02], "write": [0.25, 0.03], "finish": [0.04, 0.003]}
    result["rows"] = [scaling.summarise(2, [{"rows": 40, "seconds": 0.5, "parent_cpu_s": 0.062, "phases": phases}],
                                        [{"images": 40, "batches": 1, "seconds": 0.1, "parent_cpu_s": 0.001}])]
    lines = scaling.format_table(result).splitlines()
    at = next(i for i, text_line in enumerate(lines) if "by stage" in text_line)
    assert lines[at + 1].split() == ["workers", "find", "create", "write", "finish", "disk", "wait"]
    assert lines[at + 2].split() == ["2", "10", "/", "9", "200", "/", "20", "250", "/", "30", "40", "/", "3", "-"]


def test_efficiency_is_set_against_one_worker_and_against_the_machines_own_scaling():
    rows = [dict(workers=1, ingest_images_per_s=100.0, stream_images_per_s=1000.0,
                 machine_decode_images_per_s=120.0, machine_augment_images_per_s=1100.0),
            dict(workers=4, ingest_images_per_s=320.0, stream_images_per_s=3000.0,
                 machine_decode_images_per_s=480.0, machine_augment_images_per_s=4400.0),
            dict(workers=8, ingest_images_per_s=600.0, stream_images_per_s=6000.0,
                 machine_decode_images_per_s=None, machine_augment_images_per_s=None)]
    one, four, eight = scaling.add_efficiency(rows)
    assert one["ingest_x_linear"] == 1.0 and one["ingest_x_machine"] == 1.0
    assert four["ingest_x_linear"] == pytest.approx(0.8) and four["machine_decode_x_linear"] == pytest.approx(1.0)
    assert four["stream_x_linear"] == pytest.approx(0.75) and four["stream_x_machine"] == pytest.approx(0.75)
    assert eight["stream_x_linear"] == pytest.approx(0.75) and "stream_x_machine" not in eight
    assert "ingest_x_linear" not in rows[0]  # pure: the rows given are left as they were


def test_the_cost_past_start_up_is_the_slope_between_a_long_and_a_short_ingest():
    long_runs = [{"rows": 4000, "seconds": 2.0, "parent_cpu_s": 0.19}, {"rows": 4000, "seconds": 2.0,
                                                                        "parent_cpu_s": 0.17}]
    short_runs = [{"rows": 1000, "seconds": 0.6, "parent_cpu_s": 0.08}, {"rows": 1000, "seconds": 0.6,
                                                                         "parent_cpu_s": 0.09}]
    us, ms = scaling.past_startup(long_runs, short_runs)  # least CPU of each: (0.17 - 0.08) / 3000 rows
    assert us == pytest.approx(30.0) and ms == pytest.approx(50.0)
    row = scaling.summarise(2, long_runs, [{"images": 256, "batches": 1, "seconds": 0.1, "parent_cpu_s": 0.001}],
                            short_runs)
    assert row["ingest_parent_us_per_row"] == pytest.approx(42.5)  # the whole run: start-up included
    assert row["ingest_cap_past_startup_rows_per_s"] == pytest.approx(1e6 / 30)
    assert scaling.past_startup(long_runs, []) == (None, None)
    noisy = [{"rows": 1000, "seconds": 0.6, "parent_cpu_s": 0.2}]  # the short run cost more: no slope
    assert scaling.past_startup(long_runs, noisy) == (None, None)


def test_the_steady_rate_is_the_long_ingests_extra_rows_over_its_extra_seconds():
    long_runs = [{"rows": 4000, "seconds": 2.2, "parent_cpu_s": 0.2}, {"rows": 4000, "seconds": 2.0,
                                                                        "parent_cpu_s": 0.2}]
    short_runs = [{"rows": 1000, "seconds": 0.8, "parent_cpu_s": 0.1}, {"rows": 1000, "seconds": 0.9,
                                                                        "parent_cpu_s": 0.1}]
    assert scaling.steady_rate(long_runs, short_runs) == pytest.approx(3000 / 1.2)  # fastest of each: 2.0 - 0.8
    assert scaling.steady_rate(long_runs, []) is None
    assert scaling.steady_rate(long_runs, [{"rows": 1000, "seconds": 2.5, "parent_cpu_s": 0.1}]) is None
    # Four workers decode 4x as fast but boot 0.3 s longer: the whole run looks far from linear, the steady
    # rate does not.
    stream = [{"images": 256, "batches": 1, "seconds": 0.1, "parent_cpu_s": 0.001}]
    one = scaling.summarise(1, long_runs, stream, short_runs)
    four = scaling.summarise(4, [{"rows": 4000, "seconds": 2.0 / 4 + 0.3, "parent_cpu_s": 0.2}], stream,
                             [{"rows": 1000, "seconds": 0.8 / 4 + 0.3, "parent_cpu_s": 0.1}])
    one, four = scaling.add_efficiency([one, four])
    assert one["ingest_steady_x_linear"] == 1.0
    assert four["ingest_steady_images_per_s"] == pytest.approx(4 * 3000 / 1.2)
    assert four["ingest_steady_x_linear"] == pytest.approx(1.0)
    assert four["ingest_x_linear"] == pytest.approx((4000 / 0.8) / (4 * 4000 / 2.0))  # 0.625


def test_bench_scaling_refuses_a_worker_count_below_one(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        scaling.main(["--workers", "0", "--data", str(tmp_path)])
    assert exc.value.code == 2 and "--workers" in capsys.readouterr().err


def test_a_jpeg_folder_made_by_several_processes_is_the_one_a_single_process_makes(tmp_path):
    from benchmarks.data import make_jpegs

    make_jpegs(str(tmp_path / "one"), 7, size=(24, 24), seed=3, processes=1)
    make_jpegs(str(tmp_path / "parts"), 7, size=(24, 24), seed=3, processes=2, per_part=3)
    files = sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*.jpg"))
    assert len(files) == 7
    assert files == sorted(p.relative_to(tmp_path / "parts") for p in (tmp_path / "parts").rglob("*.jpg"))
    assert all((tmp_path / "one" / f).read_bytes() == (tmp_path / "parts" / f).read_bytes() for f in files)



def test_a_run_cut_short_leaves_the_rows_of_the_worker_counts_it_measured():
    """--partial writes, after each measurement, the table of what interleave has so far: a row for each worker
    count whose ingest and stream were measured, marked incomplete."""
    from benchmarks.harness import interleave

    ingest = {"rows": 40, "seconds": 0.5, "parent_cpu_s": 0.002}
    stream = {"images": 40, "batches": 1, "seconds": 0.1, "parent_cpu_s": 0.001}
    tables = []
    with pytest.raises(KeyboardInterrupt):  # the run stops in the stream of 2 workers
        interleave({"ingest 1": lambda: ingest, "stream 1": lambda: stream, "ingest 2": lambda: ingest,
                    "stream 2": lambda: (_ for _ in ()).throw(KeyboardInterrupt)}, 2,
                   after_each=lambda rounds: tables.append(scaling.table([1, 2], by_name(rounds))))
    assert [[row["workers"] for row in t] for t in tables] == [[], [1], [1]]
    assert tables[-1][0]["ingest_images_per_s"] == 80 and tables[-1][0]["stream_images_per_s"] == 400
    result = {"images": 40, "source": "24x24 JPEG", "out_size": 16, "batch_size": 256, "epochs": 1, "rounds": 2,
              "complete": False, "cpus": 2, "rows": tables[-1],
              "targets": {"ingest_parent_us_per_row": 25.0, "stream_parent_ms_per_batch": 0.5}}
    assert "CUT SHORT" in scaling.format_table(result)
    assert "CUT SHORT" not in scaling.format_table(dict(result, complete=True))
