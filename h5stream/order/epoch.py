"""Epoch order: which rows, in which order, read in which contiguous pieces.

Everything here is a pure function of plain values: ``(rows, block_rows, shard,
seed, epoch, rows_per_fill, batch_size)`` in, integer arrays out.  No I/O, no
threads; the reader thread and the tests call the same functions.

An epoch covers rows ``[start_row, rows)`` of the file: all of it by default,
or one part of a validation split (:mod:`h5stream.order.split`).  Blocks are
the file's blocks; the part's first block may be cut at ``start_row``.

The algorithm, for one epoch: first the epoch's *global order* (steps 1-3,
the same for every shard count), then each shard's piece of it (step 4):

1. **Blocks and units.**  The file is cut into blocks of ``block_rows``
   contiguous rows (the HDF5 chunk length).  A block may be cut further into
   *units* of ``unit_rows`` rows (still a contiguous read, of 1 to 4 MiB): the
   smaller the unit, the more places of the file a fill mixes.
2. **Fills.**  The units, sorted by file position, are dealt into *fills*:
   groups that together fit the shuffle buffer (``rows_per_fill``).  To make
   every fill a miniature of the whole epoch, the units are split into
   contiguous *strata* of ``n_fills`` units each, and every stratum gives one
   unit to every fill (stratified sampling by file position).  On a
   class-sorted file every fill then holds every class in proportion (to within
   two units: a class cuts at most two strata at its ends; a rare class, of
   fewer units than two strata, is in at least half as many fills as it has
   units), which a plain random choice of blocks does not give.  Which unit goes to which fill
   is chained from epoch to epoch (:func:`~h5stream.order.strata.chained_fills`):
   each fill's units are spread evenly over the next epoch's fills, so two
   consecutive epochs' orders are uncorrelated on every seed, not only on
   average.  Epoch 0 is what a fresh random permutation of every stratum
   (:func:`fill_schedule`, the order of states of version 1 and 2) gives.
3. **Rows.**  Inside a fill, rows are permuted with ``(seed, epoch, fill)``.
   The global order is the fills' permutations end to end.
4. **Shards.**  Shard ``(index, count)`` serves one contiguous piece of the
   global order (:mod:`h5stream.order.pieces`: sizes differ by at most one
   row), in batches cut from it; a batch may straddle two consecutive fills.
   The shard reads every fill its piece touches; a fill at a piece boundary is
   read whole by both shards, each serving its part of the fill's permutation
   (:attr:`EpochLayout.windows`).  Pieces are disjoint and cover every row; the
   concatenated pieces are the global order whatever ``count`` is, which is
   what lets a state saved by ``N`` shards finish its epoch on ``M``
   (``stages``, see :mod:`h5stream.order.pieces`).  The cost: up to two fills
   per shard and epoch read and not all served (at most ``count - 1`` fills'
   rows read twice over all shards), and every shard must have the same
   ``rows_per_fill`` and ``unit_rows`` (the same budget, or ``rows_per_fill=``).

With ``shuffle=False`` steps 2-3 keep file order: the epoch is rows
``start_row..rows-1`` in order, and a shard's piece a contiguous range of them.

Batches per shard (:func:`batch_sizes`): every shard yields the same number of
batches.  Without ``drop_remainder``, ``n_batches = ceil(rows / (count *
batch_size))``; all batches are full except the last one or two of a shard, which
share what is left (no row is dropped or repeated).  With ``drop_remainder``,
``n_batches = rows // (count * batch_size)`` full batches; the rows left over at
the end of each shard's piece (different rows every epoch) are skipped.

States of version 1 were saved under another layout, whose order depended on
the shard count: each shard permuted the blocks, took its piece of them and
dealt that piece into fills of its own.  :func:`shard_layout` keeps it, so that
such a state finishes its epoch exactly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from h5stream.errors import ConfigError
from h5stream.order.pieces import batch_sizes, piece, rest_of_epoch
from h5stream.order.strata import chained_fills
from h5stream.order.twolevel import WINDOW_PIECES, two_level_fills

__all__ = ["EpochLayout", "batch_sizes", "check_shard", "epoch_layout", "fill_schedule", "shard_layout",
           "shard_segments"]

_BLOCKS, _STRATA, _ROWS = 0, 1, 2


def _rng(seed: int, epoch: int, purpose: int, *more: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFFFFFFFFFF, int(epoch), purpose, *(int(m) for m in more)])


def check_shard(shard) -> tuple[int, int]:
    """Validate ``shard`` (None or ``(index, count)``) and return ``(index, count)``."""
    if shard is None:
        return 0, 1
    try:
        index, count = (int(v) for v in shard)
    except (TypeError, ValueError):
        raise ConfigError(f"shard must be a pair (index, count), got {shard!r}") from None
    if count < 1 or not 0 <= index < count:
        raise ConfigError(f"shard=({index}, {count}) is invalid: need count >= 1 and 0 <= index < count")
    return index, count


def shard_segments(rows: int, block_rows: int, seed: int, epoch: int, shard=(0, 1), shuffle: bool = True,
                   unit_rows: int | None = None, start_row: int = 0) -> np.ndarray:
    """The shard's segments, sorted by file position: an ``(S, 2)`` int64 array of ``[start, stop)`` row ranges.

    Each segment lies inside one *unit*: ``unit_rows`` aligned rows (default: a
    whole block; a divisor of ``block_rows``), the smallest piece that moves
    between fills.  Pieces of the ``count`` shards are disjoint and together
    cover ``range(start_row, rows)``.
    """
    index, count = check_shard(shard)
    if rows < 0 or block_rows < 1 or not 0 <= start_row <= rows:
        raise ConfigError(f"need 0 <= start_row <= rows and block_rows >= 1, got start_row={start_row}, "
                          f"rows={rows}, block_rows={block_rows}")
    first_block = start_row // block_rows
    n_blocks = -(-rows // block_rows) - first_block if rows > start_row else 0
    blocks = _rng(seed, epoch, _BLOCKS).permutation(n_blocks) if (shuffle and count > 1) else np.arange(n_blocks)
    starts = (blocks.astype(np.int64) + first_block) * block_rows
    stops = np.minimum(starts + block_rows, rows)
    starts = np.maximum(starts, start_row)
    # Row offsets of each block in the permuted sequence, and this piece's bounds.
    total = rows - start_row
    seq_end = np.cumsum(stops - starts)
    seq_start = seq_end - (stops - starts)
    lo, hi = (index * total) // count, ((index + 1) * total) // count
    keep = (seq_end > lo) & (seq_start < hi)
    s = starts[keep] + np.maximum(0, lo - seq_start[keep])
    e = stops[keep] - np.maximum(0, seq_end[keep] - hi)
    seg = np.stack([s, e], axis=1) if len(s) else np.zeros((0, 2), np.int64)
    seg = seg[np.argsort(seg[:, 0], kind="stable")]
    unit = block_rows if unit_rows is None else int(unit_rows)
    if unit < 1 or block_rows % unit:
        raise ConfigError(f"unit_rows ({unit_rows}) must divide block_rows ({block_rows})")
    if unit < block_rows and len(seg):
        # Cut every segment at unit boundaries.
        first = seg[:, 0] // unit
        last = (seg[:, 1] - 1) // unit
        counts = last - first + 1
        within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        unit_index = np.repeat(first, counts) + within
        starts = np.maximum(unit_index * unit, np.repeat(seg[:, 0], counts))
        stops = np.minimum((unit_index + 1) * unit, np.repeat(seg[:, 1], counts))
        seg = np.stack([starts, stops], axis=1)
    return seg


def fill_schedule(n_segments: int, segments_per_fill: int, seed: int, epoch: int, shard_index: int = 0,
                  shuffle: bool = True) -> list[np.ndarray]:
    """Deal segment indices (into the position-sorted segment list) into fills.

    Returns one int64 array per fill, each sorted ascending (so adjacent segments
    coalesce into one read).  Every index appears in exactly one fill; each fill
    has at most ``segments_per_fill`` segments.
    """
    if segments_per_fill < 1:
        raise ConfigError(f"segments_per_fill must be >= 1, got {segments_per_fill}")
    n_fills = max(1, -(-n_segments // segments_per_fill))
    idx = np.arange(n_segments, dtype=np.int64)
    if not shuffle:
        return [idx[f * segments_per_fill:(f + 1) * segments_per_fill] for f in range(n_fills)]
    rng = _rng(seed, epoch, _STRATA, shard_index)
    # Strata of n_fills consecutive segments; column f of the (strata x n_fills) table is fill f.
    n_strata = -(-n_segments // n_fills)
    table = np.full((n_strata, n_fills), -1, dtype=np.int64)
    for s in range(n_strata):
        members = idx[s * n_fills:(s + 1) * n_fills]
        slots = rng.permutation(n_fills)[: len(members)]
        table[s, slots] = members
    fills = [np.sort(col[col >= 0]) for col in table.T]
    return fills


@dataclass(frozen=True)
class EpochLayout:
    """One shard's epoch: segments, fills, and batch sizes.  Built by :func:`epoch_layout`."""

    segments: np.ndarray  # (S, 2) [start, stop) rows, position-sorted
    fills: tuple[np.ndarray, ...]  # segment indices per fill
    fill_rows: np.ndarray  # rows in each fill
    batch_sizes: np.ndarray  # rows in each batch of the epoch
    seed: int
    epoch: int
    shard_index: int  # in the rows' random key: 0 for a piece of the global order, the shard in a shard_layout
    shuffle: bool
    fill_keys: tuple[int, ...] | None = None  # each fill's number in the global order (None: its index here)
    windows: tuple[np.ndarray | None, ...] | None = None  # per fill, [a, b) slices of its permutation served

    @property
    def rows(self) -> int:
        """Rows the fills serve (before ``drop_remainder``)."""
        return int(self.fill_used.sum())

    @property
    def fill_used(self) -> np.ndarray:
        """Rows each fill serves: all it reads, or the parts of it this piece holds (its ``windows``)."""
        if self.windows is None:
            return self.fill_rows
        return np.array([n if w is None else int((w[:, 1] - w[:, 0]).sum())
                         for n, w in zip(self.fill_rows.tolist(), self.windows)], dtype=np.int64)

    @property
    def n_batches(self) -> int:
        return len(self.batch_sizes)

    def fill_segments(self, fill: int) -> np.ndarray:
        """``(k, 2)`` row ranges of fill ``fill``, in the order they are laid into the buffer."""
        return self.segments[self.fills[fill]]

    def fill_permutation(self, fill: int) -> np.ndarray:
        """Buffer positions of fill ``fill`` in the order they are yielded (int64): every position, or, for a
        fill this piece shares with another, the positions of its windows (the rest is read, not served)."""
        n = int(self.fill_rows[fill])
        key = fill if self.fill_keys is None else self.fill_keys[fill]
        perm = _rng(self.seed, self.epoch, _ROWS, self.shard_index, key).permutation(n) if self.shuffle \
            else np.arange(n, dtype=np.int64)
        window = None if self.windows is None else self.windows[fill]
        if window is None:
            return perm
        return np.concatenate([perm[a:b] for a, b in window.tolist()])

    def fill_row_ids(self, fill: int) -> np.ndarray:
        """File row ids held by fill ``fill``, in buffer order."""
        seg = self.fill_segments(fill)
        if len(seg) == 0:
            return np.zeros(0, np.int64)
        lengths = seg[:, 1] - seg[:, 0]
        # Each row's id is its segment's start plus its place in the segment: no array per segment.
        first = seg[:, 0] - (np.cumsum(lengths) - lengths)  # a segment's start less the rows laid before it
        return np.repeat(first, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)

    def order(self) -> np.ndarray:
        """Every row id this shard yields this epoch, in yield order (dropped rows excluded)."""
        parts = [self.fill_row_ids(f)[self.fill_permutation(f)] for f in range(len(self.fills))]
        full = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return full[: int(self.batch_sizes.sum())]


