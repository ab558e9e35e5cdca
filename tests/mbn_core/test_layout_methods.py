"""The layout methods as registered methods: trained by ``train_bundle`` with the report of
cross-fitted students, both modes where the method has an exact map, refusals where it has
none, and a method whose library is missing listed but refused before training."""

import dataclasses

import numpy as np
import pytest
from toy_method import ToyProjection

from mbn_core.bundle import load_bundle
from mbn_core.cli import main as cli_main
from mbn_core.exceptions import NoExactMap
from mbn_core.methods import Method, get_method, method_names, register, unregister
from mbn_core.pipeline.training import TrainingParams, check_feasible, fit_shape, train_bundle

LAYOUTS = ("tsne", "umap", "densmap", "pacmap", "trimap")
QUICK = {
    "tsne": {"early_exaggeration_iter": 50, "n_iter": 100},
    "umap": {"n_epochs": 60},
    "densmap": {"n_epochs": 60},
    "pacmap": {"num_iters": 220},
    "trimap": {"n_iters": 80},
}


def test_every_layout_is_registered_as_a_distilled_layout():
    for name in LAYOUTS:
        method = get_method(name)
        assert name in method_names()
        assert method.layout and method.fast_path == "distilled"
        assert (method.no_exact_map is None) == (name in ("tsne", "umap", "pacmap")), name
        assert method.unavailable is None  # the dev install has the extra
        # Measured in test_layouts: openTSNE's and PaCMAP's maps place each row alone,
        # umap-learn's depends on the rows sharing the call; no map, nothing to merge.
        assert method.batch_independent_exact == (name in ("tsne", "pacmap")), name
    assert "fast path" in get_method("trimap").no_exact_map


def test_layouts_are_fitted_on_every_row_and_checked_at_submission():
    params = TrainingParams.from_dict({"method": "tsne"})
    assert fit_shape(params, (1000, 5)) == (1000, 5)
    with pytest.raises(ValueError, match="perplexity=30 needs at least 91 rows, got 60"):
        check_feasible(params, 60)
    with pytest.raises(ValueError, match="does not take sparse input"):
        check_feasible(params, 500, sparse=True)
    with pytest.raises(ValueError, match="n_neighbors=10 needs at least 12 rows"):
        check_feasible(TrainingParams.from_dict({"method": "pacmap"}), 11)


@pytest.fixture
def missing_method():
    method = register(
        Method(
            name="toy-missing",
            estimator=ToyProjection,
            summary="a method whose library is not installed",
            save=lambda model: {},
            load=lambda arrays, params: ToyProjection(),
            missing=lambda: "Toy needs the Python package 'toylib': pip install 'mbn[toy]'",
        )
    )
    yield method
    unregister(method.name)


def test_a_method_without_its_library_is_listed_and_refused(missing_method, capsys):
    assert "toy-missing" in method_names()
    with pytest.raises(ValueError, match=r"not available on this install: .*pip install"):
        TrainingParams.from_dict({"method": "toy-missing"})
    with pytest.raises(SystemExit):
        cli_main(["train", "--help"])
    assert "toy-missing (Toy needs the Python package" in " ".join(capsys.readouterr().out.split())


def test_a_layout_cannot_be_exported():
    with pytest.raises(ValueError, match="layout method is distilled"):
        register(dataclasses.replace(get_method("umap"), name="umap-exported", export=len))


@pytest.mark.slow
@pytest.mark.parametrize("name", LAYOUTS)
def test_a_layout_trains_reports_and_embeds(name, digits, tmp_path, capsys):
    X, y = digits.X.astype(np.float32), digits.y
    path = train_bundle(
        X[:500],
        tmp_path / name,
        name=name,
        params={"method": name, "max_epochs": 8, "n_clusters": 10, **QUICK[name]},
        y=y[:500],
    )
    bundle = load_bundle(path)
    fidelity = bundle.manifest["fidelity"]
    # 500 rows: a held-out share would be 50, so the students are cross-fitted on 5 folds,
    # each row placed by a student that never saw it, against the one layout.
    assert fidelity["holdout"] == "cross-fitted students" and fidelity["folds"] == 5
    assert fidelity["n_holdout"] == 500 and fidelity["r2"] > 0.5
    assert fidelity["nmi_labels_exact"] > 0.6 and fidelity["nmi_labels_fast"] > 0.5
    assert bundle.manifest["training"]["n_fit_samples"] == 500
    assert bundle.manifest["quality"]["exact"]["trustworthiness"] > 0.8
    fast = bundle.embed(X[500:520])
    assert fast.shape == (20, 2) and np.isfinite(fast).all()
    if bundle.no_exact_map is None:
        exact = bundle.embed(X[500:520], mode="exact")
        assert exact.shape == (20, 2) and np.isfinite(exact).all()
        # Exact mode is the method's own placement: a fresh read gives the same answer.
        again = load_bundle(path).embed(X[500:520], mode="exact")
        assert np.array_equal(exact, again)
    else:
        with pytest.raises(NoExactMap, match=r"has no exact mode: .*fast path"):
            bundle.embed(X[500:520], mode="exact")
        with pytest.raises(NoExactMap):
            bundle.load_exact()
    cli_main(["info", str(path)])
    out = capsys.readouterr().out
    assert "student of 5-fold cross-fitting that never saw it" in out
    assert "meaning:" in out and "student network that never saw it" in out
    # The layout's student is the atom classifier: of 100 atoms, one per 5 of the 450 rows
    # it is trained on (50 choose its best epoch), 90.
    assert bundle.manifest["training"]["student_head"] == "atoms"
    assert bundle.manifest["training"]["n_atoms"] == 90
    assert "student classifies 90 atoms of the embedding" in out
