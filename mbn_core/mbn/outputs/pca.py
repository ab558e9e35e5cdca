"""The PCA output (the paper's): PCA of the top layer's one-hot codes.

The fitted PCA is kept as a lookup table: a row's embedding is the sum over clusterings of
the table's entry for its code there, minus an offset, so embedding costs V additions per
dimension and never builds the one-hot matrix.

Small code matrices are decomposed densely (LAPACK's SVD, scikit-learn's "full" PCA). Large
ones by ARPACK, as scikit-learn's "arpack" PCA does, with the centred one-hot matrix as an
operator read straight from the codes (``OneHotCodes``): a product reads the (n, V) codes,
V bytes a row, where a sparse one-hot matrix is 12 V bytes a row, and nothing of that size is
built. Its sums run in another order than SciPy's sparse products, so the embedding differs
from scikit-learn's on the same codes by rounding (docs/decisions/0031-training-speed.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse.linalg
from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator
from sklearn.utils import check_random_state
from sklearn.utils.extmath import svd_flip

from mbn_core.mbn import _kernels, _one_hot_kernels
from mbn_core.mbn.coassociation import one_hot
from mbn_core.mbn.outputs.base import (
    FittedOutput,
    Output,
    OutputProgress,
    StoredArrays,
)
from mbn_core.utils.pca import fit_pca

# Above this many one-hot entries the PCA runs sparse (ARPACK) instead of dense.
DENSE_PCA_MAX_ENTRIES = 5_000_000


@dataclass(frozen=True)
class PcaTop(FittedOutput):
    """PCA of the last layer's one-hot codes, as a lookup table."""

    table: np.ndarray  # (V, k_L, n_components) float64
    offset: np.ndarray  # (n_components,) float64
    variance_ratio: np.ndarray

    @property
    def n_components(self) -> int:
        return int(self.table.shape[2])

    @property
    def nbytes(self) -> int:
        return self.table.nbytes + self.offset.nbytes

    @property
    def explained_variance_ratio(self) -> np.ndarray:
        return self.variance_ratio

    def embed(self, bottom_codes: np.ndarray, top_codes: np.ndarray) -> np.ndarray:
        out = np.empty((top_codes.shape[0], self.table.shape[2]), dtype=np.float64)
        _kernels.project_codes(top_codes, self.table, self.offset, out)
        return out

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "top.table": self.table,
            "top.offset": self.offset,
            "top.explained_variance_ratio": self.variance_ratio,
        }


class PcaOutput(Output):
    """PCA of the top layer's one-hot codes (see the module docstring)."""

    name = "pca"
    array_prefix = "top."

    def fit(
        self,
        bottom_codes: np.ndarray,
        top_codes: np.ndarray,
        ks: list[int],
        n_components: int,
        rng: np.random.RandomState,
        progress: OutputProgress | None = None,
    ) -> tuple[PcaTop, np.ndarray]:
        top = fit_pca_top(top_codes, ks[-1], n_components, rng)
        return top, top.embed(bottom_codes, top_codes)

    def from_arrays(self, stored: StoredArrays, ks: list[int], n_clusterings: int) -> PcaTop:
        top = PcaTop(
            table=np.ascontiguousarray(stored.get("top.table"), dtype=np.float64),
            offset=np.asarray(stored.get("top.offset"), dtype=np.float64),
            variance_ratio=stored.get("top.explained_variance_ratio"),
        )
        if top.table.ndim != 3 or top.table.shape[:2] != (n_clusterings, ks[-1]):
            raise ValueError(f"model array 'top.table' has shape {top.table.shape}")
        if top.offset.shape != (top.table.shape[2],):
            raise ValueError(f"model array 'top.offset' has shape {top.offset.shape}")
        return top


