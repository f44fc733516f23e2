"""`h5stream bench` and `h5stream info --shuffle-report` on a tiny real class-sorted store."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from h5stream.cli import main
from h5stream.store.writer import write_arrays

ROWS, N_CLASSES, BLOCK = 2400, 10, 16
BUDGET = "8MiB"


@pytest.fixture(scope="module")
def sorted_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "sorted.h5"
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(N_CLASSES), ROWS // N_CLASSES)
    images = rng.integers(0, 256, (ROWS, 16, 16, 3), dtype=np.uint8)
    write_arrays(path, images, labels, block_rows=BLOCK, storage_order="sorted")
    return str(path)


def bench_json(capsys, *argv):
    code = main(["bench", *argv, "--json", "--memory-budget", BUDGET, "--random-seconds", "0.5"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_bench_json_has_every_figure_with_sane_values(sorted_store, capsys, tmp_path):
    plot = tmp_path / "bench.png"
    r = bench_json(capsys, sorted_store, "--epochs", "2", "--plot", str(plot))
    for key in ("samples_per_s", "peak_mem_bytes", "memory_budget_bytes"):
        assert key in r
    for key in ("sequential_samples_per_s", "random_row_samples_per_s", "single_chunk_shuffle_samples_per_s"):
        assert r["baselines"][key] > 0
    for key in ("batch_label_tvd", "batch_label_tvd_full_random", "epoch_order_tau"):
        assert key in r["shuffle"]
    assert r["memory_budget_bytes"] == 8 << 20
    assert r["rows_streamed"] == 2 * ROWS
    assert r["samples_per_s"] > 0 and r["mb_per_s"] > 0
    assert r["order_matches_yield"] is True  # the labels yielded are those of epoch_order(0)
    # The stream allocates its buffers, so memory rises, and stays within the budget (measured against the budget
    # in a fresh process, for workers and augmentation too, by test_memory_budget.py).
    assert r["peak_mem_bytes"] > 0 and r["mem_samples"] >= 2
    assert r["within_budget"] is True and r["peak_mem_bytes"] <= r["memory_budget_bytes"]
    assert r["plan"]["budget_bytes"] == 8 << 20
    s = r["shuffle"]
    # The file is class-sorted: in file order a batch is one class; the stream must mix far better.
    assert s["batch_label_tvd_file_order"] > 0.85
    assert s["batch_label_tvd"] < 0.5 * s["batch_label_tvd_file_order"]
    assert abs(s["batch_label_tvd_full_random"] - s["batch_label_tvd_expected_random"]) < 0.03
    assert -1.0 <= s["epoch_order_tau"] <= 1.0 and len(s["epoch_order_tau_pairs"]) >= 2
    assert "consumer" in r["mean_cpu_pct"]
    assert plot.stat().st_size > 0 and r["plot"] == str(plot)
    # Start-up, epoch 1 and epochs 2+ apart; the verdict compares the steady rate with the baselines.
    assert 0 < r["startup_s"] <= r["first_batch_s"] <= r["first_epoch_s"] and len(r["epoch_seconds"]) == 2
    assert r["first_epoch_samples_per_s"] == pytest.approx(ROWS / r["first_epoch_s"])
    assert r["compare_basis"] == "epochs 2+"
    assert r["compare_samples_per_s"] == r["steady_samples_per_s"] > 0
    assert r["ratios"]["vs_random_row"] == pytest.approx(
        r["steady_samples_per_s"] / r["baselines"]["random_row_samples_per_s"])


INSTALLED_BENCH = """
import json, sys
sys.modules["benchmarks"] = None  # what an installed h5stream has: benchmarks/ is a folder of the clone only
from h5stream import cli
sys.exit(cli.main(["bench", sys.argv[1], "--json", "--cold", "--memory-budget", "8MiB", "--random-seconds", "0.2"]))
"""


def test_bench_runs_with_the_installed_package_alone(sorted_store, tmp_path):
    """`h5stream bench` is a command of the installed package: it measures (memory from the monitor process, --cold
    from the evictor) with nothing from the clone's benchmarks/, from any folder."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)  # the package only; the folder it runs in is elsewhere
    done = subprocess.run([sys.executable, "-c", INSTALLED_BENCH, sorted_store], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout)
    assert r["cold"] is True and r["mem_samples"] >= 2 and r["peak_mem_bytes"] > 0
    assert r["baselines"]["sequential_samples_per_s"] > 0


