"""MBN's spectral output: the bottom x top co-association embedding and its Nystrom map."""

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.datasets import make_moons
from sklearn.metrics import normalized_mutual_info_score

from mbn_core import MBN, model_from_arrays, model_to_arrays
from mbn_core.mbn import coassociation
from mbn_core.mbn.coassociation import one_hot
from mbn_core.mbn.spectral import MAX_COASSOCIATION_PAIRS, fit_spectral


@pytest.fixture(scope="module")
def fitted(codes_output_fit):
    return codes_output_fit("spectral")


@pytest.mark.slow
def test_training_rows_get_unit_rows_of_the_weighted_eigenvectors(digits_split, fitted):
    model, embedding, _ = fitted
    assert embedding.shape == (500, 10)
    np.testing.assert_allclose(np.linalg.norm(embedding, axis=1), 1.0)
    assert model.explained_variance_ratio_ is None
    values = model.eigenvalues_
    assert values.shape == (10,) and np.all(np.diff(values) <= 0)
    # The normalised affinity's largest eigenvalue is 1 (its eigenvector is sqrt(degree)).
    assert values[0] == pytest.approx(1.0, abs=1e-8)


def test_affinity_is_the_product_of_shared_bottom_and_top_codes():
    rng = np.random.default_rng(0)
    bottom = rng.integers(0, 4, size=(30, 6)).astype(np.uint8)
    top = rng.integers(0, 2, size=(30, 6)).astype(np.uint8)
    spectral, embedding = fit_spectral(bottom, top, 4, 3, seed=0)
    shared_bottom = (bottom[:, None, :] == bottom[None, :, :]).mean(axis=2)
    shared_top = (top[:, None, :] == top[None, :, :]).mean(axis=2)
    K = shared_bottom * shared_top
    d = K.sum(axis=1)
    values = np.linalg.eigvalsh(K / np.sqrt(np.outer(d, d)))
    np.testing.assert_allclose(spectral.eigenvalues, values[::-1][:3], atol=1e-10)
    # Nystrom on the training rows reproduces their embedding.
    expected = K @ spectral.basis
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(embedding, expected, atol=1e-10)
    assert one_hot(bottom, 4).shape == (30, 24)


@pytest.mark.slow
def test_transform_reproduces_fit_and_is_batch_independent(digits_split, fitted):
    X, _, X_new, _ = digits_split
    model, embedding, _ = fitted
    np.testing.assert_array_equal(model.transform(X), embedding)
    batch = model.transform(X_new)
    singles = np.vstack([model.transform(X_new[i : i + 1]) for i in range(0, 200, 23)])
    np.testing.assert_array_equal(singles, batch[::23])
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0)


@pytest.mark.slow
def test_leave_self_out_rows_are_coded_as_new_rows(fitted):
    _, embedding, left_out = fitted
    assert left_out.shape == embedding.shape and np.isfinite(left_out).all()
    # Seen as new data, a training row moves, but stays near its in-sample place.
    cosine = np.sum(left_out * embedding, axis=1)
    assert not np.allclose(left_out, embedding)
    assert np.median(cosine) > 0.8


@pytest.mark.slow
@pytest.mark.parametrize(
    ("output", "fitted_nmi", "new_nmi"),
    [("spectral", 0.75, 0.7), ("umap", 0.8, 0.75), ("umap-bottom", 0.8, 0.75)],
)
def test_new_rows_cluster_like_the_training_rows(
    digits_split, codes_output_fit, output, fitted_nmi, new_nmi
):
    _, y, X_new, y_new = digits_split
    model, embedding, _ = codes_output_fit(output)
    kmeans = KMeans(10, n_init=10, random_state=0).fit(embedding)
    assert normalized_mutual_info_score(y, kmeans.labels_) > fitted_nmi
    assert normalized_mutual_info_score(y_new, kmeans.predict(model.transform(X_new))) > new_nmi


@pytest.mark.slow
def test_separates_the_two_moons():
    X, y = make_moons(400, noise=0.06, random_state=7)
    model = MBN(n_classes=2, n_clusterings=100, output="spectral", random_state=0)
    labels = KMeans(2, n_init=10, random_state=0).fit_predict(model.fit_transform(X))
    assert normalized_mutual_info_score(y, labels) > 0.9


