"""MBN's UMAP output: UMAP's layout of the co-association, every row placed the same way."""

import importlib
import sys

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.cluster import KMeans
from sklearn.datasets import make_circles, make_moons
from sklearn.metrics import normalized_mutual_info_score

from mbn_core import MBN, model_from_arrays, model_to_arrays
from mbn_core.mbn.coassociation import coassociation, expected_pairs
from mbn_core.mbn.outputs import umap as umap_output
from mbn_core.mbn.outputs.umap import N_NEIGHBORS, place


@pytest.fixture(scope="module")
def fitted(codes_output_fit):
    return codes_output_fit("umap")


@pytest.mark.slow
def test_transform_reproduces_fit_and_is_batch_independent(digits_split, fitted):
    X, _, X_new, _ = digits_split
    model, embedding = fitted
    assert embedding.shape == (500, 10) and model.n_components_ == 10
    np.testing.assert_array_equal(model.transform(X), embedding)
    batch = model.transform(X_new)
    singles = np.vstack([model.transform(X_new[i : i + 1]) for i in range(0, 200, 23)])
    np.testing.assert_array_equal(singles, batch[::23])
    assert model.explained_variance_ratio_ is None


def brute_force_place(affinity, anchors):
    """The definition: each row's 15 largest affinities (ties to the lower column), and
    their weighted mean of anchors."""
    dense = affinity.toarray()
    placed = []
    for row in dense:
        nonzero = np.flatnonzero(row)
        ranked = sorted(nonzero, key=lambda j: (-row[j], j))[:N_NEIGHBORS]
        weights = row[ranked]
        placed.append(weights @ anchors[ranked] / weights.sum())
    return np.array(placed)


@pytest.mark.parametrize("seed", range(4))
def test_placement_is_the_weighted_mean_of_the_strongest_rows(seed):
    rng = np.random.default_rng(seed)
    n_rows, n_train = 12, 40
    # Few distinct values, so that ties at the 15th neighbour occur.
    dense = rng.integers(0, 4, size=(n_rows, n_train)) * (rng.random((n_rows, n_train)) < 0.7)
    affinity = sp.csr_matrix(dense / 4.0)
    anchors = rng.normal(size=(n_train, 3))
    np.testing.assert_allclose(place(affinity, anchors), brute_force_place(affinity, anchors))


@pytest.mark.slow
@pytest.mark.parametrize(
    "data",
    [make_moons(400, noise=0.06, random_state=7), make_circles(400, factor=0.5, noise=0.04,
                                                               random_state=7)],
    ids=["moons", "circles"],
)  # fmt: skip
@pytest.mark.parametrize("output", ["umap", "umap-bottom"])
def test_separates_thin_manifolds(data, output):
    # With the default 400 clusterings (100 leave the co-association too coarse: one seed
    # of two merges the moons).
    X, y = data
    model = MBN(n_classes=2, output=output, random_state=0)
    labels = KMeans(2, n_init=10, random_state=0).fit_predict(model.fit_transform(X))
    assert normalized_mutual_info_score(y, labels) > 0.9


@pytest.mark.slow
def test_the_bottom_output_lays_out_the_bottom_share_alone(digits_split, codes_output_fit):
    X, _, X_new, _ = digits_split
    model, embedding = codes_output_fit("umap-bottom")
    # A network of the bottom layer alone, whose top keeps no top codes.
    assert model.ks_ == [250] and model.upper_layers_ == [] and model.delta_ is None
    assert model.top_.top_codes is None
    codes = model.encode(X_new[:7])
    affinity = coassociation(codes, None, model.top_.cells, None).toarray()
    shared = (codes[:, None, :] == model.top_.bottom_codes[None, :, :]).mean(axis=2)
    np.testing.assert_allclose(affinity, shared)
    np.testing.assert_array_equal(model.transform(X), embedding)
    np.testing.assert_array_equal(model.transform(X_new[:1]), model.transform(X_new)[:1])


