"""Units dealt into fills: stratified by file position, and each epoch's fills spread evenly over the next's.  Pure.

The one-level order (:mod:`h5stream.order.epoch`, step 2) deals ``n`` position-sorted units into ``F =
ceil(n / per_fill)`` fills so that every fill is a miniature of the file: the units are cut into contiguous
*strata* of ``F`` units, and each stratum gives one unit to every fill.  Fill ``f`` is the ``f``-th stretch of the
epoch's order, so which fill a unit lands in is, to within a fill, where its rows come in the epoch.

Drawing every epoch's assignment afresh (each stratum a new random permutation of the fills) makes two epochs'
orders independent only on average: their Kendall τ is the rank correlation of about ``n`` units over ``F`` fills,
which spreads by about ``2 / (3 sqrt(n))`` (1,400 units, a store of 1 GB under the default budget: |τ| above 0.02
on a third of the seeds).  Here consecutive epochs are *balanced* against each other instead:

* **Labels.**  In stratum ``s`` unit ``j`` has the label ``(x[s, j] + G_e[s]) mod F``, where ``x[s]`` is a
  random permutation of ``0..F-1`` drawn once per seed (epoch 0's draw, so epoch 0 is what the per-epoch draw
  gives) and ``G_e[s]`` the stratum's *offset* in epoch ``e``; the fill is ``pi_e[label]``, ``pi_e`` a random
  order of the fills (the identity in epoch 0).  A stratum's labels are a permutation, so every fill still takes
  one unit of every stratum: the class mix of a fill is that of the per-epoch draw.
* **Offsets.**  ``G_0 = 0`` and ``G_{e+1} = G_e + D_e`` (mod ``F``), where the step ``D_e`` over the strata is
  *balanced*: every residue ``0..F-1`` the same number of times, to within one (or, with fewer strata than
  fills, distinct residues), in a random arrangement drawn with ``(seed, e + 1)``.  Then the units of a fill of
  epoch ``e`` (one per stratum) go to the fills of epoch ``e + 1`` in equal shares: the table of units by
  (fill in ``e``, fill in ``e + 1``) is flat to within one unit, whose rank correlation is 0.  Where it cannot
  be flat (the residues left over when the strata are not a multiple of ``F``, a last stratum cut short), those
  residues are chosen so that the fill-level correlation of ``pi_e`` and ``pi_{e+1}`` is closest to 0
  (:func:`label_cross`, exact integers).  What is left of τ comes from rows inside fills (permuted
  independently every epoch): within ±0.002 at 1,400 units, where the per-epoch draw spreads by 0.02.
* Epochs further apart are offset by sums of balanced steps, as random as the per-epoch draw (not balanced):
  τ between epochs ``e`` and ``e + 2`` spreads as before; a pair of units shares a fill in an epoch with
  probability ``1 / F``, from one epoch to the next as independently as before.

The offsets of epoch ``e`` are ``e`` steps of one draw over the strata each (``per_fill`` of them at most: a
fill's worth, whatever the store's size) and, up to :data:`BALANCE_MAX_UNITS` units, an FFT over the fills: 0.3 to
0.5 ms a step, so laying out epoch 100 costs tens of milliseconds more than epoch 0 (a 1 TB store, past that
bound, a few); :func:`stratum_offsets` keeps the last epochs' offsets, so a stream going epoch after epoch takes
one step each.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from functools import lru_cache

import numpy as np

from h5stream.errors import ConfigError

_STRATA = 1  # the per-epoch draw's purpose (h5stream.order.epoch._STRATA): epoch 0's labels are that draw
_STEPS, _FILL_ORDER = 20, 21
_KEPT_OFFSETS = 16

BALANCE_MAX_UNITS = 1 << 17
"""Up to this many units the steps are chosen for a fill-level rank correlation of 0 (:func:`offset_step`); above
it a random order of as many units already keeps |τ| near ``2 / (3 sqrt(units))`` < 0.002, and the steps are
balanced only."""

BALANCE_MAX_FILLS = 1 << 14
"""The most fills :func:`label_cross` is exact for."""


def _rng(seed: int, epoch: int, purpose: int, *more: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFFFFFFFFFF, int(epoch), purpose, *(int(m) for m in more)])


@lru_cache(maxsize=4)
def stratum_labels(n_units: int, n_fills: int, seed: int) -> np.ndarray:
    """Each unit's label in its stratum (``x`` of the module doc): stratum ``s`` holds units ``s * n_fills ..``,
    its labels the first entries of a random permutation of ``0..n_fills-1`` (the same draws as
    :func:`~h5stream.order.epoch.fill_schedule` for epoch 0).  Read-only int64 array; cached per stream."""
    rng = _rng(seed, 0, _STRATA, 0)
    labels = np.empty(n_units, np.int64)
    for start in range(0, n_units, n_fills):
        size = min(n_fills, n_units - start)
        labels[start:start + size] = rng.permutation(n_fills)[:size]
    labels.setflags(write=False)
    return labels


def fill_order(n_fills: int, seed: int, epoch: int) -> np.ndarray:
    """``pi_epoch`` of the module doc: fill ``f`` of the label order is fill ``pi[f]`` of the epoch (the identity in
    epoch 0, so that epoch 0 is the per-epoch draw's)."""
    if epoch == 0:
        return np.arange(n_fills, dtype=np.int64)
    return _rng(seed, epoch, _FILL_ORDER).permutation(n_fills).astype(np.int64)


def label_cross(n_fills: int, seed: int, epoch: int, labels: np.ndarray | None = None) -> np.ndarray:
    """``R[d] = sum_l c(pi_{epoch-1}[l]) * c(pi_epoch[(l + d) mod F])`` for ``d = 0..F-1``, ``l`` over every label
    (or over ``labels``), where ``c(f) = 2f - (F - 1)`` centres a fill's place: what the units of a stratum
    holding those labels in epoch ``epoch - 1``, stepped by ``d``, add to the two epochs' fill-level rank
    correlation.  Exact int64 (an FFT whose error is far below 0.5 for ``F <=`` :data:`BALANCE_MAX_FILLS`, then
    rounded, so every machine gets the same integers)."""
    if n_fills > BALANCE_MAX_FILLS:
        raise ConfigError(f"label_cross: {n_fills} fills is more than the {BALANCE_MAX_FILLS} it is exact for")
    before = (2 * fill_order(n_fills, seed, epoch - 1) - (n_fills - 1)).astype(np.float64)
    after = (2 * fill_order(n_fills, seed, epoch) - (n_fills - 1)).astype(np.float64)
    if labels is not None:
        kept = np.zeros(n_fills, np.float64)
        kept[labels] = 1.0
        before *= kept
    spectrum = np.conj(np.fft.rfft(before)) * np.fft.rfft(after)
    return np.rint(np.fft.irfft(spectrum, n_fills)).astype(np.int64)


def _balance(extra: np.ndarray, cross: np.ndarray, bias: int = 0) -> np.ndarray:
    """``extra`` (distinct residues) with up to three swaps for residues outside it that bring ``bias +
    sum(cross[extra])`` closest to 0.  Integer arithmetic only, ties to the first: the same on every machine."""
    extra = extra.copy()
    for _ in range(3):
        total = int(bias) + int(cross[extra].sum())
        outside = np.setdiff1d(np.arange(len(cross)), extra)
        if total == 0 or len(outside) == 0:
            break
        by_value = outside[np.argsort(cross[outside], kind="stable")]
        values = cross[by_value]
        # Swapping extra[i] for o changes the total by cross[o] - cross[extra[i]]: o's value should be near `aim`.
        aim = cross[extra] - total
        right = np.searchsorted(values, aim).clip(0, len(values) - 1)
        left = (right - 1).clip(0)
        near = np.where(np.abs(values[left] - aim) <= np.abs(values[right] - aim), left, right)
        after = np.abs(total - cross[extra] + values[near])
        i = int(np.argmin(after))
        if after[i] >= abs(total):
            break
        extra[i] = by_value[near[i]]
    return extra


def offset_step(n_units: int, n_fills: int, seed: int, epoch: int, cut_labels: np.ndarray | None = None) -> np.ndarray:
    """``D`` taking epoch ``epoch - 1``'s offsets to epoch ``epoch``'s, one per stratum, in a random arrangement
    (module doc): over the ``n_units // n_fills`` whole strata, every residue ``q`` times and ``r`` distinct
    others once; a last stratum cut short (its units' labels in epoch ``epoch - 1``: ``cut_labels``) one more.
    Up to :data:`BALANCE_MAX_UNITS` units the ``r`` residues, or with ``r = 0`` the cut stratum's, are chosen so
    that the two epochs' fill-level rank correlation is closest to 0 (:func:`label_cross`); otherwise at random."""
    rng = _rng(seed, epoch, _STEPS)
    full, cut = divmod(n_units, n_fills)
    q, r = divmod(full, n_fills)
    extra = np.sort(rng.choice(n_fills, r, replace=False)).astype(np.int64)
    last = rng.integers(n_fills, size=int(cut > 0)).astype(np.int64)
    if (r or cut) and n_units <= BALANCE_MAX_UNITS and n_fills <= BALANCE_MAX_FILLS:
        bias = 0
        if cut and cut_labels is not None:
            part = label_cross(n_fills, seed, epoch, cut_labels)
            if not r:
                last[0] = int(np.argmin(np.abs(part)))  # the first of equals: the same on every machine
            bias = int(part[last[0]])
        if r:
            extra = _balance(extra, label_cross(n_fills, seed, epoch), bias)
    steps = np.concatenate([np.repeat(np.arange(n_fills, dtype=np.int64), q), extra])
    return np.concatenate([rng.permutation(steps), last])


_kept: OrderedDict = OrderedDict()  # (n_units, n_fills, seed, epoch) -> offsets, the most recent last
_kept_lock = threading.Lock()


def stratum_offsets(n_units: int, n_fills: int, seed: int, epoch: int) -> np.ndarray:
    """``G_epoch`` of the module doc: the offset of each stratum of ``n_fills`` units, int64 in ``[0, n_fills)``
    (read-only).

    Takes the steps from the nearest earlier epoch whose offsets were kept (the last :data:`_KEPT_OFFSETS`
    asked for), else from epoch 0.  Safe to call from any thread; the result depends on the arguments only."""
    if epoch < 0:
        raise ConfigError(f"epoch must be >= 0, got {epoch}")
    key = (int(n_units), int(n_fills), int(seed))
    with _kept_lock:
        start = max((e for (*k, e) in _kept if tuple(k) == key and e <= epoch), default=-1)
        if start >= 0:
            _kept.move_to_end((*key, start))
            offsets = _kept[(*key, start)]
        else:
            start, offsets = 0, np.zeros(-(-n_units // n_fills), np.int64)
    if start == epoch:
        return offsets
    full = (n_units // n_fills) * n_fills
    labels = stratum_labels(int(n_units), int(n_fills), int(seed))[full:]  # the cut stratum's, if any
    for e in range(start + 1, epoch + 1):
        cut_labels = (labels + offsets[-1]) % n_fills if len(labels) else None
        offsets = (offsets + offset_step(n_units, n_fills, seed, e, cut_labels)) % n_fills
    offsets.setflags(write=False)
    with _kept_lock:
        _kept[(*key, epoch)] = offsets
        while len(_kept) > _KEPT_OFFSETS:
            _kept.popitem(last=False)
    return offsets


def chained_fills(n_units: int, units_per_fill: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Deal units ``0..n_units-1`` (position-sorted) into the fills of ``epoch`` (module doc).

    Returns one sorted int64 array of unit indices per fill: every index in exactly one fill, at most
    ``units_per_fill`` per fill, every fill one unit of each stratum of ``n_fills`` consecutive units.  Epoch 0
    is :func:`~h5stream.order.epoch.fill_schedule`'s epoch 0."""
    if units_per_fill < 1:
        raise ConfigError(f"units_per_fill must be >= 1, got {units_per_fill}")
    n_fills = max(1, -(-n_units // units_per_fill))
    if n_units == 0:
        return [np.zeros(0, np.int64)]
    labels = stratum_labels(int(n_units), n_fills, int(seed))
    if epoch == 0:
        fill = labels
    else:
        offsets = stratum_offsets(n_units, n_fills, seed, epoch)
        fill = fill_order(n_fills, seed, epoch)[(labels + np.repeat(offsets, n_fills)[:n_units]) % n_fills]
    by_fill = np.argsort(fill, kind="stable")  # stable: each fill's units in position order
    bounds = np.concatenate([[0], np.cumsum(np.bincount(fill, minlength=n_fills))])
    return [by_fill[bounds[f]:bounds[f + 1]].astype(np.int64) for f in range(n_fills)]
