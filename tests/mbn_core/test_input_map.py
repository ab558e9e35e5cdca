"""InputMap: what the compressor's MLP sees of a row, standardised or projected."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.decomposition import PCA

from mbn_core.distill.input_map import InputMap, projected_width


@pytest.fixture(scope="module")
def rows(digits):
    """Every digit, as float32."""
    return digits.X.astype(np.float32)


def test_wide_dense_input_is_projected_onto_its_principal_directions(rows):
    input_map = InputMap.fit(rows, 10)
    projected = input_map.transform(rows)
    assert projected.shape == (len(rows), 10) and projected.dtype == np.float32
    assert input_map.projection is not None and input_map.scale is None
    # Orthogonal directions of one common length (1 / spread), spanning PCA's subspace.
    gram = input_map.projection.T @ input_map.projection
    spread = 1 / np.sqrt(gram[0, 0])
    np.testing.assert_allclose(gram * spread**2, np.eye(10), atol=1e-5)
    reference = PCA(10).fit(rows)
    directions = input_map.projection * spread
    overlap = np.abs(directions.T @ reference.components_.T)
    np.testing.assert_allclose(overlap, np.eye(10), atol=1e-3)
    # So distances within it are the input's, divided by one number; directions average
    # unit variance.
    np.testing.assert_allclose(np.mean(projected.var(axis=0, ddof=1)), 1.0, rtol=1e-4)
    pairs = np.linalg.norm(projected[:50, None] - projected[None, :50], axis=2)
    within = reference.transform(rows[:50])
    expected = np.linalg.norm(within[:, None] - within[None, :], axis=2) / spread
    np.testing.assert_allclose(pairs, expected, rtol=1e-3, atol=1e-3)


def test_a_new_row_is_mapped_by_the_training_rows_map(rows):
    input_map = InputMap.fit(rows[:1000], 10)
    row = rows[1500:1501]
    assert input_map.projection is not None and input_map.mean is not None
    expected = (row - input_map.mean) @ input_map.projection
    np.testing.assert_allclose(input_map.transform(row), expected, rtol=1e-4, atol=1e-5)
    # float64 rows are mapped as their float32 values are.
    np.testing.assert_array_equal(input_map.transform(row.astype(np.float64)), expected)
    # A row maps the same alone and among others, to float32 rounding (BLAS may sum a batch
    # in another order, as it does in the MLP's own layers).
    np.testing.assert_allclose(
        input_map.transform(rows[1500:1600])[:1], input_map.transform(row), rtol=1e-5, atol=1e-6
    )


def test_narrow_input_and_none_are_standardised_feature_by_feature(rows):
    for input_map in (InputMap.fit(rows, 64), InputMap.fit(rows, None)):
        assert input_map.projection is None and input_map.scale is not None
        assert input_map.n_outputs == 64
        std = rows.std(axis=0)
        typical = np.median(std[std > 0])
        # Rare pixels are not blown up: no feature is scaled by under a tenth of the median.
        assert input_map.scale.min() >= 0.1 * typical - 1e-6
        wide = std > 0.1 * typical
        np.testing.assert_allclose(input_map.scale[wide], std[wide], rtol=1e-4)
    assert projected_width(64, 64) is None and projected_width(64, None) is None
    assert projected_width(65, 64) == 64


def test_wide_sparse_input_is_projected_without_being_made_dense(rows, monkeypatch):
    sparse = sp.csr_matrix(rows)
    input_map = InputMap.fit(sparse, 10)
    dense_map = InputMap.fit(rows, 10)
    assert input_map.projection is not None and input_map.mean is not None
    np.testing.assert_allclose(
        np.abs(input_map.projection), np.abs(dense_map.projection), atol=1e-4
    )

    def no_dense(*args, **kwargs):
        raise AssertionError("a sparse input was made dense")

    monkeypatch.setattr(sp.csr_matrix, "toarray", no_dense)
    mapped = input_map.transform(sparse)
    assert isinstance(mapped, np.ndarray) and mapped.shape == (len(rows), 10)
    np.testing.assert_allclose(mapped, input_map.transform(rows), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_wide_sparse_input_beyond_the_covariance_route_is_projected():
    # 3,000 features: ARPACK on the implicitly centred sparse rows, as scikit-learn's PCA does.
    rng = np.random.default_rng(0)
    sparse = sp.random(300, 3000, density=0.01, format="csr", random_state=1, dtype=np.float32)
    sparse = sp.csr_matrix(
        sparse
        + sp.csr_matrix(
            (rng.random(300), (np.arange(300), rng.integers(0, 20, 300))), shape=(300, 3000)
        )
    )
    input_map = InputMap.fit(sparse, 8)
    assert input_map.n_outputs == 8
    reference = PCA(8, svd_solver="full").fit(sparse.toarray())
    cosines = np.abs(
        np.sum(
            input_map.projection
            / np.linalg.norm(input_map.projection, axis=0)
            * reference.components_.T,
            axis=0,
        )
    )
    assert np.all(cosines > 0.999)


def test_narrow_sparse_input_is_scaled_not_centred_and_stays_sparse(rows):
    sparse = sp.csr_matrix(rows)
    input_map = InputMap.fit(sparse, None)
    assert input_map.mean is None and input_map.projection is None
    mapped = input_map.transform(sparse)
    assert sp.issparse(mapped) and mapped.nnz == sparse.nnz
    np.testing.assert_allclose(mapped.toarray(), input_map.transform(rows), rtol=1e-6)
    # A map fitted on dense rows takes sparse rows as the dense rows they are (as ONNX does);
    # a projecting one projects them without making them dense (the same numbers, rounded
    # in another order).
    dense_map = InputMap.fit(rows, None)
    np.testing.assert_array_equal(dense_map.transform(sparse[:5]), dense_map.transform(rows[:5]))
    projecting = InputMap.fit(rows, 10)
    np.testing.assert_allclose(
        projecting.transform(sparse[:5]), projecting.transform(rows[:5]), atol=1e-4
    )


def test_few_rows_and_low_rank_input_keep_only_directions_with_variance(rows):
    # 7 rows span 6 directions once centred; a seventh would be arbitrary on new rows.
    few = InputMap.fit(rows[:7], 32)
    assert few.n_outputs == 6
    assert np.all(few.transform(rows[:7]).var(axis=0) > 1e-3)
    assert np.all(np.isfinite(few.transform(rows[:20])))
    # One varying pixel among 64: one direction, and the scale is that pixel's spread.
    low_rank = np.zeros((100, 64), dtype=np.float32)
    low_rank[:, 10] = np.arange(100) % 7
    one = InputMap.fit(low_rank, 8)
    assert one.n_outputs == 1
    np.testing.assert_allclose(one.transform(low_rank).var(ddof=1), 1.0, rtol=1e-3)
    ones = one.transform(np.ones((1, 64)))
    assert np.abs(ones).max() < 5


def test_constant_and_single_rows_are_standardised_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        constant = InputMap.fit(np.ones((20, 64), dtype=np.float32), 8)
        single = InputMap.fit(np.arange(64, dtype=np.float32)[None], 8)
    for input_map in (constant, single):
        assert input_map.projection is None and input_map.scale is not None
        assert np.all(np.isfinite(input_map.transform(np.zeros((2, 64)))))


@pytest.mark.slow
def test_the_directions_are_exact_for_fewer_rows_than_ten_per_feature():
    # 600 x 200: scikit-learn's "auto" would take a randomized SVD here, whose directions
    # drift where variances are close. The map's are the full SVD's.
    rng = np.random.RandomState(0)
    X = (rng.normal(size=(600, 200)) * np.linspace(2.0, 1.0, 200)).astype(np.float32)
    input_map = InputMap.fit(X, 16)
    assert input_map.projection is not None
    directions = input_map.projection / np.linalg.norm(input_map.projection, axis=0)
    reference = PCA(16, svd_solver="full").fit(X).components_
    np.testing.assert_allclose(np.abs(np.sum(directions.T * reference, axis=1)), 1.0, atol=1e-4)
