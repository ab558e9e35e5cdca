"""MultilevelEmbedding and MultilevelKMeans: the spec's acceptance tests (B6) and the API."""

import numpy as np
import pytest
from scipy.linalg import orthogonal_procrustes
from scipy.stats import spearmanr
from sklearn.cluster import KMeans
from sklearn.datasets import make_blobs, make_s_curve, make_swiss_roll
from sklearn.manifold import Isomap
from sklearn.utils.estimator_checks import parametrize_with_checks

from mbn_core import MultilevelEmbedding, MultilevelKMeans, TrainingStopped
from mbn_core.multilevel import _solvers as _multilevel
from mbn_core.multilevel.embedding import embedding_from_arrays, embedding_to_arrays
from mbn_core.multilevel.neighbors import knn_graph


@pytest.fixture(scope="module")
def swiss_roll():
    X, t = make_swiss_roll(2000, random_state=0)
    return X, np.c_[t, X[:, 1]]


@pytest.mark.slow
@parametrize_with_checks(
    [
        MultilevelEmbedding(n_neighbors=5, random_state=0),
        MultilevelEmbedding(method="lle", n_neighbors=5, n_levels=3, random_state=0),
        MultilevelEmbedding(method="eigenmaps", n_neighbors=5, order="fixed", weights="simple"),
        MultilevelKMeans(n_clusters=3, n_neighbors=5, random_state=0),
    ]
)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


def _aligned_spearman(Y, truth):
    """|Spearman| of each axis with its ground-truth coordinate after a best rotation."""
    Y = (Y - Y.mean(0)) / Y.std(0)
    truth = (truth - truth.mean(0)) / truth.std(0)
    rotation, _ = orthogonal_procrustes(Y, truth)
    Z = Y @ rotation
    return [abs(spearmanr(Z[:, a], truth[:, a])[0]) for a in range(truth.shape[1])]


@pytest.mark.parametrize(
    ("make", "paper"),
    [(make_swiss_roll, [2000, 351, 113, 38]), (make_s_curve, [2000, 353, 110, 34])],
    ids=["swiss roll", "S-curve"],
)
def test_manifold_levels_and_multilevel_isomap_recover_the_manifold(make, paper):
    # The paper's section 5: 2,000 points, k = 8, fixed order. Level sizes within 15% of the
    # paper's; at r = 2 both t and the height are recovered.
    X, t = make(2000, random_state=0)
    truth = np.c_[t, X[:, 1]]
    deep = MultilevelEmbedding(n_neighbors=8, n_levels=4, order="fixed", weights="simple")
    deep.fit(X)
    assert np.all(np.abs(np.array(deep.level_sizes_) - paper) <= 0.15 * np.array(paper))
    model = MultilevelEmbedding(n_neighbors=8, n_levels=2, order="fixed", weights="simple")
    assert min(_aligned_spearman(model.fit_transform(X), truth)) > 0.9


def test_one_level_isomap_is_sklearn_isomap():
    X, _ = make_swiss_roll(150, random_state=1)
    ours = MultilevelEmbedding(n_neighbors=8, n_levels=1).fit_transform(X)
    theirs = Isomap(n_neighbors=8, n_components=2).fit_transform(X)
    signs = np.sign((ours * theirs).sum(axis=0))
    np.testing.assert_allclose(ours * signs, theirs, atol=1e-8)


@pytest.mark.parametrize("kind", ["heat", "simple"])
def test_refined_points_are_weighted_means_of_their_neighbours(swiss_roll, kind):
    X = swiss_roll[0][:600]
    graph = knn_graph(X, 8)
    levels = _multilevel.build_levels(
        graph,
        max_levels=2,
        max_coarse_size=None,
        min_size=3,
        order="random",
        rng=np.random.RandomState(0),
        progress=lambda done: None,
    )
    coarse = levels[0].coarse
    coarse_embedding = np.random.RandomState(1).normal(size=(len(coarse), 2))
    weights, _ = _multilevel.edge_weights(graph, kind)
    Y = _multilevel.refine(weights, coarse, coarse_embedding)
    np.testing.assert_array_equal(Y[coarse], coarse_embedding)
    means = (weights @ Y) / np.asarray(weights.sum(axis=1))
    fine = np.setdiff1d(np.arange(len(X)), coarse)
    np.testing.assert_allclose(Y[fine], means[fine], atol=1e-10)


