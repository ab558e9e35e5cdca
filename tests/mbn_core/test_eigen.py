"""eigh_by_index: eigenpairs by index, right even where LAPACK's syevr returns none.

With SciPy 1.17.1's OpenBLAS, ``syevr`` returned no eigenpairs for matrices whose wanted
eigenvalues are tied, such as the centred Gram matrix of equidistant points. Whether it does
depends on the LAPACK build, so the fault is also injected.
"""

import numpy as np
import pytest
import scipy.linalg

from mbn_core.utils.eigen import eigh_by_index

_scipy_eigh = scipy.linalg.eigh


def _centring(n: int) -> np.ndarray:
    """I - 11^T / n: eigenvalue 1 n - 1 times, and 0."""
    return np.eye(n) - 1.0 / n


def _assert_eigenpairs(matrix, values, vectors, expected_values):
    np.testing.assert_allclose(values, expected_values, atol=1e-10)
    np.testing.assert_allclose(matrix @ vectors, vectors * values, atol=1e-10)
    np.testing.assert_allclose(vectors.T @ vectors, np.eye(len(values)), atol=1e-10)


def test_a_generic_matrix_gets_scipys_answer():
    rng = np.random.default_rng(0)
    half = rng.normal(size=(30, 30))
    matrix = half + half.T
    values, vectors = eigh_by_index(matrix, 27, 29)
    reference_values, reference_vectors = _scipy_eigh(matrix, subset_by_index=[27, 29])
    np.testing.assert_allclose(values, reference_values, atol=1e-12)
    np.testing.assert_allclose(np.abs(vectors), np.abs(reference_vectors), atol=1e-10)


@pytest.mark.parametrize(("first", "last", "expected"), [(48, 49, [1.0, 1.0]), (0, 1, [0.0, 1.0])])
def test_tied_eigenvalues_are_found(first, last, expected):
    matrix = _centring(50)
    values, vectors = eigh_by_index(matrix, first, last)
    _assert_eigenpairs(matrix, values, vectors, expected)


def test_a_short_answer_from_syevr_falls_back_to_the_full_decomposition(monkeypatch):
    def syevr_returns_nothing(matrix, *args, driver=None, **kwargs):
        if driver == "evr":
            return np.empty(0), np.empty((len(matrix), 0))
        return _scipy_eigh(matrix, *args, driver=driver, **kwargs)

    monkeypatch.setattr(scipy.linalg, "eigh", syevr_returns_nothing)
    rng = np.random.default_rng(1)
    half = rng.normal(size=(20, 20))
    matrix = half + half.T
    values, vectors = eigh_by_index(matrix, 17, 19)
    _assert_eigenpairs(matrix, values, vectors, np.linalg.eigvalsh(matrix)[17:])
