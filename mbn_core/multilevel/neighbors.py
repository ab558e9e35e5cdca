"""Exact, batch-independent k nearest neighbours and the connected k-NN graph.

Distances are first estimated by a GEMM per block of queries (the fast part): float32 when
there are enough rows for its speed to pay for converting them, float64 otherwise. Every
candidate within the estimate's worst-case rounding error of the k-th estimate is then
re-measured exactly, in float64 from the row difference, by one compiled kernel. The answer
therefore depends only on the query row and the reference set, never on the other rows of the
batch, the block size or which estimate was used.
"""

from __future__ import annotations

import numba
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components
from sklearn.metrics import pairwise_distances_argmin_min

# Query rows per GEMM block: bounds the (block, n_reference) float64 score matrix.
_BLOCK_BYTES = 128 * 2**20
# Candidates kept per row from the float32 estimate beyond k; a row whose candidates do not
# all fit within the margin is estimated again in float64.
_EXTRA_CANDIDATES = 8
# The float32 pass saves about half of a float64 GEMM (n_query * n_ref * d multiply-adds) but
# converts the rows it has not converted yet ((n_ref + n_query) * d elements, or n_ref * d when
# the queries are the reference), which is memory bound: for a few queries against many
# reference rows the conversion costs more than the float32 product saves, so float32 is used
# from about 100 queries on (docs/decisions/0017-multilevel-exact-knn.md).
_FLOAT32_MIN_PRODUCTS_PER_ROW = 100
_UNIT_ROUNDOFF = {"float32": 2.0**-24, "float64": 2.0**-53}


def _margin(precision: str, n_features: int) -> float:
    """Worst-case error of comparing two estimates, as a fraction of |q|^2 + max |x|^2.

    A dot product of d terms summed in any order is off by at most
    gamma_d * sum |q_i x_i| <= gamma_d * (|q|^2 + |x|^2) / 2, with gamma_d = d u / (1 - d u);
    rounding both rows to the estimate's precision adds 2u to that factor. The estimate is
    |x|^2 - 2 q.x, so it is off by at most about (d + 4) u (|q|^2 + |x|^2), counting the
    float64 subtraction. A row and the k-th row can each be off by that much: 2 (d + 4) u.
    The factor 3 leaves room for gamma_d's denominator.
    """
    return 3.0 * (n_features + 4) * _UNIT_ROUNDOFF[precision]


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
    first = _first_precision(queries.shape[0], reference.shape[0], exclude_self)
    return _exact_kneighbors(reference, queries, n_neighbors, exclude_self, first)


def _first_precision(n_query: int, n_ref: int, exclude_self: bool) -> str:
    """The first estimate's precision: float32 only where its speed pays for the conversion."""
    converted = n_ref + (0 if exclude_self else n_query)
    products = n_query * n_ref
    return "float32" if products >= _FLOAT32_MIN_PRODUCTS_PER_ROW * converted else "float64"


