"""The two-level order: large pieces for the requests, small units for the shuffle.  Pure, no I/O.

``epoch_layout(..., piece_rows=...)`` (``h5stream.open(piece_bytes=...)``) lays an epoch out by this module
instead of the one-level scheme of :mod:`h5stream.order.epoch`; both give an
:class:`~h5stream.order.epoch.EpochLayout`, so the reader, the shards and resuming treat them alike.

One epoch, over rows ``[start_row, rows)``:

1. **Pieces.**  The rows are cut into *pieces* of ``piece_rows`` rows (a multiple of the block: a run of
   whole chunks, read with one large ranged request by :mod:`h5stream.read.window`), aligned at multiples of
   ``piece_rows`` from row 0.  Each piece is cut into *units* of ``unit_rows`` rows (as in the one-level
   order), the smallest piece of the file that moves.
2. **Piece sequence.**  The pieces are dealt into groups of ``k = rows_per_fill // piece_rows`` (at least 1)
   stratified by file position (:func:`~h5stream.order.epoch.fill_schedule`: group ``g`` takes the ``g``-th
   piece of every stratum of consecutive pieces); the groups are permuted, and the pieces within each group.
   So any ``k`` consecutive pieces of the sequence sample the whole file, and on a class-sorted file every
   fill holds every class in proportion, as in the one-level order.
3. **Units in a sliding window.**  The ``m`` units of the piece at row position ``p`` of the sequence get
   the keys ``p + (j + phase) / m * window_pieces * piece_rows`` for ``j = 0..m-1`` in a random order (one
   random phase per piece): spread evenly over the window, so each stretch of the order takes from every
   piece its share to within one unit, as the one-level order's strata take from the file; the
   units, sorted by key, are dealt into fills of ``rows_per_fill // unit_rows`` units.  A piece's units
   thus spread over ``window_pieces`` pieces' worth of the order after its place: the pieces in memory at
   once are the fill being read and at most ``window_pieces + 1`` pieces that cross into the next fill
   (:func:`straddling_pieces`).
4. **Rows.**  Inside a fill rows are permuted with ``(seed, epoch, fill)``, as in the one-level order.

Every row is in exactly one fill; the order is a function of ``(rows, block_rows, rows_per_fill, unit_rows,
piece_rows, window_pieces, seed, epoch, start_row)`` only, so a local file and its URL opened with the same
options yield the same batches.

Why not the one-level order with a piece-sized unit: two epochs' orders are then random orders of a few
pieces (a 1 GB store has 128 pieces of 8 MiB), whose rank correlation spreads by about
``2 / (3 sqrt(pieces))``; units spread over a window of pieces, and rows over a fill, loosen it, but only a
window holding a good share of the store decorrelates epochs as well as small units do
(docs/performance.md, "Two-level order").
"""

from __future__ import annotations

import numpy as np

from h5stream.errors import ConfigError

WINDOW_PIECES = 4
"""How many pieces' worth of the order a piece's units spread over (step 3)."""

PIECE_BYTES_MIN = 8 << 20
"""The smallest piece ``piece_bytes`` may ask for: the ranged-GET size S3's guidance gives."""

PIECE_BYTES_MAX = 1 << 50
"""The largest ``piece_bytes`` (1 PiB): far past any store, and its rows stay within int64."""

_PIECES, _GROUPS, _SPREAD = 10, 11, 12


def _rng(seed: int, epoch: int, purpose: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFFFFFFFFFF, int(epoch), purpose])


