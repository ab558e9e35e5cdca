"""The bottom layer's coarse pass gives the integer path's codes, bit for bit, ties included."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits

from mbn_core import MBN
from mbn_core.mbn import coarse_pass
from mbn_core.mbn._integer_scores import (
    integer_centers,
    integer_codes,
    integer_rows,
    kernel_is_exact,
)

pytestmark = pytest.mark.skipif(not kernel_is_exact(), reason="no exact integer kernel here")


def _both(X, center_rows, features, from_previous=None):
    rows = integer_rows(X, X)
    assert rows is not None
    centers = integer_centers(X, center_rows, features, rows.low, "euclidean", from_previous)
    return integer_codes(rows, features, centers), coarse_pass.coarse_codes(rows, features, centers)


def _digits_uint8() -> np.ndarray:
    # Digits' 0-16 levels spread over 0-240: rows with structure, as images have.
    return (load_digits().data * 15).astype(np.uint8)


@pytest.mark.parametrize("seed", range(3))
def test_random_rows_and_centers(seed):
    rng = np.random.default_rng(seed)
    X = rng.integers(0, 256, size=(3000, 300), dtype=np.uint8)
    features = np.sort(rng.choice(300, 160, replace=False))
    expected, got = _both(X, rng.choice(3000, 501, replace=False), features)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("n_centers", [1, 5, 16, 17, 700])
def test_structured_rows_any_number_of_centers(n_centers):
    X = _digits_uint8()
    rng = np.random.default_rng(n_centers)
    features = np.sort(rng.choice(64, 48, replace=False))
    expected, got = _both(X, rng.choice(len(X), n_centers, replace=False), features)
    np.testing.assert_array_equal(got, expected)


def test_ties_go_to_the_lowest_center():
    # Binary rows with few distinct values: many rows equidistant from several centers, and
    # centers repeated, so the lowest index must win as the integer path's arg-max has it.
    rng = np.random.default_rng(7)
    X = (rng.random((2000, 40)) < 0.1).astype(np.uint8) * 255
    center_rows = np.concatenate([rng.choice(2000, 150, replace=False)] * 2)
    expected, got = _both(X, center_rows, np.arange(40))
    np.testing.assert_array_equal(got, expected)
    assert len(np.unique(expected)) < 150  # the repeats' higher copies never win


def test_random_reconstruction_of_the_centers():
    X = _digits_uint8()
    rng = np.random.default_rng(3)
    features = np.arange(64)
    expected, got = _both(X, rng.choice(len(X), 300, replace=False), features, rng.random(64) < 0.3)
    np.testing.assert_array_equal(got, expected)


def test_rows_and_centers_alike_everywhere_leave_it_to_the_integer_path():
    X = np.full((500, 30), 9, dtype=np.uint8)
    _, got = _both(X, np.arange(20), np.arange(30))
    assert got is None


def _image_like(n: int, d: int, seed: int) -> np.ndarray:
    # Low-rank rows clipped to 0-255 with a few saturated pixels: the production shape
    # (m = 64 directions of d >= 256 dimensions), where the projection is not an isometry.
    rng = np.random.default_rng(seed)
    factors = rng.normal(0, 1, (n, 12)) @ rng.normal(0, 40, (12, d))
    X = np.clip(factors + 90, 0, 255)
    X[rng.random((n, d)) < 0.05] = 255
    return X.astype(np.uint8)


@pytest.mark.parametrize("n_rows", [1, 31, 32, 33, 3000])
def test_image_like_rows_in_the_production_shape(n_rows):
    X = _image_like(max(n_rows, 600), 320, n_rows)[:n_rows]
    rng = np.random.default_rng(n_rows)
    features = np.sort(rng.choice(320, 300, replace=False))
    data = _image_like(600, 320, 99)
    rows = integer_rows(X, data)
    assert rows is not None
    centers = integer_centers(data, rng.choice(600, 400, replace=False), features, rows.low,
                              "euclidean")  # fmt: skip
    got = coarse_pass.coarse_codes(rows, features, centers)
    assert got is not None
    np.testing.assert_array_equal(got, integer_codes(rows, features, centers))


def test_binary_rows_keep_a_tight_bound():
    # 0/1 pixels: the rounding bound follows the rows' actual magnitudes, not 255 per pixel.
    rng = np.random.default_rng(2)
    X = (rng.random((1200, 256)) < 0.3).astype(np.uint8)
    expected, got = _both(X, rng.choice(1200, 300, replace=False), np.arange(256))
    assert got is not None
    np.testing.assert_array_equal(got, expected)


def test_rows_the_projection_does_not_separate_finish_on_the_integer_path(monkeypatch):
    # Uniform noise leaves most centers within reach; past CHECKED_ROWS the rest of the rows
    # go to the integer path, with the same codes.
    monkeypatch.setattr(coarse_pass, "CHECKED_ROWS", 64)
    rng = np.random.default_rng(4)
    X = rng.integers(0, 256, size=(2000, 256), dtype=np.uint8)
    rows = integer_rows(X, X)
    assert rows is not None
    centers = integer_centers(X, rng.choice(2000, 300, replace=False), np.arange(256), rows.low,
                              "euclidean")  # fmt: skip
    calls = []
    original = coarse_pass.integer_codes

    def counted(rest, *args):
        calls.append(rest.shape[0])
        return original(rest, *args)

    monkeypatch.setattr(coarse_pass, "integer_codes", counted)
    got = coarse_pass.coarse_codes(rows, np.arange(256), centers)
    assert calls == [2000 - 64]
    np.testing.assert_array_equal(got, original(rows, np.arange(256), centers))


@pytest.mark.parametrize("seed", range(4))
def test_adversarial_rows(seed):
    # Few distinct values, duplicates, one-unit near ties, low rank, rows at the centers'
    # mean: where a rounding allowance cut short would first lose a center.
    rng = np.random.default_rng(100 + seed)
    for case in range(60):
        n = int(rng.choice([5, 40, 200]))
        d = int(rng.choice([70, 130, 260]))
        kind = case % 5
        if kind == 0:
            X = rng.choice(rng.integers(0, 256, 3), size=(n, d)).astype(np.uint8)
        elif kind == 1:
            X = rng.integers(0, 256, size=(3, d), dtype=np.uint8)[rng.integers(0, 3, n)]
        elif kind == 2:
            X = rng.choice([0, 255], size=(n, d)).astype(np.int16)
            X = np.clip(X + rng.integers(-1, 2, size=(n, d)), 0, 255).astype(np.uint8)
        elif kind == 3:
            X = _image_like(n, d, int(rng.integers(1 << 30)))
        else:
            X = rng.integers(0, 256, size=(n, d), dtype=np.uint8)
            X[: n // 2] = np.round(X.mean(axis=0)).astype(np.uint8)
        features = np.sort(rng.choice(d, int(rng.integers(d // 2, d + 1)), replace=False))
        center_rows = rng.integers(0, n, int(rng.choice([1, 17, n])))
        expected, got = _both(X, center_rows, features)
        if got is not None:
            np.testing.assert_array_equal(got, expected, err_msg=f"case {case}")


def test_the_bound_holds_through_an_offset_low():
    # Values in [100, 355] shift by low = 100 into uint8; distances do not move.
    rng = np.random.default_rng(11)
    X = rng.integers(100, 356, size=(1500, 80)).astype(np.float32)
    features = np.sort(rng.choice(80, 70, replace=False))
    expected, got = _both(X, rng.choice(1500, 400, replace=False), features)
    np.testing.assert_array_equal(got, expected)


def test_where_it_is_taken():
    def centers(k, n_chosen=300, metric="euclidean"):
        data = np.ones((k, n_chosen))
        return integer_centers(data, np.arange(k), np.arange(n_chosen), 0, metric)

    assert coarse_pass.pays(70_000, centers(8000))
    assert coarse_pass.pays(5_000, centers(8000))
    assert not coarse_pass.pays(1_000, centers(8000))  # its cost per call
    assert not coarse_pass.pays(70_000, centers(1000))  # its cost per row
    assert not coarse_pass.pays(70_000, centers(8000, metric="cosine"))
    assert not coarse_pass.pays(70_000, centers(8000, n_chosen=200))  # too few to project
    assert not coarse_pass.pays(70_000, centers(8000, n_chosen=2000))  # directions too dear


def test_a_fit_through_it_is_the_same_model(monkeypatch):
    X = _digits_uint8()
    params = {"n_clusterings": 24, "k_max": 600, "random_state": 0, "n_jobs": 2}
    before = MBN(**params)
    embedding = before.fit_transform(X)
    taken = []
    original = coarse_pass.coarse_codes

    def counted(*args):
        codes = original(*args)
        taken.append(codes is not None)
        return codes

    monkeypatch.setattr(coarse_pass, "ROW_CENTERS", 0)
    monkeypatch.setattr(coarse_pass, "CALL_PAIRS", 100_000)
    monkeypatch.setattr(coarse_pass, "DIMENSIONS", 16)
    monkeypatch.setattr(coarse_pass, "MIN_CHOSEN", 32)
    monkeypatch.setattr(coarse_pass, "coarse_codes", counted)
    after = MBN(**params)
    np.testing.assert_array_equal(after.fit_transform(X), embedding)
    assert taken == [True] * 24  # every bottom clustering took the coarse pass
    np.testing.assert_array_equal(after.transform(X[:7]), before.transform(X[:7]))


@pytest.mark.parametrize("n_features", [1, 2])
def test_few_dimensions_where_the_levels_rounding_is_the_bound(n_features):
    # With one or two directions, rows and centers a level apart are common and the
    # rounding allowance decides which centers are scored: cut short, it loses nearest ones.
    for seed in range(20):
        rng = np.random.default_rng(seed)
        X = rng.integers(0, 256, size=(700, n_features), dtype=np.uint8)
        expected, got = _both(X, rng.integers(0, 700, 100), np.arange(n_features))
        assert got is not None
        np.testing.assert_array_equal(got, expected, err_msg=f"seed {seed}")
