"""MBN's automatic mode: measured on the data alone, deterministic, valid for any shape."""

import itertools

import numpy as np
import pytest
from sklearn.datasets import make_circles, make_moons

from mbn_core import MBN
from mbn_core.mbn.auto import (
    DELTAS,
    FRACTIONS,
    MAX_ORPHANS,
    ORPHAN_CLUSTERINGS,
    ORPHAN_ROWS,
    ORPHAN_TRIALS,
    UMAP_OUTPUT_MAX_PAIRS,
    choose_delta,
    choose_output,
    orphan_rate,
    thin_manifold_is_measurable,
)
from mbn_core.mbn.coassociation import expected_pairs
from mbn_core.mbn.persistence import model_from_arrays, model_to_arrays


class LabelsThatMustNotBeRead:
    """A y whose every use raises: the automatic mode may only look at X."""

    def __array__(self, *args, **kwargs):
        raise AssertionError("fit read y")

    def __len__(self):
        raise AssertionError("fit read y")


@pytest.fixture(scope="module")
def circles():
    X, _ = make_circles(300, factor=0.5, noise=0.04, random_state=7)
    return X


def test_auto_is_the_default_and_never_reads_y(circles):
    params = MBN().get_params()
    assert params["delta"] == params["feature_fraction"] == params["output"] == "auto"
    first = MBN(n_classes=2, n_clusterings=40, random_state=3)
    embedding = first.fit_transform(circles, LabelsThatMustNotBeRead())
    second = MBN(n_classes=2, n_clusterings=40, random_state=3).fit(circles)
    assert first.delta_ == second.delta_ and first.ks_ == second.ks_
    assert first.output_ == second.output_
    np.testing.assert_array_equal(embedding, second.transform(circles))


@pytest.mark.slow
def test_thin_manifolds_shrink_slower_and_images_keep_half(circles, digits):
    # Two rings: halving the centers leaves points with no code-sharing center.
    rings = MBN(n_classes=2, n_clusterings=40, random_state=0).fit(circles)
    assert rings.delta_ > 0.5
    assert rings.ks_ == MBN(n_classes=2, delta=rings.delta_).layer_sizes(300)
    # With the default V = 400 clusterings (fewer share fewer codes, and orphan more).
    images = MBN(random_state=0).fit(digits.X[:500])
    assert images.delta_ == 0.5
    assert images.ks_ == MBN().layer_sizes(500)


def test_orphan_rate_counts_points_without_a_shared_code():
    rng = np.random.RandomState(0)
    # Two groups of points that share no code: one center can only serve one group.
    codes = np.repeat(np.array([[0, 0, 0], [1, 1, 1]], dtype=np.uint8), 50, axis=0)
    assert orphan_rate(codes, 1, 1.0, rng) == pytest.approx(0.5, abs=0.15)
    assert orphan_rate(codes, 100, 1.0, rng) == 0.0
    same = np.zeros((100, 3), dtype=np.uint8)
    assert orphan_rate(same, 1, 1.0, rng) == 0.0


def brute_force_orphan_rate(codes, k, fraction, rng):
    """The definition, center by center: same draws as ``orphan_rate``."""
    rows = rng.choice(len(codes), min(len(codes), ORPHAN_ROWS), replace=False)
    orphans = 0
    for _ in range(ORPHAN_TRIALS):
        centers = codes[rng.choice(len(codes), k, replace=False)]
        kept = rng.random_sample((len(rows), codes.shape[1])) < fraction
        for row, keep in zip(codes[rows], kept, strict=True):
            orphans += not any(((center == row) & keep).any() for center in centers)
    return orphans / (ORPHAN_TRIALS * len(rows))


@pytest.mark.parametrize("seed", range(6))
def test_orphan_rate_equals_the_definition(seed):
    draw = np.random.RandomState(seed)
    n, V, n_values = draw.randint(5, 60), draw.randint(1, 9), draw.randint(2, 30)
    codes = draw.randint(0, n_values, size=(n, V)).astype(np.uint8)
    k, fraction = draw.randint(1, n + 1), draw.choice([0.3, 0.5, 1.0])
    expected = brute_force_orphan_rate(codes, k, fraction, np.random.RandomState(seed))
    assert orphan_rate(codes, k, fraction, np.random.RandomState(seed)) == expected


