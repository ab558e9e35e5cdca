"""Algorithm 1 (independent-set coarsening) and the eq. (5) coarse graph, property-tested."""

import numpy as np
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.sparse.csgraph import connected_components

from mbn_core.multilevel import _coarsen
from mbn_core.multilevel import _solvers as _multilevel


@st.composite
def connected_graphs(draw):
    """A random tree (always connected) plus random extra edges, with Euclidean lengths."""
    n = draw(st.integers(2, 40))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.RandomState(seed)
    parents = [int(rng.randint(i)) for i in range(1, n)]
    n_extra = draw(st.integers(0, 3 * n))
    rows = list(range(1, n)) + list(rng.randint(n, size=n_extra))
    cols = parents + list(rng.randint(n, size=n_extra))
    points = rng.normal(size=(n, 3))
    return _graph(points, rows, cols), points


def _graph(points, rows, cols):
    rows, cols = np.asarray(rows), np.asarray(cols)
    keep = rows != cols
    rows, cols = rows[keep], cols[keep]
    lengths = np.linalg.norm(points[rows] - points[cols], axis=1)
    n = len(points)
    graph = sp.csr_matrix((lengths, (rows, cols)), shape=(n, n))
    graph = graph.maximum(graph.T).tocsr()
    graph.sort_indices()
    return graph


def _states(graph, order, seed=0):
    return _multilevel.independent_set(graph, order, np.random.RandomState(seed))


@settings(max_examples=60, deadline=None)
@given(connected_graphs(), st.sampled_from(["fixed", "random"]))
def test_coarse_set_is_maximal_independent_and_keeps_the_graph_connected(case, order):
    graph, _ = case
    state = _states(graph, order)
    coarse = state == _coarsen.COARSE
    assert set(np.unique(state)) <= {_coarsen.COARSE, _coarsen.FINE}
    adjacency = (graph != 0).astype(int)
    # Independent: no edge joins two coarse vertices.
    assert adjacency[coarse][:, coarse].nnz == 0
    # Maximal: every fine vertex has a coarse neighbour.
    assert np.all(np.asarray(adjacency[~coarse][:, coarse].sum(axis=1)).ravel() > 0)
    indptr, indices, lengths = _coarsen.coarse_graph(
        graph.indptr.astype(np.int64), graph.indices.astype(np.int64), graph.data, state
    )
    n_coarse = int(coarse.sum())
    coarse_graph = sp.csr_matrix((lengths, indices, indptr), shape=(n_coarse, n_coarse))
    assert connected_components(coarse_graph, directed=False)[0] == 1


@settings(max_examples=40, deadline=None)
@given(connected_graphs())
def test_coarse_lengths_are_the_shortest_two_hop_paths(case):
    graph, points = case
    state = _states(graph, "random", seed=3)
    indptr, indices, lengths = _coarsen.coarse_graph(
        graph.indptr.astype(np.int64), graph.indices.astype(np.int64), graph.data, state
    )
    coarse = np.flatnonzero(state == _coarsen.COARSE)
    dense = graph.toarray()
    expected = {}
    for a, i in enumerate(coarse):
        for b, k in enumerate(coarse):
            both = np.flatnonzero(dense[i] * dense[:, k])
            via = dense[i, both] + dense[both, k]
            if i != k and len(via):
                expected[(a, b)] = via.min()
    found = {}
    for a in range(len(coarse)):
        for slot in range(indptr[a], indptr[a + 1]):
            found[(a, int(indices[slot]))] = lengths[slot]
        assert np.all(np.diff(indices[indptr[a] : indptr[a + 1]]) > 0)
    assert found.keys() == expected.keys()
    for (a, b), length in found.items():
        assert np.isclose(length, expected[(a, b)])
        # Triangle inequality: a 2-hop path is never shorter than the straight line.
        assert length >= np.linalg.norm(points[coarse[a]] - points[coarse[b]]) - 1e-12


def test_fixed_order_is_deterministic_and_random_order_follows_the_seed():
    rng = np.random.RandomState(0)
    points = rng.normal(size=(200, 2))
    rows = np.repeat(np.arange(200), 5)
    cols = np.argsort(((points[:, None] - points[None]) ** 2).sum(-1), axis=1)[:, 1:6].ravel()
    graph = _graph(points, rows, cols)
    assert np.array_equal(_states(graph, "fixed", 1), _states(graph, "fixed", 2))
    assert np.array_equal(_states(graph, "random", 7), _states(graph, "random", 7))
    # The seed's uniforms decide the order: each seed's states are those of its draws.
    indptr, indices = graph.indptr.astype(np.int64), graph.indices.astype(np.int64)
    for seed in (7, 8):
        uniforms = np.random.RandomState(seed).random_sample(400)
        np.testing.assert_array_equal(
            _states(graph, "random", seed),
            _coarsen.independent_set_random(indptr, indices, uniforms),
        )
    assert not np.array_equal(_states(graph, "random", 7), _states(graph, "random", 8))


def test_random_order_starts_at_the_vertex_its_uniforms_rank_first():
    # Path 0-1-2-3-4. Starting at an even vertex, the coarse set is {0, 2, 4}; at an odd one,
    # {1, 3} (each coarse vertex makes its neighbours fine, the next coarse one is 2 hops on).
    graph = _graph(np.arange(5.0)[:, None], [0, 1, 2, 3], [1, 2, 3, 4])
    indptr, indices = graph.indptr.astype(np.int64), graph.indices.astype(np.int64)
    for start in range(5):
        uniforms = np.full(10, 0.5)
        uniforms[5 + start] = 0.0  # the last n numbers rank the start vertices
        state = _coarsen.independent_set_random(indptr, indices, uniforms)
        coarse = np.flatnonzero(state == _coarsen.COARSE).tolist()
        assert coarse == ([0, 2, 4] if start % 2 == 0 else [1, 3]), start


def test_fixed_order_starts_at_vertex_zero_and_expands_first_in_first_out():
    # Path 0-1-2-3-4: 0 coarse, 1 fine, then 2 coarse, 3 fine, 4 coarse.
    points = np.arange(5.0)[:, None]
    path = _graph(points, [0, 1, 2, 3], [1, 2, 3, 4])
    assert list(_states(path, "fixed")) == [1, 2, 1, 2, 1]
    # Pendant 0 on the cycle 1-2-3-4-5-1. Expanding 0 queues 2 then 5; expanding 2 queues 4
    # behind 5. First in, first out takes 5 (which makes 4 fine); the smallest index would
    # have taken 4.
    points = np.random.RandomState(0).normal(size=(6, 2))
    cycle = _graph(points, [0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 1])
    assert list(_states(cycle, "fixed")) == [1, 2, 1, 2, 2, 1]
