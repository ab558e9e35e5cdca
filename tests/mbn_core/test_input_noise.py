"""The compressor's "auto" input noise: 0.3 on wide data, within a row's neighbourhood on thin."""

import numpy as np
import pytest
from sklearn.datasets import make_moons
from sklearn.metrics import pairwise_distances

from mbn_core.distill.input_map import InputMap
from mbn_core.distill.input_noise import MAX_INPUT_NOISE, NEIGHBOURHOOD_SHARE, auto_input_noise


def mlp_input(X):
    X = np.asarray(X, dtype=np.float64)
    return np.asarray(InputMap.fit(X, 32).transform(X), dtype=np.float64)


def test_wide_data_keep_the_calibrated_noise(digits):
    # Digits projected onto 32 directions: 0.3 stays within half a neighbourhood.
    assert auto_input_noise(mlp_input(digits.X)) == MAX_INPUT_NOISE


def test_a_thin_manifold_gets_noise_within_a_neighbourhood():
    X, _ = make_moons(1000, noise=0.06, random_state=7)
    Z = mlp_input(X)
    noise = auto_input_noise(Z)
    # The definition, by brute force: 0.6 of the median distance to the 10th nearest row,
    # spread over the input's dimensions (every row sampled: 1,000 <= 2,000).
    tenth = np.sort(pairwise_distances(Z), axis=1)[:, 10]
    expected = NEIGHBOURHOOD_SHARE * np.median(tenth) / np.sqrt(2)
    assert noise == pytest.approx(expected, rel=1e-6)
    assert noise < 0.2 * MAX_INPUT_NOISE  # measured 0.044


@pytest.mark.parametrize("X", [np.ones((1, 3)), np.ones((12, 3)), np.zeros((2, 1))])
def test_no_distinct_neighbour_means_no_noise(X):
    assert auto_input_noise(X) == 0.0


def test_repeated_rows_are_measured_by_their_distinct_neighbours():
    # Six binary inputs, 3,000 rows: every row has dozens of copies, so the 10th nearest row
    # is a copy at distance 0. The distinct rows are one unit step apart.
    X = np.random.default_rng(0).integers(0, 2, size=(3000, 6)).astype(np.float64)
    assert auto_input_noise(X) == MAX_INPUT_NOISE  # 0.6 * 1.41 / sqrt(6) = 0.35, capped


def test_the_rows_order_does_not_matter():
    # 3,999 rows, a tight cluster listed first: a sample of the first rows would see only it.
    rng = np.random.default_rng(1)
    X = np.vstack([rng.normal(0, 0.01, size=(2000, 2)), rng.normal(5, 1.0, size=(1999, 2))])
    shuffled = X[rng.permutation(len(X))]
    assert auto_input_noise(X) == auto_input_noise(shuffled)
    assert auto_input_noise(X) > 0.001  # a tight first cluster alone gives 0.0006


def test_few_rows_measure_by_the_rows_there_are():
    # Four rows on a diagonal, 0.02 * sqrt(2) apart: three neighbours at most. The third
    # nearest is 0.06 * sqrt(2) away from the end rows and 0.04 * sqrt(2) from the inner.
    Z = 0.01 * np.arange(8, dtype=np.float64).reshape(4, 2)
    median_third = 0.05 * np.sqrt(2)
    assert auto_input_noise(Z) == pytest.approx(0.6 * median_third / np.sqrt(2))  # 0.03
