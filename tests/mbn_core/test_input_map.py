"""InputMap: what the compressor's MLP sees of a row, standardised or projected."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_digits
from sklearn.decomposition import PCA

from mbn_core.input_map import InputMap


@pytest.fixture(scope="module")
def digits():
    return load_digits().data.astype(np.float32)


def test_wide_dense_input_is_projected_onto_its_principal_directions(digits):
    input_map = InputMap.fit(digits, 10)
    projected = input_map.transform(digits)
    assert projected.shape == (len(digits), 10) and projected.dtype == np.float32
    assert input_map.projection is not None
    np.testing.assert_allclose(input_map.projection.T @ input_map.projection, np.eye(10), atol=1e-5)
    # The same subspace as PCA's, and one scale for every direction: distances within it are
    # the input's, divided by one number.
    reference = PCA(10).fit(digits)
    np.testing.assert_allclose(
        np.abs(input_map.projection.T @ reference.components_.T), np.eye(10), atol=1e-3
    )
    assert len(set(input_map.scale.tolist())) == 1
    np.testing.assert_allclose(np.mean(projected.var(axis=0)), 1.0, rtol=1e-3)
    pairs = np.linalg.norm(projected[:50, None] - projected[None, :50], axis=2)
    within = reference.transform(digits[:50])
    expected = np.linalg.norm(within[:, None] - within[None, :], axis=2) / input_map.scale[0]
    np.testing.assert_allclose(pairs, expected, rtol=1e-3, atol=1e-3)


def test_a_new_row_is_mapped_by_the_training_rows_map(digits):
    input_map = InputMap.fit(digits[:1000], 10)
    row = digits[1500:1501]
    assert input_map.projection is not None and input_map.mean is not None
    expected = (row - input_map.mean) / input_map.scale @ input_map.projection
    np.testing.assert_allclose(input_map.transform(row), expected, rtol=1e-4, atol=1e-5)
    # A row maps the same alone and among others, to float32 rounding (BLAS may sum a batch
    # in another order, as it does in the MLP's own layers).
    np.testing.assert_allclose(
        input_map.transform(digits[1500:1600])[:1], input_map.transform(row), rtol=1e-5, atol=1e-6
    )


def test_narrow_input_and_none_are_standardised_feature_by_feature(digits):
    for input_map in (InputMap.fit(digits, 64), InputMap.fit(digits, None)):
        assert input_map.projection is None and input_map.n_outputs == 64
        std = digits.std(axis=0)
        typical = np.median(std[std > 0])
        # Rare pixels are not blown up: no feature is scaled by under a tenth of the median.
        assert input_map.scale.min() >= 0.1 * typical - 1e-6
        wide = std > 0.1 * typical
        np.testing.assert_allclose(input_map.scale[wide], std[wide], rtol=1e-4)


def test_sparse_input_is_scaled_not_centred_and_stays_sparse(digits):
    sparse = sp.csr_matrix(digits)
    input_map = InputMap.fit(sparse, 10)
    assert input_map.mean is None and input_map.projection is None
    mapped = input_map.transform(sparse)
    assert sp.issparse(mapped) and mapped.nnz == sparse.nnz
    np.testing.assert_allclose(mapped.toarray(), input_map.transform(digits), rtol=1e-6)
    dense_map = InputMap.fit(digits, 10)
    with pytest.raises(ValueError, match="dense"):
        dense_map.transform(sparse)


def test_fewer_rows_than_components_and_constant_rows(digits):
    few = InputMap.fit(digits[:7], 32)
    assert few.n_outputs == 7
    assert np.all(np.isfinite(few.transform(digits[:20])))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        constant = InputMap.fit(np.ones((20, 64), dtype=np.float32), 8)
    assert constant.projection is None
    assert np.all(constant.transform(np.zeros((2, 64))) == -1.0 / constant.scale)