def _whole_epoch(rows: int, block_rows: int, rows_per_fill: int, seed: int, epoch: int, shuffle: bool,
                 unit_rows: int | None, start_row: int, piece_rows: int | None = None,
                 window_pieces: int = WINDOW_PIECES, chained: bool = True) -> EpochLayout:
    """The global order: rows ``[start_row, rows)`` laid out as one shard (no batches yet); with
    ``piece_rows``, by the two-level scheme of :mod:`h5stream.order.twolevel`."""
    unit = block_rows if unit_rows is None else int(unit_rows)
    if rows_per_fill < unit:
        raise ConfigError(f"rows_per_fill ({rows_per_fill}) must hold at least one unit ({unit} rows)")
    segments = shard_segments(rows, block_rows, seed, epoch, (0, 1), shuffle, unit, start_row)
    if piece_rows is not None and shuffle:
        fills = two_level_fills(segments, rows_per_fill, unit, int(piece_rows), seed, epoch, window_pieces)
    elif shuffle and chained:
        fills = chained_fills(len(segments), rows_per_fill // unit, seed, epoch)
    else:
        fills = fill_schedule(len(segments), rows_per_fill // unit, seed, epoch, 0, shuffle)
    lengths = segments[:, 1] - segments[:, 0]
    fill_rows = np.array([int(lengths[f].sum()) for f in fills], dtype=np.int64)
    return EpochLayout(segments, tuple(fills), fill_rows, np.zeros(0, np.int64), int(seed), int(epoch), 0,
                       bool(shuffle))


def _view(whole: EpochLayout, part, sizes: np.ndarray) -> EpochLayout:
    """The layout serving the global positions ``part`` (intervals) of ``whole`` in batches of ``sizes``: every
    fill ``part`` touches, read whole, serving the windows of its permutation that ``part`` holds."""
    bounds = np.concatenate([[0], np.cumsum(whole.fill_rows)])
    keys: list[int] = []
    windows: list[list[tuple[int, int]]] = []
    for lo, hi in part:
        f = int(np.searchsorted(bounds, lo, side="right")) - 1
        while f < len(whole.fills) and bounds[f] < hi:
            a, b = max(lo, int(bounds[f])) - int(bounds[f]), min(hi, int(bounds[f + 1])) - int(bounds[f])
            if a < b:
                if keys and keys[-1] == f:
                    windows[-1].append((a, b))
                else:
                    keys.append(f)
                    windows.append([(a, b)])
            f += 1
    full = [w == [(0, int(whole.fill_rows[k]))] for k, w in zip(keys, windows)]
    if keys == list(range(len(whole.fills))) and all(full):
        return dataclasses.replace(whole, batch_sizes=sizes)  # the whole order: exactly the one-shard layout
    return dataclasses.replace(
        whole, fills=tuple(whole.fills[k] for k in keys), fill_rows=whole.fill_rows[keys].astype(np.int64),
        batch_sizes=sizes, fill_keys=tuple(keys),
        windows=tuple(None if f else np.array(w, np.int64) for f, w in zip(full, windows)))


def epoch_layout(rows: int, block_rows: int, rows_per_fill: int, batch_size: int, seed: int, epoch: int,
                 shard=None, shuffle: bool = True, drop_remainder: bool = False,
                 unit_rows: int | None = None, start_row: int = 0, stages=(), piece_rows: int | None = None,
                 window_pieces: int = WINDOW_PIECES, chained: bool = True) -> EpochLayout:
    """Lay out one epoch of one shard over rows ``[start_row, rows)``: its piece of the epoch's global order.

    ``rows_per_fill`` is the shuffle buffer's capacity in rows; ``unit_rows`` (a divisor of ``block_rows``,
    default the block) is the piece that moves between fills; ``stages`` (pairs ``(count, batches)``, see
    :mod:`h5stream.order.pieces`) are what other rank counts served of this epoch before: the shard's piece is
    then one of the rest.  ``piece_rows`` (a multiple of ``block_rows``; None: the one-level order) orders
    the epoch by :mod:`h5stream.order.twolevel`, units spread over ``window_pieces`` pieces.  ``chained=False``
    deals the one-level order's fills by the per-epoch draw of :func:`fill_schedule` (the order of states of
    version 1 and 2) instead of :func:`~h5stream.order.strata.chained_fills`.  Raises :class:`ConfigError` for
    values that give no layout.
    """
    index, count = check_shard(shard)
    whole = _whole_epoch(rows, block_rows, rows_per_fill, seed, epoch, shuffle, unit_rows, start_row,
                         piece_rows, window_pieces, chained)
    rest = rest_of_epoch(rows - start_row, batch_size, drop_remainder, stages)
    part, sizes = piece(rest, index, count, batch_size, drop_remainder)
    return _view(whole, part, sizes)


def shard_layout(rows: int, block_rows: int, rows_per_fill: int, batch_size: int, seed: int, epoch: int,
                 shard=None, shuffle: bool = True, drop_remainder: bool = False,
                 unit_rows: int | None = None, start_row: int = 0) -> EpochLayout:
    """The layout of states of version 1 (whose order depended on the shard count): the blocks permuted with
    ``(seed, epoch)`` and cut into ``count`` pieces, each piece dealt into fills of its own.  Kept so that such a
    state resumes its epoch exactly; every epoch after it is an :func:`epoch_layout`."""
    index, count = check_shard(shard)
    unit = block_rows if unit_rows is None else int(unit_rows)
    if rows_per_fill < unit:
        raise ConfigError(f"rows_per_fill ({rows_per_fill}) must hold at least one unit ({unit} rows)")
    segments = shard_segments(rows, block_rows, seed, epoch, (index, count), shuffle, unit, start_row)
    fills = fill_schedule(len(segments), rows_per_fill // unit, seed, epoch, index, shuffle)
    lengths = segments[:, 1] - segments[:, 0]
    fill_rows = np.array([int(lengths[f].sum()) for f in fills], dtype=np.int64)
    sizes = batch_sizes(int(lengths.sum()), rows - start_row, batch_size, count, drop_remainder)
    return EpochLayout(segments, tuple(fills), fill_rows, sizes, int(seed), int(epoch), index, bool(shuffle))