def test_iterative_refinement_solves_the_same_system(swiss_roll, monkeypatch):
    X = swiss_roll[0][:500]
    graph = knn_graph(X, 8)
    state = _multilevel.independent_set(graph, "fixed", np.random.RandomState(0))
    coarse = np.flatnonzero(state == 1)
    coarse_embedding = np.random.RandomState(2).normal(size=(len(coarse), 3))
    weights, _ = _multilevel.edge_weights(graph, "heat")
    direct = _multilevel.refine(weights, coarse, coarse_embedding)
    monkeypatch.setattr(_multilevel, "DIRECT_SOLVE_MAX", 0)
    iterative = _multilevel.refine(weights, coarse, coarse_embedding)
    np.testing.assert_allclose(iterative, direct, atol=1e-8)


def test_eigenmaps_embedding_is_D_orthonormal_and_orthogonal_to_D_ones(swiss_roll):
    graph = knn_graph(swiss_roll[0][:400], 8)
    weights, _ = _multilevel.edge_weights(graph, "heat")
    Y = _multilevel.embed_eigenmaps(weights, 3, seed=0)
    degree = np.asarray(weights.sum(axis=1)).ravel()
    np.testing.assert_allclose(Y.T @ (degree[:, None] * Y), np.eye(3), atol=1e-6)
    np.testing.assert_allclose(Y.T @ degree, 0, atol=1e-6)


def test_lle_bottom_is_the_null_space_of_its_variable_neighbourhood_weights(swiss_roll):
    X = swiss_roll[0][:300]
    graph = knn_graph(X, 8)  # symmetrised: neighbour lists of different lengths
    assert len(set(np.diff(graph.indptr))) > 1
    Y = _multilevel.embed_lle(graph, X, 2, np.random.RandomState(0))
    # Bottom eigenvectors of a symmetric M: orthonormal, and orthogonal to the constant
    # vector (M 1 = 0 because each row's barycentre weights sum to one).
    np.testing.assert_allclose(Y.T @ Y, np.eye(2), atol=1e-8)
    np.testing.assert_allclose(Y.sum(axis=0), 0, atol=1e-6)


def test_out_of_sample_training_rows_midpoints_and_batches(swiss_roll):
    X = swiss_roll[0][:800]
    model = MultilevelEmbedding(n_neighbors=8, random_state=0).fit(X)
    np.testing.assert_array_equal(model.transform(X[:50]), model.embedding_[:50])
    new = X[:40] + 0.3
    batch = model.transform(new)
    for row in range(0, 40, 7):
        np.testing.assert_array_equal(model.transform(new[row : row + 1])[0], batch[row])
    # With two neighbours, a point halfway between two rows lands between their embeddings.
    line = np.c_[np.linspace(0, 10, 60), np.sin(np.linspace(0, 3, 60))]
    pair = MultilevelEmbedding(n_neighbors=2, n_levels=1).fit(line)
    middle = pair.transform((line[20:21] + line[21:22]) / 2)[0]
    ends = pair.embedding_[20:22]
    assert np.all(middle >= ends.min(axis=0) - 1e-12)
    assert np.all(middle <= ends.max(axis=0) + 1e-12)


def test_same_seed_same_embedding_random_order(swiss_roll):
    X = swiss_roll[0][:500]
    first = MultilevelEmbedding(n_levels=3, random_state=5).fit_transform(X)
    second = MultilevelEmbedding(n_levels=3, random_state=5).fit_transform(X)
    np.testing.assert_array_equal(first, second)


def test_max_coarse_size_stops_coarsening(swiss_roll):
    X = swiss_roll[0]
    model = MultilevelEmbedding(n_neighbors=8, n_levels=None, max_coarse_size=150).fit(X)
    assert model.level_sizes_[-1] <= 150 < model.level_sizes_[-2]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"method": "tsne"}, "method"),
        ({"n_neighbors": 0}, "n_neighbors"),
        ({"n_neighbors": 40}, "n_neighbors=40 must be < n_samples=40"),
        ({"n_levels": None}, "n_levels and max_coarse_size"),
        ({"weights": "gaussian"}, "weights"),
        ({"callback": 3}, "callback"),
    ],
)
def test_bad_parameters_raise_value_error_naming_them(params, message):
    X = np.random.RandomState(0).normal(size=(40, 3))
    with pytest.raises(ValueError, match=message):
        MultilevelEmbedding(**params).fit(X)


