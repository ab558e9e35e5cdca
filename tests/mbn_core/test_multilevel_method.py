"""Multilevel manifold learning as the registered method "multilevel": trained, bundled and
served through the method-agnostic pipeline (fast path distilled, exact path the k-NN step)."""

import numpy as np
import pytest

from mbn_core import cli
from mbn_core.bundle import OutOfRangeInput, load_bundle
from mbn_core.methods import get_method
from mbn_core.multilevel.method import MultilevelMethod
from mbn_core.pipeline.training import TrainingParams, train_bundle


@pytest.fixture(scope="module")
def split(digits):
    """1,200 digits to fit and the last 597 new ones, as float32: (X, y, X_new)."""
    X, y = digits
    X = X.astype(np.float32)
    return X[:1200], y[:1200], X[1200:]


@pytest.fixture(scope="module")
def bundle(split, tmp_path_factory):
    X, y, _ = split
    params = {
        "method": "multilevel",
        "coarse_method": "isomap",
        "n_components": 5,
        "n_neighbors": 8,
        "n_clusters": 10,
        "hidden_layer_sizes": [64],
        "max_epochs": 20,
    }
    path = train_bundle(X, tmp_path_factory.mktemp("ml") / "ml", name="ml", y=y, params=params)
    return load_bundle(path)


def test_registered_with_its_options_and_a_distilled_fast_path():
    method = get_method("multilevel")
    assert method.fast_path == "distilled"
    names = [param.name for param in method.params()]
    assert names[:3] == ["coarse_method", "n_neighbors", "n_components"]
    with pytest.raises(ValueError, match="coarse_method"):
        TrainingParams.from_dict({"method": "multilevel", "coarse_method": "tsne"})


@pytest.mark.slow
def test_bundle_exact_mode_is_the_knn_refinement(bundle, split):
    _, _, new = split
    manifest = bundle.manifest
    assert (manifest["method"], manifest["fast_path"]) == ("multilevel", "distilled")
    assert manifest["hyperparameters"]["multilevel"]["coarse_method"] == "isomap"
    # The teacher is fitted without the fidelity report's held-out rows.
    assert manifest["training"]["level_sizes"][0] == manifest["training"]["n_fit_samples"]
    model = bundle.load_exact().estimator
    assert isinstance(model, MultilevelMethod)
    exact = bundle.embed(new, mode="exact")
    np.testing.assert_allclose(exact, model.transform(new), rtol=1e-6, atol=1e-6)
    # A training row gets its stored embedding back.
    training_rows = model.X_fit_[:3].astype(np.float32)
    np.testing.assert_allclose(
        bundle.embed(training_rows, mode="exact"), model.embedding_[:3], rtol=1e-6, atol=1e-6
    )


@pytest.mark.slow
def test_fast_path_reports_fidelity_on_unseen_rows(bundle, split):
    _, _, new = split
    fidelity = bundle.manifest["fidelity"]
    assert fidelity["n_holdout"] > 0
    assert fidelity["r2"] > 0.5
    fast, exact = bundle.embed(new), bundle.embed(new, mode="exact")
    assert fast.shape == exact.shape == (len(new), 5)
    residual = np.sum((fast - exact) ** 2) / np.sum((exact - exact.mean(axis=0)) ** 2)
    assert residual < 0.5


@pytest.mark.slow
def test_rows_whose_embedding_overflows_are_refused_by_name(bundle, split):
    _, _, new = split
    extreme = np.vstack([new[:2], np.full((1, new.shape[1]), 3.4e38, np.float32)])
    # Finite float32 input, but the distilled MLP extrapolates it past float32's range.
    with pytest.raises(OutOfRangeInput, match=r"^1 row\(s\) \(2\) embed to NaN .* fast mode"):
        bundle.embed(extreme)
    with pytest.raises(OutOfRangeInput):
        bundle.predict_clusters(extreme)
    # The exact map (neighbours of the row in the training data) stays finite.
    assert np.isfinite(bundle.embed(extreme, mode="exact")).all()


@pytest.mark.slow
def test_cli_trains_a_multilevel_model(split, tmp_path, monkeypatch, capsys):
    X, y, new = split
    monkeypatch.chdir(tmp_path)
    np.savez("train.npz", x=X[:600], y=y[:600])
    np.save("new.npy", new[:20])
    assert cli.main(["train", "train.npz", "--out", "m", "--method", "multilevel",
                     "--coarse-method", "lle", "--n-neighbors", "8", "--max-epochs", "3",
                     "--quiet"]) == 0  # fmt: skip
    assert "method:      multilevel (fast path: distilled)" in capsys.readouterr().out
    assert (
        load_bundle(tmp_path / "m").manifest["hyperparameters"]["multilevel"]["coarse_method"]
        == "lle"
    )
    assert cli.main(["embed", "m", "new.npy", "--out", "e.npy", "--exact"]) == 0
    assert np.load("e.npy").shape == (20, 2)
