"""The method registry: a method plugs in by registering, with no change to the trainer, the
bundle code or the CLI (``toy_method`` registers two, one exported and one distilled)."""

import json

import numpy as np
import pytest
import toy_method
from digits_data import Digits

from mbn_core import cli
from mbn_core.bundle import load_bundle
from mbn_core.methods import (
    Method,
    get_method,
    method_names,
    register,
    unregister,
)
from mbn_core.pipeline.options import option_groups, options
from mbn_core.pipeline.training import TrainingParams, train_bundle


@pytest.fixture(scope="module")
def split(digits):
    """1,200 digits to fit and the last 597, new to every model: (X, y, X_new)."""
    X, y = digits
    return X[:1200], y[:1200], X[1200:]


def test_registered_methods_are_listed():
    names = method_names()
    assert names[0] == "mbn"
    assert {"toy-exported", "toy-distilled"} <= set(names)
    assert get_method("toy-exported").fast_path == "exported"
    assert get_method("toy-distilled").fast_path == "distilled"
    assert get_method("mbn").fast_path == "distilled"


def test_options_come_from_the_estimators():
    exported = [p.name for p in options(get_method("toy-exported"))]
    assert exported == ["n_components", "whiten", "holdout_fraction", "n_clusters",
                        "random_state", "n_jobs", "input_scaling", "map_points"]  # fmt: skip
    distilled = {p.name: p for p in options(get_method("toy-distilled"))}
    assert "hidden_layer_sizes" in distilled and "n_clusterings" not in distilled
    assert distilled["n_components"].default == 3  # the method's declared training default
    assert distilled["n_components"].help == "Dimension of the embedding."


def test_params_are_checked_per_method():
    with pytest.raises(ValueError, match="unknown training parameter 'n_clusterings' for method"):
        TrainingParams.from_dict({"method": "toy-exported", "n_clusterings": 5})
    with pytest.raises(ValueError, match="unknown training parameter 'max_epochs'"):
        TrainingParams.from_dict({"method": "toy-exported", "max_epochs": 5})
    with pytest.raises(ValueError, match="whiten"):
        TrainingParams.from_dict({"method": "toy-exported", "whiten": 1})
    params = TrainingParams.from_dict({"method": "toy-exported", "whiten": True})
    assert params.to_dict()["method"] == "toy-exported"
    assert TrainingParams.from_dict(json.loads(json.dumps(params.to_dict()))) == params


def test_a_clashing_or_misnamed_method_is_refused():
    base = get_method("toy-exported")
    with pytest.raises(ValueError, match="must match"):
        register(Method(name="Bad Name", estimator=base.estimator, summary="", save=base.save,
                        load=base.load))  # fmt: skip
    with pytest.raises(ValueError, match="already registered"):
        register(Method(name="toy-exported", estimator=base.estimator, summary="other",
                        save=base.save, load=base.load))  # fmt: skip

    class Clashing(toy_method.ToyProjection):
        """Clashes with the pipeline.

        Parameters
        ----------
        n_clusters : int, default=2
            Clashes.
        """

        _parameter_constraints = {"n_clusters": [int]}

        def __init__(self, n_clusters=2):
            self.n_clusters = n_clusters

    with pytest.raises(ValueError, match=r"\['n_clusters'\] clash"):
        register(Method(name="clash", estimator=Clashing, summary="", save=base.save,
                        load=base.load))  # fmt: skip
    unregister("clash")
    with pytest.raises(ValueError, match="unknown method 'clash'"):
        get_method("clash")

    class ClashingWithTheDistiller(toy_method.ToyProjection):
        """Clashes with the distiller, which only a distilled method has.

        Parameters
        ----------
        max_epochs : int, default=2
            Clashes.
        """

        _parameter_constraints = {"max_epochs": [int]}

        def __init__(self, max_epochs=2):
            self.max_epochs = max_epochs

    distilled = Method(name="clash-distilled", estimator=ClashingWithTheDistiller,
                       summary="", save=base.save, load=base.load)  # fmt: skip
    with pytest.raises(ValueError, match=r"\['max_epochs'\] clash with the compressor"):
        option_groups(distilled)
    exported = Method(name="clash-exported", estimator=ClashingWithTheDistiller, summary="",
                      save=base.save, load=base.load, export=base.export)  # fmt: skip
    assert options(exported)[0].name == "max_epochs"


