"""What a user reads keeps matching the code: ``help()`` of every public name states each of its parameters, every
error a docstring or doc names can be caught as ``h5stream.<Name>``, and every flag the docs show exists in the
command, benchmark or example they show it on (and every flag of every subcommand is in the README's table)."""

from __future__ import annotations

import argparse
import ast
import builtins
import functools
import glob
import inspect
import os
import re
import subprocess
import sys

import pytest

import h5stream
from h5stream import errors
from h5stream.cli import build_parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]


def _read(rel: str) -> str:
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def _public_callables() -> dict[str, object]:
    """Every public function and class of ``h5stream`` (errors aside) and the public methods of its classes."""
    found = {}
    for name in h5stream.__all__:
        obj = getattr(h5stream, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            continue
        found[name] = obj
        if isinstance(obj, type):
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and (inspect.isfunction(member) or isinstance(member, property)):
                    found[f"{name}.{attr}"] = member
    return found


def test_every_error_class_is_a_public_name():
    """A docstring that says ``raises ResourceLimitError`` is no use if ``h5stream.ResourceLimitError`` is not there."""
    classes = [obj for obj in vars(errors).values()
               if isinstance(obj, type) and issubclass(obj, errors.H5StreamError)]
    assert len(classes) > 20
    for cls in classes:
        assert getattr(h5stream, cls.__name__, None) is cls, cls.__name__
        assert cls.__name__ in h5stream.__all__, cls.__name__


def test_every_error_the_docs_and_docstrings_name_can_be_caught_by_that_name():
    texts = {name: inspect.getdoc(obj) or "" for name, obj in _public_callables().items()}
    texts.update({rel: _read(rel) for rel in DOCS})
    for where, text in texts.items():
        for name in set(re.findall(r"\b([A-Z]\w*Error)\b", text)):
            assert hasattr(h5stream, name) or hasattr(builtins, name), f"{where} names {name}, which is not public"


def _parameters(obj) -> list[str]:
    if isinstance(obj, property):
        return []
    target = obj.__init__ if isinstance(obj, type) else obj
    try:
        params = inspect.signature(obj if isinstance(obj, type) else target).parameters
    except (TypeError, ValueError):
        return []
    return [p.name for p in params.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in ("self", "cls")
            and not p.name.startswith("_")]


def test_help_of_every_public_name_states_each_of_its_parameters():
    missing = {}
    for name, obj in _public_callables().items():
        doc = inspect.getdoc(obj) or ""
        if isinstance(obj, type):
            doc += inspect.getdoc(obj.__init__) or ""
        assert doc.strip(), f"{name} has no docstring"
        absent = [p for p in _parameters(obj) if not re.search(rf"\b{re.escape(p)}\b", doc)]
        if absent:
            missing[name] = absent
    assert missing == {}


def test_help_of_the_keras_names_states_each_of_their_parameters():
    pytest.importorskip("keras")
    import h5stream.keras as hk

    for name in hk.__all__:
        obj = getattr(hk, name)
        doc = (inspect.getdoc(obj) or "") + (inspect.getdoc(obj.__init__) if isinstance(obj, type) else "")
        absent = [p for p in _parameters(obj) if p != "stream" and not re.search(rf"\b{re.escape(p)}\b", doc)]
        assert absent == [], (name, absent)


# -- flags ----------------------------------------------------------------------------------------------------------

def _subcommands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _cli_flags() -> dict[str, set[str]]:
    return {name: {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
            for name, parser in _subcommands().items()}


FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")
COMMAND = re.compile(r"(h5stream (?:ingest|info|verify|repair|bench|preview)\b|python -m benchmarks\.\w+"
                     r"|(?:examples|tools|benchmarks)/\w+\.py)")


def _commands_in(markdown: str) -> list[tuple[str, str]]:
    """``[(command, the text after it)]`` for each command in a code span or a fenced block's line; what follows
    `` -- `` is another program's."""
    fence = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
    prose = fence.sub("", markdown)
    spans = [s.replace("\n", " ") for s in re.findall(r"`([^`\n]+(?:\n[^`\n]+)?)`", prose)]
    for block in fence.findall(markdown):
        spans += block.replace("\\\n", " ").splitlines()
    found = []
    for span in spans:
        parts = COMMAND.split(span)
        found += [(parts[i], parts[i + 1].split(" -- ")[0]) for i in range(1, len(parts), 2)]
    return found


@functools.lru_cache(maxsize=None)
def _help(script: str) -> subprocess.CompletedProcess:
    """``python SCRIPT --help`` (``script`` relative to the repository), as a user runs it from the clone."""
    return subprocess.run([sys.executable, os.path.join(ROOT, script), "--help"], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)


def _script_flags(command: str) -> set[str] | None:
    """The flags a benchmark's or example's ``--help`` lists, None if it has no argparse help."""
    script = command.split()[-1].replace(".", "/") + ".py" if command.startswith("python -m") else command
    proc = _help(script)
    return set(FLAG.findall(proc.stdout)) if proc.returncode == 0 and proc.stdout.startswith("usage:") else None


def _scripts() -> list[str]:
    """Every benchmark, example and tool a user runs (those with a ``__main__`` block)."""
    found = []
    for pattern in ("benchmarks/*.py", "examples/*.py", "tools/*.py"):
        for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
            with open(path, encoding="utf-8") as f:
                if 'if __name__ == "__main__":' in f.read():
                    found.append(os.path.relpath(path, ROOT))
    return found


def test_every_script_answers_help_with_its_usage_not_a_traceback():
    scripts = _scripts()
    assert len(scripts) > 30
    for script in scripts:
        proc = _help(script)
        assert "Traceback" not in proc.stderr, (script, proc.stderr[-2000:])
        if proc.returncode == 0:
            assert proc.stdout.startswith("usage:"), (script, proc.stdout[:300])
        else:  # a part of another benchmark: one line that says how to run that one
            assert proc.stderr.startswith("run it as: python -m benchmarks."), (script, proc.stderr[-500:])


def test_every_flag_the_docs_show_exists_where_they_show_it():
    cli = _cli_flags()
    scripts: dict[str, set[str] | None] = {}
    wrong = []
    for rel in DOCS:
        for command, rest in _commands_in(_read(rel)):
            flags = set(FLAG.findall(rest))
            if not flags:
                continue
            if command.startswith("h5stream "):
                known = cli[command.split()[1]]
            else:
                if command not in scripts:
                    scripts[command] = _script_flags(command)
                known = scripts[command]
                assert known is not None, f"{rel} shows flags of {command}, which has no --help"
            wrong += [(rel, command, flag) for flag in sorted(flags - known - {"--help"})]
    assert len(scripts) > 10  # the scan found the benchmark commands
    assert wrong == []


def test_every_flag_a_scripts_docstring_shows_exists_in_that_script():
    """The usage lines at the top of each example and benchmark (``python examples/x.py --data photos/ ...``)."""
    cli = _cli_flags()
    wrong, checked = [], 0
    for script in _scripts():
        with open(os.path.join(ROOT, script), encoding="utf-8") as f:
            doc = ast.get_docstring(ast.parse(f.read())) or ""
        for line in doc.replace("\\\n", " ").splitlines():
            for command, rest in _commands_in("```\n" + line.replace("``", "") + "\n```\n"):
                flags = set(FLAG.findall(rest))
                if not flags:
                    continue
                known = cli[command.split()[1]] if command.startswith("h5stream ") else _script_flags(command)
                assert known is not None, f"{script} shows flags of {command}, which has no --help"
                checked += 1
                wrong += [(script, command, flag) for flag in sorted(flags - known)]
    assert checked > 10
    assert wrong == []


def test_the_readme_table_lists_every_flag_of_every_subcommand():
    readme = _read("README.md")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `h5stream (\w+) [^\n]*", readme, re.MULTILINE)}
    cli = _cli_flags()
    assert set(rows) == set(cli)
    for name, flags in cli.items():
        shown = set(FLAG.findall(rows[name].split("` |")[0]))
        assert sorted(flags - {"--help"} - shown) == [], name
        assert sorted(shown - flags) == [], name


def test_the_scan_finds_commands_and_keeps_other_programs_flags_apart():
    text = ("`h5stream info S --json` and\n```sh\npython -m benchmarks.stream --quick \\\n  --json\n"
            "python examples/x.py SRC -- --size 64\n```\n")
    assert _commands_in(text) == [("h5stream info", " S --json"), ("python -m benchmarks.stream", " --quick    --json"),
                                  ("examples/x.py", " SRC")]


def test_every_subcommand_flag_that_takes_a_value_names_it_and_states_its_default():
    """``--memory-budget BYTES (default 256MiB)``, not argparse's ``--memory-budget MEMORY_BUDGET`` with no default."""
    for name, parser in _subcommands().items():
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0 or action.help == argparse.SUPPRESS:
                continue
            flag = action.option_strings[-1]
            assert action.metavar or action.choices, f"h5stream {name} {flag}: no metavar"
            if action.default is not None:  # None: the flag is absent unless given, or its help says the default
                assert "default" in action.help, f"h5stream {name} {flag}"


def test_the_readme_extras_table_lists_what_each_extra_installs():
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    rows = dict(re.findall(r"^\| `\[([\w-]+)\]` \| ([^|]*) \|", _read("README.md"), re.MULTILINE))
    assert set(rows) == set(extras)
    for extra, requirements in extras.items():
        listed = set(re.findall(r"`([^`]+)`", rows[extra]))
        packages = {re.split(r"[<>=!~ ;]", r, maxsplit=1)[0] for r in requirements}
        assert packages == listed, extra


def test_verify_help_states_the_exit_statuses_the_command_returns():
    from h5stream import cli
    from h5stream.commands import verify
    from h5stream.commands.arguments import VERIFY_EXIT

    assert {verify.EXIT_DAMAGED, verify.EXIT_UNCHECKED, verify.EXIT_UNFINISHED, cli.EXIT_USAGE, cli.EXIT_ERROR, 0} \
        == set(VERIFY_EXIT)
    assert "damage" in VERIFY_EXIT[verify.EXIT_DAMAGED] and "unfinished" in VERIFY_EXIT[verify.EXIT_UNFINISHED]
    assert "no checksums" in VERIFY_EXIT[verify.EXIT_UNCHECKED] and "usage" in VERIFY_EXIT[cli.EXIT_USAGE]
    help_text = " ".join(_subcommands()["verify"].format_help().split())
    for code, what in VERIFY_EXIT.items():
        assert f"{code} {' '.join(what.split())}" in help_text


def _table_names(markdown: str, heading: str) -> set[str]:
    """The backticked names in the first column of the tables under the level-2 ``heading``."""
    section = markdown.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    names = set()
    for cell in re.findall(r"^\| ([^|]+) \|", section, re.MULTILINE):
        names |= set(re.findall(r"`(\w+)`", cell))
    return names


def test_the_design_docs_options_table_is_every_option_of_open_and_the_readmes_names_only_options():
    options = set(inspect.signature(h5stream.open).parameters) - {"path"}
    assert _table_names(_read("docs/design.md"), "Options") == options
    readme = _table_names(_read("README.md"), "Python API")
    assert readme <= options and {"memory_budget", "seed", "verify_reads"} <= readme


def test_help_of_write_names_every_option_it_takes():
    from h5stream.ingest.writeoptions import writer_option_names

    doc = inspect.getdoc(h5stream.write)
    assert [name for name in writer_option_names() if f"``{name}``" not in doc] == []


@pytest.mark.parametrize("module, names", [
    ("h5stream.adapters.tf", ["as_tf_dataset"]),
    ("h5stream.adapters.distribute", ["distributed_dataset"]),
    ("h5stream.adapters.torch", ["as_torch"]),
])
def test_help_of_the_adapters_states_each_of_their_parameters(module, names):
    pytest.importorskip("torch" if module.endswith("torch") else "tensorflow")
    import importlib

    adapters = importlib.import_module(module)
    for name in names:
        obj = getattr(adapters, name)
        doc = inspect.getdoc(obj) or ""
        absent = [p for p in _parameters(obj) if p != "stream" and not re.search(rf"\b{re.escape(p)}\b", doc)]
        assert absent == [], (name, absent)