@pytest.mark.slow
def test_a_thin_manifold_gets_the_same_delta_on_every_seed():
    # Two moons leave 2% of points orphaned at 0.5 and 0.3-0.5% at 0.7: the bound must not
    # cut through the 0.7 rates, or the seed picks between 0.7 and a network 3x as deep.
    X, _ = make_moons(1000, noise=0.06, random_state=7)
    chosen = set()
    for seed in range(3):
        network = MBN(ks=[500, 3], n_classes=2, output="pca", random_state=seed)
        codes = network.fit(X).encode(X, layer=0)
        chosen.add(choose_delta(codes, 500, 0.5, 3.0, np.random.RandomState(seed)))
    assert chosen == {0.7}


@pytest.fixture(scope="module")
def moons_codes_1600():
    """Bottom-layer codes of two moons from a network of 1,600 clusterings."""
    X, _ = make_moons(1000, noise=0.06, random_state=7)
    mbn = MBN(ks=[500, 3], n_classes=2, n_clusterings=1600, output="pca", random_state=0)
    mbn.fit(X)
    return mbn.encode(X, layer=0)


def rule_on(codes, k1, rng):
    """The rule spelled out: the first delta whose orphan rate passes, drawn from ``rng``."""
    for delta in DELTAS:
        if orphan_rate(codes, int(delta * k1), 0.5, rng) <= MAX_ORPHANS:
            return delta
    return DELTAS[-1]


@pytest.mark.slow
def test_more_clusterings_do_not_turn_a_thin_manifold_into_dense_data(moons_codes_1600):
    # Over all of 1,600 clusterings two moons leave under 1% orphaned at 0.5 (each clustering
    # is one more chance to share a code), and at 0.5 the network merges the moons. The rate
    # is taken over 400 of them, where the bound was measured.
    codes = moons_codes_1600
    assert rule_on(codes, 500, np.random.RandomState(0)) == 0.5
    assert choose_delta(codes, 500, 0.5, 3.0, np.random.RandomState(0)) == 0.7
    # The subset is choose_delta's first draw; the rates are then drawn as for 400.
    rng = np.random.RandomState(0)
    subset = np.sort(rng.choice(codes.shape[1], ORPHAN_CLUSTERINGS, replace=False))
    assert rule_on(codes[:, subset], 500, rng) == 0.7


@pytest.mark.slow
def test_networks_up_to_the_reference_size_are_measured_whole(moons_codes_1600):
    codes = moons_codes_1600[:, :ORPHAN_CLUSTERINGS]
    for seed in range(2):
        delta = choose_delta(codes, 500, 0.5, 3.0, np.random.RandomState(seed))
        assert delta == rule_on(codes, 500, np.random.RandomState(seed)) == 0.7


def test_choose_delta_leaves_the_callers_stream_alone():
    codes = np.random.RandomState(0).randint(0, 20, size=(200, 30)).astype(np.uint8)
    rng = np.random.RandomState(5)
    before = rng.get_state()[1].copy()
    delta = choose_delta(codes, 100, 0.5, 3.0, rng)
    assert delta in DELTAS
    np.testing.assert_array_equal(rng.get_state()[1], before)
    assert delta == choose_delta(codes, 100, 0.5, 3.0, np.random.RandomState(5))


@pytest.mark.slow
def test_thin_manifolds_get_the_bottom_umap_output_and_images_the_pca_output(circles, digits):
    # The measurement behind delta, at the V = 400 it was calibrated at: on two rings it
    # leaves orphans at 0.5, on digits none.
    rings = MBN(n_classes=2, random_state=0)
    embedding = rings.fit_transform(circles)
    assert rings.output_ == "umap-bottom" and rings.top_.top_codes is None
    # Its network is the bottom layer alone, so no shrink factor was used.
    assert rings.ks_ == [150] and rings.upper_layers_ == [] and rings.delta_ is None
    # The choice builds exactly what asking for that output builds.
    chosen = MBN(n_classes=2, output="umap-bottom", random_state=0)
    np.testing.assert_array_equal(embedding, chosen.fit_transform(circles))
    assert chosen.ks_ == [150] and chosen.layer_sizes(300) == [150]
    images = MBN(random_state=0).fit(digits.X[:500])
    assert images.output_ == "pca" and images.explained_variance_ratio_ is not None


@pytest.mark.slow
def test_given_upper_layers_are_kept_and_still_let_the_data_choose_the_output(circles):
    # The output is measured even when delta is not: the paper's 0.5 on two rings. Layers
    # asked for are kept, so the thin manifold gets the UMAP output over all of them.
    model = MBN(n_classes=2, delta=0.5, random_state=0).fit(circles)
    assert model.output_ == "umap" and model.delta_ == 0.5 and len(model.ks_) > 1
    given = MBN(n_classes=2, ks=[150, 75, 37], random_state=0).fit(circles)
    assert given.delta_ is None and given.output_ == "umap" and given.ks_ == [150, 75, 37]
    # One layer given is the one-layer network "auto" builds anyway.
    one = MBN(n_classes=2, ks=[150], random_state=0).fit(circles)
    assert one.output_ == "umap-bottom" and one.ks_ == [150]


