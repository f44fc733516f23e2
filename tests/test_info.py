"""`h5stream info`: text and --json describe the store; errors are one line."""

from __future__ import annotations

import json

import pytest

from h5stream.store.writer import write_arrays

from conftest import CLASS_NAMES, PER_CLASS, REG_N

JSON_KEYS = {"rows", "image_shape", "dtype", "label_kind", "classes", "block_rows", "file_bytes", "order"}


@pytest.fixture(scope="module")
def class_store(class_src, tmp_path_factory):
    from h5stream import cli

    out = tmp_path_factory.mktemp("info") / "c.h5"
    assert cli.main(["ingest", class_src[0], str(out), "--size", "12x10", "--workers", "0", "--block-rows", "4"]) == 0
    return out


def test_json_has_the_documented_keys_and_true_counts(class_store, h5cli):
    code, stdout, _ = h5cli("info", class_store, "--json")
    assert code == 0
    info = json.loads(stdout)
    assert JSON_KEYS <= set(info)
    assert info["rows"] == sum(PER_CLASS) and info["image_shape"] == [12, 10, 3] and info["dtype"] == "uint8"
    assert info["label_kind"] == "class" and info["classes"] == dict(zip(CLASS_NAMES, PER_CLASS))
    assert list(info["classes"]) == list(CLASS_NAMES)  # in label order
    assert info["block_rows"] == 4 and info["chunk_shape"] == [4, 12, 10, 3]
    assert info["order"] == "shuffled" and info["order_seed"] == 0 and info["compression"] is None
    assert info["file_bytes"] == class_store.stat().st_size and info["skipped_files"] == 0


def test_text_lists_classes_with_counts(class_store, h5cli):
    code, stdout, _ = h5cli("info", class_store)
    assert code == 0
    assert f"rows            {sum(PER_CLASS)}" in stdout and "12x10x3 uint8" in stdout
    rows = [line.split() for line in stdout.splitlines()]
    for index, (name, count) in enumerate(zip(CLASS_NAMES, PER_CLASS)):
        assert [str(index), name, str(count)] in rows
    assert "storage order   shuffled (seed 0)" in stdout and "block rows      4" in stdout


def test_regression_store(regression_src, tmp_path, h5cli):
    root, csv_path, _ = regression_src
    out = tmp_path / "r.h5"
    code = h5cli("ingest", root, out, "--labels", csv_path, "--size", "8", "--order", "sorted", "--workers", "0")[0]
    assert code == 0
    info = json.loads(h5cli("info", out, "--json")[1])
    assert info["rows"] == REG_N and info["label_kind"] == "regression" and info["classes"] is None
    assert info["label_shape"] == [2] and info["label_columns"] == ["t0", "t1"] and info["order"] == "sorted"


def test_store_written_from_arrays(tmp_path, h5cli):
    import numpy as np

    out = tmp_path / "w.h5"
    write_arrays(out, np.zeros((7, 2, 3, 1), np.uint8), np.array([0, 1, 1, 2, 2, 2, 0]), class_names=["a", "b", "c"])
    info = json.loads(h5cli("info", out, "--json")[1])
    assert info["classes"] == {"a": 2, "b": 2, "c": 3} and info["image_shape"] == [2, 3, 1]


@pytest.mark.parametrize("kind", ["missing", "not hdf5"])
def test_errors_are_one_line(tmp_path, h5cli, kind):
    path = tmp_path / "x.h5"
    if kind == "not hdf5":
        path.write_text("hello")
    code, stdout, err = h5cli("info", path)
    assert code == 1 and stdout == "" and err.count("\n") == 1 and err.startswith("h5stream: error: ")


@pytest.mark.parametrize("compression,reported", [("zlib", "gzip"), ("blosc", "blosc")])
def test_compression_is_reported_even_for_plugin_filters(class_src, tmp_path, h5cli, compression, reported):
    out = tmp_path / f"{compression}.h5"
    assert h5cli("ingest", class_src[0], out, "--size", "8", "--compression", compression, "--workers", "0")[0] == 0
    assert json.loads(h5cli("info", out, "--json")[1])["compression"] == reported


