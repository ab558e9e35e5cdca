"""Trustworthiness of several embeddings of the same rows, the rows' own ranks computed once.

``sklearn.manifold.trustworthiness(X, Z)`` ranks every pair of rows of X (a distance matrix
and a sort) and then looks up the ranks of Z's nearest neighbours. Scoring several Z against
one X (random subsets of the inputs, an embedding and a baseline) repeats the first half
each time, and it is the larger half. ``Trustworthiness(X).of(Z)`` does it once and returns,
for each Z, the same float as scikit-learn's function, bit for bit: the ranks come from the
same calls (scikit-learn's distances, NumPy's sort, scikit-learn's neighbour search) and the
score from the same arithmetic.
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import pairwise_distances
from sklearn.neighbors import NearestNeighbors

from mbn_core.utils.blas import one_openmp_thread


class Trustworthiness:
    """Trustworthiness (Venna and Kaski) of embeddings of the rows of ``X``, k = ``n_neighbors``.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
        The rows in their own space.
    n_neighbors : int
        Neighbours per row; must be below ``n_samples / 2`` (scikit-learn's bound).
    """

    def __init__(self, X: np.ndarray, n_neighbors: int) -> None:
        n_samples = X.shape[0]
        if n_neighbors >= n_samples / 2:
            raise ValueError(
                f"n_neighbors ({n_neighbors}) should be less than n_samples / 2 ({n_samples / 2})"
            )
        distances = pairwise_distances(X)
        np.fill_diagonal(distances, np.inf)  # a row is not its own neighbour
        order = np.argsort(distances, axis=1)
        # rank[i, j]: j's place among i's neighbours in X, counting from 1.
        self._rank = np.zeros((n_samples, n_samples), dtype=np.int64)
        np.put_along_axis(self._rank, order, np.arange(1, n_samples + 1)[None, :], axis=1)
        self.n_samples = n_samples
        self.n_neighbors = n_neighbors

    def of(self, Z: np.ndarray) -> float:
        """Trustworthiness of ``Z`` (the same rows, embedded): 1 when each row's k nearest
        neighbours in Z are among its k nearest in X, lower as Z brings in others."""
        n, k = self.n_samples, self.n_neighbors
        with one_openmp_thread():  # a few hundred rows: threads would only wait for cores
            neighbours = NearestNeighbors(n_neighbors=k).fit(Z).kneighbors(return_distance=False)
        excess = np.take_along_axis(self._rank, neighbours, axis=1) - k
        total = np.sum(excess[excess > 0])
        return float(1.0 - total * (2.0 / (n * k * (2.0 * n - 3.0 * k - 1.0))))
