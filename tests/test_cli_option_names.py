"""Advice in the commands' one-line errors and warnings names the flag the user typed (``--memory-budget 7MiB``),
never the Python keyword (``memory_budget='7MiB'``); the Python API keeps its keywords, also after a command ran in
the same process.  The real CLI in-process, a real store."""

from __future__ import annotations

import re
import warnings

import pytest

import h5stream
from h5stream import _optnames
from h5stream.errors import BudgetError

API_NAMES = re.compile(r"\b(memory_budget|batch_size|rows_per_fill|workers=|read_unit|piece_bytes)\b")


@pytest.mark.parametrize("argv,flagged", [
    (["info", "{store}", "--shuffle-report", "--memory-budget", "20KiB"], r"raise --memory-budget to \d+MiB or more"),
    (["info", "{store}", "--shuffle-report", "--batch-size", "9", "--memory-budget", "20KiB"], "for --batch-size 9, "),
    (["info", "{store}", "--shuffle-report", "--rows-per-fill", "0"], "^h5stream: error: --rows-per-fill must be"),
    (["bench", "{store}", "--memory-budget", "20KiB", "--epochs", "1"], "raise --memory-budget to"),
    (["bench", "{store}", "--batch-size", "0", "--epochs", "1"], "--batch-size must be an integer >= 1, got 0$"),
])
def test_budget_and_option_errors_from_a_command_name_its_flags(small_class_store, h5cli, argv, flagged):
    code, _out, err = h5cli(*(a.format(store=small_class_store) for a in argv))
    assert code == 1 and err.count("\n") == 1, err
    assert re.search(flagged, err.strip()), err
    assert not API_NAMES.search(err), err


def test_the_workers_warning_of_a_command_names_the_flag(small_class_store, h5cli, monkeypatch):
    from h5stream.concurrency import cores

    monkeypatch.setattr(cores, "usable_cores", lambda: 1)  # more workers than cores on any machine
    with _optnames.cli_flags({"workers": "--workers"}), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cores.warn_if_more_workers_than_cores(3)
    assert "--workers 3 on 1 usable CPU core" in str(caught[0].message) and "--workers 1 leaves" in str(
        caught[0].message)


def test_the_python_api_keeps_its_keywords_after_a_command_ran(small_class_store, h5cli):
    assert h5cli("info", small_class_store, "--shuffle-report", "--memory-budget", "20KiB")[0] == 1
    with pytest.raises(BudgetError, match=r"raise memory_budget to '\d+MiB' or more"):
        h5stream.open(small_class_store, batch_size=32, memory_budget="20KiB")