@pytest.mark.slow
def test_the_bottom_output_round_trips_and_is_not_taken_for_the_other(
    digits_split, codes_output_fit
):
    _, _, X_new, _ = digits_split
    model, _ = codes_output_fit("umap-bottom")
    arrays = model_to_arrays(model)
    assert "umap.anchors" in arrays and "umap.top_codes" not in arrays
    restored = model_from_arrays(arrays, model.get_params())
    assert restored.output_ == "umap-bottom" and restored.top_.top_codes is None
    np.testing.assert_array_equal(restored.transform(X_new), model.transform(X_new))
    auto = model_from_arrays(arrays, dict(model.get_params(), output="auto"))
    assert auto.output_ == "umap-bottom"
    with pytest.raises(ValueError, match=r"umap\.top_codes"):
        model_from_arrays(arrays, dict(model.get_params(), output="umap"))
    stray = dict(arrays, **{"umap.top_codes": arrays["umap.bottom_codes"]})
    with pytest.raises(ValueError, match=r"umap\.top_codes.*not part of"):
        model_from_arrays(stray, model.get_params())
    without_anchors = {k: v for k, v in arrays.items() if k != "umap.anchors"}
    with pytest.raises(ValueError, match=r"umap\.anchors"):
        model_from_arrays(without_anchors, dict(model.get_params(), output="auto"))
    # The other UMAP output's arrays hold a network of several layers; without their top
    # codes they are still that output's, and say what is missing.
    layered, _ = codes_output_fit("umap")
    layered_arrays = model_to_arrays(layered)
    with pytest.raises(ValueError, match="one layer"):
        model_from_arrays(layered_arrays, dict(model.get_params()))
    del layered_arrays["umap.top_codes"]
    with pytest.raises(ValueError, match=r"umap\.top_codes.*missing"):
        model_from_arrays(layered_arrays, dict(layered.get_params(), output="auto"))


@pytest.mark.slow
def test_deterministic_when_the_graph_falls_into_pieces(digits_split):
    # Groups of duplicates: the co-association graph has more pieces than UMAP's spectral
    # start can place, and umap-learn places them with numpy's global generator.
    X = np.vstack([digits_split[0][:5]] * 20)
    before = np.random.get_state()[1].copy()  # noqa: NPY002 - what umap-learn draws from
    runs = [
        MBN(n_components=2, n_clusterings=20, output="umap", random_state=0).fit_transform(X)
        for _ in range(2)
    ]
    np.testing.assert_array_equal(*runs)
    np.testing.assert_array_equal(np.random.get_state()[1], before)  # noqa: NPY002


@pytest.mark.slow
@pytest.mark.parametrize(("n", "n_components"), [(3, 2), (6, 6), (10, 9)])
def test_as_many_components_as_rows(n, n_components):
    # UMAP's spectral start cannot ask for n_components + 1 eigenvectors of n rows.
    X = np.random.default_rng(n).normal(size=(n, 2))
    model = MBN(n_components=n_components, n_clusterings=20, output="umap", random_state=0)
    Z = model.fit_transform(X)
    assert Z.shape == (n, n_components) and np.isfinite(Z).all()


def test_rows_that_share_no_cell_are_named():
    # Every row is a center of every bottom clustering: no two rows share a cell.
    X = np.random.default_rng(0).normal(size=(12, 3))
    with pytest.raises(ValueError, match="no two training rows that share a bottom cell"):
        MBN(n_classes=2, n_clusterings=10, ks=[12, 3], output="umap", random_state=0).fit(X)


def test_a_missing_umap_learn_says_how_to_install_it(monkeypatch):
    # None in sys.modules makes the import fail as a missing package does.
    monkeypatch.setitem(sys.modules, "umap", None)
    monkeypatch.setitem(sys.modules, "umap.umap_", None)
    with pytest.raises(ImportError, match="pip install umap-learn"):
        MBN(n_classes=2, n_clusterings=10, output="umap").fit(np.eye(12))


@pytest.mark.slow
def test_fits_a_large_co_association_block_by_block():
    # 1,000 rows in 10 bottom cells over 400 clusterings: expected_pairs' bound is 40 million;
    # the UMAP output reads it in blocks of 100 rows.
    X, y = make_moons(1000, noise=0.06, random_state=7)
    params = dict(n_classes=2, ks=[10, 5], n_clusterings=400, random_state=0)
    assert expected_pairs(1000, 400, 10) == 40_000_000
    model = MBN(output="umap", **params)
    Z = model.fit_transform(X)
    assert Z.shape == (1000, 2) and np.isfinite(Z).all()
    np.testing.assert_array_equal(model.transform(X[::97]), Z[::97])
    labels = KMeans(2, n_init=10, random_state=0).fit_predict(Z)
    assert normalized_mutual_info_score(y, labels) > 0.99  # the moons still apart


@pytest.mark.slow
def test_umap_learns_kernels_are_cached_on_disk_for_the_next_process():
    # umap-learn compiles them in every process without cache=True: 5-6 s of each training
    # process's first UMAP-output fit. After a fit each one has a cache and was looked up in it.
    X, _ = make_moons(200, noise=0.06, random_state=7)
    MBN(n_classes=2, n_clusterings=20, output="umap-bottom", random_state=0).fit(X)
    for module_name, name in umap_output._UNCACHED_KERNELS:
        stats = getattr(importlib.import_module(module_name), name).stats
        assert stats.cache_path is not None, name
        assert sum(stats.cache_hits.values()) + sum(stats.cache_misses.values()) > 0, name
