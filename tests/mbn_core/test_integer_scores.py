"""The integer bottom layer gives the float path's codes, bit for bit, ties included."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from mbn_core import MBN
from mbn_core.mbn import _integer_scores, bottom
from mbn_core.mbn._integer_scores import (
    IntegerRows,
    integer_centers,
    integer_codes,
    integer_rows,
    integral_range,
    kernel_is_exact,
)
from mbn_core.mbn.bottom import (
    bottom_clustering_codes,
    bottom_input,
    input_row_norms,
    with_ones_column,
)


@pytest.fixture
def float_path(monkeypatch):
    """Run the block with the integer path switched off (every input takes float32)."""

    def switch_off():
        monkeypatch.setattr(bottom, "integer_rows", lambda *args: None)

    return switch_off


def _float_codes(X, features, centers, metric):
    X_work = with_ones_column(X.astype(np.float32))
    norms = input_row_norms(X)
    return bottom_clustering_codes(X_work, features, centers.astype(np.float32), metric, norms)


def _integer(X, centers, features, metric):
    rows = integer_rows(X, centers)
    assert rows is not None
    block = integer_centers(centers, np.arange(len(centers)), features, rows.low, metric)
    return integer_codes(rows, features, block)


def test_the_kernel_is_exact_here():
    # The probe covers the saturating pairs (255 x -128); CI machines must pass it, or the
    # integer path never runs there and the tests below would compare the float path to itself.
    assert kernel_is_exact()


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_random_bytes_match_the_float_path(metric):
    rng = np.random.default_rng(0)
    X = rng.integers(0, 256, size=(600, 50)).astype(np.float64)
    centers = X[rng.choice(600, 40, replace=False)]
    features = np.sort(rng.choice(50, 25, replace=False))
    got = _integer(X, centers, features, metric)
    np.testing.assert_array_equal(got, _float_codes(X, features, centers[:, features], metric))


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_exact_ties_go_to_the_lowest_index(metric):
    rng = np.random.default_rng(1)
    base = rng.integers(0, 256, size=(30, 16)).astype(np.float64)
    # Every center appears three times, and rows sit exactly midway between two centers
    # (even coordinates, so the midpoint is whole), and at the extremes 0 and 255.
    centers = np.repeat(base[:10], 3, axis=0)
    rng.shuffle(centers)
    even = 2 * (centers // 2)
    middle = (even[:-1] + even[1:]) / 2
    X = np.vstack([base, centers, middle, np.zeros((3, 16)), np.full((3, 16), 255.0), even])
    centers = np.vstack([centers, even[:5]])
    features = np.arange(16)
    got = _integer(X, centers, features, metric)
    np.testing.assert_array_equal(got, _float_codes(X, features, centers, metric))
    if metric == "euclidean":
        # Ties really occurred and were resolved to the first of the equal centers.
        distances = ((X[:, None, :] - centers[None]) ** 2).sum(axis=2)
        first = np.argmin(distances, axis=1)
        np.testing.assert_array_equal(got, first)
        assert (np.sum(distances == distances.min(axis=1, keepdims=True), axis=1) > 1).sum() > 30


@pytest.mark.parametrize(
    "low, metric", [(0, "euclidean"), (-128, "euclidean"), (1000, "cosine"), (-40, "cosine")]
)
def test_shifted_ranges_match_the_float_path(low, metric):
    rng = np.random.default_rng(2)
    X = rng.integers(low, low + 256, size=(300, 20)).astype(np.float64)
    centers = X[:25]
    features = np.array([0, 3, 4, 9, 11, 12, 19])
    rows = integer_rows(X, centers)
    assert rows is not None and rows.low == low
    got = _integer(X, centers, features, metric)
    np.testing.assert_array_equal(got, _float_codes(X, features, centers[:, features], metric))


def test_only_small_whole_numbers_qualify():
    X = np.arange(40, dtype=np.float64).reshape(20, 2)
    assert integer_rows(X, X) is not None
    assert integer_rows(X / 255, X / 255) is None  # fractions
    assert integer_rows(X * 7, X * 7) is None  # 273 levels
    wide = X.copy()
    wide[0, 0] = 300  # the rows alone are narrow enough, rows and centers are not
    assert integer_rows(X, wide) is None
    assert integral_range(np.array([[np.nan, 1.0]])) is None
    # float64 values that float32 rounds to whole numbers are whole numbers there.
    assert integral_range(np.array([[3.00000001, 4.0]])) == (3, 4)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64])
def test_integral_range_of_integer_dtypes_matches_their_float_values(dtype):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(0)
    values = rng.integers(max(info.min, -(2**20)), min(info.max, 2**20), (5000, 3)).astype(dtype)
    values[0, 0], values[-1, -1] = max(info.min, -(2**20)), min(info.max, 2**20) - 1
    assert integral_range(values) == integral_range(values.astype(np.float64))


def test_too_many_dimensions_are_refused():
    big = _integer_scores.MAX_CHOSEN_DIMENSIONS + 1
    with pytest.raises(ValueError, match="exact range"):
        integer_centers(np.zeros((2, big)), np.arange(2), np.arange(big), 0, "euclidean")


def _generated_images(n=400, side=12, seed=0):
    """uint8 images: a few blurred strokes per class, noise, saturated pixels (ties at 0, 255)."""
    rng = np.random.default_rng(seed)
    prototypes = rng.random((5, side, side)) > 0.7
    labels = rng.integers(0, 5, n)
    images = prototypes[labels] * 200.0 + rng.normal(0, 40, (n, side, side))
    images = np.clip(np.rint(images), 0, 255).astype(np.uint8)
    return images.reshape(n, -1)


def _codes(model, X):
    return [model.encode(X, layer=i) for i in range(len(model.ks_))]


def _fit(X, **params):
    model = MBN(n_clusterings=12, k_max=150, random_state=0, n_jobs=2, **params)
    return model, model.fit_transform(X)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, params",
    [
        ("digits", {}),
        ("images", {}),
        ("images", {"metric": "cosine"}),
        ("digits", {"shift_fraction": 0.5}),
        ("duplicated", {}),
    ],
)
def test_networks_are_identical_to_the_float_path(name, params, float_path, digits):
    if name == "digits":
        X = digits.X[:500]  # whole numbers 0..16, float64
    elif name == "images":
        X = _generated_images()
    else:  # every row three times: centers tie exactly at distance 0
        X = np.repeat(digits.X[:150], 3, axis=0)
    assert isinstance(bottom_input(np.asarray(X, np.float64), _bottom(X)), IntegerRows)
    model, embedding = _fit(X, **params)
    codes = _codes(model, X)
    transformed = model.transform(X[:40])
    one_row = model.transform(X[7:8])
    float_path()
    reference, ref_embedding = _fit(X, **params)
    np.testing.assert_array_equal(embedding, ref_embedding)
    for mine, theirs in zip(codes, _codes(reference, X), strict=True):
        np.testing.assert_array_equal(mine, theirs)
    np.testing.assert_array_equal(transformed, reference.transform(X[:40]))
    np.testing.assert_array_equal(one_row[0], transformed[7])


def _bottom(X):
    model = MBN(n_clusterings=2, ks=[5], output="pca", n_components=2, random_state=0)
    return model.fit(X).bottom_layer_


def test_scaled_floats_take_the_float_path():
    X = _generated_images().astype(np.float32) / 255
    assert not isinstance(bottom_input(X, _bottom(X)), IntegerRows)


@pytest.mark.slow  # over a second; the full suite runs it
def test_sparse_counts_match_the_dense_integer_path(digits):
    X = digits.X[:500]
    params = {"n_clusterings": 12, "k_max": 150, "random_state": 0, "n_jobs": 2}
    dense = MBN(**params).fit(X)
    sparse = MBN(**params).fit(sp.csr_matrix(X))
    for mine, theirs in zip(_codes(dense, X), _codes(sparse, sp.csr_matrix(X)), strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_the_int64_arg_max_gives_the_same_codes(monkeypatch):
    # Past MAX_INT32_SCORE_DIMENSIONS the Euclidean scores are ranked in int64 instead.
    rng = np.random.default_rng(4)
    X = rng.integers(0, 256, size=(200, 30)).astype(np.float64)
    X[100:] = X[:100]  # exact ties
    features = np.arange(30)
    fast = _integer(X, X[:50], features, "euclidean")
    monkeypatch.setattr(_integer_scores, "MAX_INT32_SCORE_DIMENSIONS", 0)
    wide = _integer(X, X[:50], features, "euclidean")
    np.testing.assert_array_equal(fast, wide)
    np.testing.assert_array_equal(wide, _float_codes(X, features, X[:50], "euclidean"))


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("packed_rows", [0, 10**9])
def test_packed_and_per_call_centers_give_the_float_codes(monkeypatch, metric, packed_rows):
    # Large batches score against centers packed into a session of their own, small ones
    # pass them with every block; both must give the float path's codes, across the
    # blocks' boundaries (1,037 rows is no multiple of a block) and on exact ties.
    monkeypatch.setattr(_integer_scores, "PACKED_ROWS", packed_rows)
    monkeypatch.setattr(_integer_scores, "_BLOCK_BYTES", 64 * 4 * 70)  # 64-row blocks
    rng = np.random.default_rng(5)
    X = rng.integers(0, 256, size=(1037, 24)).astype(np.float64)
    X[::7] = 0
    X[1::7] = 255
    centers = np.vstack([X[rng.choice(1037, 60, replace=False)], X[:10]])  # repeated centers
    features = np.sort(rng.choice(24, 17, replace=False))
    got = _integer(X, centers, features, metric)
    np.testing.assert_array_equal(got, _float_codes(X, features, centers[:, features], metric))


def test_the_int32_arg_max_is_exact_at_its_bound():
    # At MAX_INT32_SCORE_DIMENSIONS the scores 2 x'.b - |w'|^2 reach their extremes
    # (rows of 255 against centers of 0 and of 255); the int32 arg-max must rank them as
    # the int64 one does.
    d = _integer_scores.MAX_INT32_SCORE_DIMENSIONS
    X = np.zeros((6, d))
    X[:3] = 255
    X[4, : d // 2] = 255
    centers = np.vstack([np.zeros(d), np.full(d, 255.0), X[4], np.zeros(d)])
    features = np.arange(d)
    rows = integer_rows(X, centers)
    assert rows is not None
    block = integer_centers(centers, np.arange(4), features, rows.low, "euclidean")
    dots = X.astype(np.int64) @ block.b.astype(np.int64)
    assert (2 * dots - block.center_term).min() < -(2**30)  # near the int32 bound
    got = integer_codes(rows, features, block)
    np.testing.assert_array_equal(got, [1, 1, 1, 0, 2, 0])
    wide = np.empty(6, np.int32)
    _integer_scores.integer_best(dots, block.center_term, wide)
    np.testing.assert_array_equal(got, wide)


def test_packed_sessions_keep_a_bounded_number_of_models(monkeypatch):
    monkeypatch.setattr(_integer_scores, "PACKED_ROWS", 0)
    rng = np.random.default_rng(6)
    X = rng.integers(0, 256, size=(200, 12)).astype(np.float64)
    for n_centers in range(3, 3 + 2 * _integer_scores._TEMPLATES_KEPT):
        centers = X[:n_centers]
        got = _integer(X, centers, np.arange(12), "euclidean")
        np.testing.assert_array_equal(got, _float_codes(X, np.arange(12), centers, "euclidean"))
    assert len(_integer_scores._state["templates"]) <= _integer_scores._TEMPLATES_KEPT


def _cosine_reference(dots, norms, offsets, row_terms):
    # The float path's re-rank: x.w / |w| by a float64 division, a zero center scoring 0,
    # the first arg-max.
    x_w = dots.astype(np.int64) + row_terms[:, None] + offsets[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        scores = np.where(norms > 0, x_w / norms, 0.0)
    return scores.argmax(axis=1)


@pytest.mark.parametrize("k", [1, 7, 16, 33, 500])
def test_the_cosine_arg_max_is_the_divisions(k):
    rng = np.random.default_rng(k)
    dots = rng.integers(-(2**20), 2**20, size=(40, k)).astype(np.int32)
    center_term = rng.integers(0, 2**24, size=k)
    center_term[::5] = 0  # zero centers score 0
    block = _integer_scores.IntegerCenters(
        b=np.zeros((1, k), np.int8), center_term=center_term,
        b_sums=rng.integers(-5000, 5000, size=k), metric="cosine",
    )  # fmt: skip
    norms, inverse, offsets = _integer_scores.cosine_center_terms(block, 3)
    row_terms = rng.integers(-(2**20), 2**20, size=40)
    got = np.empty(40, np.int32)
    _integer_scores.cosine_best(dots, norms, inverse, offsets, row_terms, got)
    np.testing.assert_array_equal(got, _cosine_reference(dots, norms, offsets, row_terms))


def test_the_cosine_arg_max_keeps_exact_ties_of_different_centers_apart():
    # Center 2j + 1 is center 2j scaled by 2: |w| doubles exactly, and so does x.w, so the
    # two scores are equal to the last bit; the lower index must win, whichever stripe each
    # of the pair falls in.
    rng = np.random.default_rng(5)
    base_dots = rng.integers(0, 2**20, size=(64, 40))
    base_terms = rng.integers(1, 2**22, size=40)
    dots = np.empty((64, 80), np.int32)
    dots[:, 0::2] = base_dots
    dots[:, 1::2] = 2 * base_dots
    center_term = np.empty(80, np.int64)
    center_term[0::2] = base_terms
    center_term[1::2] = 4 * base_terms
    block = _integer_scores.IntegerCenters(
        b=np.zeros((1, 80), np.int8), center_term=center_term, b_sums=np.zeros(80, np.int64),
        metric="cosine",
    )  # fmt: skip
    norms, inverse, offsets = _integer_scores.cosine_center_terms(block, 0)
    row_terms = np.zeros(64, np.int64)
    got = np.empty(64, np.int32)
    _integer_scores.cosine_best(dots, norms, inverse, offsets, row_terms, got)
    expected = _cosine_reference(dots, norms, offsets, row_terms)
    np.testing.assert_array_equal(got, expected)
    assert (expected % 2 == 0).all()  # the tie always goes to the lower of the pair
