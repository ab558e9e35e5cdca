"""Exact, batch-independent k-NN and the connected k-NN graph (the paper's footnote 4)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.sparse.csgraph import connected_components

from mbn_core.multilevel.neighbors import (
    _exact_kneighbors,
    _first_precision,
    exact_kneighbors,
    knn_graph,
)


def _brute(reference, queries, k):
    distances = np.sqrt(((queries[:, None, :] - reference[None]) ** 2).sum(-1))
    order = np.lexsort((np.broadcast_to(np.arange(len(reference)), distances.shape), distances))
    order = order[:, :k]
    return np.take_along_axis(distances, order, axis=1), order


@pytest.mark.parametrize("first", ["float32", "float64"])
def test_matches_brute_force_with_ties_broken_by_index(first):
    # Integer grid points: many exactly tied distances.
    rng = np.random.RandomState(0)
    reference = rng.randint(0, 4, size=(300, 3)).astype(float)
    queries = rng.randint(0, 4, size=(50, 3)).astype(float) + 0.5
    distances, indices = _exact_kneighbors(reference, queries, 12, False, first)
    expected_d, expected_i = _brute(reference, queries, 12)
    np.testing.assert_allclose(distances, expected_d, rtol=1e-12)
    assert np.array_equal(indices, expected_i)


@pytest.mark.parametrize("first", ["float32", "float64"])
def test_few_wide_rows_with_ties_match_brute_force(first):
    # Few rows of many features (the Teapot-like shape), far beyond the width where float32
    # rounding could be ignored. 0/1 entries make every squared distance an exact integer, so
    # ties are exact (many rows are equally far apart) and must go to the smaller index.
    rng = np.random.RandomState(5)
    X = rng.randint(0, 2, size=(60, 20_000)).astype(float)
    X[10] = X[3]  # a duplicate: distance 0
    X[21] = X[20]
    X[21, :2] = 1 - X[20, :2]  # two coordinates apart
    X[40:50] = X[30]
    X[40:50, np.arange(10) * 7] = 1 - X[30, np.arange(10) * 7]  # ten equal rows, each tied
    distances, indices = _exact_kneighbors(X, X, 7, True, first)
    for i in range(len(X)):
        d = np.sqrt(((X - X[i]) ** 2).sum(axis=1))
        d[i] = np.inf
        order = np.lexsort((np.arange(len(X)), d))[:7]
        assert np.array_equal(indices[i], order), i
        assert np.array_equal(distances[i], d[order]), i


def test_answer_does_not_depend_on_the_first_estimate_bit_for_bit():
    rng = np.random.RandomState(6)
    reference = rng.normal(size=(2000, 30)) * 100
    queries = rng.normal(size=(300, 30)) * 100
    # The batch is estimated in float32, a single row in float64: same answers, bit for bit.
    assert _first_precision(300, 2000, False) == "float32"
    assert _first_precision(1, 2000, False) == "float64"
    distances, indices = exact_kneighbors(reference, queries, 9)
    for row in (0, 123, 299):
        d1, i1 = exact_kneighbors(reference, queries[row : row + 1], 9)
        assert np.array_equal(d1[0], distances[row])
        assert np.array_equal(i1[0], indices[row])


def test_batch_independent_bit_for_bit():
    rng = np.random.RandomState(1)
    reference = rng.normal(size=(500, 30)) * 100
    queries = rng.normal(size=(40, 30)) * 100
    distances, indices = exact_kneighbors(reference, queries, 7)
    for row in (0, 17, 39):
        d1, i1 = exact_kneighbors(reference, queries[row : row + 1], 7)
        assert np.array_equal(d1[0], distances[row])
        assert np.array_equal(i1[0], indices[row])


def test_exclude_self_skips_each_row_itself():
    rng = np.random.RandomState(2)
    X = rng.normal(size=(60, 4))
    _, indices = exact_kneighbors(X, X, 5, exclude_self=True)
    assert not np.any(indices == np.arange(60)[:, None])
    _, expected = _brute(X, X, 6)
    assert np.array_equal(indices, expected[:, 1:])


def test_disconnected_graph_gets_the_shortest_edge_between_components():
    rng = np.random.RandomState(3)
    left = rng.normal(size=(30, 2))
    right = rng.normal(size=(30, 2)) + np.array([50.0, 0.0])
    X = np.vstack([left, right])
    graph = knn_graph(X, 4)
    assert connected_components(graph, directed=False)[0] == 1
    between = graph[:30][:, 30:].tocoo()
    gaps = np.linalg.norm(left[:, None] - right[None], axis=-1)
    i, j = np.unravel_index(np.argmin(gaps), gaps.shape)
    # Exactly one edge (both directions) was added: the closest pair of the two blobs.
    assert between.nnz == 1
    assert (between.row[0], between.col[0]) == (i, j)
    assert np.isclose(between.data[0], gaps[i, j])
    assert np.allclose((graph - graph.T).data, 0)


def test_duplicate_rows_keep_their_edges():
    X = np.array([[0.0, 0], [0, 0], [1, 0], [2, 0], [3, 0]])
    graph = knn_graph(X, 1)
    assert graph[0, 1] > 0 and graph[1, 0] > 0
    assert connected_components(graph, directed=False)[0] == 1


def test_near_duplicates_beyond_float32_resolution_are_ranked_exactly():
    rng = np.random.RandomState(4)
    base = rng.uniform(100, 200, size=2000)
    # Rows a hair apart relative to their norms: float32 sees them all as ties.
    reference = base + 1e-3 * rng.normal(size=(300, 2000))
    queries = base + 1e-3 * rng.normal(size=(5, 2000))
    distances, indices = exact_kneighbors(reference, queries, 4)
    expected_d, expected_i = _brute(reference, queries, 4)
    assert np.array_equal(indices, expected_i)
    np.testing.assert_allclose(distances, expected_d, rtol=1e-9)
    d1, i1 = exact_kneighbors(reference, queries[2:3], 4)
    assert np.array_equal(i1[0], indices[2]) and np.array_equal(d1[0], distances[2])


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 30),
    d=st.sampled_from([1, 3, 40, 2500]),
    n_queries=st.integers(0, 5),
    scale_exp=st.integers(-20, 20),
    self_queries=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
    first=st.sampled_from(["float32", "float64"]),
    data=st.data(),
)
def test_any_shape_matches_brute_force(n, d, n_queries, scale_exp, self_queries, seed, first, data):
    # Small integers times a power of two: every squared distance is exact in float64, so
    # ties are real and the brute force below is the truth whatever the summation order.
    rng = np.random.RandomState(seed)
    reference = rng.randint(0, 3, size=(n, d)) * 2.0**scale_exp
    queries = reference if self_queries else rng.randint(0, 3, size=(n_queries, d)) * 2.0**scale_exp
    k = data.draw(st.integers(1, n - 1 if self_queries else n))
    distances, indices = _exact_kneighbors(reference, queries, k, self_queries, first)
    for row, query in enumerate(queries):
        dist = np.sqrt(((reference - query) ** 2).sum(axis=1))
        if self_queries:
            dist[row] = np.inf
        order = np.lexsort((np.arange(n), dist))[:k]
        assert np.array_equal(indices[row], order)
        assert np.array_equal(distances[row], dist[order])
