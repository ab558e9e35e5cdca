"""The evaluation protocols of "Modular Dimensionality Reduction" (Section 6.2).

* Retrieval precision at κ: each module retrieves its κ nearest database points, the union of
  those candidates is re-ranked by the summed squared distance over modules (the Euclidean
  distance of the concatenated embedding), and the top κ are compared with the query's κ
  nearest neighbours in the *input* space. A Gaussian kernel's feature-space distance is
  monotone in input distance, so these are also its RKHS neighbours.
* Ensemble classification: one k-NN classifier per module, combined by majority vote (ties go
  to the smallest label).

Embeddings are passed per module, shape (n, n_modules, module_dim); a monolithic embedding is
one module.
"""

from __future__ import annotations

import numpy as np
from sklearn.neighbors import KNeighborsClassifier, NearestNeighbors

# Queries re-ranked at once: bounds the (queries x candidates x dims) gather to ~4 MB, which
# stays in cache; chunks far larger than the cache made the re-ranking several times slower.
_RERANK_BYTES = 4 << 20


def input_neighbours(database: np.ndarray, queries: np.ndarray, kappa: int = 10) -> np.ndarray:
    """Indices (n_queries, kappa) of each query's kappa nearest database rows (Euclidean)."""
    index = NearestNeighbors(n_neighbors=kappa, algorithm="brute").fit(database)
    return index.kneighbors(queries, return_distance=False)


def modular_neighbours(database: np.ndarray, queries: np.ndarray, kappa: int = 10) -> np.ndarray:
    """The κ database rows each query retrieves: per-module κ-NN, then re-ranked (see above).

    Parameters
    ----------
    database : ndarray (n, n_modules, module_dim)
    queries : ndarray (n_queries, n_modules, module_dim)
    kappa : int
        Neighbours retrieved, at most n.

    Returns
    -------
    ndarray (n_queries, kappa) of database indices, nearest first.
    """
    _check_modular("database", database)
    _check_modular("queries", queries)
    n, n_modules, _ = database.shape
    if queries.shape[1:] != database.shape[1:]:
        raise ValueError(
            f"queries have modules of shape {queries.shape[1:]}, database {database.shape[1:]}"
        )
    if not 1 <= kappa <= n:
        raise ValueError(f"kappa={kappa} must be in [1, {n}] (the database size)")
    if n_modules == 1:
        return input_neighbours(database[:, 0], queries[:, 0], kappa)
    candidates = np.concatenate(
        [input_neighbours(database[:, m], queries[:, m], kappa) for m in range(n_modules)],
        axis=1,
    )
    return rerank(database, queries, candidates, kappa)


def rerank(
    database: np.ndarray, queries: np.ndarray, candidates: np.ndarray, kappa: int
) -> np.ndarray:
    """The merge step of ``modular_neighbours``: the κ nearest of each query's candidates.

    ``candidates`` (n_queries, c) holds database indices, repeats allowed (a point found by
    several modules); the distance is the summed squared distance over modules. Shapes as in
    ``modular_neighbours``, whose validation is assumed here.
    """
    n = database.shape[0]
    flat_db = database.reshape(n, -1)
    flat_q = queries.reshape(len(queries), -1)
    chunk = max(1, _RERANK_BYTES // (8 * candidates.shape[1] * flat_db.shape[1]))
    result = np.empty((len(queries), kappa), dtype=np.intp)
    for start in range(0, len(queries), chunk):
        cand = np.sort(candidates[start : start + chunk], axis=1)
        diff = flat_db[cand]
        diff -= flat_q[start : start + chunk, None, :]
        distance = np.einsum("qcd,qcd->qc", diff, diff)
        # A point found by several modules is one candidate.
        distance[:, 1:][cand[:, 1:] == cand[:, :-1]] = np.inf
        order = np.argsort(distance, axis=1, kind="stable")[:, :kappa]
        result[start : start + chunk] = np.take_along_axis(cand, order, axis=1)
    return result


def retrieval_precision(retrieved: np.ndarray, truth: np.ndarray) -> float:
    """Mean over queries of |retrieved ∩ truth| / κ, for index arrays (n_queries, κ)."""
    retrieved, truth = np.asarray(retrieved), np.asarray(truth)
    if retrieved.shape != truth.shape or retrieved.ndim != 2:
        raise ValueError(
            f"retrieved {retrieved.shape} and truth {truth.shape} must be equal 2-D shapes"
        )
    hits = sum(
        np.intersect1d(row, true_row, assume_unique=True).size
        for row, true_row in zip(retrieved, truth, strict=True)
    )
    return float(hits) / truth.size


def ensemble_predict(
    database: np.ndarray, labels: np.ndarray, queries: np.ndarray, n_neighbors: int = 5
) -> np.ndarray:
    """Labels of the queries by a majority vote of one k-NN classifier per module."""
    _check_modular("database", database)
    _check_modular("queries", queries)
    classes, encoded = np.unique(np.asarray(labels), return_inverse=True)
    votes = np.empty((len(queries), database.shape[1]), dtype=np.intp)
    for m in range(database.shape[1]):
        classifier = KNeighborsClassifier(n_neighbors=n_neighbors, algorithm="brute")
        votes[:, m] = classifier.fit(database[:, m], encoded).predict(queries[:, m])
    return classes[majority_vote(votes, len(classes))]


def majority_vote(votes: np.ndarray, n_classes: int) -> np.ndarray:
    """The merge step of ``ensemble_predict``: the most frequent class of each row.

    ``votes`` (n, n_modules) holds class indices in [0, n_classes); ties go to the smallest.
    """
    counts = np.zeros((len(votes), n_classes), dtype=np.intp)
    np.add.at(counts, (np.arange(len(votes))[:, None], votes), 1)
    # argmax picks the first maximum.
    return np.argmax(counts, axis=1)


def _check_modular(name: str, array: np.ndarray) -> None:
    if np.ndim(array) != 3:
        raise ValueError(f"{name} must be (n, n_modules, module_dim), got {np.shape(array)}")
