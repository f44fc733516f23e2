"""Shuffle quality: how well an epoch order mixes labels, and how much two epochs differ.

Pure functions over numpy arrays; nothing here reads a file or starts a thread.
``h5stream bench`` and ``h5stream info --shuffle-report`` report these figures:

* **batch label TVD** -- for each batch, the total-variation distance
  ``0.5 * sum_c |p_batch(c) - p_all(c)|`` between the batch's label histogram
  and the whole set's, averaged over batches.  0 means every batch has the
  set's exact class mix; a class-sorted file read in order scores close to
  ``1 - 1/n_classes``.  Even a perfect shuffle scores above 0 because a batch
  is a small sample: :func:`expected_batch_label_tvd` gives the exact
  expectation for a uniformly random permutation, and
  :func:`batch_label_tvd` of :func:`full_random_order` measures it.
* **Kendall tau between epochs** -- the rank correlation between the positions
  of each row in two epochs' orders: 1 for the same order, -1 for the reverse,
  about 0 for independent orders.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from h5stream.errors import ConfigError

TAU_EXACT_MAX_ROWS = 4_000_000
"""Above this many rows :func:`kendall_tau` works on a random subset of rows (see there)."""

TAU_SAMPLE_ROWS = 1_000_000
"""Rows in that subset: standard error about ``0.67 / sqrt(rows)`` ~ 0.0007 near tau = 0."""

REGRESSION_BINS = 10
"""Regression labels are cut into this many quantile bins before measuring the label mix."""


# -- label mix ------------------------------------------------------------------------
def class_counts(labels: np.ndarray, n_classes: int) -> np.ndarray:
    """Rows per class, ``int64[n_classes]``; raises :class:`ConfigError` for a label outside ``[0, n_classes)``."""
    labels = _int_labels(labels, n_classes)
    return np.bincount(labels, minlength=n_classes).astype(np.int64)


def batch_label_tvd(
    labels_in_order: np.ndarray,
    batch_size: int,
    n_classes: int,
    *,
    reference: np.ndarray | None = None,
) -> float:
    """Mean total-variation distance between each batch's label histogram and the set's.

    ``labels_in_order`` are the class ids (``0 <= id < n_classes``) in the order
    they are yielded; consecutive runs of ``batch_size`` form the batches.  A
    trailing partial batch is left out (its smaller sample inflates the figure),
    unless it is the only batch.  ``reference`` is the class distribution to
    compare against (default: the histogram of ``labels_in_order`` itself).
    """
    labels = _int_labels(labels_in_order, n_classes)
    batch_size = _positive_int(batch_size, "batch_size")
    n = labels.size
    if n == 0:
        raise ConfigError("batch_label_tvd: no labels given; pass at least one row")
    p_all = _reference(labels, n_classes, reference)
    n_batches = max(1, n // batch_size)
    size = min(n, batch_size)
    used = labels[: n_batches * size].reshape(n_batches, size)
    # One bincount over (batch, class) pairs instead of a Python loop over batches.
    flat = np.bincount((np.arange(n_batches)[:, None] * n_classes + used).ravel(), minlength=n_batches * n_classes)
    p_batch = flat.reshape(n_batches, n_classes) / size
    return float(np.mean(0.5 * np.abs(p_batch - p_all).sum(axis=1)))


def batches_label_tvd(batches: list[np.ndarray], n_classes: int, *, reference: np.ndarray | None = None) -> float:
    """Like :func:`batch_label_tvd` for batches given one by one (sizes may differ).

    Every batch counts, weighted equally; use this on what a stream actually
    yielded.  ``reference`` defaults to the histogram of all given labels.
    """
    if not batches:
        raise ConfigError("batches_label_tvd: no batches given; pass at least one batch")
    arrays = [_int_labels(b, n_classes) for b in batches]
    p_all = _reference(np.concatenate(arrays), n_classes, reference)
    tvds = []
    for b in arrays:
        if b.size:
            p_b = np.bincount(b, minlength=n_classes) / b.size
            tvds.append(0.5 * np.abs(p_b - p_all).sum())
    return float(np.mean(tvds))


def expected_batch_label_tvd(counts: np.ndarray, batch_size: int) -> float:
    """Exact expected batch label TVD of a uniformly random permutation.

    A batch of a random permutation is a draw of ``batch_size`` rows without
    replacement, so the count of class ``c`` in it is hypergeometric
    ``(N, K_c, batch_size)``; by linearity the expectation is
    ``0.5 * sum_c E|X_c / b - K_c / N|``, summed here over the exact pmf.
    """
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    b = _positive_int(batch_size, "batch_size")
    if total < 1:
        raise ConfigError("expected_batch_label_tvd: counts sum to 0; pass the rows per class")
    b = min(b, total)
    log_all = _log_comb(total, b)
    expected = 0.0
    for k in (int(c) for c in counts):
        if k == 0:
            continue
        p = k / total
        lo, hi = max(0, b - (total - k)), min(b, k)
        for x in range(lo, hi + 1):
            log_pmf = _log_comb(k, x) + _log_comb(total - k, b - x) - log_all
            expected += math.exp(log_pmf) * abs(x / b - p)
    return 0.5 * expected


def quality_labels(labels: np.ndarray, label_kind: str, class_names: tuple[str, ...] | None) -> tuple[np.ndarray, int]:
    """Labels as class ids for the TVD figures, and the number of classes.

    Class files use their labels.  Regression files (``(N,)`` or ``(N, K)``
    floats) are cut on the first column into :data:`REGRESSION_BINS` quantile
    bins, so the figure then says how well batches mix the label's range.
    """
    labels = np.asarray(labels)
    if label_kind == "none":  # a store without labels: every row alike, one bin
        return np.zeros(labels.shape[0], np.int64), 1
    if label_kind == "class":
        n_classes = len(class_names) if class_names else (int(labels.max()) + 1 if labels.size else 0)
        return labels.astype(np.int64, copy=False), max(1, n_classes)
    values = labels.reshape(labels.shape[0], -1)[:, 0].astype(np.float64)
    edges = np.quantile(values, np.linspace(0, 1, REGRESSION_BINS + 1)[1:-1]) if values.size else []
    return np.searchsorted(edges, values, side="right").astype(np.int64), REGRESSION_BINS


def seed_entropy(seed: int) -> int:
    """``seed`` as numpy's generators take it (0 .. 2**64 - 1): any integer, as ``h5stream.open`` takes any seed
    (:mod:`h5stream.order.epoch` folds it the same way), so ``--seed -1`` gets reference orders too."""
    return int(seed) & 0xFFFFFFFFFFFFFFFF


# -- reference orders -----------------------------------------------------------------
def full_random_order(n_rows: int, seed: int) -> np.ndarray:
    """A uniformly random permutation of ``range(n_rows)`` (the ideal an in-RAM shuffle gives)."""
    return np.random.default_rng(seed_entropy(seed)).permutation(_positive_int(n_rows, "n_rows")).astype(np.int64)


def single_chunk_shuffle_order(n_rows: int, chunk_rows: int, seed: int, epoch: int = 0) -> np.ndarray:
    """The one-contiguous-chunk shuffle: read ``chunk_rows`` rows in file order, shuffle them, repeat.

    This is the order the chunked-PyTables generator of the references yields
    (chunk order unchanged, rows permuted inside each chunk, a new permutation
    per ``(seed, epoch)``).  On a class-sorted file every chunk holds one or two
    classes, which is why its batch label TVD stays high.
    """
    n_rows = _positive_int(n_rows, "n_rows")
    chunk_rows = _positive_int(chunk_rows, "chunk_rows")
    rng = np.random.default_rng([seed_entropy(seed), epoch])
    parts = [start + rng.permutation(min(chunk_rows, n_rows - start)) for start in range(0, n_rows, chunk_rows)]
    return np.concatenate(parts).astype(np.int64)


# -- epoch-to-epoch correlation ---------------------------------------------------------
def kendall_tau(
    order_a: np.ndarray,
    order_b: np.ndarray,
    *,
    max_exact_rows: int = TAU_EXACT_MAX_ROWS,
    sample_rows: int = TAU_SAMPLE_ROWS,
    seed: int = 0,
) -> float:
    """Kendall's tau between two orders of the same rows (1 same, -1 reversed, ~0 independent).

    ``order_a`` and ``order_b`` are row ids in yield order and must be
    permutations of the same set of distinct ids.  Exact (no ties, so tau-a ==
    tau-b) via an O(n log^2 n) vectorised merge-sort inversion count while
    ``n <= max_exact_rows``.  Beyond that, tau is computed exactly on a uniform
    random subset of ``sample_rows`` rows (chosen from ``seed``): an unbiased
    estimate whose standard error near tau = 0 is
    ``sqrt(2 (2k + 5) / (9 k (k - 1)))`` ~ ``0.67 / sqrt(k)`` for ``k`` rows.
    """
    a = np.asarray(order_a, dtype=np.int64).ravel()
    b = np.asarray(order_b, dtype=np.int64).ravel()
    if a.size != b.size:
        raise ConfigError(f"kendall_tau: orders have {a.size} and {b.size} rows; pass two orders of the same rows")
    if a.size < 2:
        raise ConfigError(f"kendall_tau: need at least 2 rows, got {a.size}")
    sorted_ids = np.sort(a)
    if np.any(sorted_ids[1:] == sorted_ids[:-1]):
        raise ConfigError("kendall_tau: order_a repeats a row id; pass permutations of distinct ids")
    b_by_id = np.argsort(b, kind="stable")
    if not np.array_equal(b[b_by_id], sorted_ids):
        raise ConfigError("kendall_tau: the two orders do not hold the same row ids; pass two orders of the same rows")
    # seq[i] = position in order_b of the row at position i of order_a.
    seq = b_by_id[np.searchsorted(sorted_ids, a)]
    if seq.size > max_exact_rows:
        rng = np.random.default_rng(seed_entropy(seed))
        keep = np.sort(rng.choice(seq.size, size=min(sample_rows, seq.size), replace=False))
        seq = np.argsort(np.argsort(seq[keep], kind="stable"), kind="stable")  # re-rank to 0..k-1
    n = seq.size
    pairs = n * (n - 1) / 2
    return float(1.0 - 2.0 * count_inversions(seq) / pairs)


def count_inversions(perm: np.ndarray) -> int:
    """Number of pairs ``i < j`` with ``perm[i] > perm[j]``; ``perm`` is a permutation of ``range(n)``.

    Bottom-up merge sort, one level at a time and vectorised: at each level the
    right run of every pair looks up, with one ``searchsorted``, how many
    elements of its left run are larger; then each pair is merged by a stable
    sort of ``pair * n + value``.
    """
    x = np.asarray(perm, dtype=np.int64).ravel().copy()
    n = x.size
    if n < 2:
        return 0
    idx = np.arange(n, dtype=np.int64)
    inversions = 0
    width = 1
    while width < n:
        pair = idx // (2 * width)
        is_right = (idx // width) % 2 == 1
        keys = pair * n + x
        left_keys = keys[~is_right]
        right_pair = pair[is_right]
        if right_pair.size:
            left_start = np.searchsorted(left_keys, right_pair * n)
            not_greater = np.searchsorted(left_keys, keys[is_right]) - left_start
            inversions += int((width - not_greater).sum())  # a left run next to a right run is always full
        x = np.sort(keys, kind="stable") - pair * n
        width *= 2
    return inversions


# -- the report -----------------------------------------------------------------------
def shuffle_report(
    labels: np.ndarray,
    n_classes: int,
    epoch_order: Callable[[int], np.ndarray],
    *,
    batch_size: int,
    seed: int = 0,
    epochs: tuple[int, int] = (0, 1),
    chunk_rows: int | None = None,
) -> dict:
    """Shuffle-quality figures for one stream configuration, as a flat dict of floats.

    ``labels[i]`` is the class id of row ``i``; ``epoch_order(e)`` returns the
    row ids the stream yields in epoch ``e`` (e.g. ``Stream.epoch_order``).
    Compares the stream's batch label TVD with a full random permutation of the
    same rows (measured and exact expectation), the single-contiguous-chunk
    shuffle with ``chunk_rows`` rows (default ``100 * batch_size``), and the
    file's own order; and gives Kendall's tau between the two ``epochs``.
    """
    labels = np.asarray(labels, dtype=np.int64)
    first, second = (int(e) for e in epochs)
    order_first = np.asarray(epoch_order(first), dtype=np.int64)
    order_second = np.asarray(epoch_order(second), dtype=np.int64)
    n = order_first.size
    rows = labels[order_first]
    p_all = np.bincount(rows, minlength=n_classes) / max(1, rows.size)
    chunk_rows = int(chunk_rows or 100 * batch_size)
    chunk = single_chunk_shuffle_order(labels.size, chunk_rows, seed, first)
    random = full_random_order(n, seed)
    report = {
        "rows": int(n),
        "batch_size": int(batch_size),
        "n_classes": int(n_classes),
        "batch_label_tvd": batch_label_tvd(rows, batch_size, n_classes, reference=p_all),
        "batch_label_tvd_full_random": batch_label_tvd(rows[random], batch_size, n_classes, reference=p_all),
        "batch_label_tvd_expected_random": expected_batch_label_tvd(
            np.bincount(rows, minlength=n_classes), batch_size
        ),
        "batch_label_tvd_single_chunk": batch_label_tvd(labels[chunk], batch_size, n_classes),
        "batch_label_tvd_file_order": batch_label_tvd(labels, batch_size, n_classes),
        "single_chunk_rows": chunk_rows,
        "epoch_order_tau": kendall_tau(order_first, order_second) if n >= 2 else 0.0,
        "epochs": [first, second],
    }
    report["tvd_ratio_to_random"] = report["batch_label_tvd"] / max(report["batch_label_tvd_full_random"], 1e-12)
    return report


# -- helpers --------------------------------------------------------------------------
def _int_labels(labels, n_classes: int) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ConfigError(f"labels must be integer class ids, got dtype {arr.dtype}; bin regression labels first")
    arr = arr.astype(np.int64, copy=False)
    n_classes = _positive_int(n_classes, "n_classes")
    if arr.size and (arr.min() < 0 or arr.max() >= n_classes):
        raise ConfigError(
            f"labels must lie in [0, {n_classes}), found [{arr.min()}, {arr.max()}]; pass the right n_classes"
        )
    return arr


def _reference(labels: np.ndarray, n_classes: int, reference) -> np.ndarray:
    if reference is None:
        return np.bincount(labels, minlength=n_classes) / labels.size
    p = np.asarray(reference, dtype=np.float64)
    if p.shape != (n_classes,):
        raise ConfigError(f"reference must have shape ({n_classes},), got {p.shape}")
    return p / p.sum()


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or int(value) != value or int(value) < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
