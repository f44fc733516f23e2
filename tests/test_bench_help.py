"""Every benchmark's ``--help`` states the default of each option that has one (``--rounds N (default: 5)``, not
argparse's bare ``--rounds ROUNDS``), on the real parser each ``main`` builds, read back from the help text a user
sees."""

from __future__ import annotations

import argparse
import glob
import importlib
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Parsed(Exception):
    """Raised in place of parsing: carries the parser a benchmark's ``main`` built."""

    def __init__(self, parser):
        super().__init__()
        self.parser = parser


def _benchmark_parsers(monkeypatch) -> dict[str, argparse.ArgumentParser]:
    """``{module: the parser its main() builds}`` for every benchmark whose ``main`` parses with argparse (the
    children run by a peer's venv take fixed positional arguments and have none)."""
    def capture(self, *args, **kwargs):
        raise _Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    parsers = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.py"))):
        name = "benchmarks." + os.path.basename(path)[:-3]
        main = getattr(importlib.import_module(name), "main", None)
        if main is None:
            continue
        try:
            main(["--help"])
        except _Parsed as got:
            parsers[name] = got.parser
        except SystemExit:  # prints its own usage line: no argparse
            pass
    return parsers


def _option_help(help_text: str, flag: str) -> str:
    """The help text of the option whose invocation starts with ``flag``, its lines joined."""
    lines = help_text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("  ") and (line.split()[0].rstrip(",") == flag):
            block = [line]
            for rest in lines[i + 1:]:
                if not rest.startswith("   ") or rest.lstrip().startswith("-"):
                    break
                block.append(rest)
            return " ".join(" ".join(block).split())
    raise AssertionError(f"{flag} is not in the help:\n{help_text}")


def _expected(default) -> str:
    """A default as typed on the command line: ``20`` for 20.0, a list's values separated by spaces."""
    def one(value):
        return f"{value:g}" if isinstance(value, float) else str(value)

    if isinstance(default, (list, tuple)):
        return " ".join(one(v) for v in default) or "none"
    return one(default) or "none"


def test_every_benchmark_help_states_the_default_of_each_option_that_has_one(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: nothing wraps inside a default
    parsers = _benchmark_parsers(monkeypatch)
    assert len(parsers) > 25 and "benchmarks.stream" in parsers and "benchmarks.remote" in parsers
    missing, checked = [], 0
    for name, parser in parsers.items():
        help_text = parser.format_help()
        for action in parser._actions:
            if (not action.option_strings or action.nargs == 0 or action.default is None
                    or action.default is argparse.SUPPRESS):
                continue
            shown = _option_help(help_text, action.option_strings[0])
            checked += 1
            if f"(default: {_expected(action.default)})" in shown:
                continue
            # A default computed at run time (0 or "" standing for "h5stream's own", "all") is worded by the help.
            if not action.default and "default" in (action.help or ""):
                continue
            missing.append(f"{name} {action.option_strings[0]}={action.default!r}: {shown}")
    assert checked > 100
    assert missing == [], "\n".join(missing)


def test_the_help_keeps_the_descriptions_line_breaks(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    parser = _benchmark_parsers(monkeypatch)["benchmarks.scaling"]
    assert parser.description.count("\n") >= 1
    assert parser.description.splitlines()[1] in parser.format_help()


@pytest.mark.parametrize("default, shown", [(20.0, "20"), (0.25, "0.25"), ([1.1, 10.0], "1.1 10"), ([], "none"),
                                            ("256MiB", "256MiB"), (3, "3")])
def test_a_default_is_shown_as_it_is_typed(default, shown):
    from benchmarks.harness import HelpFormatter

    parser = argparse.ArgumentParser(prog="x", formatter_class=HelpFormatter)
    parser.add_argument("--opt", default=default, help="what it is")
    assert f"what it is (default: {shown})" in " ".join(parser.format_help().split())
