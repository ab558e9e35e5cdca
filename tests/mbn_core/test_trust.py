"""Trustworthiness with the rows' ranks computed once: scikit-learn's score, bit for bit."""

import numpy as np
import pytest
from sklearn.manifold import trustworthiness

from mbn_core.utils.trust import Trustworthiness


@pytest.mark.parametrize("seed", range(4))
def test_scores_equal_sklearns_bit_for_bit(seed, digits):
    rng = np.random.default_rng(seed)
    X = digits.X[rng.choice(1797, 200, replace=False)]  # whole numbers: many ties
    faithful = Trustworthiness(X, 10)
    for size in (2, 16, 40):
        Z = X[:, rng.choice(64, size, replace=False)]
        assert faithful.of(Z) == trustworthiness(X, Z, n_neighbors=10)
    Z = rng.standard_normal((200, 3))
    assert faithful.of(Z) == trustworthiness(X, Z, n_neighbors=10)


def test_too_many_neighbours_are_refused_as_sklearn_does():
    with pytest.raises(ValueError, match=r"n_neighbors \(10\) should be less than n_samples / 2"):
        Trustworthiness(np.zeros((20, 3)), 10)
