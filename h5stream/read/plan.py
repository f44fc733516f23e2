"""Byte sizes as people write them, and the unit of rows a read moves.  Pure, no I/O.

The memory budget itself (every allocation a stream makes) is :mod:`h5stream.streaming.budget`.
"""

from __future__ import annotations

import math
import re

from h5stream import _optnames as opt
from h5stream.errors import BudgetError, ConfigError

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
_BYTES_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

UNIT_TARGET_BYTES = 1 << 20
"""The smallest default unit: rows move between fills in units of at least about this size (a contiguous read;
smaller units decorrelate epochs, larger ones cost fewer requests)."""

UNIT_MOST_BYTES = 4 << 20
"""The largest default unit: a whole block of a store laid out by h5stream's rule (at most 4 MiB), one request
of the size an object store serves at its full rate (a 768 KiB unit gets a third of it)."""

UNITS_PER_FILL = 32
"""The default unit is at most this fraction of a fill, so a small shuffle buffer still mixes many places
of the file (the shuffle's quality); a fill of 128 MiB or more takes the largest unit."""

UNITS_PER_EPOCH = 1152
"""The default unit is at most this fraction of the rows an epoch orders.  Two epochs' orders are random
orders of the units, whose Kendall tau spreads by about 2 / (3 sqrt(units)): with 1,152 units or more its
standard deviation is about 0.02 (measured 0.022 for the 1,400 units of a 1.1 GB store: within 0.02 on 65% of
seeds; units of 4 rows would keep it within 0.02 on every seed, at 0.8x the warm local rate, so they are an
option, ``read_unit``, not the default: docs/performance.md, "The default unit and the epoch-to-epoch τ").  So
a store of a few GB or more takes the largest unit, and a smaller one (which a machine can often hold in
memory) keeps units near :data:`UNIT_TARGET_BYTES`."""


def default_unit_bytes(fill_bytes: int, epoch_bytes: int | None = None) -> int:
    """The default unit's target size for a fill of ``fill_bytes`` and an epoch of ``epoch_bytes`` (None:
    no limit from it): the smaller of a ``1/UNITS_PER_FILL`` share of the fill and a ``1/UNITS_PER_EPOCH``
    share of the epoch, between :data:`UNIT_TARGET_BYTES` and :data:`UNIT_MOST_BYTES`.  The local file and its
    URL plan the same fill and epoch under the same options, so they get the same unit and the same batches."""
    share = int(fill_bytes) // UNITS_PER_FILL
    if epoch_bytes is not None:
        share = min(share, int(epoch_bytes) // UNITS_PER_EPOCH)
    return int(min(UNIT_MOST_BYTES, max(UNIT_TARGET_BYTES, share)))


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
        if not value > 0 or value == math.inf:  # nan and inf too
            raise ConfigError(f"{what} must be a positive, finite number of bytes, got {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be bytes or a string like '512MiB', got {value!r}")
    m = _BYTES_RE.match(value)
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise ConfigError(
            f"cannot parse {what} {value!r}; write a number with an optional unit, e.g. '512MB', '1.5GiB'"
        )
    number = float(m.group(1)) * _UNITS[unit]
    if number == math.inf:  # '1e400'
        raise ConfigError(f"{what} {value!r} is too large; write a number of bytes with a unit, e.g. '100GB'")
    n = int(number)
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
    fixes = [f"raise {opt.name('memory_budget')} to {opt.value('memory_budget', mib_at_least(min_budget))} or more",
             *alternatives]
    return BudgetError(
        f"memory budget {format_bytes(budget_bytes)} is below the minimum {format_bytes(min_budget)} "
        f"({min_budget} bytes) for {what}: " + ", or ".join(fixes)
    )



def url_plan(plan, url: str, budget_bytes: int, client_bytes: int, local_verify_bytes: int,
             local_encoded_bytes: int = 0):
    """The plan of a stream over ``url`` under a given budget, with its local file's order.

    ``plan(fill=None, client=..., verify=..., encoded=...)`` plans with the URL's own shares by default.  The
    local file (read through the page cache: no client, its own check buffers and, for an encoded store, its
    own JPEG reads, ``local_encoded_bytes``) gets fills of some size under this budget;
    the URL gets the same fills, and so the same unit and the same batches, when its client fits beside them,
    else :class:`BudgetError` naming the fill that fits and the default budget: a smaller fill would silently
    change the order."""
    here = plan(client=0, verify=local_verify_bytes, encoded=local_encoded_bytes)
    try:
        return plan(fill=here.rows_per_fill)
    except BudgetError:
        fits = plan().rows_per_fill
    raise url_order_error(url, budget_bytes, here.rows_per_fill, client_bytes, fits)


def url_order_error(url: str, budget_bytes: int, local_fill: int, client_bytes: int, fits: int) -> BudgetError:
    """The error for a URL whose remote client (``client_bytes``) does not fit beside the fills of ``local_fill``
    rows that its local file gets under the same ``budget_bytes``: a smaller fill would change the order, so the
    caller chooses (``fits``: the most rows per fill that fit beside the client, also kept as the error's
    ``rows_per_fill``)."""
    error = BudgetError(
        f"{url}: under {opt.setting('memory_budget', mib_at_least(budget_bytes))} the local file's shuffle fills hold "
        f"{local_fill} rows, and the remote client's {format_bytes(client_bytes)} does not fit beside them (a "
        f"smaller fill would give other batches than the local file): pass {opt.setting('rows_per_fill', fits)}, "
        "the most that fits here (give the local file the same for the same batches), or leave "
        f"{opt.name('memory_budget')} unset (the "
        "client's memory then comes on top of the default)"
    )
    error.rows_per_fill = fits
    return error
