"""Which positions of an epoch's global order each rank serves, and what is left of an epoch after a resume.

Pure arithmetic on positions ``0 .. total-1`` of the epoch's *global order*
(:func:`h5stream.order.epoch.epoch_layout` says which row stands at each
position); nothing here knows rows, seeds or files.

**Pieces.**  ``count`` ranks cut the order into ``count`` contiguous pieces whose
sizes differ by at most one row: rank ``i`` serves positions
``[i * total // count, (i + 1) * total // count)``, in batches of
:func:`batch_sizes` (the same number of batches on every rank).  The global
order does not depend on ``count``: only the cuts do.

**Stages.**  An epoch may be served by several rank counts one after the other
(a state saved by ``N`` ranks, resumed by ``M``): each *stage* ``(count,
batches)`` says that ``count`` ranks, moving in step, each served their first
``batches`` batches.  What is left after a stage -- *the rest of the epoch* --
is every position not served yet, in global order: the unserved tail of every
piece, the pieces one after the other.  The next stage cuts that rest as the
first cut the whole order: contiguous pieces differing by at most one row,
batches of :func:`batch_sizes` of the rest's length (so every rank again
serves the same number of batches; with ``drop_remainder`` fewer than
``count * batch_size`` rows of the rest are left out, the tail of each piece).
An epoch with no earlier stage is the plain epoch.  Rows a stage left out under
``drop_remainder`` are in the rest, so a later stage may serve them: every row
still comes at most once.
"""

from __future__ import annotations

import numpy as np

from h5stream.errors import ConfigError

Intervals = tuple[tuple[int, int], ...]
"""``[start, stop)`` ranges of global positions, in the order they are served."""


def batch_sizes(shard_rows: int, total_rows: int, batch_size: int, count: int = 1,
                drop_remainder: bool = False) -> np.ndarray:
    """Sizes of the batches one rank yields out of a piece of ``shard_rows`` of ``total_rows`` rows cut for
    ``count`` ranks; the same length for every rank.

    Without ``drop_remainder``, ``n = ceil(total_rows / (count * batch_size))``
    batches, all full except the last one or two, which share what is left (no
    row dropped or repeated).  With ``drop_remainder``, ``n = total_rows //
    (count * batch_size)`` full batches; the rows left at the end of the piece
    are skipped.
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if drop_remainder:
        n = total_rows // (count * batch_size)
        return np.full(n, batch_size, dtype=np.int64)
    n = -(-total_rows // (count * batch_size))
    if n == 0:
        return np.zeros(0, np.int64)
    if shard_rows < n:
        raise ConfigError(
            f"{total_rows} rows cannot give {count} shards {n} batches each with batch_size={batch_size}; "
            "use drop_remainder=True or fewer shards"
        )
    sizes = np.full(n, batch_size, dtype=np.int64)
    extra = n * batch_size - shard_rows  # rows missing from full batches, taken from the last batches
    k = n - 1
    while extra > 0:
        take = min(extra, batch_size - 1)  # every batch keeps at least one row
        sizes[k] -= take
        extra -= take
        k -= 1
    return sizes


def _length(intervals: Intervals) -> int:
    return sum(hi - lo for lo, hi in intervals)


def _slice(intervals: Intervals, start: int, stop: int) -> Intervals:
    """Positions ``start .. stop-1`` of the sequence ``intervals`` lays end to end, as intervals."""
    out, seen = [], 0
    for lo, hi in intervals:
        a, b = max(start - seen, 0), min(stop - seen, hi - lo)
        if a < b:
            out.append((lo + a, lo + b))
        seen += hi - lo
        if seen >= stop:
            break
    return tuple(out)


def piece(rest: Intervals, index: int, count: int, batch_size: int,
          drop_remainder: bool) -> tuple[Intervals, np.ndarray]:
    """Rank ``index`` of ``count``'s piece of ``rest`` and its batch sizes (see the module doc)."""
    total = _length(rest)
    lo, hi = (index * total) // count, ((index + 1) * total) // count
    return _slice(rest, lo, hi), batch_sizes(hi - lo, total, batch_size, count, drop_remainder)


def check_stages(stages) -> tuple[tuple[int, int], ...]:
    """``stages`` (pairs ``(count, batches)``, e.g. from a state's JSON) as a tuple of int pairs, or
    :class:`ConfigError` for anything else."""
    try:
        out = tuple((int(c), int(b)) for c, b in stages)
    except (TypeError, ValueError):
        raise ConfigError(f"a state's stages must be pairs (shard count, batches served), got {stages!r}") from None
    if any(c < 1 or b < 1 for c, b in out):
        raise ConfigError(f"a state's stages must be pairs of shard count >= 1 and batches >= 1, got {stages!r}")
    return out


def rest_of_epoch(total: int, batch_size: int, drop_remainder: bool, stages=()) -> Intervals:
    """The positions not served after ``stages`` (see the module doc), in global order.

    Raises :class:`ConfigError` for a stage that claims more batches than its ranks had.
    """
    rest: Intervals = ((0, total),) if total else ()
    for count, batches in check_stages(stages):
        left = []
        for i in range(count):
            part, sizes = piece(rest, i, count, batch_size, drop_remainder)
            if batches > len(sizes):
                raise ConfigError(f"cannot resume: the state says {count} shards served {batches} batches each, "
                                  f"but {_length(rest)} rows left give them {len(sizes)}")
            left.extend(_slice(part, int(sizes[:batches].sum()), _length(part)))
        rest = tuple(left)
    return rest


def rows_served(total: int, batch_size: int, drop_remainder: bool, stages=()) -> int:
    """Rows of the epoch's global order served by every rank together over ``stages``."""
    stages = check_stages(stages)
    if not stages:
        return 0
    before = rest_of_epoch(total, batch_size, drop_remainder, stages[:-1])
    count, batches = stages[-1]
    done = sum(int(piece(before, i, count, batch_size, drop_remainder)[1][:batches].sum()) for i in range(count))
    return total - _length(before) + done


def resumed_stages(stages, count: int, batch: int, new_count: int) -> tuple[tuple[tuple[int, int], ...], int]:
    """``(stages, batch)`` of a rank of ``new_count`` continuing a state of ``count`` ranks at ``batch`` with
    earlier ``stages``: the same count continues the same stage; another one starts a new stage at batch 0
    with the state's stage (if it served anything) among the earlier ones."""
    stages = check_stages(stages)
    if new_count == count:
        return stages, int(batch)
    return (stages + ((int(count), int(batch)),) if batch else stages), 0