def fit_pca_top(codes: np.ndarray, n_values: int, n_components: int, rng) -> PcaTop:
    """PCA of the one-hot top codes, returned as a (V, k, n_components) lookup table."""
    n_samples, n_clusterings = codes.shape
    n_dims = n_clusterings * n_values
    seed = rng.randint(np.iinfo(np.int32).max)
    if n_samples * n_dims <= DENSE_PCA_MAX_ENTRIES or n_components >= min(n_samples, n_dims):
        onehot = one_hot(codes, n_values, dtype=np.float64)
        pca = fit_pca(onehot.toarray(), n_components, svd_solver="full", random_state=seed)
        components, mean = pca.components_, pca.mean_
        ratio = pca.explained_variance_ratio_
    else:
        try:
            components, mean, ratio = arpack_pca(codes, n_values, n_components, seed)
        except ArpackNoConvergence:  # scikit-learn's routes and their fallbacks (utils.pca)
            onehot = one_hot(codes, n_values, dtype=np.float64)
            pca = fit_pca(onehot, n_components, svd_solver="arpack", random_state=seed)
            components, mean = pca.components_, pca.mean_
            ratio = pca.explained_variance_ratio_
    table = np.ascontiguousarray(components.T.reshape(n_clusterings, n_values, n_components))
    offset = components @ mean
    return PcaTop(table=table, offset=offset, variance_ratio=np.nan_to_num(ratio))


class OneHotCodes(LinearOperator):
    """The column-centred one-hot matrix of (n, V) ``codes`` (values below ``n_values``), as
    a ``LinearOperator`` of shape (n, V * n_values), float64."""

    def __init__(self, codes: np.ndarray, n_values: int) -> None:
        n_samples, n_clusterings = codes.shape
        super().__init__(np.dtype(np.float64), (n_samples, n_clusterings * n_values))
        # Clustering by clustering: each product's pass over a clustering reads a run.
        self.codes_t = np.ascontiguousarray(codes.T)
        self.n_values = n_values
        counts = np.empty(n_clusterings * n_values, dtype=np.int64)
        _one_hot_kernels.one_hot_counts(self.codes_t, n_values, counts)
        self.mean = counts / n_samples

    def _matvec(self, x):
        x = np.ascontiguousarray(np.ravel(x), dtype=np.float64)
        out = np.empty(self.shape[0], dtype=np.float64)
        _one_hot_kernels.one_hot_matvec(self.codes_t, self.n_values, x, out)
        out -= self.mean @ x
        return out

    def _rmatvec(self, x):
        x = np.ascontiguousarray(np.ravel(x), dtype=np.float64)
        out = np.empty(self.shape[1], dtype=np.float64)
        _one_hot_kernels.one_hot_rmatvec(self.codes_t, self.n_values, x, out)
        out -= self.mean * x.sum()
        return out

    def _adjoint(self):
        return _Transposed(self)

    def total_variance(self) -> float:
        """Sum of the columns' variances (ddof=1): a one-hot column of share p has n p (1 - p)
        / (n - 1)."""
        n = self.shape[0]
        return float(np.sum(self.mean * (1.0 - self.mean)) * n / (n - 1))


class _Transposed(LinearOperator):
    def __init__(self, operator: OneHotCodes) -> None:
        super().__init__(operator.dtype, operator.shape[::-1])
        self.operator = operator

    def _matvec(self, x):
        return self.operator._rmatvec(x)

    def _rmatvec(self, x):
        return self.operator._matvec(x)


def arpack_pca(codes: np.ndarray, n_values: int, n_components: int, seed: int):
    """(components, mean, explained variance ratio) of the one-hot ``codes``, as
    scikit-learn's ``PCA(n_components, svd_solver="arpack", random_state=seed)`` computes
    them from a sparse one-hot matrix: the same start vector, ARPACK to machine precision
    (tol 0), the same signs; only the products' summation order differs."""
    operator = OneHotCodes(codes, n_values)
    v0 = check_random_state(seed).uniform(-1, 1, min(operator.shape))
    _, S, Vt = scipy.sparse.linalg.svds(operator, k=n_components, tol=0.0, v0=v0)
    S = S[::-1]
    _, Vt = svd_flip(None, Vt[::-1], u_based_decision=False)
    explained = S**2 / (operator.shape[0] - 1)
    return Vt, operator.mean, explained / operator.total_variance()
