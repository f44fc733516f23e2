"""What the benchmark suites share: rounds, statistics, CPU accounting, the page cache, data, child processes, output.

* Rounds -- :func:`interleave` runs every measurement once per round, in a
  fixed order, so each one sees the same drift of a shared machine and ratios
  taken within a round hold even when absolute figures move; :func:`by_name`
  regroups the rounds per measurement.
* Statistics -- :func:`median` (``None`` values ignored) and
  :func:`same_round_ratios` (a ratio per round, then its median and range).
* CPU -- :func:`cpu_seconds` of live processes and :func:`cores_busy` between
  two readings (a process and its workers), :func:`self_and_children_cpu_s`
  (this process plus its waited-for children), :func:`probe_cores` (how much
  CPU a run can get right now).
* Page cache -- :func:`warm` (one sequential read), :func:`evict_folder`, and
  :func:`kept_cold` (the file kept out of the cache, as ``h5stream bench --cold``);
  the mechanisms are :mod:`h5stream.measure`'s.
* Data -- :data:`DATA_DIR` (``bench-data/`` at the repository root, git-ignored)
  and :func:`cached_dir` (a generated folder, made once).
* Child processes -- :func:`child_command` runs a function of a ``benchmarks``
  module in a fresh interpreter; :func:`child_env` is the environment it gets
  (the repository root on ``PYTHONPATH``, plus the settings that child needs),
  so no benchmark changes its own ``os.environ`` for a child.
* Command line -- :func:`new_parser` (every benchmark's parser: ``--help``
  keeps the description's line breaks and states each option's default,
  :class:`HelpFormatter`), :func:`add_json_option`, :func:`add_data_option`,
  :func:`run_cli`.
* Output -- :func:`emit` (a table or one JSON object on stdout) and
  :func:`log` (progress on stderr).

Importing this module imports only the standard library; h5stream and psutil
load in the functions that need them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The repository root: the ``benchmarks`` package's parent."""

DATA_DIR = os.path.join(REPO, "bench-data")
"""Default cache for generated images and stores (git-ignored)."""

EVICT_INTERVAL_S = 0.25
"""Period of :func:`kept_cold`'s evictions, as ``h5stream bench --cold``."""


# -- rounds -------------------------------------------------------------------------------
def interleave(measurements: Mapping[str, Callable[[], Any]], rounds: int, *,
               before_round: Callable[[int], None] | None = None, progress: bool = False,
               after_each: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Call every measurement once per round, in the mapping's order, for ``rounds`` rounds.

    ``before_round(i)``, if given, runs at the start of round ``i`` (another
    measurement sampled in the same rounds).  With ``progress``, each call is
    logged to stderr first.  ``after_each(rounds_so_far)``, if given, runs
    after every measurement with the results so far, the round under way
    included (for a run cut short to leave what it measured).  Returns one
    dict per round, name -> result; a measurement that returns ``None`` (a
    baseline that is not available) is left out of that round.
    """
    out: list[dict[str, Any]] = []
    for i in range(rounds):
        if before_round is not None:
            before_round(i)
        results: dict[str, Any] = {}
        out.append(results)
        for name, measure in measurements.items():
            if progress:
                log(f"  round {i + 1}/{rounds}: {name}")
            value = measure()
            if value is not None:
                results[name] = value
            if after_each is not None:
                after_each(out)
    return out


def write_json(path: str, obj) -> None:
    """``obj`` as JSON in ``path``, replaced whole (a reader never sees half a file)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=2)
    os.replace(tmp, path)


def by_name(rounds: Iterable[Mapping[str, Any]]) -> dict[str, list]:
    """name -> its results in round order, from :func:`interleave`'s rounds (first-seen name order)."""
    out: dict[str, list] = {}
    for results in rounds:
        for name, value in results.items():
            out.setdefault(name, []).append(value)
    return out


