"""The k-centers layers of an MBN: a dense bottom layer and one-hot upper layers.

A layer is V independent k-centers clusterings. Each clustering picks a random subset of the
input dimensions and k random training points as centers, and codes every point by its
nearest center. The functions that encode one clustering are pure functions of
(data, chosen features, centers) so a layer can be mapped over any pool of workers.

Exactness: the bottom layer ranks centers with a float32 GEMM, then re-ranks in float64 every
row whose runner-up lies within the GEMM's rounding-error bound. The result is the exact
nearest center (lowest index on exact ties) whatever the batch, so ``transform`` of a batch
equals ``transform`` of each row alone, bit for bit.
"""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from mbn_core.mbn import _kernels
from mbn_core.mbn._scratch import ScratchArrays

_FLOAT32_EPS = float(np.finfo(np.float32).eps) / 2  # unit roundoff u
_FLOAT64_EPS = float(np.finfo(np.float64).eps) / 2
# Re-rank rows whose runner-up is within this multiple of the worst-case GEMM error.
# 2 is the bound for two scores; the margin covers float64 re-ranking of candidates.
_TIE_MARGIN = 4.0
# Rows per GEMM block: large enough that BLAS packs the centers rarely, small enough to
# bound memory (rows x k float32 scores per thread).
_BLOCK_BYTES = 16 << 20
# Batches up to this many dense rows are scored straight from the stored center rows
# (``bottom_codes_direct``): gathering a clustering's (k, d) centers for the GEMM costs more.
DIRECT_MAX_ROWS = 16
# The GEMM blocks' gathered input and scores, reused by each thread (see ``_scratch``).
_scratch = ScratchArrays()


