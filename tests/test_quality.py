"""Shuffle-quality figures on orders whose answer is known."""

import itertools

import numpy as np
import pytest

from h5stream.errors import ConfigError
from h5stream.order import quality

N_CLASSES = 10


def sorted_labels(per_class=1000, n_classes=N_CLASSES):
    return np.repeat(np.arange(n_classes), per_class)


def brute_inversions(p):
    return sum(1 for i, j in itertools.combinations(range(len(p)), 2) if p[i] > p[j])


def test_sorted_file_in_order_scores_near_one_minus_one_over_classes():
    labels = sorted_labels()
    # Every batch of 32 holds one class, except the few straddling a class boundary.
    tvd = quality.batch_label_tvd(labels, 32, N_CLASSES)
    assert 0.88 < tvd <= 0.9


def test_random_permutation_matches_the_exact_expectation():
    labels = sorted_labels()
    expected = quality.expected_batch_label_tvd(np.full(N_CLASSES, 1000), 32)
    measured = [quality.batch_label_tvd(labels[quality.full_random_order(labels.size, seed)], 32, N_CLASSES)
                for seed in range(5)]
    # 312 batches per permutation: the mean of 5 permutations is within ~1% of the expectation.
    assert abs(np.mean(measured) - expected) < 0.01
    assert 0.19 < expected < 0.23  # far from both 0 and the sorted figure


def test_expected_tvd_of_a_batch_holding_the_whole_set_is_zero_and_of_single_rows_is_maximal():
    counts = np.array([30, 70])
    assert quality.expected_batch_label_tvd(counts, 100) == pytest.approx(0.0, abs=1e-12)
    # One-row batches: TVD is 1 - p(label), so its expectation is 1 - sum p^2.
    assert quality.expected_batch_label_tvd(counts, 1) == pytest.approx(1 - (0.3**2 + 0.7**2))


def test_single_chunk_shuffle_is_a_permutation_that_stays_bad_on_a_sorted_file():
    labels = sorted_labels()
    order = quality.single_chunk_shuffle_order(labels.size, 3200, seed=0)
    assert np.array_equal(np.sort(order), np.arange(labels.size))
    # Rows never leave their chunk.
    assert order[:3200].min() == 0 and order[:3200].max() == 3199
    tvd = quality.batch_label_tvd(labels[order], 32, N_CLASSES)
    assert tvd > 2 * quality.expected_batch_label_tvd(np.full(N_CLASSES, 1000), 32)
    # Different epochs permute differently, the same (seed, epoch) identically.
    assert not np.array_equal(order, quality.single_chunk_shuffle_order(labels.size, 3200, seed=0, epoch=1))
    assert np.array_equal(order, quality.single_chunk_shuffle_order(labels.size, 3200, seed=0))


def test_batches_label_tvd_of_yielded_batches_equals_the_order_form_for_equal_batches():
    labels = sorted_labels()[quality.full_random_order(10_000, 3)]
    batches = np.split(labels[:9984], 312)
    assert quality.batches_label_tvd(batches, N_CLASSES, reference=np.full(N_CLASSES, 0.1)) == pytest.approx(
        quality.batch_label_tvd(labels[:9984], 32, N_CLASSES, reference=np.full(N_CLASSES, 0.1)))


def test_trailing_partial_batch_is_left_out():
    labels = np.array([0, 1] * 16 + [0])  # one full mixed batch, then a lone row
    assert quality.batch_label_tvd(labels, 32, 2) == pytest.approx(0.5 * (abs(0.5 - 17 / 33) + abs(0.5 - 16 / 33)))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 17, 64, 100])
def test_inversion_count_matches_brute_force(n):
    rng = np.random.default_rng(n)
    for _ in range(10):
        p = rng.permutation(n)
        assert quality.count_inversions(p) == brute_inversions(p)


def test_kendall_tau_identical_reversed_and_independent():
    rng = np.random.default_rng(0)
    a = rng.permutation(50_000) + 7  # arbitrary ids, not 0..n-1
    assert quality.kendall_tau(a, a) == 1.0
    assert quality.kendall_tau(a, a[::-1]) == -1.0
    b = rng.permutation(a)
    # Null standard deviation ~ 0.67 / sqrt(n) = 0.003.
    assert abs(quality.kendall_tau(a, b)) < 0.015


def test_kendall_tau_small_case_by_hand():
    # Positions in b of a's rows: [0, 2, 1] -> one discordant pair of three -> tau = 1 - 2/3 * 2 = 1/3.
    assert quality.kendall_tau([10, 11, 12], [10, 12, 11]) == pytest.approx(1 / 3)


def test_kendall_tau_sampled_estimate_is_close_to_exact():
    rng = np.random.default_rng(1)
    a = np.arange(20_000)
    b = a.copy()
    swap = rng.choice(20_000, 4000, replace=False)  # partly correlated orders
    b[swap] = rng.permutation(b[swap])
    exact = quality.kendall_tau(a, b)
    approx = quality.kendall_tau(a, b, max_exact_rows=1000, sample_rows=5000, seed=2)
    assert 0.5 < exact < 0.99
    assert abs(approx - exact) < 0.03  # standard error ~ 0.67 / sqrt(5000) ~ 0.01


def test_kendall_tau_rejects_orders_of_different_rows():
    with pytest.raises(ConfigError, match="same row ids"):
        quality.kendall_tau([0, 1, 2], [0, 1, 3])
    with pytest.raises(ConfigError, match="repeats"):
        quality.kendall_tau([0, 0, 1], [0, 1, 0])
    with pytest.raises(ConfigError, match="3 and 2"):
        quality.kendall_tau([0, 1, 2], [0, 1])


def test_bad_labels_are_config_errors():
    with pytest.raises(ConfigError, match=r"\[0, 3\)"):
        quality.batch_label_tvd(np.array([0, 1, 5]), 2, 3)
    with pytest.raises(ConfigError, match="integer"):
        quality.batch_label_tvd(np.array([0.5, 1.0]), 2, 3)
    with pytest.raises(ConfigError, match="batch_size"):
        quality.batch_label_tvd(np.array([0, 1]), 0, 3)


def test_regression_labels_are_binned_into_quantiles():
    values = np.linspace(0, 1, 1000, dtype=np.float32)
    bins, n = quality.quality_labels(values, "regression", None)
    assert n == quality.REGRESSION_BINS
    assert np.array_equal(np.bincount(bins), np.full(n, 100))
    assert np.all(np.diff(bins) >= 0)  # monotone in the value


def test_shuffle_report_on_a_random_order_and_on_the_file_order():
    labels = sorted_labels(200)
    n = labels.size

    def random_epoch(e):
        return quality.full_random_order(n, 100 + e)

    report = quality.shuffle_report(labels, N_CLASSES, random_epoch, batch_size=32)
    assert report["tvd_ratio_to_random"] == pytest.approx(1.0, abs=0.1)
    assert abs(report["epoch_order_tau"]) < 0.05
    assert report["batch_label_tvd_file_order"] > 0.85
    same = quality.shuffle_report(labels, N_CLASSES, lambda e: np.arange(n), batch_size=32)
    assert same["epoch_order_tau"] == 1.0
    assert same["tvd_ratio_to_random"] > 3
