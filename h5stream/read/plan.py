"""Byte sizes as people write them, and the unit of rows a read moves.  Pure, no I/O.

The memory budget itself (every allocation a stream makes) is :mod:`h5stream.budget`.
"""

from __future__ import annotations

import re

from h5stream.errors import BudgetError, ConfigError

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
_BYTES_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

UNIT_TARGET_BYTES = 1 << 20
"""Rows move between fills in units of about this size (a contiguous read; smaller units decorrelate epochs)."""


def unit_rows_for(block_rows: int, row_bytes: int, compressed: bool, target_bytes: int | None = None) -> int:
    """Largest power-of-two divisor of ``block_rows`` whose rows fit in ``target_bytes`` (default
    :data:`UNIT_TARGET_BYTES`; at least 1 row).

    Compressed chunks are decoded whole, so there the unit is the whole block.
    """
    if compressed:
        return int(block_rows)
    target = UNIT_TARGET_BYTES if target_bytes is None else int(target_bytes)
    unit = 1
    while block_rows % (unit * 2) == 0 and unit * 2 * row_bytes <= target:
        unit *= 2
    return unit


def parse_bytes(value, what: str = "memory budget") -> int:
    """``1024``, ``"512MB"``, ``"1.5GiB"``, ``"256 MiB"`` -> bytes (int); ``what`` names the value in errors.

    Units: B, kB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{what} must be bytes or a string like '512MiB', got {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ConfigError(f"{what} must be positive, got {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be bytes or a string like '512MiB', got {value!r}")
    m = _BYTES_RE.match(value)
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise ConfigError(
            f"cannot parse {what} {value!r}; write a number with an optional unit, e.g. '512MB', '1.5GiB'"
        )
    n = int(float(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise ConfigError(f"{what} must be positive, got {value!r}")
    return n


def mib_at_least(n: int) -> str:
    """``n`` bytes as a ``memory_budget`` string of whole MiB, rounded up: ``"102MiB"``."""
    return f"{-(-int(n) // (1 << 20))}MiB"


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def budget_error(budget_bytes: int, min_budget: int, what: str, alternatives: tuple[str, ...] = ()) -> BudgetError:
    """The error for a budget below ``min_budget``: the minimum, for what (``what``), and every fix, with numbers.

    ``alternatives`` are other changes that would fit this budget (``"use workers=1"``), computed by the caller.
    """
    fixes = [f"raise memory_budget to {mib_at_least(min_budget)!r} or more", *alternatives]
    return BudgetError(
        f"memory budget {format_bytes(budget_bytes)} is below the minimum {format_bytes(min_budget)} "
        f"({min_budget} bytes) for {what}: " + ", or ".join(fixes)
    )