# The outputs that keep the training rows' codes (this one and mbn_core.mbn.umap_output's two).
CODES_OUTPUTS = ["spectral", "umap", "umap-bottom"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("output", "own_array", "misshapen", "other_output"),
    [
        ("spectral", "spectral.basis", lambda basis: basis[:, :3], "pca"),
        ("umap", "umap.anchors", lambda anchors: anchors[:-1], "spectral"),
    ],
    ids=["spectral", "umap"],
)
def test_arrays_round_trip_and_corruption_is_named(
    digits_split, codes_output_fit, output, own_array, misshapen, other_output
):
    X, _, X_new, _ = digits_split
    model, _, _ = codes_output_fit(output)
    params = model.get_params()
    arrays = model_to_arrays(model)
    assert "top.table" not in arrays and own_array in arrays
    restored = model_from_arrays(arrays, params)
    np.testing.assert_array_equal(restored.transform(X_new), model.transform(X_new))
    np.testing.assert_array_equal(restored.eigenvalues_, model.eigenvalues_)  # None for umap
    with pytest.raises(ValueError, match=own_array):
        model_from_arrays(dict(arrays, **{own_array: misshapen(arrays[own_array])}), params)
    bad_codes = arrays[f"{output}.top_codes"].astype(np.int64) + 1000
    with pytest.raises(ValueError, match=rf"{output}.top_codes"):
        model_from_arrays(dict(arrays, **{f"{output}.top_codes": bad_codes}), params)
    not_finite = arrays[own_array].copy()
    not_finite[0, 0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        model_from_arrays(dict(arrays, **{own_array: not_finite}), params)
    # Another output's arrays do not load as this one's.
    other = MBN(n_clusterings=10, delta=0.5, output=other_output, random_state=0).fit(X[:100])
    with pytest.raises(ValueError, match=rf"{output}.bottom_codes"):
        model_from_arrays(model_to_arrays(other), dict(other.get_params(), output=output))


@pytest.mark.slow
@pytest.mark.parametrize("output", CODES_OUTPUTS)
@pytest.mark.parametrize(("n", "d"), [(10, 1), (12, 3), (40, 1), (60, 7)])
def test_any_small_shape(n, d, output):
    X = np.random.default_rng(n + d).normal(size=(n, d))
    model = MBN(n_classes=2, n_clusterings=20, output=output, random_state=0)
    Z = model.fit_transform(X)
    assert Z.shape == (n, 2) and np.isfinite(Z).all()
    assert np.isfinite(model.transform(X[:3] + 0.01)).all()


@pytest.mark.slow
@pytest.mark.parametrize("output", CODES_OUTPUTS)
def test_deterministic_for_a_seed(digits_split, output):
    X, _, _, _ = digits_split
    runs = [
        MBN(n_clusterings=15, output=output, random_state=3).fit_transform(X[:300])
        for _ in range(2)
    ]
    np.testing.assert_array_equal(*runs)


@pytest.mark.slow
@pytest.mark.parametrize("output", CODES_OUTPUTS)
def test_constant_and_duplicate_rows(output):
    X = np.vstack([np.zeros((20, 3)), np.ones((5, 3))])
    Z = MBN(n_classes=2, n_clusterings=10, output=output, random_state=0).fit_transform(X)
    assert np.isfinite(Z).all()


def test_too_large_a_coassociation_is_refused_before_fitting():
    X = np.zeros((30, 2))
    V = MAX_COASSOCIATION_PAIRS  # 30 rows x V clusterings x 15 rows per cell: far over
    with pytest.raises(ValueError, match="co-association pairs"):
        MBN(n_clusterings=V, output="spectral").fit(X)
    with pytest.raises(ValueError, match="output"):
        MBN(output="tsne").fit(X)


def test_a_row_sharing_no_top_cluster_falls_back_to_its_bottom_share():
    rng = np.random.default_rng(1)
    bottom = rng.integers(0, 3, size=(20, 4)).astype(np.uint8)
    top = np.zeros((20, 4), dtype=np.uint8)
    top[10:] = 1
    spectral, _ = fit_spectral(bottom, top, 3, 2, seed=0)
    lonely_top = np.full((1, 4), 2, dtype=np.uint8)  # a top code no training row has
    Z = spectral.embed(bottom[:1], lonely_top)
    shared_bottom = (bottom[:1] == bottom).mean(axis=1)
    expected = shared_bottom @ spectral.basis
    np.testing.assert_allclose(Z[0], expected / np.linalg.norm(expected), atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("output", CODES_OUTPUTS)
def test_blocks_of_rows_change_no_value(digits_split, codes_output_fit, output, monkeypatch):
    # The co-association read a few rows at a time (as on all of MNIST) gives the same fit,
    # leave-self-out rows and new rows as in one block.
    X, _, X_new, _ = digits_split
    model, embedding, left_out = codes_output_fit(output)
    # 500 rows, k1 = 250: each row meets about 2 rows per clustering, so blocks of 3 rows.
    monkeypatch.setattr(coassociation, "BLOCK_PAIRS", 3 * model.n_clusterings * 2)
    blocked = MBN(**model.get_params())
    blocked_embedding, blocked_left_out = blocked.fit_transform_leave_self_out(X)
    np.testing.assert_array_equal(blocked_embedding, embedding)
    np.testing.assert_array_equal(blocked_left_out, left_out)
    np.testing.assert_array_equal(blocked.transform(X_new), model.transform(X_new))
