"""MBN.plan (mbn_core/mbn/plan.py): the "auto" choices settled before any fit, as fit makes them."""

import numpy as np
import pytest
from sklearn.datasets import make_moons

from mbn_core import MBN
from mbn_core.mbn.backends import use_backend
from mbn_core.mbn.backends.local import LocalBackend
from mbn_core.mbn.plan import Plan


@pytest.fixture(scope="module")
def rows(digits):
    """The first 400 digits."""
    return digits.X[:400]


def assert_plan_is_the_fit(plan: Plan, model: MBN, X) -> None:
    assert list(plan.ks) == model.ks_
    assert plan.delta == model.delta_
    assert plan.output == model.output_
    assert plan.n_components == model.n_components_
    assert (plan.n_samples, plan.n_features) == X.shape
    chosen = np.unpackbits(model.bottom_layer_.feature_masks, axis=1)[:, : X.shape[1]]
    assert (chosen.sum(axis=1) == plan.bottom_features).all()
    for layer in model.upper_layers_:
        assert layer.feature_fraction == plan.upper_feature_fraction


@pytest.mark.slow
@pytest.mark.parametrize(
    "params",
    [
        {"n_clusterings": 30},  # feature fraction and delta measured
        {"n_clusterings": 30, "delta": 0.7, "feature_fraction": 0.25, "n_components": 3},
        {"n_clusterings": 30, "ks": [100, 40, 20]},
        {"n_clusterings": 30, "k1": 0.2, "output": "umap-bottom"},
    ],
    ids=["auto", "given", "explicit-ks", "bottom-only"],
)
def test_plan_is_what_fit_then_does(rows, params):
    model = MBN(random_state=2, **params)
    plan = model.plan(rows)
    model.fit(rows)
    assert_plan_is_the_fit(plan, model, rows)


@pytest.mark.slow
def test_plan_of_a_thin_manifold_measures_the_output_as_fit_does():
    X, _ = make_moons(300, noise=0.05, random_state=0)
    model = MBN(n_clusterings=400, n_classes=2, random_state=4)
    plan = model.plan(X)
    # delta was measured to choose the output, and a one-layer network has no delta to use.
    assert plan.measured == ("feature_fraction", "output")
    assert plan.output == "umap-bottom" and len(plan.ks) == 1 and plan.delta is None
    model.fit(X)
    assert_plan_is_the_fit(plan, model, X)


@pytest.mark.slow  # over a second; the full suite runs it
def test_plan_leaves_the_estimator_as_it_was(rows):
    state = np.random.RandomState(5)
    model = MBN(n_clusterings=20, random_state=state)
    params = model.get_params()
    before = state.get_state()[1].copy()
    first = model.plan(rows)
    assert not hasattr(model, "n_features_in_") and not hasattr(model, "ks_")
    assert model.get_params() == params
    np.testing.assert_array_equal(state.get_state()[1], before)  # copied, not advanced
    assert model.plan(rows) == first
    fitted = MBN(n_clusterings=20, random_state=np.random.RandomState(5)).fit(rows)
    assert_plan_is_the_fit(first, fitted, rows)


class CountingBackend(LocalBackend):
    layers: list[str] = []

    def bottom_codes(self, layer, X):
        CountingBackend.layers.append("bottom")
        return super().bottom_codes(layer, X)


def test_plan_fits_the_bottom_layer_only_to_measure_on_its_codes(rows):
    CountingBackend.layers = []
    with use_backend(CountingBackend):
        given = MBN(n_clusterings=20, delta=0.5, feature_fraction=0.5).plan(rows)
        assert CountingBackend.layers == []  # nothing to measure: nothing fitted
        assert given.measured == ()
        measured = MBN(n_clusterings=20, random_state=0).plan(rows)
        assert CountingBackend.layers == ["bottom"]  # delta="auto" reads its codes
        assert measured.measured == ("feature_fraction", "delta")


def test_plan_reads_as_a_report(rows):
    plan = MBN(n_clusterings=20, delta=0.5, feature_fraction=0.5, random_state=0).plan(rows)
    text = str(plan)
    assert text.splitlines()[0] == "MBN plan for 400 rows x 64 features"
    assert f"centers per layer {list(plan.ks)}" in text
    assert "delta:             0.5 (given or default)" in text
    assert "bottom features:   32 of 64 per clustering (fraction 0.5, given or default)" in text
    assert "embedding:         10 dimensions" in text


def test_plan_refuses_what_fit_refuses(rows):
    with pytest.raises(ValueError, match="n_components=500"):
        MBN(n_clusterings=20, n_components=500).plan(rows)
    with pytest.raises(ValueError, match="bottom layer alone"):
        MBN(output="umap-bottom", delta=0.5).plan(rows)
    with pytest.raises(ValueError, match="minimum of 2 is required"):
        MBN().plan(rows[:1])