@pytest.mark.slow
def test_exported_method_trains_bundles_and_serves_both_paths(split, tmp_path):
    X, y, new = split
    path = train_bundle(
        X, tmp_path / "toy", name="toy", y=y,
        params={"method": "toy-exported", "n_components": 4, "n_clusters": 5},
    )  # fmt: skip
    bundle = load_bundle(path)
    manifest = bundle.manifest
    assert (manifest["method"], manifest["fast_path"]) == ("toy-exported", "exported")
    assert set(manifest["hyperparameters"]) == {"toy-exported", "pipeline"}
    assert manifest["hyperparameters"]["toy-exported"]["n_components"] == 4
    assert manifest["training"]["toy_axes"] == 4
    # The exact map is the fast path: they agree to float32 rounding on rows never seen.
    exact, fast = bundle.embed(new, mode="exact"), bundle.embed(new)
    np.testing.assert_allclose(fast, exact, rtol=1e-4, atol=1e-3)
    assert manifest["fidelity"]["r2"] > 0.9999
    assert manifest["fidelity"]["n_holdout"] == 120  # holdout_fraction 0.1 of 1200 rows
    np.testing.assert_array_equal(
        bundle.predict_clusters(new[:50]), bundle.predict_clusters(new[:50], mode="exact")
    )
    assert manifest["training"]["n_fit_samples"] == 1080


@pytest.mark.slow
def test_distilled_method_gets_a_compressor(split, tmp_path):
    X, y, new = split
    path = train_bundle(
        X, tmp_path / "toy", name="toy", y=y,
        params={"method": "toy-distilled", "hidden_layer_sizes": [32], "max_epochs": 30},
    )  # fmt: skip
    bundle = load_bundle(path)
    assert bundle.manifest["fast_path"] == "distilled"
    assert bundle.manifest["hyperparameters"]["compressor"]["hidden_layer_sizes"] == [32]
    assert bundle.output_dim == 3
    exact = bundle.embed(new, mode="exact")
    projection = bundle.load_exact().estimator
    expected = (new - projection.mean_) @ projection.components_.T
    np.testing.assert_allclose(exact, expected, rtol=1e-5, atol=1e-4)
    # The MLP follows the map on new rows (answering the mean would leave a residual of 1).
    fast = bundle.embed(new)
    residual = np.sum((fast - exact) ** 2) / np.sum((exact - exact.mean(axis=0)) ** 2)
    assert residual < 0.3


@pytest.mark.slow
def test_cli_trains_and_embeds_with_a_registered_method(split, tmp_path, monkeypatch, capsys):
    X, y, new = split
    monkeypatch.chdir(tmp_path)
    np.savez("train.npz", x=X, y=y)
    np.save("new.npy", new)
    assert cli.main(["train", "train.npz", "--out", "m", "--method", "toy-exported",
                     "--n-components", "3", "--whiten", "true", "--quiet"]) == 0  # fmt: skip
    assert "method:      toy-exported (fast path: exported)" in capsys.readouterr().out
    assert load_bundle(tmp_path / "m").manifest["hyperparameters"]["toy-exported"] == {
        "n_components": 3, "whiten": True, "random_state": 0,
    }  # fmt: skip
    assert cli.main(["embed", "m", "new.npy", "--out", "e.npy"]) == 0
    assert np.load("e.npy").shape == (len(new), 3)
    # Options of another method are not options of this one.
    with pytest.raises(SystemExit):
        cli.main(["train", "train.npz", "--out", "m2", "--method", "toy-exported",
                  "--n-clusterings", "5"])  # fmt: skip
    assert "unrecognized arguments: --n-clusterings" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name", ["mbn", pytest.param("modular_kpca", marks=pytest.mark.slow), "multilevel"]
)
def test_methods_that_declare_a_batch_independent_exact_map_have_one(
    name: str, digits: Digits
) -> None:
    """``batch_independent_exact`` lets a server merge requests into one ``transform`` call:
    each row must get the same bits whatever rows share its call."""
    method = get_method(name)
    assert method.batch_independent_exact
    x = digits.X.astype(np.float32)
    params = {"n_clusterings": 10, "random_state": 0} if name == "mbn" else {}
    estimator = method.estimator(**params).fit(x[:300])
    new = x[400:520]
    whole = np.asarray(estimator.transform(new))
    for sizes in ([1] * 10, [3, 17, 2], [64, 1, 40]):
        ends = np.cumsum(sizes)
        parts = [
            estimator.transform(new[end - size : end])
            for size, end in zip(sizes, ends, strict=True)
        ]
        np.testing.assert_array_equal(np.vstack(parts), whole[: ends[-1]])
