"""scikit-learn's PCA, fitted so that a LAPACK convergence fault does not fail a training.

LAPACK's divide-and-conquer SVD (``gesdd``, which PCA's "full" and, on small input, "auto"
solvers call) occasionally reports that it did not converge on an ordinary, finite matrix,
depending on the BLAS build and its thread count (OpenMathLib/OpenBLAS#3044). It happened
here with the wheels of SciPy 1.17.1 (OpenBLAS 0.3.30) on the one-hot top codes of a small
digits model, fitted with one BLAS thread as MBN's layers are; with two threads the same
matrix converged. Two other exact routes to the same components are the fallbacks:
- the eigendecomposition of the d x d covariance (another LAPACK routine), while it is small;
- else ARPACK's few leading singular vectors, which never factorise the whole matrix.
"""

from __future__ import annotations

import logging

import numpy as np
import scipy.sparse as sp
from sklearn.decomposition import PCA

logger = logging.getLogger(__name__)

# The covariance route holds a d x d float64 matrix: 4,096 features take 128 MiB.
MAX_COVARIANCE_FEATURES = 4096


def fit_pca(X, n_components: int, svd_solver: str = "auto", random_state=None) -> PCA:
    """``PCA(n_components, svd_solver, random_state).fit(X)``, refitted by another exact
    route when the SVD of dense ``X`` does not converge; the error stands when none fits."""
    try:
        return PCA(n_components, svd_solver=svd_solver, random_state=random_state).fit(X)
    except np.linalg.LinAlgError:
        fallback = None if sp.issparse(X) else _fallback_solver(X.shape, n_components)
        if fallback is None or fallback == svd_solver:
            raise
        logger.warning(
            "the SVD of a %d x %d matrix did not converge; fitting the PCA with %s instead",
            *X.shape,
            fallback,
        )
        return PCA(n_components, svd_solver=fallback, random_state=random_state).fit(X)


def _fallback_solver(shape: tuple[int, int], n_components: int) -> str | None:
    if shape[1] <= MAX_COVARIANCE_FEATURES:
        return "covariance_eigh"
    if n_components < min(shape):  # ARPACK finds fewer components than the rank
        return "arpack"
    return None