def test_an_encoded_store_is_described_by_its_jpeg_bytes_not_its_empty_images_array(class_src, tmp_path, h5cli):
    """/images of a JPEG store holds no rows: the text speaks of /image_bytes' chunks and of JPEG bytes."""
    out = tmp_path / "j.h5"
    assert h5cli("ingest", class_src[0], out, "--size", "12x10", "--workers", "0", "--block-rows", "4",
                 "--encoding", "jpeg")[0] == 0
    code, stdout, _ = h5cli("info", out)
    assert code == 0
    assert "block rows      4 (JPEG bytes in chunks of 1.0 MiB)" in stdout
    assert "of which      JPEG bytes " in stdout and "a chunk whole: 1.0 MiB of JPEG bytes" in stdout
    assert "image rows" not in stdout and "pixels" not in stdout
    info = json.loads(h5cli("info", out, "--json")[1])
    assert info["encoded_chunk_bytes"] == 1 << 20 and info["encoding"] == "jpeg"


@pytest.mark.parametrize("seed", [-1, 2 ** 64 + 5])
def test_shuffle_figures_take_any_seed_the_stream_takes(small_class_store, h5cli, seed):
    """h5stream.open takes any integer seed; the shuffle report's reference orders (full random, single chunk)
    did not: --seed -1 was a numpy ValueError traceback."""
    code, out, err = h5cli("info", small_class_store, "--shuffle-report", "--json", "--seed", str(seed))
    assert code == 0, err
    assert json.loads(out)["shuffle_report"]["seed"] == seed


@pytest.mark.parametrize("argv, helps", [(["info", "S", "--bogus"], "h5stream info --help"),
                                         (["verify", "S", "--shuffle-report"], "h5stream verify --help"),
                                         (["--bogus"], "h5stream --help")])
def test_an_unknown_flag_points_at_the_help_of_its_command(small_class_store, h5cli, argv, helps):
    """argparse reported a subcommand's unknown flag from the top parser: '(see h5stream --help)', which does not
    list the command's flags."""
    code, out, err = h5cli(*[small_class_store if a == "S" else a for a in argv])
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("h5stream: error: unrecognized arguments: ") and err.rstrip().endswith(f"(see {helps})")


def test_the_shuffle_report_of_an_empty_store_says_the_store_is_empty(tmp_path, h5cli):
    """It said 'n_rows must be a positive integer, got 0' (the quality module's argument), naming no file."""
    import numpy as np

    path = tmp_path / "empty.h5"
    write_arrays(path, np.zeros((0, 4, 4, 3), np.uint8), np.zeros(0, np.int64), class_names=["a"], block_rows=4)
    code, _out, err = h5cli("info", path, "--shuffle-report")
    assert code == 1 and err.count("\n") == 1
    assert err.startswith(f"h5stream: error: {path}: the store has no committed rows"), err


@pytest.mark.parametrize("command", [["info", "--json"], ["info"], ["verify"]])
def test_output_to_a_full_disk_is_one_line_and_exit_1(small_class_store, command):
    """`h5stream info S --json > out.json` on a full disk (here /dev/full) was an OSError traceback from the final
    flush of stdout."""
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "h5stream", command[0], small_class_store, *command[1:]],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr == ("h5stream: error: cannot write the output to stdout (No space left on device); free space "
                           "where it goes, or send it elsewhere\n")


def test_no_command_is_one_usage_line(h5cli):
    """It read 'h5stream: error: h5stream: choose a command: ...' (the prefix twice)."""
    code, out, err = h5cli()
    assert code == 2 and out == ""
    assert err == ("h5stream: error: choose a command: ingest, info, bench, preview, verify, repair "
                   "(see h5stream --help)\n")


def test_shuffle_report_flags_without_the_report_are_refused(small_class_store, h5cli):
    """`info S --memory-budget 1GiB` printed the plain description, as if the budget had been taken into account."""
    code, out, err = h5cli("info", small_class_store, "--memory-budget", "1GiB", "--seed", "3")
    assert code == 1 and out == ""
    assert err == ("h5stream: error: --memory-budget, --seed only shape the shuffle report; add --shuffle-report (or "
                   "leave them out)\n")
    assert h5cli("info", small_class_store, "--memory-budget", "1GiB", "--shuffle-report")[0] == 0
