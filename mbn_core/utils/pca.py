"""scikit-learn's PCA, fitted so that a LAPACK convergence fault does not fail a training.

LAPACK's divide-and-conquer SVD (``gesdd``) occasionally reports that it did not converge on
an ordinary, finite matrix, depending on the BLAS build and its thread count
(OpenMathLib/OpenBLAS#3044). PCA's "full" solver calls it on the whole matrix, "randomized"
on its small projected one, "arpack" inside ``svds``, and "auto" picks one of them. It
happened here with the wheels of SciPy 1.17.1 (OpenBLAS 0.3.30) on the one-hot top codes of
a small digits model, fitted with one BLAS thread as MBN's layers are; with two threads the
same matrix converged. Two other exact routes to the same components are the fallbacks:
- the eigendecomposition of the d x d covariance (another LAPACK routine), while it is small;
- else ARPACK's few leading singular vectors of a dense matrix.
"""

from __future__ import annotations

import logging

import numpy as np
from scipy.sparse.linalg import ArpackNoConvergence
from sklearn.decomposition import PCA

log = logging.getLogger(__name__)

# The covariance route holds a d x d float64 matrix: 4,096 features take 128 MiB. (The
# input map takes that route by choice only up to 1,000 features, where it is also faster.)
MAX_COVARIANCE_FEATURES = 4096


def fit_pca(X, n_components: int, svd_solver: str = "auto", random_state=None) -> PCA:
    """``PCA(n_components, svd_solver, random_state).fit(X)``, refitted by another exact
    route when LAPACK (or ARPACK) does not converge; the error stands when no other route
    fits."""
    try:
        return PCA(n_components, svd_solver=svd_solver, random_state=random_state).fit(X)
    except (np.linalg.LinAlgError, ArpackNoConvergence):
        fallback = _fallback_solver(X, n_components)
        if fallback is None or fallback == svd_solver:
            raise
        log.warning(
            "the PCA of a %d x %d matrix did not converge; fitting it with %s instead",
            *X.shape,
            fallback,
        )
        return PCA(n_components, svd_solver=fallback, random_state=random_state).fit(X)


def _fallback_solver(X, n_components: int) -> str | None:
    if X.shape[1] <= MAX_COVARIANCE_FEATURES:  # dense or sparse
        return "covariance_eigh"
    if n_components < min(X.shape) and isinstance(X, np.ndarray):
        return "arpack"  # it needs fewer components than min(n_samples, n_features)
    return None
