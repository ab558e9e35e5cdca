"""The bottom layer of an MBN: k-centers clusterings of the input rows.

A layer is V independent k-centers clusterings (``mbn_core.mbn.upper`` holds the one-hot
upper layers). Each clustering picks a random subset of the
input dimensions and k random training points as centers, and codes every point by its
nearest center. The functions that encode one clustering are pure functions of
(data, chosen features, centers) so a layer can be mapped over any pool of workers.

Exactness: the bottom layer ranks centers with a float32 GEMM, then re-ranks in float64 every
row whose runner-up lies within the GEMM's rounding-error bound. The result is the exact
nearest center (lowest index on exact ties) whatever the batch, so ``transform`` of a batch
equals ``transform`` of each row alone, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from mbn_core.mbn import _bottom_kernels, _kernels, coarse_pass
from mbn_core.mbn._integer_scores import (
    IntegerCenters,
    IntegerRows,
    integer_centers,
    integer_codes,
    integer_rows,
)
from mbn_core.mbn._scratch import ScratchArrays
from mbn_core.mbn.dtypes import smallest_uint

_FLOAT32_EPS = float(np.finfo(np.float32).eps) / 2  # unit roundoff u
_FLOAT64_EPS = float(np.finfo(np.float64).eps) / 2
# Re-rank rows whose runner-up is within this multiple of the worst-case GEMM error.
# 2 is the bound for two scores; the margin covers float64 re-ranking of candidates.
TIE_MARGIN = 4.0
# Rows per GEMM block: large enough that BLAS packs the centers rarely, small enough to
# bound memory (rows x k float32 scores per thread).
_BLOCK_BYTES = 16 << 20
# Batches up to this many dense rows are scored straight from the stored center rows
# (``bottom_codes_direct``): gathering a clustering's (k, d) centers for the GEMM costs more.
DIRECT_MAX_ROWS = 16
# The GEMM blocks' gathered input and scores, reused by each thread (see ``_scratch``).
_scratch = ScratchArrays()


def _block_rows(n_centers: int) -> int:
    return int(max(32, min(4096, _BLOCK_BYTES // (4 * max(n_centers, 1)))))


def bottom_clustering_codes(
    X: np.ndarray | sp.csr_matrix,
    features: np.ndarray,
    center_values: np.ndarray,
    metric: str,
    row_norms: np.ndarray | None = None,
) -> np.ndarray:
    """Nearest center of every row of X for one bottom-layer clustering.

    Parameters
    ----------
    X : ndarray of shape (n, d + 1), float32, or CSR matrix of shape (n, d), float32
        The input. A dense X carries a trailing column of ones (see ``with_ones_column``) so
        the squared-norm term rides inside the GEMM.
    features : ndarray of shape (d_chosen,)
        Indices of the chosen input dimensions.
    center_values : ndarray of shape (k, d_chosen), float32
        The centers restricted to the chosen dimensions.
    metric : {"euclidean", "cosine"}
        Smallest squared distance, or largest cosine similarity on the chosen dimensions.
    row_norms : ndarray of shape (n,), optional
        Upper bounds of the rows' Euclidean norms on the chosen dimensions (the full-row
        norms do); they size the rounding-error bound. Computed when not given.

    Returns
    -------
    codes : ndarray of shape (n,), int32
    """
    return _bottom_codes(X, features, center_values, metric, row_norms)


def _bottom_codes(X, features, center_values, metric, row_norms) -> np.ndarray:
    if sp.issparse(X):
        X = sp.csr_matrix(X)
    n_centers, n_chosen = center_values.shape
    center_values = np.ascontiguousarray(center_values, dtype=np.float32)
    # The GEMM computes x.w + bias, then argmax: bias = -|w|^2 / 2 gives the nearest center.
    weights = _scratch.array("weights", (n_chosen + 1, n_centers), np.float32)
    sq_norms = np.empty(n_centers, dtype=np.float64)
    _bottom_kernels.squared_norms(center_values, sq_norms)
    norms = np.sqrt(sq_norms)
    if metric == "euclidean":
        weights[:n_chosen] = center_values.T
        weights[n_chosen] = -0.5 * sq_norms
    else:
        safe = np.where(norms > 0, norms, 1.0)
        weights[:n_chosen] = (center_values.astype(np.float64) / safe[:, None]).T
        weights[n_chosen] = 0.0
    error_per_norm, error_const = _error_terms(norms, n_chosen, metric)

    n_rows = X.shape[0]
    codes = np.empty(n_rows, dtype=np.int32)
    block = _block_rows(n_centers)
    sparse_input = isinstance(X, sp.csr_matrix)
    if isinstance(X, sp.csr_matrix):
        X_chosen = X[:, features].tocsr()
    else:
        gather = np.append(features, X.shape[1] - 1)
    if row_norms is None:
        row_norms = input_row_norms(X_chosen if sparse_input else np.take(X, features, axis=1))
    for start in range(0, n_rows, block):
        stop = min(start + block, n_rows)
        if sparse_input:
            A = X_chosen[start:stop]
            scores = np.asarray(A @ weights[:n_chosen], dtype=np.float32)
            scores += weights[n_chosen]
        else:
            # mode="clip" writes straight into the scratch view ("raise" buffers the output).
            A = _scratch.array("input", (stop - start, gather.size), X.dtype)
            np.take(X[start:stop], gather, axis=1, out=A, mode="clip")
            scores_dtype = np.result_type(A, weights)
            scores = _scratch.array("scores", (stop - start, n_centers), scores_dtype)
            np.matmul(A, weights, out=scores)
        tolerance = _tolerance(row_norms[start:stop], error_per_norm, error_const)

        def chosen_row(i: int, A=A) -> np.ndarray:
            if sparse_input:
                return np.asarray(A[i].toarray(), dtype=np.float64).ravel()
            return A[i, :n_chosen].astype(np.float64)

        best = codes[start:stop]
        _pick_centers(
            scores,
            tolerance,
            chosen_row,
            lambda rows: center_values[rows].astype(np.float64),
            metric,
            best,
        )
    return codes


def _error_terms(
    norms: np.ndarray, n_chosen: int, metric: str, unit: float = _FLOAT32_EPS
) -> tuple[float, float]:
    """(per unit of the row's norm, constant) of the rounding-error bound of a float32 score
    summed at unit roundoff ``unit`` (float32's, or float64's for sums cast to float32)."""
    gamma = (n_chosen + 1) * unit / (1 - (n_chosen + 1) * unit)
    # The final float32 value adds float32's own roundoff when the sum was wider.
    last = unit + (_FLOAT32_EPS if unit < _FLOAT32_EPS else 0.0)
    if metric == "euclidean":
        w_max = float(norms.max()) if norms.size else 0.0
        return (gamma + last) * w_max, (gamma + last) * 0.5 * w_max**2
    return gamma + unit + last, 0.0


def _tolerance(x_norms: np.ndarray, error_per_norm: float, error_const: float) -> np.ndarray:
    return (TIE_MARGIN * (error_per_norm * x_norms + error_const)).astype(np.float32)


def _pick_centers(scores, tolerance, chosen_row, candidate_values, metric, best) -> None:
    """Best center of each row of ``scores``, re-ranking near ties exactly in float64.

    ``chosen_row(i)`` is row i's input on the chosen dimensions and ``candidate_values(idx)``
    the centers ``idx`` on them, both float64. Whichever way the scores were computed, the
    result is the float64 nearest center (lowest index on exact ties).
    """
    near_tie = np.empty(scores.shape[0], dtype=np.bool_)
    _bottom_kernels.best_scores(scores, tolerance, best, near_tie)
    for i in np.flatnonzero(near_tie):
        row = scores[i]
        candidates = np.flatnonzero(row >= row.max() - tolerance[i])
        values = candidate_values(candidates)
        best[i] = candidates[exact_best(chosen_row(i), values, metric)]


def bottom_codes_direct(
    X: np.ndarray, layer: BottomLayer, clustering: int, row_norms: np.ndarray
) -> np.ndarray:
    """``layer.clustering_codes`` for a few dense rows: same codes, no (k, d) center matrix.

    Scores come from ``_bottom_kernels.bottom_scores_direct``, read straight from the stored center
    rows, so a one-row request costs k * d multiply-adds per clustering instead of gathering
    and converting every clustering's centers.
    """
    features = layer.features(clustering)
    rows = layer.centers[clustering]
    mask = np.zeros(layer.n_features, dtype=np.float32)
    mask[features] = 1.0
    shifted = np.zeros(0, dtype=np.intp)
    if layer.shift_masks is not None:
        shifted = np.flatnonzero(
            np.unpackbits(layer.shift_masks[clustering], count=layer.n_features)
        )
    scores = np.empty((X.shape[0], len(rows)), dtype=np.float32)
    sq_norms = np.empty(len(rows), dtype=np.float64)
    X_chosen = X[:, : layer.n_features] * mask
    _bottom_kernels.bottom_scores_direct(
        X_chosen, layer.center_data, rows, mask, shifted, layer.metric == "cosine", scores, sq_norms
    )
    error_per_norm, error_const = _error_terms(np.sqrt(sq_norms), len(features), layer.metric)
    codes = np.empty(X.shape[0], dtype=np.int32)
    _pick_centers(
        scores,
        _tolerance(row_norms, error_per_norm, error_const),
        lambda i: X[i, features].astype(np.float64),
        lambda idx: layer.center_values(clustering, idx).astype(np.float64),
        layer.metric,
        codes,
    )
    return codes


def canonical_sparse(X):
    """Dense X as it is; sparse X with each (row, column) stored once, in order.

    A CSR matrix may list an entry twice, meaning the sum. The sparse products add both, but
    exact re-ranking reads entries one by one: without this, some codes differed
    from the dense route's on such input.
    """
    if sp.issparse(X) and not X.has_canonical_format:
        X = X.copy()
        X.sum_duplicates()
    return X


def bottom_codes_sparse(
    X: sp.csr_matrix, layer: BottomLayer, clustering: int, row_norms: np.ndarray
) -> np.ndarray:
    """``layer.clustering_codes`` for sparse rows and sparse centers (``_sparse_codes``)."""
    return _sparse_codes(X, layer, clustering, row_norms)


def _sparse_codes(
    X: sp.csr_matrix,
    layer: BottomLayer,
    clustering: int,
    row_norms: np.ndarray,
) -> np.ndarray:
    """``layer.clustering_codes`` for sparse rows and sparse centers: same codes, nothing
    made dense but the (rows, k) scores.

    The chosen dimensions mask the centers alone (x . (c * mask) is x . c on them), so
    neither side is sliced by column, and the products cost the nonzeros that rows and
    centers share. Scores are float64 sums cast to float32: their error bound is about one
    float32 roundoff, not d_chosen of them, so few rows are near ties that ``_pick_centers``
    must re-rank (whole-number counts still make exact ones).
    """
    features = layer.features(clustering)
    # Each chosen dimension's place among them (-1: not chosen): masks the centers, and
    # scatters rows into dense vectors for re-ranking near ties.
    position = np.full(layer.n_features, -1, dtype=np.int32)
    position[features] = np.arange(len(features), dtype=np.int32)
    centers = sp.csr_matrix(layer.center_data[layer.centers[clustering]], dtype=np.float64)
    centers.data[position[centers.indices] < 0] = 0.0
    centers.eliminate_zeros()  # so that the products cost the chosen words only
    sq_norms = np.asarray(centers.multiply(centers).sum(axis=1), dtype=np.float64).ravel()
    norms = np.sqrt(sq_norms)
    if layer.metric == "euclidean":
        scale, shift = np.ones_like(norms), -0.5 * sq_norms
    else:
        scale, shift = 1.0 / np.where(norms > 0, norms, 1.0), np.zeros_like(norms)
    error_per_norm, error_const = _error_terms(norms, len(features), layer.metric, _FLOAT64_EPS)
    centers_t = sp.csc_matrix(centers.T)
    # Near ties (short texts tie often: the same length, no word shared with either center)
    # are re-ranked from dense vectors scattered through ``position``, not CSR column slices.
    X = canonical_sparse(sp.csr_matrix(X))
    codes = np.empty(X.shape[0], dtype=np.int32)
    block = _block_rows(len(norms))

    def candidate_values(idx):
        return _chosen_dense(centers, idx, position, len(features))

    for start in range(0, X.shape[0], block):
        stop = min(start + block, X.shape[0])
        rows = sp.csr_matrix(X[start:stop], dtype=np.float64)
        products = (rows @ centers_t).toarray()
        products *= scale
        products += shift
        scores = products.astype(np.float32)
        tolerance = _tolerance(row_norms[start:stop], error_per_norm, error_const)

        def chosen_row(i: int, rows=rows) -> np.ndarray:
            return _chosen_dense(rows, [i], position, len(features))[0]

        best = codes[start:stop]
        _pick_centers(scores, tolerance, chosen_row, candidate_values, layer.metric, best)
    return codes


def _chosen_dense(matrix: sp.csr_matrix, rows, position: np.ndarray, n_chosen: int) -> np.ndarray:
    """float64 (len(rows), n_chosen): rows of ``matrix`` on the chosen dimensions, which
    ``position`` numbers (-1: not chosen)."""
    out = np.zeros((len(rows), n_chosen), dtype=np.float64)
    for j, row in enumerate(rows):
        begin, end = matrix.indptr[row], matrix.indptr[row + 1]
        at = position[matrix.indices[begin:end]]
        kept = at >= 0
        out[j, at[kept]] = matrix.data[begin:end][kept]
    return out


def exact_best(x: np.ndarray, W: np.ndarray, metric: str) -> int:
    """Index of the best of a few candidate centers, ranked in float64 in a fixed order.

    Computed from the candidates' rows alone (norms included), so every scoring path that
    proposes the same candidates gets the same answer.
    """
    if metric == "euclidean":
        distances = ((W - x) ** 2).sum(axis=1)
        return int(np.argmin(distances))
    norms = np.sqrt((W * W).sum(axis=1))
    similarity = (W * x).sum(axis=1)
    similarity = np.divide(similarity, norms, out=np.zeros_like(similarity), where=norms > 0)
    return int(np.argmax(similarity))


def input_row_norms(X: np.ndarray | sp.csr_matrix) -> np.ndarray:
    """float64 Euclidean norms of the rows of X (without the ones column, if any)."""
    if sp.issparse(X):
        X = sp.csr_matrix(X)
        squares = X.multiply(X).sum(axis=1)
        return np.sqrt(np.asarray(squares, dtype=np.float64).ravel())
    norms = np.empty(X.shape[0], dtype=np.float64)
    for start in range(0, X.shape[0], 4096):
        block = X[start : start + 4096].astype(np.float64)
        norms[start : start + 4096] = np.sqrt(np.einsum("ij,ij->i", block, block))
    return norms


def bottom_input(X, layer: BottomLayer) -> np.ndarray | sp.csr_matrix | IntegerRows:
    """The working copy of validated input X that ``layer.clustering_codes`` reads.

    Small-integer dense data (images) is scored in exact integer arithmetic
    (``_integer_scores``); other dense input as float32 with a ones column; sparse input as
    float32 CSR. Batches of a few rows keep the float copy, for the direct route.
    """
    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=np.float32)
        X.sort_indices()
        return X
    if X.shape[0] > DIRECT_MAX_ROWS and not sp.issparse(layer.center_data):
        rows = integer_rows(X, layer.center_data)
        if rows is not None:
            return rows
    return with_ones_column(X)


def with_ones_column(X: np.ndarray) -> np.ndarray:
    """float32 copy of dense X with a trailing column of ones (the GEMM's bias input)."""
    out = np.empty((X.shape[0], X.shape[1] + 1), dtype=np.float32)
    out[:, :-1] = X
    out[:, -1] = 1.0
    return out


@dataclass(frozen=True)
class BottomLayer:
    """A fitted bottom layer: V k-centers clusterings of the raw input.

    Attributes
    ----------
    feature_masks : ndarray of shape (V, ceil(d / 8)), uint8
        Bit-packed chosen input dimensions of each clustering.
    shift_masks : ndarray of shape (V, ceil(d / 8)), uint8, or None
        Bit-packed dimensions whose center values are cyclically shifted by one center
        (the random reconstruction of the arXiv version); None when disabled.
    centers : ndarray of shape (V, k), unsigned int
        Rows of ``center_data`` that serve as each clustering's centers.
    center_data : ndarray or CSR matrix of shape (n_center_rows, d)
        The training rows used as centers, in the smallest exact dtype.
    metric : {"euclidean", "cosine"}
    """

    feature_masks: np.ndarray
    shift_masks: np.ndarray | None
    centers: np.ndarray
    center_data: np.ndarray | sp.csr_matrix
    metric: str

    @property
    def n_centers(self) -> int:
        return int(self.centers.shape[1])

    @property
    def n_features(self) -> int:
        return int(self.center_data.shape[1])

    def features(self, clustering: int) -> np.ndarray:
        bits = np.unpackbits(self.feature_masks[clustering], count=self.n_features)
        return np.flatnonzero(bits)

    def center_values(self, clustering: int, subset: np.ndarray | None = None) -> np.ndarray:
        """The (k, d_chosen) float32 centers of one clustering, reconstruction applied.

        ``subset`` selects some of the k centers (by index) without building the others.
        """
        features = self.features(clustering)
        rows = self.centers[clustering]
        index = np.arange(len(rows)) if subset is None else np.asarray(subset)
        values = self._values(rows[index], features)
        if self.shift_masks is not None:
            shifted = np.unpackbits(self.shift_masks[clustering], count=self.n_features)
            local = np.flatnonzero(shifted[features])
            # Reconstruction: a shifted dimension takes the previous center's value.
            previous = self._values(rows[(index - 1) % len(rows)], features[local])
            values[:, local] = previous
        return values

    def integer_centers(self, clustering: int, features: np.ndarray, low: int) -> IntegerCenters:
        """One clustering's centers for the integer kernel (rows shifted by ``low``), read
        straight from the stored center rows: no float32 copy in between, so a small batch
        does not pay more for its centers than for its products."""
        if isinstance(self.center_data, sp.csr_matrix):
            values = self.center_values(clustering)
            k, n_chosen = values.shape
            return integer_centers(values, np.arange(k), np.arange(n_chosen), low, self.metric)
        from_previous = None
        if self.shift_masks is not None:
            shifted = np.unpackbits(self.shift_masks[clustering], count=self.n_features)
            from_previous = shifted[features].astype(np.bool_)
        return integer_centers(
            self.center_data, self.centers[clustering], features, low, self.metric, from_previous
        )

    def _values(self, rows: np.ndarray, features: np.ndarray) -> np.ndarray:
        if isinstance(self.center_data, sp.csr_matrix):
            values = self.center_data[rows][:, features].toarray()
            return np.asarray(values, dtype=np.float32)
        out = np.empty((len(rows), len(features)), dtype=np.float32)
        _bottom_kernels.gather_rows(self.center_data, rows, features, out)
        return out

    @property
    def few_rows_supported(self) -> bool:
        """Whether ``codes_few`` applies: dense centers without random reconstruction."""
        return self.shift_masks is None and not sp.issparse(self.center_data)

    @cached_property
    def _masks(self) -> np.ndarray:
        # (V, d) uint8 0/1: the chosen dimensions, unpacked once for ``codes_few``.
        return np.unpackbits(self.feature_masks, axis=1, count=self.n_features)

    @cached_property
    def _center_sq_norms(self) -> np.ndarray:
        # (V, k): the centers' squared norms on their chosen dimensions, computed on the
        # first small request (one pass over the centers) and kept. Centers stored as uint8
        # have whole-number norms below 2**32, held exactly in uint32 (half of float64).
        d = self.n_features
        exact_uint32 = self.center_data.dtype == np.uint8 and d * 255**2 < 2**32
        out = np.empty(self.centers.shape, dtype=np.uint32 if exact_uint32 else np.float64)
        _bottom_kernels.bottom_center_norms(self.center_data, self.centers, self._masks, out)
        return out

    @cached_property
    def _row_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        # The centers by stored row (``_kernels.build_row_pairs``), for ``codes_few``'s one
        # pass over ``center_data``: V * k uint32 keys plus a pointer per stored row.
        n_rows = self.center_data.shape[0]
        row_start = np.empty(n_rows + 1, dtype=np.int32 if self.centers.size < 2**31 else np.int64)
        pairs = np.empty(self.centers.size, dtype=smallest_uint(max(self.centers.size - 1, 0)))
        _kernels.build_row_pairs(self.centers, row_start, pairs)
        return row_start, pairs

    def codes_few(self, X: np.ndarray, row_norms: np.ndarray) -> np.ndarray:
        """Codes of a few dense rows in all V clusterings, straight from the stored rows.

        Same codes as ``clustering_codes`` for every clustering (near ties are re-ranked
        exactly); needs ``few_rows_supported``. One row is scored in one pass over the
        stored rows (``bottom_codes_few``); several rows clustering by clustering, a few rows
        per pass over each center (``bottom_codes_batch``), so that each costs less than
        alone.

        Parameters
        ----------
        X : ndarray of shape (n, d) or (n, d + 1), float32
            The rows (a trailing ones column, if any, is ignored).
        row_norms : ndarray of shape (n,)
            The rows' Euclidean norms (``input_row_norms``).

        Returns
        -------
        codes : ndarray of shape (n, V), smallest unsigned dtype for k
        """
        X = np.ascontiguousarray(X[:, : self.n_features], dtype=np.float32)
        row_norms = np.asarray(row_norms, dtype=np.float64)
        if len(X) == 1:
            codes = self._one_row_codes(X, row_norms)
        else:
            codes = self._batch_codes(X, row_norms)
        return codes.astype(smallest_uint(self.n_centers - 1))

    def _one_row_codes(self, X: np.ndarray, row_norms: np.ndarray) -> np.ndarray:
        n_points = X.shape[0]
        V = self.centers.shape[0]
        codes = np.empty((n_points, V), dtype=np.int32)
        near_tie = np.empty((n_points, V), dtype=np.bool_)
        row_start, pairs = self._row_pairs
        _bottom_kernels.bottom_codes_few(
            X,
            self.center_data,
            row_start,
            pairs,
            self._masks,
            self._center_sq_norms,
            self.metric == "cosine",
            TIE_MARGIN,
            row_norms,
            codes,
            near_tie,
        )
        for i, v in zip(*np.nonzero(near_tie), strict=True):
            codes[i, v] = bottom_codes_direct(X[i : i + 1], self, int(v), row_norms[i : i + 1])[0]
        return codes

    def _batch_codes(self, X: np.ndarray, row_norms: np.ndarray) -> np.ndarray:
        codes = np.empty((X.shape[0], self.centers.shape[0]), dtype=np.int32)
        n_ties, ties, candidates = _bottom_kernels.bottom_codes_batch(
            X,
            self.center_data,
            self.centers,
            self._masks,
            self._center_sq_norms,
            self.metric == "cosine",
            TIE_MARGIN,
            row_norms,
            codes,
            np.empty((16, 4), dtype=np.int64),
            np.empty(256, dtype=np.int64),
        )
        # Near ties, re-ranked exactly as ``_pick_centers`` re-ranks them.
        for i, v, start, stop in ties[:n_ties].tolist():
            near = candidates[start:stop]
            values = self.center_values(v, near).astype(np.float64)
            chosen = X[i, self.features(v)].astype(np.float64)
            codes[i, v] = near[exact_best(chosen, values, self.metric)]
        return codes

    def clustering_codes(
        self, X: np.ndarray | sp.csr_matrix | IntegerRows, clustering: int, row_norms: np.ndarray
    ) -> np.ndarray:
        if isinstance(X, IntegerRows):
            features = self.features(clustering)
            centers = self.integer_centers(clustering, features, X.low)
            if coarse_pass.pays(X.shape[0], centers):
                codes = coarse_pass.coarse_codes(X, features, centers)
                if codes is not None:
                    return codes
            return integer_codes(X, features, centers)
        if sp.issparse(X) and sp.issparse(self.center_data) and self.shift_masks is None:
            return bottom_codes_sparse(X, self, clustering, row_norms)
        if (
            X.shape[0] <= DIRECT_MAX_ROWS
            and not sp.issparse(X)
            and not sp.issparse(self.center_data)
        ):
            return bottom_codes_direct(X, self, clustering, row_norms)
        return bottom_clustering_codes(
            X, self.features(clustering), self.center_values(clustering), self.metric, row_norms
        )

    @property
    def nbytes(self) -> int:
        arrays = [self.feature_masks, self.centers]
        if self.shift_masks is not None:
            arrays.append(self.shift_masks)
        data = self.center_data
        if isinstance(data, sp.csr_matrix):
            arrays += [data.data, data.indices, data.indptr]
        else:
            arrays.append(data)
        return sum(a.nbytes for a in arrays)
