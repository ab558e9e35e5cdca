"""Shared fixtures: faults injected into LAPACK, a digits split for the output tests, and
the models those tests share.

Whether LAPACK's SVD reports non-convergence on a given matrix depends on the BLAS build and
its thread count (it struck SciPy 1.17.1's OpenBLAS with one thread), so the tests make it
raise ``LinAlgError``, as LAPACK's non-convergence does, where each route meets it.
"""

import numpy as np
import pytest
import scipy.linalg
import sklearn.decomposition._pca

from mbn_core import MBN


def _no_convergence(*args, **kwargs):
    raise np.linalg.LinAlgError("SVD did not converge")


@pytest.fixture
def svd_fails(monkeypatch):
    monkeypatch.setattr(scipy.linalg, "svd", _no_convergence)


@pytest.fixture
def svds_fails(monkeypatch):
    # PCA's ARPACK route runs an SVD of its own inside svds.
    monkeypatch.setattr(sklearn.decomposition._pca, "svds", _no_convergence)


@pytest.fixture(scope="session")
def digits_split(digits):
    """500 digits to fit and 200 new ones: (X, y, X_new, y_new)."""
    X, y = digits
    return X[:500], y[:500], X[500:700], y[500:700]


@pytest.fixture(scope="session")
def codes_output_fit(digits_split):
    """``fit(output)``: a model with that output fitted on the digits split, as
    (model, embedding); one per output and test process."""
    fits = {}

    def fit(output):
        if output not in fits:
            # "umap-bottom" has no upper layers, so no delta to give.
            delta = "auto" if output == "umap-bottom" else 0.5
            model = MBN(n_clusterings=40, delta=delta, output=output, random_state=0)
            fits[output] = (model, model.fit_transform(digits_split[0]))
        return fits[output]

    return fit