def test_epoch_rates_keep_start_up_out_of_the_comparison():
    from h5stream.measure.passes import epoch_rates

    r = epoch_rates(100, 1000, [2.0, 3.0, 4.0], open_s=1.0, first_batch_s=1.5)
    assert (r["startup_s"], r["first_batch_s"], r["first_epoch_s"]) == (1.0, 1.5, 2.0)
    assert r["first_epoch_samples_per_s"] == 50 and r["first_epoch_after_open_samples_per_s"] == 100
    assert r["steady_samples_per_s"] == 100 and r["steady_mb_per_s"] == pytest.approx(0.1)
    assert (r["compare_samples_per_s"], r["compare_basis"]) == (100, "epochs 2+")
    one = epoch_rates(100, 1000, [2.0], open_s=1.5, first_batch_s=1.8)
    assert one["steady_samples_per_s"] is None
    assert (one["compare_samples_per_s"], one["compare_basis"]) == (200, "epoch 1 after open()")


def test_bench_cold_and_table(sorted_store, capsys):
    code = main(["bench", sorted_store, "--cold", "--memory-budget", BUDGET, "--random-seconds", "0.5"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "cold page cache" in out
    for row in ("h5stream stream, epoch 1 after open()", "h5stream stream, epoch 1 ", "start-up included",
                "h5py sequential read_direct", "single contiguous chunk shuffle", "h5py one row per call, random",
                "stream is = the stream's rate over epoch 1 after open()", "batch label TVD", "Kendall tau",
                "epoch 1 is the stream's slowest: each block is read for the first time and,",
                "`--epochs 3` compares the steady state"):
        assert row in out


def test_bench_says_where_the_plot_went_and_what_epochs_2_and_later_are(sorted_store, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "b.png"
    code = main(["bench", sorted_store, "--epochs", "2", "--memory-budget", BUDGET, "--random-seconds", "0.5",
                 "--plot", str(plot)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.rstrip().splitlines()[-1] == f"plot written to {plot}" and plot.stat().st_size > 0
    assert "h5stream stream, epochs 2+" in out and "epoch 1 is the stream's slowest" not in out


def test_bench_random_rows_are_capped_and_extrapolated(sorted_store):
    from h5stream.measure.passes import measure_random_rows
    from h5stream.store.meta import read_meta

    meta = read_meta(sorted_store)
    r = measure_random_rows(meta, seed=0, seconds=1e-9, cold=False, progress=False)
    assert r["random_row_rows_measured"] < ROWS and r["random_row_extrapolated"] is True
    assert r["random_row_epoch_s_estimated"] == pytest.approx(ROWS / r["random_row_samples_per_s"])


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "0"], "--epochs"),
    (["--memory-budget", "lots"], "memory budget"),
    (["--augment", "{not json"], "--augment"),
])
def test_bench_bad_arguments_are_one_line_errors(sorted_store, capsys, argv, message):
    assert main(["bench", sorted_store, *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("h5stream: error:") and message in err and err.count("\n") == 1


def test_bench_missing_file(tmp_path, capsys):
    assert main(["bench", str(tmp_path / "nope.h5")]) == 1
    assert "no such file" in capsys.readouterr().err


def test_file_shuffle_report_on_sorted_store(sorted_store):
    from h5stream.commands._common import file_shuffle_report

    r = file_shuffle_report(sorted_store, memory_budget=BUDGET, batch_size=32, seed=0)
    assert r["rows"] == ROWS and r["n_classes"] == N_CLASSES
    assert r["batch_label_tvd"] < 0.5 * r["batch_label_tvd_file_order"]
    assert r["plan"]["budget_bytes"] == 8 << 20 and "budget" in r["plan_text"]
    # The smallest budget the plan allows buys a smaller shuffle buffer than 8 MiB does.
    small = file_shuffle_report(sorted_store, memory_budget=r["plan"]["min_budget_bytes"], batch_size=32, seed=0)
    assert small["plan"]["rows_per_fill"] < r["plan"]["rows_per_fill"]


@pytest.mark.parametrize("workers", [0, 2])
def test_the_shuffle_report_plans_what_a_stream_of_the_same_options_runs(sorted_store, workers):
    """The report's plan (fill, unit, every share of the budget) is the plan of ``h5stream.open`` with the same
    budget, batch size and workers and its defaults (read checks "once" took a share the report left out)."""
    import h5stream
    from h5stream.commands._common import file_shuffle_report

    budget = "160MiB" if workers else BUDGET
    r = file_shuffle_report(sorted_store, memory_budget=budget, batch_size=32, seed=0, workers=workers)
    augment = h5stream.Augment(horizontal_flip=True) if workers else None
    with h5stream.open(sorted_store, memory_budget=budget, batch_size=32, seed=0, workers=workers,
                       augment=augment) as s:
        assert r["plan"] == s.plan.as_dict()


def test_bench_file_generator_writes_a_class_sorted_store(tmp_path):
    from benchmarks.data import make_bench_file, rows_for_gb

    out = str(tmp_path / "gen.h5")
    make_bench_file(out, rows=500, size=32, n_classes=5, progress=False)
    from h5stream.store.meta import read_meta
    import h5py

    meta = read_meta(out)
    assert meta.rows == 500 and meta.image_shape == (32, 32, 3) and meta.storage_order == "sorted"
    with h5py.File(out) as f:
        labels, images = f["labels"][:], f["images"][:]
    assert np.all(np.diff(labels) >= 0) and np.array_equal(np.bincount(labels), np.full(5, 100))
    assert images.std() > 10  # not constant
    assert rows_for_gb(1.0, 128, 3) * 128 * 128 * 3 >= 1e9


def test_info_shuffle_report_text_and_json(sorted_store, capsys):
    assert main(["info", sorted_store, "--shuffle-report", "--memory-budget", BUDGET]) == 0
    out = capsys.readouterr().out
    assert "shuffle report" in out and "batch label TVD" in out and "epoch tau" in out
    assert main(["info", sorted_store, "--shuffle-report", "--memory-budget", BUDGET, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["shuffle_report"]
    assert report["memory_budget_bytes"] == 8 << 20
    assert report["batch_label_tvd"] < report["batch_label_tvd_file_order"]
    assert main(["info", sorted_store, "--json"]) == 0
    assert "shuffle_report" not in json.loads(capsys.readouterr().out)  # only when asked for


def test_info_shuffle_report_bad_budget(sorted_store, capsys):
    assert main(["info", sorted_store, "--shuffle-report", "--memory-budget", "1KiB"]) == 1
    assert "minimum" in capsys.readouterr().err


def test_info_shuffle_report_plans_for_workers_and_a_pinned_window(sorted_store, capsys):
    import h5stream
    from h5stream.streaming.planning import plan_stream
    from h5stream.store.meta import read_meta

    meta = read_meta(sorted_store)  # the report plans augmenting workers (their transform's library counted)
    tight = str(plan_stream(meta, 1 << 40, 32, workers=2, augment=h5stream.Augment()).min_budget_bytes + (1 << 20))

    def report(*extra):
        assert main(["info", sorted_store, "--shuffle-report", "--memory-budget", tight, "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)["shuffle_report"]

    alone, pooled = report(), report("--workers", "2")
    assert pooled["workers"] == 2 and pooled["plan"]["rows_per_fill"] < alone["plan"]["rows_per_fill"]
    pinned = report("--rows-per-fill", str(pooled["plan"]["rows_per_fill"]))
    assert pinned["plan"]["rows_per_fill"] == pooled["plan"]["rows_per_fill"]
    assert pinned["batch_label_tvd"] == pooled["batch_label_tvd"]
    assert pinned["epoch_order_tau"] == pooled["epoch_order_tau"]
    assert main(["info", sorted_store, "--shuffle-report", "--memory-budget", tight, "--workers", "2",
                 "--rows-per-fill", str(alone["plan"]["rows_per_fill"])]) == 1
    err = capsys.readouterr().err.strip()
    assert "--rows-per-fill" in err and "raise --memory-budget" in err and "rows_per_fill" not in err
    assert "holds at most" in err and len(err.splitlines()) == 1


def test_info_shuffle_report_takes_a_read_unit(sorted_store, capsys):
    def report(*extra):
        assert main(["info", sorted_store, "--shuffle-report", "--memory-budget", BUDGET, "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)["shuffle_report"]

    whole, quarter = report(), report("--read-unit", "3KiB")  # 768-byte rows in blocks of 16: 16 rows, then 4
    assert (whole["plan"]["unit_rows"], quarter["plan"]["unit_rows"]) == (BLOCK, 4)
    assert quarter["epoch_order_tau"] != whole["epoch_order_tau"]
    assert main(["info", sorted_store, "--shuffle-report", "--read-unit", "lots"]) == 1
    err = capsys.readouterr().err.strip()
    assert "read_unit" in err and len(err.splitlines()) == 1


def test_bench_takes_any_seed_the_stream_takes(small_class_store, capsys):
    """--seed -1 (h5stream.open takes any integer) was a numpy ValueError traceback after the stream's pass."""
    assert main(["bench", small_class_store, "--seed", "-1", "--json", "--random-seconds", "0.2"]) == 0
    assert json.loads(capsys.readouterr().out)["seed"] == -1


@pytest.mark.parametrize("plot", ["fig", "fig.xyz", "folder"])
def test_a_plot_name_matplotlib_cannot_honour_is_refused_before_measuring(small_class_store, capsys, tmp_path, plot):
    """matplotlib adds '.png' to a name without an extension (the command said the plot went to 'fig', it went to
    'fig.png'; a folder 'folder' got 'folder.png') and refuses an unknown extension with a ValueError traceback
    only after the whole run."""
    pytest.importorskip("matplotlib")
    (tmp_path / "folder").mkdir()
    before = sorted(os.listdir(tmp_path))
    code = main(["bench", small_class_store, "--no-baselines", "--plot", str(tmp_path / plot)])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and err.startswith(f"h5stream: error: --plot {tmp_path / plot}: "), err
    assert sorted(os.listdir(tmp_path)) == before


def test_random_seconds_nan_is_refused(small_class_store, capsys):
    assert main(["bench", small_class_store, "--random-seconds", "nan"]) == 1
    assert "--random-seconds must be > 0" in capsys.readouterr().err


def test_a_plot_that_cannot_be_written_is_one_line_and_leaves_the_old_file(small_class_store, tmp_path):
    """RLIMIT_FSIZE (as a full disk) while matplotlib writes: was its OSError traceback after the whole run."""
    import resource

    pytest.importorskip("matplotlib")
    plot = tmp_path / "b.png"
    plot.write_bytes(b"the previous plot")

    def cap():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    child = subprocess.run([sys.executable, "-m", "h5stream", "bench", small_class_store, "--no-baselines", "--plot",
                            str(plot)], capture_output=True, text=True, preexec_fn=cap, timeout=300)
    assert child.returncode == 1, child.stderr
    assert child.stderr.splitlines()[-1].startswith(f"h5stream: error: --plot {plot}: cannot write it ")
    assert "Traceback" not in child.stderr
    assert plot.read_bytes() == b"the previous plot" and sorted(p.name for p in tmp_path.iterdir()) == ["b.png"]