def smallest_uint(max_value: int) -> type[np.unsignedinteger]:
    """The narrowest unsigned dtype holding values in [0, max_value]."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if max_value <= np.iinfo(dtype).max:
            return dtype
    return np.uint64


def compact_values(X: np.ndarray) -> np.ndarray:
    """Store dense input in the smallest dtype that holds it exactly as float32.

    Images arrive as uint8 pixels or floats that are whole numbers; storing them as uint8 or
    uint16 quarters or halves the exact model without changing any computed distance.
    """
    X32 = np.asarray(X, dtype=np.float32)
    if X32.size and np.array_equal(X32, np.rint(X32)):
        low, high = float(X32.min()), float(X32.max())
        if low >= 0:
            dtype = smallest_uint(int(high))
            if dtype in (np.uint8, np.uint16):
                return X32.astype(dtype)
    return X32


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
    _kernels.squared_norms(center_values, sq_norms)
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
    return (_TIE_MARGIN * (error_per_norm * x_norms + error_const)).astype(np.float32)


def _pick_centers(scores, tolerance, chosen_row, candidate_values, metric, best) -> None:
    """Best center of each row of ``scores``, re-ranking near ties exactly in float64.

    ``chosen_row(i)`` is row i's input on the chosen dimensions and ``candidate_values(idx)``
    the centers ``idx`` on them, both float64. Whichever way the scores were computed, the
    result is the float64 nearest center (lowest index on exact ties).
    """
    near_tie = np.empty(scores.shape[0], dtype=np.bool_)
    _kernels.best_scores(scores, tolerance, best, near_tie)
    for i in np.flatnonzero(near_tie):
        row = scores[i]
        candidates = np.flatnonzero(row >= row.max() - tolerance[i])
        values = candidate_values(candidates)
        best[i] = candidates[_exact_best(chosen_row(i), values, metric)]


def bottom_codes_direct(
    X: np.ndarray, layer: BottomLayer, clustering: int, row_norms: np.ndarray
) -> np.ndarray:
    """``layer.clustering_codes`` for a few dense rows: same codes, no (k, d) center matrix.

    Scores come from ``_kernels.bottom_scores_direct``, read straight from the stored center
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
    _kernels.bottom_scores_direct(
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
    exact re-ranking reads entries one by one: without this, 129 of 10,000 codes differed
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


def _exact_best(x: np.ndarray, W: np.ndarray, metric: str) -> int:
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

    def _values(self, rows: np.ndarray, features: np.ndarray) -> np.ndarray:
        if isinstance(self.center_data, sp.csr_matrix):
            values = self.center_data[rows][:, features].toarray()
            return np.asarray(values, dtype=np.float32)
        out = np.empty((len(rows), len(features)), dtype=np.float32)
        _kernels.gather_rows(self.center_data, rows, features, out)
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
        _kernels.bottom_center_norms(self.center_data, self.centers, self._masks, out)
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
        """Codes of a few dense rows in all V clusterings, in one pass over the centers.

        Same codes as ``clustering_codes`` for every clustering (near ties are re-ranked
        exactly by ``bottom_codes_direct``); needs ``few_rows_supported``.

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
        n_points = X.shape[0]
        V = self.centers.shape[0]
        codes = np.empty((n_points, V), dtype=np.int32)
        near_tie = np.empty((n_points, V), dtype=np.bool_)
        row_start, pairs = self._row_pairs
        _kernels.bottom_codes_few(
            np.ascontiguousarray(X[:, : self.n_features], dtype=np.float32),
            self.center_data,
            row_start,
            pairs,
            self._masks,
            self._center_sq_norms,
            self.metric == "cosine",
            _TIE_MARGIN,
            np.asarray(row_norms, dtype=np.float64),
            codes,
            near_tie,
        )
        for i, v in zip(*np.nonzero(near_tie), strict=True):
            codes[i, v] = bottom_codes_direct(X[i : i + 1], self, int(v), row_norms[i : i + 1])[0]
        return codes.astype(smallest_uint(self.n_centers - 1))

    def clustering_codes(
        self, X: np.ndarray | sp.csr_matrix, clustering: int, row_norms: np.ndarray
    ) -> np.ndarray:
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


def keep_threshold(fraction: float) -> np.uint64:
    """Hash threshold that keeps a one-hot dimension with probability ``fraction``."""
    return np.uint64(min(int(fraction * 2.0**64), 2**64 - 1))


@dataclass(frozen=True)
class CodeIndex:
    """The center rows of an upper layer by (clustering, code): the center codes inverted.

    Each row has one code per clustering, so clustering v's lists fill ``rows[v * n_rows:
    (v + 1) * n_rows]``; the rows whose code in clustering v is c are
    ``rows[v * n_rows + offsets[v, c]:v * n_rows + offsets[v, c + 1]]``, in increasing order
    (``rows_with``). ``rows`` has as many entries as the code matrix and ``offsets`` V x
    (n_values + 1), both in the smallest dtype that numbers the rows, so the index replaces
    the matrix in memory; the matrix is rebuilt from it when a large batch needs it
    (``codes``).
    """

    offsets: np.ndarray
    rows: np.ndarray
    n_rows: int
    n_values: int
    code_dtype: np.dtype

    @classmethod
    def build(cls, center_codes: np.ndarray, n_values: int) -> CodeIndex:
        """Invert a (n_rows, V) code matrix with values in [0, n_values)."""
        n_rows, n_clusterings = center_codes.shape
        offsets = np.empty((n_clusterings, n_values + 1), dtype=smallest_uint(n_rows))
        rows = np.empty(n_rows * n_clusterings, dtype=smallest_uint(max(n_rows - 1, 0)))
        _kernels.build_code_index(center_codes, offsets, rows)
        return cls(
            offsets=offsets,
            rows=rows,
            n_rows=n_rows,
            n_values=n_values,
            code_dtype=center_codes.dtype,
        )

    def rows_with(self, clustering: int, code: int) -> np.ndarray:
        """The rows whose code in ``clustering`` is ``code``, in increasing order."""
        base = clustering * self.n_rows
        start, stop = self.offsets[clustering, code : code + 2].astype(np.int64)
        return self.rows[base + start : base + stop]

    def codes(self) -> np.ndarray:
        """The (n_rows, V) code matrix the index was built from."""
        out = np.empty((self.n_rows, self.offsets.shape[0]), dtype=self.code_dtype)
        _kernels.fill_codes_from_index(self.offsets, self.rows, out)
        return out

    @property
    def nbytes(self) -> int:
        return self.offsets.nbytes + self.rows.nbytes


@dataclass(frozen=True)
class UpperLayer:
    """A fitted upper layer: V k-centers clusterings of the previous layer's one-hot codes.

    The input is the concatenation of the previous layer's V one-hot codes, V * k_prev
    dimensions. Each clustering keeps every one of them with probability
    ``feature_fraction``, decided by hashing (seed, dimension): the choice is never
    materialised, and is evaluated only where a center has a one.

    Build with ``UpperLayer.create``: it stores the center codes either as the matrix or as
    its ``CodeIndex`` (the faster for small requests, kept where it is no larger).

    Attributes
    ----------
    centers : ndarray of shape (V, k), unsigned int
        Rows of ``center_codes`` that serve as each clustering's centers.
    seeds : ndarray of shape (V,), uint64
        Seeds of each clustering's dimension choice.
    n_values : int
        k of the previous layer (codes lie in [0, n_values)).
    feature_fraction : float
        Probability that a one-hot dimension is chosen.
    stored_codes : ndarray of shape (n_center_rows, V_prev), unsigned int, or None
        Previous-layer codes of the training points used as centers, when kept as a matrix.
    index : CodeIndex or None
        The same codes inverted, when kept as an index.
    """

    centers: np.ndarray
    seeds: np.ndarray
    n_values: int
    feature_fraction: float
    stored_codes: np.ndarray | None = None
    index: CodeIndex | None = None

    @classmethod
    def create(
        cls,
        centers: np.ndarray,
        center_codes: np.ndarray,
        seeds: np.ndarray,
        n_values: int,
        feature_fraction: float,
    ) -> UpperLayer:
        """A layer storing ``center_codes`` as the matrix or as its index (see the class).

        The index answers a small request in fewer steps in every layer measured (MNIST-60k
        default model: 2.2 to 2.8 ms a row for the wide layers, against 7.5 ms for the
        matrix of layer 3), so it is kept wherever it takes no more memory than the matrix:
        where the row numbers are no wider than the codes. Deep layers (codes < 256 of
        thousands of rows) keep the matrix, half the size.
        """
        n_rows = center_codes.shape[0]
        row_dtype = np.dtype(smallest_uint(max(n_rows - 1, 0)))
        if row_dtype.itemsize <= center_codes.dtype.itemsize:
            return cls(
                centers, seeds, n_values, feature_fraction,
                index=CodeIndex.build(center_codes, n_values),
            )  # fmt: skip
        return cls(centers, seeds, n_values, feature_fraction, stored_codes=center_codes)

    @property
    def center_codes(self) -> np.ndarray:
        """(n_center_rows, V_prev) previous-layer codes of the center rows (rebuilt from the
        index when the layer keeps one: a copy, not a view)."""
        if self.stored_codes is not None:
            return self.stored_codes
        assert self.index is not None
        return self.index.codes()

    @property
    def n_centers(self) -> int:
        return int(self.centers.shape[1])

    def codes_few(self, codes: np.ndarray) -> np.ndarray:
        """This layer's codes of a few points from their previous-layer ``codes``.

        Every clustering, over the index or the code matrix, with nothing rebuilt per call:
        the same codes as ``upper_clustering_codes`` over any layout.
        """
        out = np.empty((codes.shape[0], self.centers.shape[0]), dtype=np.int32)
        threshold = keep_threshold(self.feature_fraction)
        keep_all = self.feature_fraction >= 1.0
        row_start, pairs = self._row_pairs
        if self.index is not None:
            _kernels.upper_codes_indexed_by_row(
                codes, self.index.offsets, self.index.rows, row_start, pairs, self.n_centers,
                self.seeds, self.n_values, threshold, keep_all, out,
            )  # fmt: skip
        else:
            assert self.stored_codes is not None
            _kernels.upper_codes_dense_by_row(
                codes.astype(self.stored_codes.dtype), self.stored_codes, row_start, pairs,
                self.n_centers, self.seeds, self.n_values, threshold, keep_all, out,
            )  # fmt: skip
        return out.astype(smallest_uint(self.n_centers - 1))

    @cached_property
    def _row_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        # The centers by stored code row, for ``codes_few``: V * k keys plus a pointer per
        # stored row, so that each stored row is visited once for every center it is.
        n_rows = self.index.n_rows if self.index is not None else len(self.center_codes)
        row_start = np.empty(n_rows + 1, dtype=np.int32 if self.centers.size < 2**31 else np.int64)
        pairs = np.empty(self.centers.size, dtype=smallest_uint(max(self.centers.size - 1, 0)))
        _kernels.build_row_pairs(self.centers, row_start, pairs)
        return row_start, pairs

    @property
    def nbytes(self) -> int:
        stored = self.stored_codes.nbytes if self.stored_codes is not None else 0
        indexed = self.index.nbytes if self.index is not None else 0
        return self.centers.nbytes + stored + indexed + self.seeds.nbytes


# Posting lists are laid out per center row (see ``_kernels.inline_postings``) while they
# average at most this many points and the copy stays under INLINE_MAX_BYTES; longer lists
# are read in place, where they are long sequential runs anyway. Measured on MNIST 5k: lists
# of 8 points are read twice as fast inline, lists of 16 equally fast, for a dearer copy.
INLINE_MAX_MEAN = 12.0
INLINE_MAX_BYTES = 256 << 20


@dataclass(frozen=True)
class Postings:
    """Posting lists of a batch's previous-layer codes, located for a layer's center rows.

    Shared by all V clusterings of a layer: built once per layer and batch. Stored in the
    narrowest dtypes that fit, because the kernels' random reads are only cheap while these
    arrays stay within a few megabytes of cache. Either ``rows`` / ``start`` / ``length``
    (lists read in place) or ``segments`` / ``neighbors`` (lists copied per center row) are set.
    """

    n_points: int
    centers_are_points: bool = False
    rows: np.ndarray | None = None
    start: np.ndarray | None = None
    length: np.ndarray | None = None
    segments: np.ndarray | None = None
    neighbors: np.ndarray | None = None

    @classmethod
    def build(
        cls,
        codes: np.ndarray,
        center_codes: np.ndarray,
        n_values: int,
        inline: bool | None = None,
        centers_are_points: bool = False,
        pool: Executor | None = None,
    ) -> Postings:
        """Invert ``codes`` and locate the lists of every center row.

        ``inline`` forces a layout; None chooses by the lists' mean length and size.
        ``centers_are_points`` says that center row r is the batch's point r (training: the
        centers are training points), which the inline layout uses to skip self matches.
        ``pool`` shares the copy of the inline layout between two of its threads.
        """
        n_points = codes.shape[0]
        indptr, rows = _kernels.build_postings(codes, n_values)
        point_dtype = smallest_uint(max(n_points - 1, 0))
        n_centers, n_clusterings = center_codes.shape
        start = np.empty(center_codes.shape, dtype=np.int32 if rows.size < 2**31 else np.int64)
        longest = int(np.diff(indptr).max()) if indptr.size > 1 else 0
        length = np.empty(center_codes.shape, dtype=smallest_uint(longest))
        _kernels.locate_postings(indptr, center_codes, n_values, start, length)
        total = int(length.sum(dtype=np.int64))
        if inline is None:
            inline = (
                total <= INLINE_MAX_MEAN * n_centers * n_clusterings
                and total * np.dtype(point_dtype).itemsize <= INLINE_MAX_BYTES
            )
        if inline:
            # Self matches are left out when the centers are the points.
            counts = length.astype(np.int64) - (1 if centers_are_points else 0)
            ends = np.cumsum(counts, axis=None).reshape(counts.shape)
            segments = np.empty(
                (n_centers, n_clusterings + 1), dtype=np.int32 if total < 2**31 else np.int64
            )
            segments[:, :n_clusterings] = ends - counts
            segments[:, n_clusterings] = ends[:, -1]
            neighbors = np.zeros(int(ends[-1, -1]) + _kernels.ROW_PAD, dtype=point_dtype)

            def fill(part: tuple[int, int]) -> None:
                if centers_are_points:
                    _kernels.inline_own_postings(indptr, rows, n_values, segments, neighbors, *part)
                else:
                    _kernels.inline_postings(
                        indptr, rows, center_codes, n_values, segments, neighbors, *part
                    )

            # Memory-latency bound: worth both cores even though it runs once per layer.
            n_parts = n_clusterings if centers_are_points else n_centers
            cuts = np.linspace(0, n_parts, 3 if pool is not None else 2).astype(int)
            parts = list(zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True))
            if pool is None:
                fill(parts[0])
            else:
                list(pool.map(fill, parts))
            return cls(
                n_points=n_points,
                centers_are_points=centers_are_points,
                segments=segments,
                neighbors=neighbors,
            )
        padded = np.zeros(rows.size + _kernels.ROW_PAD, dtype=point_dtype)
        padded[: rows.size] = rows
        return cls(n_points=n_points, rows=padded, start=start, length=length)


@dataclass(frozen=True)
class PointPostings:
    """The center rows sharing each code of a small batch (``_kernels.batch_key_postings``).

    The layout for a few rows (a request): one pass over the center codes per layer, then
    each clustering costs about k + (shared codes) per point instead of k * V.
    """

    n_points: int
    n_center_rows: int
    codes: np.ndarray
    point_keys: np.ndarray
    indptr: np.ndarray
    rows: np.ndarray

    @classmethod
    def build(cls, codes: np.ndarray, center_codes: np.ndarray, n_values: int) -> PointPostings:
        point_keys, indptr, rows = _kernels.batch_key_postings(codes, center_codes, n_values)
        return cls(
            n_points=codes.shape[0],
            n_center_rows=center_codes.shape[0],
            codes=codes,
            point_keys=point_keys,
            indptr=indptr,
            rows=rows,
        )

    @staticmethod
    def cheaper(
        n_points: int, n_center_rows: int, n_values: int, k: int, V: int, fraction: float
    ) -> bool:
        """Whether this layout beats ``Postings`` for a batch (estimated work per clustering)."""
        per_point = V + fraction * V * n_center_rows / n_values + k
        per_center = V * (1 + fraction * n_points / n_values)
        return n_points * per_point < k * per_center


def upper_clustering_codes(
    postings: Postings | PointPostings,
    center_codes: np.ndarray,
    centers: np.ndarray,
    n_values: int,
    seed: np.uint64,
    feature_fraction: float,
) -> np.ndarray:
    """Nearest center of every point of a batch for one upper-layer clustering.

    Parameters
    ----------
    postings : Postings or PointPostings
        The batch's previous-layer codes, inverted (``Postings.build``), or the center rows
        sharing each of them (``PointPostings.build``, for small batches).
    center_codes : ndarray of shape (n_center_rows, V_prev), unsigned int
        Previous-layer codes of the candidate center rows.
    centers : ndarray of shape (k,), int32
        This clustering's centers, as rows of ``center_codes``.
    n_values : int
        k of the previous layer.
    seed : uint64
        Seed of this clustering's choice of one-hot dimensions.
    feature_fraction : float
        Probability that a one-hot dimension is chosen.

    Returns
    -------
    codes : ndarray of shape (n_points,), int32
    """
    out = np.empty(postings.n_points, dtype=np.int32)
    choice = (np.uint64(seed), keep_threshold(feature_fraction), feature_fraction >= 1.0)
    if isinstance(postings, PointPostings):
        _kernels.upper_codes_by_point(
            postings.codes,
            postings.point_keys,
            postings.indptr,
            postings.rows,
            centers,
            postings.n_center_rows,
            n_values,
            *choice,
            out,
        )
    elif postings.segments is not None:
        _kernels.upper_codes_inline(
            postings.segments,
            postings.neighbors,
            center_codes,
            centers,
            n_values,
            *choice,
            postings.centers_are_points,
            postings.n_points,
            out,
        )
    else:
        _kernels.upper_codes(
            postings.rows,
            postings.start,
            postings.length,
            center_codes,
            centers,
            n_values,
            *choice,
            postings.n_points,
            out,
        )
    return out
