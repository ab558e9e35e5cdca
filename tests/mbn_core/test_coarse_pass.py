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


def test_the_bound_holds_through_an_offset_low():
    # Values in [100, 355] shift by low = 100 into uint8; distances do not move.
    rng = np.random.default_rng(11)
    X = rng.integers(100, 356, size=(1500, 80)).astype(np.float32)
    features = np.sort(rng.choice(80, 70, replace=False))
    expected, got = _both(X, rng.choice(1500, 400, replace=False), features)
    np.testing.assert_array_equal(got, expected)


def test_where_it_is_taken():
    def centers(k, n_chosen=200, metric="euclidean"):
        data = np.ones((k, n_chosen))
        return integer_centers(data, np.arange(k), np.arange(n_chosen), 0, metric)

    assert coarse_pass.pays(70_000, centers(8000))
    assert coarse_pass.pays(5_000, centers(8000))
    assert not coarse_pass.pays(1_000, centers(8000))  # its cost per call
    assert not coarse_pass.pays(70_000, centers(1000))  # its cost per row
    assert not coarse_pass.pays(70_000, centers(8000, metric="cosine"))
    assert not coarse_pass.pays(70_000, centers(8000, n_chosen=100))  # fewer than 2 m


def test_a_fit_through_it_is_the_same_model(monkeypatch):
    X = _digits_uint8()
    params = {"n_clusterings": 24, "k_max": 600, "random_state": 0, "n_jobs": 2}
    before = MBN(**params)
    embedding = before.fit_transform(X)
    taken = []
    original = coarse_pass.coarse_codes

    def counted(*args):
        taken.append(1)
        return original(*args)

    monkeypatch.setattr(coarse_pass, "ROW_CENTERS", 0)
    monkeypatch.setattr(coarse_pass, "CALL_PAIRS", 100_000)
    monkeypatch.setattr(coarse_pass, "DIMENSIONS", 16)
    monkeypatch.setattr(coarse_pass, "coarse_codes", counted)
    after = MBN(**params)
    np.testing.assert_array_equal(after.fit_transform(X), embedding)
    assert len(taken) == 24  # every bottom clustering took the coarse pass
    np.testing.assert_array_equal(after.transform(X[:7]), before.transform(X[:7]))
