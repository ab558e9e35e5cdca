"""scikit-learn's PCA, fitted so that a LAPACK convergence fault does not fail a training.

LAPACK's divide-and-conquer SVD (``gesdd``, which PCA's "full" and, on small input, "auto"
solvers call) occasionally reports that it did not converge on an ordinary, finite matrix,
depending on the BLAS build and its thread count (OpenMathLib/OpenBLAS#3044). It happened
here with the wheels of SciPy 1.17.1 (OpenBLAS 0.3.30) on the one-hot top codes of a small
digits model, fitted with one BLAS thread as MBN's layers are; with two threads the same
matrix converged. The eigendecomposition of the covariance is an exact PCA by another
LAPACK routine, so it is the fallback for dense input.
"""

from __future__ import annotations

import logging

import numpy as np
import scipy.sparse as sp
from sklearn.decomposition import PCA

logger = logging.getLogger(__name__)


def fit_pca(X, n_components: int, svd_solver: str = "auto", random_state=None) -> PCA:
    """``PCA(n_components, svd_solver, random_state).fit(X)``, refitted from the covariance's
    eigendecomposition when the SVD of dense ``X`` does not converge."""
    try:
        return PCA(n_components, svd_solver=svd_solver, random_state=random_state).fit(X)
    except np.linalg.LinAlgError:
        if sp.issparse(X) or svd_solver == "covariance_eigh":
            raise
        logger.warning(
            "the SVD of a %d x %d matrix did not converge; using the covariance's "
            "eigendecomposition instead",
            *X.shape,
        )
        return PCA(n_components, svd_solver="covariance_eigh").fit(X)
