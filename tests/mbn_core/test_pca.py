"""fit_pca: scikit-learn's PCA, surviving LAPACK's SVD reporting that it did not converge.

The fault itself depends on the BLAS build and thread count (it struck the one-hot top codes
of a digits model with SciPy 1.17.1's OpenBLAS and one thread), so it is injected
(``svd_fails``, ``svds_fails`` in conftest.py).
"""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.decomposition import PCA

from mbn_core import MBN
from mbn_core.utils.pca import MAX_COVARIANCE_FEATURES, fit_pca


@pytest.fixture(scope="module")
def rows(digits):
    """The first 600 digits."""
    return digits.X[:600]


@pytest.fixture(scope="module")
def wide():
    """Dense input too wide for the covariance route."""
    return np.random.default_rng(0).normal(size=(60, MAX_COVARIANCE_FEATURES + 1))


def _same_subspace(a: PCA, b: PCA) -> None:
    np.testing.assert_allclose(a.mean_, b.mean_, atol=1e-12)
    np.testing.assert_allclose(a.explained_variance_, b.explained_variance_, rtol=1e-8)
    # The same directions, up to numerics (both fits flip signs the same way).
    np.testing.assert_allclose(a.components_, b.components_, atol=1e-6)


def test_without_a_fault_it_is_scikit_learns_pca(rows):
    _same_subspace(fit_pca(rows, 5, svd_solver="full"), PCA(5, svd_solver="full").fit(rows))


@pytest.mark.parametrize("solver", ["full", "auto"])
def test_an_svd_that_does_not_converge_falls_back_to_the_covariance(rows, svd_fails, solver):
    with pytest.raises(np.linalg.LinAlgError):
        PCA(5, svd_solver=solver).fit(rows)  # the fault is real for scikit-learn's PCA
    fitted = fit_pca(rows, 5, svd_solver=solver)
    _same_subspace(fitted, PCA(5, svd_solver="covariance_eigh").fit(rows))


def test_sparse_input_falls_back_to_the_covariance(rows, svds_fails):
    sparse = sp.csr_matrix(rows)
    with pytest.raises(np.linalg.LinAlgError):
        PCA(5, svd_solver="arpack").fit(sparse)
    fitted = fit_pca(sparse, 5, svd_solver="arpack", random_state=0)
    _same_subspace(fitted, PCA(5, svd_solver="covariance_eigh").fit(rows))


def test_input_too_wide_for_the_covariance_falls_back_to_arpack(wide, svd_fails):
    fitted = fit_pca(wide, 5, svd_solver="full", random_state=0)
    # The reference by a third route: the eigenvectors of the 60 x 60 Gram matrix.
    centred = wide - wide.mean(axis=0)
    eigenvalues, eigenvectors = np.linalg.eigh(centred @ centred.T / (len(wide) - 1))
    np.testing.assert_allclose(fitted.explained_variance_, eigenvalues[::-1][:5], rtol=1e-8)
    directions = centred.T @ eigenvectors[:, ::-1][:, :5]
    directions /= np.linalg.norm(directions, axis=0)
    overlap = np.abs(fitted.components_ @ directions)
    np.testing.assert_allclose(overlap, np.eye(5), atol=1e-6)
    # ARPACK starts from a random vector: the seed reaches it, so a refit is the same.
    again = fit_pca(wide, 5, svd_solver="full", random_state=0)
    np.testing.assert_array_equal(again.components_, fitted.components_)


def test_without_another_route_the_error_stands(wide, svd_fails, svds_fails):
    with pytest.raises(np.linalg.LinAlgError):  # as many components as min(n, d)
        fit_pca(wide, 60, svd_solver="full")
    with pytest.raises(np.linalg.LinAlgError):  # sparse and too wide for the covariance
        fit_pca(sp.csr_matrix(wide), 5, svd_solver="arpack")


@pytest.fixture(scope="module")
def unfaulted_mbn(rows):
    """An MBN and its embedding of digits, fitted before any fault is injected."""
    mbn = MBN(n_clusterings=10, k1=0.2, n_components=3, random_state=0, n_jobs=1)
    return mbn, mbn.fit_transform(rows)


@pytest.mark.slow
def test_an_mbn_fit_survives_the_fault_in_its_top_layer(rows, unfaulted_mbn, svd_fails):
    mbn, expected = unfaulted_mbn
    embedded = mbn.fit_transform(rows)
    np.testing.assert_allclose(embedded, expected, atol=1e-6)