@pytest.mark.parametrize("params", [{"delta": 0.7}, {"ks": [150, 75]}])
def test_the_bottom_output_refuses_upper_layers(circles, params):
    model = MBN(n_classes=2, output="umap-bottom", random_state=0, **params)
    with pytest.raises(ValueError, match=r"umap-bottom.*bottom layer alone"):
        model.fit(circles)


def test_few_clusterings_keep_the_pca_output(circles):
    # Below the V the orphan bound was measured at, images orphan too: no choice is made.
    rings = MBN(n_classes=2, n_clusterings=40, random_state=0).fit(circles)
    assert rings.delta_ > 0.5 and rings.output_ == "pca"


def test_the_output_is_chosen_only_where_the_measurement_was_calibrated():
    assert choose_output(DELTAS[0]) == "pca" and choose_output(DELTAS[1]) == "umap-bottom"
    assert thin_manifold_is_measurable(1000, ORPHAN_CLUSTERINGS, 500)
    assert not thin_manifold_is_measurable(1000, ORPHAN_CLUSTERINGS - 1, 500)  # fewer V
    assert not thin_manifold_is_measurable(1000, ORPHAN_CLUSTERINGS, 501)  # k1 above n / 2
    # A thin manifold too large for the co-association's budget keeps the PCA output.
    n, k1 = 100_000, 2000
    assert expected_pairs(n, 400, k1) > UMAP_OUTPUT_MAX_PAIRS
    assert not thin_manifold_is_measurable(n, 400, k1)


@pytest.mark.slow
def test_every_row_a_center_keeps_the_pca_output(circles):
    # k1 = n: no two rows share a cell, every point orphans, and no layout could be drawn.
    for params in ({"k1": 1.0}, {"ks": [300, 150, 75]}):
        model = MBN(n_classes=2, random_state=0, **params).fit(circles)
        assert model.output_ == "pca"


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["rings", "digits"])
def test_a_stored_auto_model_keeps_its_output(circles, shape, digits):
    X = circles if shape == "rings" else digits.X[:300]
    model = MBN(n_classes=2, random_state=0).fit(X)
    assert model.output_ == ("umap-bottom" if shape == "rings" else "pca")
    params = {key: value for key, value in model.get_params().items() if key != "callback"}
    restored = model_from_arrays(model_to_arrays(model), params)
    assert restored.output == "auto" and restored.output_ == model.output_
    np.testing.assert_array_equal(restored.transform(X[:25]), model.transform(X[:25]))


@pytest.mark.slow
@pytest.mark.parametrize(("n", "d"), [(10, 1), (10, 2), (11, 5), (25, 1), (40, 3), (60, 13)])
def test_every_choice_fits_any_shape(n, d):
    X = np.random.RandomState(n * 100 + d).normal(size=(n, d))
    fractions = sorted({max(1, round(f * d)) / d for f in FRACTIONS})
    for delta, fraction in itertools.product(DELTAS, fractions):
        model = MBN(n_clusterings=6, delta=delta, feature_fraction=fraction, random_state=0)
        embedding = model.fit_transform(X)
        assert embedding.shape == (n, model.n_components_) and np.isfinite(embedding).all()
    auto = MBN(n_clusterings=6, n_classes=2, random_state=0)
    assert np.isfinite(auto.fit_transform(X)).all() and auto.delta_ in DELTAS
    # With the default 400 clusterings "auto" may choose either output: both must fit.
    chosen = MBN(n_classes=2, random_state=0)
    embedding = chosen.fit_transform(X)
    assert chosen.output_ in ("pca", "umap-bottom") and np.isfinite(embedding).all()
    np.testing.assert_array_equal(chosen.transform(X), embedding)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"delta": "automatic"}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"delta": float("nan")}, "delta"),
        ({"feature_fraction": "half"}, "feature_fraction"),
        ({"output": "automatic"}, "output"),
    ],
)
def test_bad_parameters_are_named(params, match):
    with pytest.raises(ValueError, match=match):
        MBN(**params).fit(np.zeros((20, 3)))


def test_bad_input_is_named():
    X = np.random.RandomState(0).normal(size=(30, 4))
    X[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        MBN().fit(X)
    with pytest.raises(ValueError, match="feature"):
        MBN().fit(np.zeros((30, 0)))