def test_callback_reports_stages_and_can_stop(swiss_roll):
    X = swiss_roll[0][:600]
    calls = []
    MultilevelEmbedding(n_levels=3, callback=lambda *args: calls.append(args)).fit(X)
    assert calls == [(0, 1, 2), (0, 2, 2), (1, 1, 1), (2, 1, 2), (2, 2, 2)]
    model = MultilevelEmbedding(n_levels=3, callback=lambda stage, done, total: stage == 1)
    with pytest.raises(TrainingStopped, match="embed"):
        model.fit(X)
    assert not hasattr(model, "embedding_")


def test_disconnected_data_is_embedded_in_one_piece():
    X, _ = make_blobs(300, centers=[[0, 0, 0], [100, 0, 0]], random_state=0)
    Y = MultilevelEmbedding(n_neighbors=5, random_state=0).fit_transform(X)
    assert np.all(np.isfinite(Y))


@pytest.mark.parametrize("method", ["isomap", "lle", "eigenmaps"])
def test_equidistant_points_are_embedded(method):
    # One-hot rows: every distance is sqrt(2), so the coarse problem's eigenvalues are tied,
    # where LAPACK's syevr (SciPy 1.17.1's OpenBLAS) returned no eigenpairs at all.
    Y = MultilevelEmbedding(method=method, random_state=0).fit_transform(np.eye(60))
    assert Y.shape == (60, 2) and np.all(np.isfinite(Y))


@pytest.mark.parametrize("seed", [18, 36])
def test_far_edges_keep_the_refinement_solvable(seed):
    # 1-D Gaussian data with 3 neighbours: its outliers' edges are 30-40 times the median
    # length, and heat weights of 1e-200 and less made the refinement exactly singular.
    X = np.random.default_rng(seed).normal(size=(100, 1))
    Y = MultilevelEmbedding(n_neighbors=3, random_state=0).fit_transform(X)
    assert np.all(np.isfinite(Y))
    weights, _ = _multilevel.edge_weights(knn_graph(X, 3), "heat")
    assert weights.data.min() < 1e-90  # far edges already at the finest level


@pytest.mark.slow
def test_multilevel_kmeans_needs_no_more_final_iterations_than_random_kmeans(digits):
    X = digits.X[:900]
    ours, plain = [], []
    for seed in range(6):
        model = MultilevelKMeans(n_clusters=10, random_state=seed).fit(X)
        assert len(model.n_iter_levels_) == 2
        ours.append(model.n_iter_)
        baseline = KMeans(10, init="random", n_init=1, random_state=seed).fit(model.embedding_)
        plain.append(baseline.n_iter_)
    assert np.mean(ours) <= np.mean(plain)
    assert np.array_equal(model.predict(X[:20]), model.labels_[:20])


def test_arrays_round_trip_transforms_identically(swiss_roll):
    X = swiss_roll[0][:400]
    model = MultilevelEmbedding(n_neighbors=6, random_state=0).fit(X)
    params = {k: v for k, v in model.get_params().items() if k != "callback"}
    arrays = embedding_to_arrays(model)
    assert all(isinstance(value, np.ndarray) for value in arrays.values())
    loaded = embedding_from_arrays(arrays, params)
    new = X[:30] + 0.2
    np.testing.assert_array_equal(loaded.transform(new), model.transform(new))
    np.testing.assert_array_equal(loaded.transform(X[:5]), model.embedding_[:5])
    broken = dict(arrays, embedding=arrays["embedding"][:, :1])
    with pytest.raises(ValueError, match="'embedding'"):
        embedding_from_arrays(broken, params)
    with pytest.raises(ValueError, match="'sigma' is missing"):
        embedding_from_arrays({k: v for k, v in arrays.items() if k != "sigma"}, params)