def piece_rows_for(block_rows: int, row_bytes: int, piece_bytes: int) -> int:
    """Rows per piece for pieces of at least ``piece_bytes`` bytes: the fewest whole blocks that hold them."""
    if piece_bytes < 1 or block_rows < 1 or row_bytes < 1:
        raise ConfigError(f"piece_bytes ({piece_bytes}), block_rows and row_bytes must be positive")
    if piece_bytes > PIECE_BYTES_MAX:  # rows past int64 in the order's arithmetic: a ReaderError at the first read
        raise ConfigError(f"piece_bytes {piece_bytes} is past the largest piece, {PIECE_BYTES_MAX} bytes (1 PiB); a "
                          "piece as large as the store or larger is the whole store: give at most the store's size")
    block_bytes = block_rows * row_bytes
    return int(-(-int(piece_bytes) // block_bytes) * block_rows)


def piece_sequence(n_pieces: int, pieces_per_group: int, seed: int, epoch: int) -> np.ndarray:
    """Piece indices ``0..n_pieces-1`` in the epoch's order (step 2): stratified groups of ``pieces_per_group``,
    the groups and the pieces within each permuted with ``(seed, epoch)``.  A permutation (int64)."""
    if n_pieces == 0:
        return np.zeros(0, np.int64)
    n_groups = -(-n_pieces // max(1, int(pieces_per_group)))
    # Strata of n_groups consecutive pieces; each stratum's pieces go to distinct groups, at random.
    rng = _rng(seed, epoch, _PIECES)
    n_strata = -(-n_pieces // n_groups)
    group_of = np.concatenate([rng.permutation(n_groups)[:len(range(s * n_groups, min(n_pieces, (s + 1) * n_groups)))]
                               for s in range(n_strata)])
    rng = _rng(seed, epoch, _GROUPS)
    group_rank = rng.permutation(n_groups)  # the groups' order
    within = rng.random(n_pieces)  # the pieces' order within a group
    return np.lexsort((within, group_rank[group_of])).astype(np.int64)


def two_level_fills(segments: np.ndarray, rows_per_fill: int, unit_rows: int, piece_rows: int, seed: int,
                    epoch: int, window_pieces: int = WINDOW_PIECES) -> list[np.ndarray]:
    """Deal the position-sorted units ``segments`` (``(S, 2)`` row ranges, each inside one unit) into fills by
    the two-level scheme (steps 2-3 of the module doc).  Returns one sorted int64 array of segment indices
    per fill; every index is in exactly one fill, each fill holds at most ``rows_per_fill // unit_rows``
    segments."""
    if piece_rows < 1 or unit_rows < 1 or piece_rows % unit_rows:
        raise ConfigError(f"piece_rows ({piece_rows}) must be a positive multiple of unit_rows ({unit_rows})")
    if window_pieces < 0:
        raise ConfigError(f"window_pieces must be >= 0, got {window_pieces}")
    per_fill = rows_per_fill // unit_rows
    if per_fill < 1:
        raise ConfigError(f"rows_per_fill ({rows_per_fill}) must hold at least one unit ({unit_rows} rows)")
    n = len(segments)
    if n == 0:
        return [np.zeros(0, np.int64)]
    piece_of = segments[:, 0] // piece_rows
    first_piece = int(piece_of[0])
    local = piece_of - first_piece
    n_pieces = int(local[-1]) + 1
    sequence = piece_sequence(n_pieces, rows_per_fill // piece_rows, seed, epoch)
    # Rows of each piece, and each piece's row position in the sequence.
    lengths = segments[:, 1] - segments[:, 0]
    piece_len = np.bincount(local, weights=lengths, minlength=n_pieces).astype(np.int64)
    start_in_seq = np.zeros(n_pieces, np.int64)
    start_in_seq[sequence] = np.cumsum(piece_len[sequence]) - piece_len[sequence]
    # Each piece's units spread evenly over the window, in random order and with a random phase: every stretch
    # of the order then takes from each piece its share to within one unit (no chance excess of one class).
    rng = _rng(seed, epoch, _SPREAD)
    units_in = np.bincount(local, minlength=n_pieces)
    first_unit = np.cumsum(units_in) - units_in
    rank = np.argsort(local + rng.random(n), kind="stable")  # units grouped by piece, shuffled within each
    slot = np.empty(n, np.int64)
    slot[rank] = np.arange(n) - np.repeat(first_unit, units_in)
    phase = rng.random(n_pieces)
    spread = (slot + phase[local]) / units_in[local] * (window_pieces * piece_rows)
    keys = start_in_seq[local] + spread
    by_key = np.argsort(keys, kind="stable").astype(np.int64)
    n_fills = -(-n // per_fill)
    return [np.sort(by_key[f * per_fill:(f + 1) * per_fill]) for f in range(n_fills)]


def fill_pieces(segments: np.ndarray, fills, piece_rows: int) -> list[np.ndarray]:
    """The pieces (indices ``row // piece_rows``) each fill reads, sorted."""
    piece_of = segments[:, 0] // piece_rows if len(segments) else np.zeros(0, np.int64)
    return [np.unique(piece_of[f]) for f in fills]


def straddling_pieces(segments: np.ndarray, fills, piece_rows: int) -> int:
    """The most pieces that one fill and a later one both read: what a reader fetching each piece once per
    epoch must keep in memory across a fill boundary, besides the fill being read.  At most
    ``window_pieces + 1`` for :func:`two_level_fills` (the module doc, step 3)."""
    per_fill = fill_pieces(segments, fills, piece_rows)
    last: dict[int, int] = {}
    for f, pieces in enumerate(per_fill):
        for p in pieces.tolist():
            last[p] = f
    most = 0
    seen: set[int] = set()
    for f, pieces in enumerate(per_fill):
        seen.update(pieces.tolist())
        kept = {p for p in seen if last[p] > f}
        most = max(most, len(kept))
        seen = kept
    return most


def window_capacity(in_flight: int, window_pieces: int = WINDOW_PIECES) -> int:
    """Pieces a reader of the two-level order holds at most: those crossing the fill boundaries on either side
    of the fill being read (``window_pieces + 1`` each), and one per read in flight plus one being finished."""
    return 2 * (int(window_pieces) + 1) + int(in_flight) + 1


def window_pieces_bytes(piece_rows: int, row_bytes: int, in_flight: int, window_pieces: int = WINDOW_PIECES) -> int:
    """Bytes of :func:`window_capacity` pieces of ``piece_rows`` rows."""
    return int(window_capacity(in_flight, window_pieces) * piece_rows * row_bytes)
