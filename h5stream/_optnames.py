"""How a message names an option: as the Python API's keyword (``memory_budget='7MiB'``), or as the flag typed on the
command line (``--memory-budget 7MiB``) while an ``h5stream`` command runs (pure but for the one setting below; no
h5stream imports).

The same plan and budget code runs under ``h5stream.open(...)`` and under ``h5stream bench``, ``info
--shuffle-report`` and the other commands; advice such as "raise memory_budget to '7MiB'" is right in Python and
wrong on a command line, where the user typed ``--memory-budget``.  :func:`cli_flags` is entered by
:func:`h5stream.cli.main` around a command, with that command's flags; every message that names an option does so
through :func:`name` or :func:`setting`.  A module-level setting, not a context variable: the command's threads
(a stream's reader) build messages too, and only one command runs in a process at a time.
"""

from __future__ import annotations

import contextlib

_flags: dict[str, str] | None = None  # keyword -> the flag of the command now running


@contextlib.contextmanager
def cli_flags(flags: dict[str, str]):
    """While in the block, options with a flag in ``flags`` (keyword -> ``--flag``) are named by it."""
    global _flags
    before, _flags = _flags, dict(flags)
    try:
        yield
    finally:
        _flags = before


def name(option: str) -> str:
    """``option`` (a keyword of the Python API) as the user gave it: its flag under a command that has one."""
    return (_flags or {}).get(option, option)


def setting(option: str, value) -> str:
    """``option`` set to ``value`` as the user would write it: ``memory_budget='7MiB'``, or ``--memory-budget 7MiB``."""
    if _flags and option in _flags:
        return f"{_flags[option]} {value}"
    return f"{option}={value!r}"


def value(option: str, value) -> str:
    """``value`` of ``option`` as the user would write it: ``'7MiB'`` in Python, ``7MiB`` after a flag."""
    return str(value) if _flags and option in _flags else repr(value)
