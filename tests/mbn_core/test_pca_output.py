"""The PCA output of large code matrices: ARPACK over the centred one-hot codes read as an
operator (``OneHotCodes``), within rounding of scikit-learn's ARPACK PCA of the sparse
one-hot matrix that it replaced."""

import numpy as np
import pytest
import scipy.sparse.linalg
from sklearn.decomposition import PCA

from mbn_core.mbn.coassociation import one_hot
from mbn_core.mbn.outputs import pca as pca_output
from mbn_core.mbn.outputs.pca import OneHotCodes, PcaTop, fit_pca_top


def clustered_codes(n, V, k, seed):
    """Codes with structure: rows of a few groups agree on most clusterings."""
    rng = np.random.default_rng(seed)
    group = rng.integers(0, 6, n)
    base = rng.integers(0, k, (6, V))
    noisy = rng.random((n, V)) < 0.3
    return np.where(noisy, rng.integers(0, k, (n, V)), base[group]).astype(np.uint8)


def sklearn_top(codes, n_values, n_components, seed):
    """The PCA output as it was: scikit-learn's ARPACK PCA of the sparse one-hot codes."""
    fitted = PCA(n_components, svd_solver="arpack", random_state=seed)
    fitted.fit(one_hot(codes, n_values, dtype=np.float64))
    components = fitted.components_
    table = np.ascontiguousarray(components.T.reshape(codes.shape[1], n_values, n_components))
    return PcaTop(table, components @ fitted.mean_, fitted.explained_variance_ratio_)


@pytest.mark.parametrize(("n", "V", "k"), [(3000, 120, 15), (600, 400, 22)])
def test_within_rounding_of_sklearns_arpack_pca(n, V, k):
    # Tall (n > V k) and wide (n < V k) one-hot matrices, both above the dense route's size.
    codes = clustered_codes(n, V, k, seed=n)
    assert n * V * k > pca_output.DENSE_PCA_MAX_ENTRIES
    rng = np.random.RandomState(0)
    seed = np.random.RandomState(0).randint(np.iinfo(np.int32).max)
    ours = fit_pca_top(codes, k, 10, rng)
    theirs = sklearn_top(codes, k, 10, seed)
    got, expected = ours.embed(codes, codes), theirs.embed(codes, codes)
    # 1e-6 relative per component is the bound the decision allows; rounding gives ~1e-12.
    scale = np.abs(expected).max(axis=0)
    assert np.all(np.abs(got - expected).max(axis=0) <= 1e-6 * scale)
    np.testing.assert_allclose(ours.variance_ratio, theirs.explained_variance_ratio, rtol=1e-9)


def test_the_operator_is_the_centred_one_hot_matrix():
    codes = clustered_codes(50, 7, 5, seed=1)
    dense = one_hot(codes, 5, dtype=np.float64).toarray()
    centred = dense - dense.mean(axis=0)
    operator = OneHotCodes(codes, 5)
    x, y = np.random.default_rng(2).standard_normal((2, 35))[0], np.random.default_rng(3).random(50)
    np.testing.assert_allclose(operator.matvec(x), centred @ x, atol=1e-12)
    np.testing.assert_allclose(operator.rmatvec(y), centred.T @ y, atol=1e-12)
    assert operator.total_variance() == pytest.approx(centred.var(axis=0, ddof=1).sum())


def test_arpack_that_does_not_converge_falls_back_to_sklearns_routes(monkeypatch):
    codes = clustered_codes(3000, 120, 15, seed=4)

    def no_convergence(*args, **kwargs):
        raise scipy.sparse.linalg.ArpackNoConvergence("no convergence", np.empty(0), None)

    monkeypatch.setattr(pca_output.scipy.sparse.linalg, "svds", no_convergence)
    top = fit_pca_top(codes, 15, 10, np.random.RandomState(0))
    seed = np.random.RandomState(0).randint(np.iinfo(np.int32).max)
    np.testing.assert_array_equal(
        top.embed(codes, codes), sklearn_top(codes, 15, 10, seed).embed(codes, codes)
    )
