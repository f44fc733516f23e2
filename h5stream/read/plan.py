"""Memory budget -> read plan.  Pure arithmetic, no I/O.

The budget is a ceiling on everything a stream allocates:

* two fills of ``rows_per_fill`` rows (pixels + labels + the fill's permutation
  and row ids): one being handed out while the next is read (the rows are read
  straight into the batches they belong to, so these *are* the shuffle buffer);
* ``queue_depth`` batches waiting in the queue, plus two more in flight (one
  being built by the reader, one just handed to the consumer);
* with worker processes, the pool's output slots, each worker's own
  footprint (interpreter, heap, transform temporaries) and, once, the library
  code they share;
* a fixed allowance for bookkeeping (chunk offsets, the epoch's segment table,
  Python objects);
* for a remote store, what its client holds (``source_bytes``: the library,
  connections, pieces of responses in flight), which like the workers' share
  comes on top of the default budget, so a URL streams the same batches as
  the local file.

:func:`plan_read` gives the shuffle buffers whatever the rest leaves, rounded
down to whole blocks; a budget that cannot hold one block per buffer and two
queued batches raises :class:`BudgetError` naming the minimum.

Without a budget (``None``) the plan takes :data:`DEFAULT_BUDGET_BYTES` for
reading and shuffling and gives the workers their share on top, so adding
workers neither fails nor changes the epoch order.  With a budget, the workers'
share comes out of it, and the order depends on the worker count through
``rows_per_fill``; a caller that needs the same order whatever the workers (or
the budget) fixes ``rows_per_fill`` instead, and the plan checks that it fits.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from h5stream.errors import BudgetError, ConfigError

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
_BYTES_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

DEFAULT_BUDGET_BYTES = 256 << 20
"""Memory for reading and shuffling when no budget is given; worker processes get their share on top."""

BOOKKEEPING_BYTES = 6 << 20
"""Fixed allowance for Python objects, thread stacks and small arrays."""

MAX_QUEUE_DEPTH = 16

UNIT_TARGET_BYTES = 1 << 20
"""Rows move between fills in units of about this size (a contiguous read; smaller units decorrelate epochs)."""


def unit_rows_for(block_rows: int, row_bytes: int, compressed: bool) -> int:
    """Largest power-of-two divisor of ``block_rows`` whose rows fit in ``UNIT_TARGET_BYTES`` (at least 1 row).

    Compressed chunks are decoded whole, so there the unit is the whole block.
    """
    if compressed:
        return int(block_rows)
    unit = 1
    while block_rows % (unit * 2) == 0 and unit * 2 * row_bytes <= UNIT_TARGET_BYTES:
        unit *= 2
    return unit


def parse_bytes(value) -> int:
    """``1024``, ``"512MB"``, ``"1.5GiB"``, ``"256 MiB"`` -> bytes (int).  Units: B, kB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB."""
    if isinstance(value, bool):
        raise ConfigError(f"memory budget must be bytes or a string like '512MiB', got {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ConfigError(f"memory budget must be positive, got {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise ConfigError(f"memory budget must be bytes or a string like '512MiB', got {value!r}")
    m = _BYTES_RE.match(value)
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise ConfigError(
            f"cannot parse memory budget {value!r}; write a number with an optional unit, e.g. '512MB', '1.5GiB'"
        )
    n = int(float(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise ConfigError(f"memory budget must be positive, got {value!r}")
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


@dataclass(frozen=True)
class ReadPlan:
    """How a stream splits its memory budget.  All sizes in bytes unless named ``*_rows``."""

    budget_bytes: int
    batch_size: int
    block_rows: int
    unit_rows: int
    rows_per_fill: int
    n_buffers: int
    queue_depth: int
    buffer_bytes: int  # all shuffle buffers together
    batch_bytes: int  # one batch as handed to the consumer
    queue_bytes: int  # queued + in-flight batches
    pool_bytes: int  # worker input and output slots + worker footprints
    label_cache_bytes: int  # all labels held in memory (0: read with the pixels, run by run)
    bookkeeping_bytes: int
    min_budget_bytes: int
    workers: int = 0
    default_budget: bool = False  # no budget was given: DEFAULT_BUDGET_BYTES plus the workers' share
    source_bytes: int = 0  # a remote store's client

    @property
    def total_bytes(self) -> int:
        return (self.buffer_bytes + self.queue_bytes + self.pool_bytes + self.bookkeeping_bytes
                + self.label_cache_bytes + self.source_bytes)

    @property
    def blocks_per_fill(self) -> int:
        return self.rows_per_fill // self.block_rows

    def as_dict(self) -> dict:
        d = asdict(self)
        d["total_bytes"] = self.total_bytes
        d["blocks_per_fill"] = self.blocks_per_fill
        return d

    def describe(self) -> str:
        budget = format_bytes(self.budget_bytes)
        if self.default_budget:
            reading = self.budget_bytes - self.pool_bytes - self.source_bytes
            budget += (f" (default: {format_bytes(reading)} for reading"
                       + (f" + {format_bytes(self.pool_bytes)} for {self.workers} workers" if self.workers else "")
                       + (f" + {format_bytes(self.source_bytes)} for the remote client" if self.source_bytes else "")
                       + ")")
        return (
            f"budget {budget}: {self.n_buffers} x {self.rows_per_fill} rows "
            f"({self.rows_per_fill // self.unit_rows} units of {self.unit_rows}) = {format_bytes(self.buffer_bytes)} "
            "shuffle buffer, "
            f"{self.queue_depth} queued batches = {format_bytes(self.queue_bytes)}, "
            f"workers {format_bytes(self.pool_bytes)}, bookkeeping {format_bytes(self.bookkeeping_bytes)}"
            + (f", remote client {format_bytes(self.source_bytes)}" if self.source_bytes else "")
        )


def plan_read(
    budget_bytes: int | None,
    *,
    rows: int,
    row_bytes: int,
    label_row_bytes: int,
    block_rows: int,
    batch_size: int,
    out_row_bytes: int | None = None,
    out_label_row_bytes: int = 0,
    n_out_slots: int = 0,
    n_in_slots: int = 0,
    workers: int = 0,
    worker_bytes: int = 0,
    shared_worker_bytes: int = 0,
    unit_rows: int | None = None,
    rows_per_fill: int | None = None,
    epoch_rows: int | None = None,
    source_bytes: int = 0,
) -> ReadPlan:
    """Split ``budget_bytes`` between shuffle buffers, queue and workers for a store of ``rows`` rows.

    ``budget_bytes=None``: :data:`DEFAULT_BUDGET_BYTES` plus the pool's share
    (see the module doc).  ``out_row_bytes`` is the size of one output row
    (differs from ``row_bytes`` when augmentation emits float32);
    ``out_label_row_bytes`` is what a yielded label takes besides the stored
    one (a one-hot row, say); ``n_out_slots`` output slots of ``batch_size``
    rows live in shared memory when ``workers > 0``, each worker costs
    ``worker_bytes`` on top, and all of them together ``shared_worker_bytes``
    once (library code they share).  ``rows_per_fill`` fixes the fill size (rounded
    down to whole blocks, at most the epoch) instead of taking what the budget
    leaves; :class:`BudgetError` if it does not fit.  ``epoch_rows`` (default
    ``rows``) is how many contiguous rows an epoch covers when it streams part
    of the file (a validation split).  ``source_bytes`` is what the byte source holds (a remote client),
    counted like the pool: on top of the default budget, out of a given one.
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    out_row_bytes = row_bytes if out_row_bytes is None else out_row_bytes
    epoch_rows = rows if epoch_rows is None else int(epoch_rows)
    # Per buffered row: pixels, label, its permutation entry and row id (int64 each).
    buffered_row_bytes = row_bytes + label_row_bytes + 16
    batch_bytes = batch_size * (out_row_bytes + label_row_bytes + out_label_row_bytes)
    unit_rows = int(unit_rows or block_rows)
    n_blocks = -(-rows // block_rows) if rows else 0
    # Blocks one epoch touches: a part of the file that starts inside a block touches one more.
    epoch_blocks = n_blocks if epoch_rows >= rows else min(n_blocks, -(-epoch_rows // block_rows) + 1)
    n_units = -(-epoch_rows // unit_rows) + (1 if epoch_rows < rows else 0)
    bookkeeping = BOOKKEEPING_BYTES + n_blocks * 8 + n_units * 48  # chunk offsets; segment table + fill schedule
    slots = n_out_slots * batch_size * out_row_bytes + n_in_slots * batch_size * row_bytes
    pool = workers * worker_bytes + (shared_worker_bytes + slots if workers else 0) + int(source_bytes)
    in_flight = 4  # a straddling batch on each side of the two fills, one being handed out, one held by the consumer

    # A fill holds at least one batch, so a batch touches at most two fills in the usual case.
    min_rows = -(-batch_size // block_rows) * block_rows
    min_budget = bookkeeping + pool + 2 * min_rows * buffered_row_bytes + (2 + in_flight) * batch_bytes
    default = budget_bytes is None
    if default:
        budget_bytes = max(DEFAULT_BUDGET_BYTES + pool, min_budget)
    if budget_bytes < min_budget:
        raise budget_error(budget_bytes, min_budget, f"batch_size={batch_size}, {block_rows}-row blocks"
                           + (f" and {workers} workers" if workers else ""))
    # What the workers leave is the memory for reading; the queue and the label cache are sized from it.
    reading = budget_bytes - pool
    # Labels are tiny next to pixels: keep them all in memory when they take at most 1/16 of the budget.
    label_bytes = rows * label_row_bytes
    label_cache = label_bytes if label_bytes <= reading // 16 and budget_bytes - label_bytes >= min_budget else 0
    # Two fills are in memory at once: one being handed out, the next being read.
    n_buffers = 2
    most_rows = max(1, epoch_blocks) * block_rows
    fixed = None
    if rows_per_fill is not None:
        if isinstance(rows_per_fill, bool) or int(rows_per_fill) < 1:
            raise ConfigError(f"rows_per_fill must be a positive number of rows, got {rows_per_fill!r}")
        fixed = max(min_rows, min(int(rows_per_fill) // block_rows * block_rows, most_rows))

    def left_for_fills(depth: int) -> int:
        return budget_bytes - bookkeeping - label_cache - pool - (depth + in_flight) * batch_bytes

    if fixed is not None:
        most = max(0, left_for_fills(2) // (n_buffers * buffered_row_bytes) // block_rows * block_rows)
        if fixed > most:
            need = budget_bytes + n_buffers * (fixed - most) * buffered_row_bytes
            raise BudgetError(
                f"rows_per_fill={rows_per_fill} needs a memory budget of about {format_bytes(need)}"
                + (f" with {workers} workers" if workers else "")
                + f"; this budget ({format_bytes(budget_bytes)}) holds at most {most} rows per fill: "
                f"raise memory_budget to {mib_at_least(need)!r} or lower rows_per_fill"
            )
    # Queue: about a tenth of the reading memory, between 2 and MAX_QUEUE_DEPTH batches, shrunk until the
    # fills fit (the smallest fill, or the fixed one).
    queue_depth = int(max(2, min(MAX_QUEUE_DEPTH, (reading // 10) // max(1, batch_bytes))))
    while queue_depth > 2 and left_for_fills(queue_depth) < n_buffers * (fixed or min_rows) * buffered_row_bytes:
        queue_depth -= 1
    if fixed is not None:
        rows_per_fill = fixed
    else:
        rows_per_fill = (left_for_fills(queue_depth) // (n_buffers * buffered_row_bytes)) // block_rows * block_rows
        rows_per_fill = max(min_rows, min(rows_per_fill, most_rows))
    return ReadPlan(
        budget_bytes=int(budget_bytes),
        batch_size=int(batch_size),
        block_rows=int(block_rows),
        unit_rows=unit_rows,
        rows_per_fill=int(rows_per_fill),
        n_buffers=n_buffers,
        queue_depth=queue_depth,
        buffer_bytes=int(n_buffers * rows_per_fill * buffered_row_bytes),
        batch_bytes=int(batch_bytes),
        queue_bytes=int((queue_depth + in_flight) * batch_bytes),
        pool_bytes=int(pool - source_bytes),
        label_cache_bytes=int(label_cache),
        bookkeeping_bytes=int(bookkeeping),
        min_budget_bytes=int(min_budget),
        workers=int(workers),
        default_budget=default,
        source_bytes=int(source_bytes),
    )


def budget_error(budget_bytes: int, min_budget: int, what: str, alternatives: tuple[str, ...] = ()) -> BudgetError:
    """The error for a budget below ``min_budget``: the minimum, for what (``what``), and every fix, with numbers.

    ``alternatives`` are other changes that would fit this budget (``"use workers=1"``), computed by the caller.
    """
    fixes = [f"raise memory_budget to {mib_at_least(min_budget)!r} or more", *alternatives]
    return BudgetError(
        f"memory budget {format_bytes(budget_bytes)} is below the minimum {format_bytes(min_budget)} "
        f"({min_budget} bytes) for {what}: " + ", or ".join(fixes)
    )