def _exact_kneighbors(
    reference: np.ndarray,
    queries: np.ndarray,
    n_neighbors: int,
    exclude_self: bool,
    first: str,
) -> tuple[np.ndarray, np.ndarray]:
    """``exact_kneighbors`` with the first estimate's precision given (``first``).

    The answer does not depend on ``first``; only the time does (tested).
    """
    reference = np.ascontiguousarray(reference)
    n_ref, n_features = reference.shape
    n_query = queries.shape[0]
    ref_sq = np.einsum("ij,ij->i", reference, reference)
    max_ref_sq = float(ref_sq.max()) if n_ref else 0.0
    margin32 = _margin("float32", n_features)
    margin64 = _margin("float64", n_features)
    ref32 = np.ascontiguousarray(reference, dtype=np.float32) if first == "float32" else None
    distances = np.empty((n_query, n_neighbors), dtype=np.float64)
    indices = np.empty((n_query, n_neighbors), dtype=np.int64)
    n_cand = min(n_ref, n_neighbors + _EXTRA_CANDIDATES + int(exclude_self))
    block = max(1, _BLOCK_BYTES // (8 * max(n_ref, 1)))
    for start in range(0, n_query, block):
        stop = min(n_query, start + block)
        q = np.ascontiguousarray(queries[start:stop])
        q_sq = np.einsum("ij,ij->i", q, q)
        own = np.arange(stop - start), np.arange(start, stop)
        rows_parts, cols_parts = [], []
        unsettled = np.arange(stop - start)
        if ref32 is not None:
            q32 = ref32[start:stop] if exclude_self else q.astype(np.float32)
            estimate = ref_sq[None, :] - 2.0 * (q32 @ ref32.T)
            if exclude_self:
                estimate[own] = np.inf
            part = np.argpartition(estimate, n_cand - 1, axis=1)[:, :n_cand]
            part_est = np.take_along_axis(estimate, part, axis=1)
            kth = np.partition(part_est, n_neighbors - 1, axis=1)[:, n_neighbors - 1]
            threshold = kth + margin32 * (q_sq + max_ref_sq)
            # A row is settled when its worst kept estimate is beyond the threshold: no row
            # outside its candidates can be among its k nearest. Rows whose float32 estimates
            # cannot separate the candidates (near neighbours much closer than the rows' norms,
            # e.g. images a degree of rotation apart) are estimated again in float64.
            settled = (n_cand == n_ref) | (part_est.max(axis=1) > threshold)
            keep = (part_est <= threshold[:, None]) & settled[:, None]
            rows32, slots = np.nonzero(keep)
            rows_parts.append(rows32)
            cols_parts.append(part[rows32, slots])
            unsettled = np.flatnonzero(~settled)
        if len(unsettled):
            # Every row unsettled: use the block itself rather than a copy, so that a block
            # that is the whole reference reaches numpy's X @ X.T case (syrk, half a GEMM).
            q_unsettled = q if len(unsettled) == len(q) else q[unsettled]
            precise = ref_sq[None, :] - 2.0 * (q_unsettled @ reference.T)
            if exclude_self:
                precise[np.arange(len(unsettled)), start + unsettled] = np.inf
            kth64 = np.partition(precise, n_neighbors - 1, axis=1)[:, n_neighbors - 1]
            threshold64 = kth64 + margin64 * (q_sq[unsettled] + max_ref_sq)
            rows64, cols64 = np.nonzero(precise <= threshold64[:, None])
            rows_parts.append(unsettled[rows64])
            cols_parts.append(cols64)
        rows = np.concatenate(rows_parts)
        cols = np.concatenate(cols_parts).astype(np.int64)
        order = np.lexsort((cols, rows))
        indptr = np.zeros(stop - start + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=stop - start), out=indptr[1:])
        _select_exact(reference, q, indptr, cols[order], distances[start:stop], indices[start:stop])
    return distances, indices


@numba.njit(cache=True)
def _select_exact(reference, queries, indptr, candidates, distances, indices):
    """Re-measure each query's candidates exactly and keep the k nearest (ties: smaller index).

    ``candidates[indptr[r]:indptr[r + 1]]`` are row r's candidates in increasing order, so a
    stable sort by distance breaks ties by index. Each distance is the square root of a sum of
    squared differences in a fixed order, a function of the two rows alone.
    """
    k = distances.shape[1]
    for r in range(queries.shape[0]):
        cand = candidates[indptr[r] : indptr[r + 1]]
        dist = np.empty(len(cand))
        for c in range(len(cand)):
            dist[c] = np.sqrt(_squared_distance(reference[cand[c]], queries[r]))
        order = np.argsort(dist, kind="mergesort")[:k]
        for j in range(k):
            distances[r, j] = dist[order[j]]
            indices[r, j] = cand[order[j]]


@numba.njit(cache=True)
def _squared_distance(a, b):
    # Four running sums in a fixed interleaving: the compiler may keep them in one vector
    # register, and the result still depends on the two rows alone.
    s0 = s1 = s2 = s3 = 0.0
    n = len(a)
    m = n - n % 4
    for i in range(0, m, 4):
        d0 = a[i] - b[i]
        d1 = a[i + 1] - b[i + 1]
        d2 = a[i + 2] - b[i + 2]
        d3 = a[i + 3] - b[i + 3]
        s0 += d0 * d0
        s1 += d1 * d1
        s2 += d2 * d2
        s3 += d3 * d3
    for i in range(m, n):
        d0 = a[i] - b[i]
        s0 += d0 * d0
    return (s0 + s1) + (s2 + s3)


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
