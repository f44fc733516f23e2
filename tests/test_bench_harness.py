"""The benchmark harness: round order, medians, same-round ratios, CPU accounting, child processes, the data cache."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks import harness

pytestmark = pytest.mark.usefixtures("no_leaks")  # some tests start child processes


def test_interleave_runs_every_measurement_once_per_round_in_order():
    calls = []
    measurements = {name: (lambda name=name: calls.append(name) or f"{name}{len(calls)}") for name in "abc"}
    rounds = harness.interleave(measurements, 3, before_round=lambda i: calls.append(f"round{i}"))
    assert calls == ["round0", "a", "b", "c", "round1", "a", "b", "c", "round2", "a", "b", "c"]
    assert rounds == [{"a": "a2", "b": "b3", "c": "c4"}, {"a": "a6", "b": "b7", "c": "c8"},
                      {"a": "a10", "b": "b11", "c": "c12"}]
    assert harness.by_name(rounds) == {"a": ["a2", "a6", "a10"], "b": ["b3", "b7", "b11"], "c": ["c4", "c8", "c12"]}


def test_interleave_leaves_out_a_measurement_that_returns_none():
    flip = iter([None, 2.0])
    rounds = harness.interleave({"x": lambda: 1.0, "maybe": lambda: next(flip)}, 2)
    assert rounds == [{"x": 1.0}, {"x": 1.0, "maybe": 2.0}]
    assert harness.by_name(rounds) == {"x": [1.0, 1.0], "maybe": [2.0]}


def test_median_ignores_missing_values():
    assert harness.median([3.0, None, 1.0, 2.0]) == 2.0
    assert harness.median([4.0, 1.0]) == 2.5
    assert harness.median([None, None]) is None
    assert harness.median([]) is None


def test_same_round_ratios_pair_figures_within_each_round():
    rounds = [{"fast": 20.0, "slow": 10.0}, {"fast": 9.0, "slow": 3.0}, {"fast": 5.0}, {"fast": 8.0, "slow": 8.0}]
    # Ratios of the best of each (20 / 10) would hide the drift; per round: 2, 3, (none), 1.
    assert harness.same_round_ratios(rounds, "fast", "slow") == {"median": 2.0, "min": 1.0, "max": 3.0}
    assert harness.same_round_ratios(rounds, "fast", "absent") is None


def test_cores_busy_counts_only_the_chosen_pids_present_in_both_readings():
    before = {1: 10.0, 2: 5.0, 3: 1.0}
    after = {1: 12.0, 2: 6.0, 4: 9.0}  # 3 exited, 4 started in between
    assert harness.cores_busy(before, after, 2.0) == pytest.approx(1.5)
    assert harness.cores_busy(before, after, 2.0, [1]) == pytest.approx(1.0)
    assert harness.cores_busy(before, after, 2.0, [3, 4]) == 0.0
    assert harness.cores_busy(before, after, 0.0) == 0.0


def test_cpu_seconds_leave_out_a_process_that_is_gone():
    proc = subprocess.Popen(["true"])
    proc.wait()
    first = harness.cpu_seconds([os.getpid(), proc.pid])
    assert list(first) == [os.getpid()]
    assert harness.cpu_seconds([os.getpid()])[os.getpid()] >= first[os.getpid()] > 0


def test_a_child_runs_a_benchmarks_function_with_the_repository_on_its_path(tmp_path):
    env = harness.child_env(H5STREAM_BENCH_PROBE="set")
    assert env["PYTHONPATH"].split(os.pathsep)[0] == harness.REPO
    assert "H5STREAM_BENCH_PROBE" not in os.environ  # the setting goes to the child only
    proc = subprocess.run(harness.child_command("benchmarks.harness:spin", 0.05), env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert 0.0 < float(proc.stdout) < 60.0


def test_child_env_keeps_a_setting_the_user_made(monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    assert harness.child_env(TF_CPP_MIN_LOG_LEVEL="3")["TF_CPP_MIN_LOG_LEVEL"] == "0"


def test_cached_dir_makes_once_and_remakes_a_half_made_folder(tmp_path):
    made = []

    def make(root):
        made.append(root)
        os.makedirs(root)
        (tmp_path / "cache" / "file").write_text("x")

    root = str(tmp_path / "cache")
    assert harness.cached_dir(root, make) == root
    assert harness.cached_dir(root, make) == root
    assert made == [root]
    os.unlink(os.path.join(root, harness.COMPLETE_MARKER))  # as if a run was killed before it finished
    harness.cached_dir(root, make)
    assert made == [root, root] and sorted(os.listdir(root)) == sorted([harness.COMPLETE_MARKER, "file"])



PIN_SCRIPT = r"""
import os, runpy, sys
if sys.argv[1] == "run":
    sys.argv = ["benchmarks.augment", "--help"]
    try:
        runpy.run_module("benchmarks.augment", run_name="__main__")
    except SystemExit:
        pass
else:
    import benchmarks.pipeline  # imports benchmarks.augment as a module
print(os.environ.get("OPENBLAS_NUM_THREADS"), "numpy" in sys.modules)
"""


@pytest.mark.parametrize("how,expected", [("run", "1 True"), ("import", "None True")])
def test_only_the_augment_program_pins_threads_and_importing_it_changes_no_environment(how, expected):
    env = {k: v for k, v in harness.child_env().items() if k != "OPENBLAS_NUM_THREADS"}
    proc = subprocess.run([sys.executable, "-c", PIN_SCRIPT, how], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[-2] == expected
