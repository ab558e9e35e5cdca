"""ModularKPCA and its baselines as scikit-learn estimators, and their exact maps."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics.pairwise import euclidean_distances
from sklearn.utils.estimator_checks import parametrize_with_checks

from mbn_core import ModularBaseline, ModularKPCA, TrainingStopped
from mbn_core.modular.evaluation import (
    ensemble_predict,
    input_neighbours,
    majority_vote,
    modular_neighbours,
    rerank,
    retrieval_precision,
)
from mbn_core.modular.kernel_map import fit_kernel_features, kwok_tsang_gamma

SMALL = {"n_modules": 3, "module_dim": 4, "n_landmarks": 60, "random_state": 0}


@pytest.fixture(scope="module")
def sample(digits):
    """The first 400 digits scaled to [0, 1], and their labels."""
    X, y = digits
    return X[:400] / 16.0, y[:400]


@pytest.fixture(scope="module")
def fitted(sample):
    return ModularKPCA(**SMALL, max_epochs=30).fit(sample[0][:300])


@parametrize_with_checks(
    [
        ModularKPCA(n_modules=3, module_dim=2, n_landmarks=15, max_epochs=5, random_state=0),
        ModularBaseline("bootstrap", n_modules=2, module_dim=2, n_landmarks=15, random_state=0),
    ]
)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


def test_kwok_tsang_gamma_is_one_over_the_mean_squared_distance(sample):
    X = sample[0][:100]
    mean_sq = np.mean(euclidean_distances(X, squared=True))
    np.testing.assert_allclose(kwok_tsang_gamma(X), 1.0 / mean_sq, rtol=1e-10)
    assert kwok_tsang_gamma(np.ones((5, 3))) == 1.0


def test_transform_is_batch_independent_bit_for_bit(fitted, sample):
    X = sample[0][300:]
    batch = fitted.transform(X)
    alone = np.vstack([fitted.transform(X[i : i + 1]) for i in range(len(X))])
    assert np.array_equal(batch, alone)
    assert np.array_equal(fitted.transform(X[::-1])[::-1], batch)


def test_transform_of_training_rows_reproduces_the_training_loss(fitted, sample):
    # A6.9, in sample space and independent of the compressed problem: the inner products of
    # transform(X_train) against the centred Nyström kernel give loss_curve_[-1].
    X = sample[0][:300]
    features = fit_kernel_features(X, SMALL["n_landmarks"], "auto", np.random.RandomState(0))
    psi = features.centred(X)
    K = psi @ psi.T
    modules = fitted.transform_modules(X)
    inner = np.einsum("imh,jmh->mij", modules, modules)
    per_module = np.mean([np.mean((P - K) ** 2) for P in inner])
    composite = np.mean((inner.mean(axis=0) - K) ** 2)
    lam = fitted.diversity_
    np.testing.assert_allclose(
        (1 - lam) * per_module + lam * composite, fitted.loss_curve_[-1], rtol=1e-6
    )
    # The concatenation is scaled so its Gram matrix is the mean of the modules'.
    joint = fitted.transform(X)
    np.testing.assert_allclose(joint @ joint.T, inner.mean(axis=0), atol=1e-10)


def test_loss_curve_decreases_and_fit_reports_its_shape(fitted):
    assert fitted.n_components_ == 12
    assert fitted.rank_ <= SMALL["n_landmarks"]
    assert len(fitted.loss_curve_) == fitted.n_iter_ + 1
    assert np.all(np.diff(fitted.loss_curve_) <= 0)
    assert fitted.loss_curve_[-1] < 0.5 * fitted.loss_curve_[0]


def loss_against_kernel(model, X, seed):
    """The training loss of ``model`` recomputed in sample space (as in the test above),
    against the centred Nyström kernel whose landmarks ``random_state=seed`` draws."""
    features = fit_kernel_features(X, model.n_landmarks, "auto", np.random.RandomState(seed))
    psi = features.centred(X)
    K = psi @ psi.T
    inner = np.einsum("imh,jmh->mij", *[model.transform_modules(X)] * 2)
    per_module = np.mean([np.mean((P - K) ** 2) for P in inner])
    composite = np.mean((inner.mean(axis=0) - K) ** 2)
    return (1 - model.diversity_) * per_module + model.diversity_ * composite


@pytest.mark.slow
def test_same_seed_same_model_and_different_seed_differs(sample):
    X = sample[0][:150]
    a = ModularKPCA(**SMALL, max_epochs=5).fit(X).transform(X)
    b = ModularKPCA(**SMALL, max_epochs=5).fit(X).transform(X)
    other = ModularKPCA(**{**SMALL, "random_state": 1}, max_epochs=5).fit(X)
    assert np.array_equal(a, b)
    # The seed draws the landmarks: the other seed's model was fitted to seed 1's kernel
    # (its training loss is recomputed against it), not to seed 0's.
    loss = other.loss_curve_[-1]
    np.testing.assert_allclose(loss_against_kernel(other, X, 1), loss, rtol=1e-6)
    assert not np.isclose(loss_against_kernel(other, X, 0), loss, rtol=1e-3)
    assert not np.allclose(a, other.transform(X))


@pytest.mark.slow
def test_callback_sees_every_module_and_can_stop(sample):
    X = sample[0][:100]
    seen = []
    model = ModularKPCA(**SMALL, max_epochs=2, tol=0.0, callback=lambda *a: seen.append(a))
    model.fit(X)
    assert seen == [(e, m, 3) for e in range(2) for m in range(1, 4)]

    stopper = ModularKPCA(**SMALL, callback=lambda epoch, module, total: module == 2)
    with pytest.raises(TrainingStopped):
        stopper.fit(X)
    assert not hasattr(stopper, "map_")
    # A refit that stops leaves the previous model in place.
    model.set_params(callback=lambda *a: True)
    before = model.transform(X[:3])
    with pytest.raises(TrainingStopped):
        model.fit(X[:50])
    assert np.array_equal(model.transform(X[:3]), before)


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({"n_modules": 0}, "n_modules"),
        ({"module_dim": 2.5}, "module_dim"),
        ({"diversity": 1.5}, "diversity"),
        ({"diversity": "auto"}, "diversity"),
        ({"gamma": -1.0}, "gamma"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"n_landmarks": 0}, "n_landmarks"),
        ({"callback": 3}, "callback"),
    ],
)
def test_bad_parameters_raise_value_error_naming_them(sample, params, name):
    with pytest.raises(ValueError, match=name):
        ModularKPCA(**{**SMALL, **params}).fit(sample[0][:50])


def test_bad_input_raises_value_error(fitted, sample):
    with pytest.raises(ValueError, match="features"):
        fitted.transform(sample[0][:2, :10])
    bad = sample[0][:2].copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        fitted.transform(bad)
    with pytest.raises(ValueError, match="12 samples"):
        ModularKPCA(**SMALL, diversity="validate").fit(sample[0][:10])


@pytest.mark.slow
def test_validate_picks_a_diversity_from_the_grid_by_retrieval(sample):
    model = ModularKPCA(**SMALL, diversity="validate", max_epochs=10).fit(sample[0][:200])
    scores = model.validation_scores_
    assert set(scores) == {0.0, 0.2, 0.5, 0.8, 0.9, 0.95, 0.99, 0.999, 1.0}
    assert model.diversity_ in scores
    assert scores[model.diversity_] == max(scores.values())
    # Diverse modules retrieve better than identical ones (λ = 0), as in the paper.
    assert scores[model.diversity_] > scores[0.0]


@pytest.mark.slow
def test_baselines_share_the_landmarks_and_have_their_structure(sample):
    X = sample[0][:200]
    mbm = ModularKPCA(**SMALL, max_epochs=3).fit(X)
    maps = {
        name: ModularBaseline(name, **SMALL).fit(X).map_
        for name in ("monolithic", "partition", "bootstrap", "random")
    }
    for landmark_map in maps.values():
        assert np.array_equal(landmark_map.landmarks, mbm.map_.landmarks)
    mono = maps["monolithic"]
    assert (mono.n_modules, mono.module_dim) == (1, 12)
    # Partition: the same 12 kernel principal components, regrouped (and scaled by M^-1/2).
    part = maps["partition"]
    mono_rows = {tuple(np.round(r, 10)) for r in mono.weights}
    part_rows = {tuple(np.round(r * 1.0, 10)) for r in part.weights}
    assert mono_rows == part_rows
    # Monolithic output is PCA of the features: uncorrelated, decreasing variance.
    Z = ModularBaseline("monolithic", **SMALL).fit(X).transform(X)
    covariance = np.cov(Z.T)
    np.testing.assert_allclose(covariance - np.diag(np.diag(covariance)), 0, atol=1e-9)
    assert np.all(np.diff(np.diag(covariance)) <= 1e-12)
    rows = maps["random"].weights
    assert rows.shape == (12, SMALL["n_landmarks"])


@pytest.mark.slow
def test_mbm_retrieves_better_than_the_modular_baselines(sample):
    # The ranking of Table 2 (retrieval) at a small scale: digits, 300 train / 100 queries.
    X, _ = sample
    train, queries = X[:300], X[300:]
    truth = input_neighbours(train, queries, 10)
    params = {"n_modules": 5, "module_dim": 4, "n_landmarks": 150, "random_state": 0}
    precision = {}
    models = {"mbm": ModularKPCA(**params, diversity=0.99, max_epochs=60)}
    for name in ("partition", "bootstrap", "random"):
        models[name] = ModularBaseline(name, **params)
    for name, model in models.items():
        model.fit(train)
        retrieved = modular_neighbours(
            model.transform_modules(train), model.transform_modules(queries), 10
        )
        precision[name] = retrieval_precision(retrieved, truth)
    assert precision["mbm"] > max(precision[n] for n in ("partition", "bootstrap", "random"))


def test_modular_neighbours_rerank_the_union_of_module_candidates():
    rng = np.random.default_rng(0)
    database = rng.standard_normal((50, 3, 2))
    queries = rng.standard_normal((4, 3, 2))
    found = modular_neighbours(database, queries, 5)
    flat = database.reshape(50, -1)
    for q, row in zip(queries.reshape(4, -1), found, strict=True):
        distance = np.sum((flat - q) ** 2, axis=1)
        # Sorted by full distance, no duplicates, and each is some module's 5-NN.
        assert np.all(np.diff(distance[row]) >= 0)
        assert len(set(row)) == 5
    assert retrieval_precision(found, found) == 1.0
    with pytest.raises(ValueError, match="kappa"):
        modular_neighbours(database, queries, 51)


def test_ensemble_vote_breaks_ties_towards_the_smallest_label():
    # Two modules, each a perfect 1-NN for a different labelling: every vote ties 1-1.
    database = np.array([[[0.0], [1.0]], [[1.0], [0.0]]])
    labels = np.array([7, 3])
    queries = np.array([[[0.0], [0.0]]])
    assert ensemble_predict(database, labels, queries, n_neighbors=1).tolist() == [3]


def test_merge_steps_alone():
    # rerank: a candidate found by two modules counts once, and the order is the full distance.
    database = np.array([[[0.0], [0.0]], [[1.0], [1.0]], [[3.0], [0.0]], [[5.0], [5.0]]])
    query = np.zeros((1, 2, 1))
    candidates = np.array([[3, 1, 1, 2]])
    assert rerank(database, query, candidates, 3).tolist() == [[1, 2, 3]]
    # majority_vote: the most frequent class per row, the smallest on a tie.
    votes = np.array([[2, 0, 2], [1, 0, 2], [4, 4, 1]])
    assert majority_vote(votes, 5).tolist() == [2, 0, 4]