# -- statistics ---------------------------------------------------------------------------
def median(values: Iterable[float | None]) -> float | None:
    """Median of the values that are not ``None``; ``None`` if there are none."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def same_round_ratios(rounds: Iterable[Mapping[str, float]], numerator: str, denominator: str) -> dict | None:
    """``numerator / denominator`` within each round that has both: ``{"median", "min", "max"}``, or ``None``.

    Two figures taken minutes apart on a shared machine can differ by its
    drift; a pair taken in the same round says more than two bests taken at
    different times.
    """
    ratios = [r[numerator] / r[denominator] for r in rounds if numerator in r and denominator in r]
    if not ratios:
        return None
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


# -- CPU ----------------------------------------------------------------------------------
def cpu_seconds(pids: Iterable[int]) -> dict[int, float]:
    """User + system CPU seconds of each live pid (those gone are left out)."""
    import psutil

    out = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return out


def cores_busy(before: Mapping[int, float], after: Mapping[int, float], seconds: float,
               pids: Iterable[int] | None = None) -> float:
    """Cores kept busy over ``seconds``: CPU seconds used between two :func:`cpu_seconds` readings / wall seconds.

    Counts ``pids`` (default: every pid of ``after``) that appear in both readings.
    """
    if seconds <= 0:
        return 0.0
    chosen = after if pids is None else pids
    return sum(after[p] - before[p] for p in chosen if p in before and p in after) / seconds


def self_and_children_cpu_s() -> float:
    """CPU seconds of this process plus its waited-for children (a finished pool's workers included)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def probe_cores(seconds: float = 0.5, procs: int = 2) -> float:
    """CPU cores this run can get right now: ``procs`` spinning processes' CPU seconds / wall seconds.

    On a machine shared with other users this is below the core count; every
    figure measured next to a low probe is measured with less CPU.
    """
    running = [subprocess.Popen(child_command("benchmarks.harness:spin", seconds), env=child_env(),
                                stdout=subprocess.PIPE, text=True) for _ in range(procs)]
    return sum(float(p.communicate()[0]) for p in running) / seconds


def spin(argv: list[str]) -> int:
    """Child of :func:`probe_cores`: spin for ``argv[0]`` seconds, print the CPU seconds it got."""
    seconds = float(argv[0])
    t0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        pass
    print(time.process_time() - c0)
    return 0


def available_cores() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


# -- page cache ---------------------------------------------------------------------------
def warm(path: str, block: int = 64 << 20) -> None:
    """Read the whole file once so the next pass is served from the page cache."""
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(block)
        while f.readinto(buf):
            pass


def evict_folder(folder: str) -> None:
    """Drop every file under ``folder`` from the page cache (cold reads)."""
    from h5stream.measure import evict_from_page_cache

    for root, _, files in os.walk(folder):
        for name in files:
            evict_from_page_cache(os.path.join(root, name))


def kept_cold(path: str, cold: bool = True):
    """A context that keeps ``path`` out of the page cache while it is open (a null context unless ``cold``).

    Entering gives the :class:`~h5stream.measure.PeriodicEvictor` (``None`` when not cold).
    """
    from h5stream.measure import PeriodicEvictor

    return PeriodicEvictor(path, EVICT_INTERVAL_S) if cold else contextlib.nullcontext()


# -- data ---------------------------------------------------------------------------------
COMPLETE_MARKER = ".complete"


def cached_dir(root: str, make: Callable[[str], object]) -> str:
    """``root``, made by ``make(root)`` unless a previous call finished it; returns ``root``.

    A marker file is written after ``make`` returns, so a folder left half-made
    by a killed run is made again.
    """
    marker = os.path.join(root, COMPLETE_MARKER)
    if not os.path.exists(marker):
        shutil.rmtree(root, ignore_errors=True)
        t0 = time.perf_counter()
        make(root)
        with open(marker, "w") as fh:
            fh.write("ok\n")
        log(f"generated {root} in {time.perf_counter() - t0:.1f} s")
    return root


# -- child processes ----------------------------------------------------------------------
def child_command(entry: str, *args: object) -> list[str]:
    """argv that runs ``entry`` (``"benchmarks.module:function"``) in a fresh interpreter.

    The function gets the remaining arguments as strings (``function(argv)``)
    and its return value is the exit status.  Run it with :func:`child_env`.
    """
    module, _, function = entry.partition(":")
    code = f"import sys; from {module} import {function}; sys.exit({function}(sys.argv[1:]))"
    return [sys.executable, "-c", code, *map(str, args)]


def child_env(**settings: str) -> dict[str, str]:
    """This process's environment plus the repository root on ``PYTHONPATH`` and ``settings`` for a child.

    ``settings`` are defaults: a value the user already set stays.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    for key, value in settings.items():
        env.setdefault(key, value)
    return env


# -- output -------------------------------------------------------------------------------
# -- command line ------------------------------------------------------------------------------
def shown_default(action: argparse.Action) -> str | None:
    """How ``--help`` writes ``action``'s default, or None where it has none to state: a positional, a flag that
    takes no value (``store_true``), a default of None (the option is absent unless given), or a help text that
    words the default itself (a default computed at run time: ``0: a free port``)."""
    default = action.default
    if (not action.option_strings or action.nargs == 0 or default is None or default is argparse.SUPPRESS
            or "default" in (action.help or "")):
        return None
    if isinstance(default, (list, tuple)):
        return " ".join(shown_default_value(v) for v in default) or "none"
    return shown_default_value(default) or "none"


def shown_default_value(value) -> str:
    """One value as it is typed on the command line: ``20`` for 20.0, ``0.25``, ``256MiB``."""
    return f"{value:g}" if isinstance(value, float) else str(value)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` of the benchmarks: the description's own line breaks (a docstring's paragraph, already wrapped),
    and the help of every option that has a default ends ``(default: VALUE)``.  An option with no help text gets
    no line at all from argparse, so every option of a benchmark has one."""

    def _get_help_string(self, action):
        text = action.help or ""
        shown = shown_default(action)
        if shown is None:
            return text
        return (text + " " if text else "") + "(default: " + shown.replace("%", "%%") + ")"


def new_parser(description: str, *, prog: str | None = None) -> argparse.ArgumentParser:
    """The parser of a benchmark's ``main``: :class:`HelpFormatter`, so ``--help`` states every default."""
    return argparse.ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter)


def add_json_option(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def add_data_option(parser, *aliases: str) -> None:
    parser.add_argument("--data", *aliases, dest="data", default=DATA_DIR,
                        help="cache for the generated data (bench-data/ at the repository root is git-ignored)")


def emit(result: dict, *, as_json: bool, format_text: Callable[[dict], str], indent: int | None = 2) -> None:
    """Print ``result`` as one JSON object, or ``format_text(result)``."""
    print(json.dumps(result, indent=indent) if as_json else format_text(result))


def run_cli(parser, argv, run: Callable, format_text: Callable[[dict], str]) -> int:
    """Add ``--data`` and ``--json`` to ``parser``, parse ``argv``, print ``run(args)`` as the table or JSON."""
    add_data_option(parser)
    add_json_option(parser)
    args = parser.parse_args(argv)
    emit(run(args), as_json=args.json, format_text=format_text)
    return 0


def log(msg: str) -> None:
    """A progress line on stderr (stdout carries only the table or the JSON)."""
    print(msg, file=sys.stderr, flush=True)
