"""Exact, batch-independent k nearest neighbours and the connected k-NN graph.

Distances are first estimated with one float32 GEMM per block of queries (the fast part),
then every candidate within a rounding margin of the k-th estimate is re-measured exactly in
float64, one pair at a time. The answer therefore depends only on the query row and the
reference set, never on the other rows of the batch or on the block size.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components
from sklearn.metrics import pairwise_distances_argmin_min

# Query rows per GEMM block: bounds the (block, n_reference) float32 score matrix.
_BLOCK_BYTES = 64 * 2**20
# Candidates re-measured per row beyond k when the estimates leave no doubt.
_EXTRA_CANDIDATES = 8
# float32 GEMM estimates of a squared distance are trusted to within this fraction of
# |x|^2 + |y|^2 (far above float32 rounding of a dot product of a few thousand terms).
_RELATIVE_MARGIN = 1e-4
# The same for a float64 GEMM (its rounding stays below 1e-12 of the norms for d up to ~10^4).
_RELATIVE_MARGIN_FLOAT64 = 1e-9


def exact_kneighbors(
    reference: np.ndarray, queries: np.ndarray, n_neighbors: int, *, exclude_self: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The ``n_neighbors`` nearest reference rows of each query row, by Euclidean distance.

    Ties are broken by the smaller reference index, so the result is fully determined.

    Parameters
    ----------
    reference : ndarray of shape (n_reference, n_features), float64
    queries : ndarray of shape (n_queries, n_features), float64
    n_neighbors : int
        At most ``n_reference`` (``n_reference - 1`` with ``exclude_self``).
    exclude_self : bool, default=False
        Queries are the reference rows themselves, in order; row i never returns i.

    Returns
    -------
    distances : ndarray of shape (n_queries, n_neighbors), float64, ascending per row
    indices : ndarray of shape (n_queries, n_neighbors), int64
    """
    n_ref = reference.shape[0]
    n_query = queries.shape[0]
    ref32 = np.ascontiguousarray(reference, dtype=np.float32)
    ref_sq = np.einsum("ij,ij->i", reference, reference)
    max_ref_sq = float(ref_sq.max()) if n_ref else 0.0
    distances = np.empty((n_query, n_neighbors), dtype=np.float64)
    indices = np.empty((n_query, n_neighbors), dtype=np.int64)
    n_cand = min(n_ref, n_neighbors + _EXTRA_CANDIDATES + int(exclude_self))
    block = max(1, _BLOCK_BYTES // (4 * max(n_ref, 1)))
    for start in range(0, n_query, block):
        stop = min(n_query, start + block)
        q = queries[start:stop]
        q_sq = np.einsum("ij,ij->i", q, q)
        estimate = ref_sq[None, :] - 2.0 * (np.ascontiguousarray(q, dtype=np.float32) @ ref32.T)
        if exclude_self:
            estimate[np.arange(stop - start), np.arange(start, stop)] = np.inf
        part = np.argpartition(estimate, n_cand - 1, axis=1)[:, :n_cand]
        part_est = np.take_along_axis(estimate, part, axis=1)
        kth = np.partition(part_est, n_neighbors - 1, axis=1)[:, n_neighbors - 1]
        margin = _RELATIVE_MARGIN * (q_sq + max_ref_sq)
        threshold = kth + margin
        # A row is settled when its worst kept estimate is clearly beyond the threshold;
        # otherwise some reference row outside the candidates might be closer.
        settled = (n_cand == n_ref) | (part_est.max(axis=1) > threshold)
        # Rows whose float32 estimates cannot separate the candidates (near neighbours much
        # closer than the rows' norms, e.g. images a degree of rotation apart) are estimated
        # again by a float64 GEMM, whose rounding is five orders of magnitude smaller.
        unsettled = np.flatnonzero(~settled)
        slot = np.full(stop - start, -1)
        slot[unsettled] = np.arange(len(unsettled))
        precise = threshold64 = np.empty(0)
        if len(unsettled):
            precise = ref_sq[None, :] - 2.0 * (q[unsettled] @ reference.T)
            if exclude_self:
                precise[np.arange(len(unsettled)), start + unsettled] = np.inf
            kth64 = np.partition(precise, n_neighbors - 1, axis=1)[:, n_neighbors - 1]
            threshold64 = kth64 + _RELATIVE_MARGIN_FLOAT64 * (q_sq[unsettled] + max_ref_sq)
        for row in range(stop - start):
            if settled[row]:
                cand = part[row][part_est[row] <= threshold[row]]
            else:
                cand = np.flatnonzero(precise[slot[row]] <= threshold64[slot[row]])
            dist = _exact_distances(reference[cand], q[row])
            order = np.lexsort((cand, dist))[:n_neighbors]
            distances[start + row] = dist[order]
            indices[start + row] = cand[order]
    return distances, indices


def _exact_distances(rows: np.ndarray, query: np.ndarray) -> np.ndarray:
    diff = rows - query
    return np.sqrt(np.einsum("ij,ij->i", diff, diff))


def knn_graph(X: np.ndarray, n_neighbors: int) -> sp.csr_matrix:
    """Symmetrised k-NN graph of X with Euclidean edge lengths, joined into one component.

    Components are joined as in the paper's footnote 4: while the graph is disconnected, the
    smallest component gets the shortest edge between it and the rest of the points.
    Zero lengths (duplicate rows) are raised to a tiny positive value, because SciPy's sparse
    graph routines would read an explicit zero as a missing edge.
    """
    n = X.shape[0]
    distances, indices = exact_kneighbors(X, X, n_neighbors, exclude_self=True)
    lengths = np.maximum(distances.ravel(), _tiny_length(distances))
    rows = np.repeat(np.arange(n), n_neighbors)
    graph = sp.csr_matrix((lengths, (rows, indices.ravel())), shape=(n, n))
    graph = join_components(graph.maximum(graph.T).tocsr(), X)
    graph.sort_indices()
    return graph


def join_components(graph: sp.csr_matrix, X: np.ndarray) -> sp.csr_matrix:
    """Add shortest edges between components until the undirected graph is connected."""
    graph = graph.tocsr()
    n_comp, labels = connected_components(graph, directed=False)
    while n_comp > 1:
        sizes = np.bincount(labels)
        smallest = int(np.argmin(sizes))
        inside = np.flatnonzero(labels == smallest)
        outside = np.flatnonzero(labels != smallest)
        nearest, dist = pairwise_distances_argmin_min(X[inside], X[outside])
        best = int(np.argmin(dist))
        i, j = int(inside[best]), int(outside[nearest[best]])
        length = max(float(dist[best]), _tiny_length(graph.data))
        extra = sp.csr_matrix(([length, length], ([i, j], [j, i])), shape=graph.shape)
        graph = (graph + extra).tocsr()
        n_comp, labels = connected_components(graph, directed=False)
    return graph


def _tiny_length(lengths: np.ndarray) -> float:
    positive = lengths[lengths > 0]
    scale = float(positive.mean()) if positive.size else 1.0
    return 1e-12 * scale
