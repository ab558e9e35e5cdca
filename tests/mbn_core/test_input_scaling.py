"""Input scaling: chosen from the data, applied inside the bundle, recorded, overridable."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
import scipy.sparse as sp
from onnx import TensorProto, helper
from sklearn.datasets import load_breast_cancer, load_iris, load_wine

from mbn_core.bundle import BundleError, OutOfRangeInput, load_bundle
from mbn_core.bundle.load import check_scaled_range
from mbn_core.bundle.manifest import MANIFEST, write_manifest
from mbn_core.data.scaling import (
    SCALING_FILE,
    InputScaling,
    choose_scaling,
    feature_range_ratio,
    scale_graph_input,
)
from mbn_core.distill.onnx import OnnxEmbedder
from mbn_core.pipeline.novelty import load_novelty
from mbn_core.pipeline.training import TrainingParams, train_bundle

# ---------------------------------------------------------------------- the choice


@pytest.mark.parametrize(
    ("loader", "expected"),
    [
        (load_wine, "standard"),  # proline in the hundreds, hue near 1
        (load_breast_cancer, "standard"),  # areas in the thousands, fractal dimensions 0.06
        (load_iris, "none"),  # four lengths in centimetres
        ("digits", "none"),  # 8x8 images, 0..16 (the digits fixture)
    ],
)
def test_auto_standardises_mixed_units_and_leaves_one_unit_alone(loader, expected, digits):
    X = digits.X if loader == "digits" else loader().data
    assert choose_scaling(X, "auto").method == expected


def test_auto_leaves_images_alone_even_with_rarely_lit_edge_pixels():
    # MNIST-like: most pixels span 0..255, a border of pixels lit once or never.
    rng = np.random.RandomState(0)
    images = (rng.rand(500, 100) < 0.3) * rng.randint(1, 256, size=(500, 100))
    images[:, :5] = 0
    images[0, :5] = 3  # edge pixels whose range is 3, not 255
    scaling = choose_scaling(images.astype(np.uint8), "auto")
    assert scaling.method == "none"
    assert scaling.range_ratio < 2


def test_auto_keeps_sparse_input_sparse_and_standard_refuses_it():
    X = sp.random(50, 30, density=0.1, format="csr", random_state=0)
    X = X @ sp.diags(np.logspace(0, 4, 30))  # ranges 10,000x apart
    assert choose_scaling(X, "auto").method == "none"
    with pytest.raises(ValueError, match="sparse input dense"):
        choose_scaling(X, "standard")


def test_explicit_choices_override_auto(digits):
    X = load_wine().data
    assert choose_scaling(X, "none").method == "none"
    assert choose_scaling(digits.X, "standard").method == "standard"
    with pytest.raises(ValueError, match="input_scaling"):
        choose_scaling(X, "minmax")


def test_standard_scaling_gives_zero_mean_unit_variance_and_keeps_constant_features():
    X = load_wine().data.copy()
    X[:, 3] = 7.0
    scaling = InputScaling.fit(X, "standard")
    scaled = scaling.transform(X)
    assert scaled.dtype == np.float32
    np.testing.assert_allclose(np.delete(scaled.mean(axis=0), 3), 0, atol=1e-5)
    np.testing.assert_allclose(np.delete(scaled.std(axis=0), 3), 1, atol=1e-5)
    assert np.all(scaled[:, 3] == 0)


def test_range_ratio_needs_two_varying_features():
    assert feature_range_ratio(np.c_[np.arange(5.0), np.ones(5)]) is None
    assert feature_range_ratio(np.c_[np.arange(5.0), 100 * np.arange(5.0)]) > 10


def test_training_parameter_is_checked_by_name():
    assert TrainingParams.from_dict({})["input_scaling"] == "auto"
    with pytest.raises(ValueError, match="input_scaling"):
        TrainingParams.from_dict({"input_scaling": "minmax"})


# ---------------------------------------------------------------------- the graph


def test_the_graph_scales_rows_bit_for_bit_as_numpy_does():
    rng = np.random.RandomState(1)
    X = rng.rand(200, 5).astype(np.float32) * np.array([1, 10, 100, 1000, 1e4], np.float32)
    scaling = InputScaling.fit(X, "standard")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["input"], ["embedding"])],
        "identity",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, 5])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [None, 5])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folded = scale_graph_input(proto, scaling)
    onnx.checker.check_model(folded)
    import onnxruntime as ort

    session = ort.InferenceSession(folded.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"input": X})
    np.testing.assert_array_equal(out, scaling.transform(X))
    assert scale_graph_input(proto, InputScaling("none")) is proto


# ---------------------------------------------------------------------- the bundle


@pytest.fixture(scope="module")
def wine_bundle(tmp_path_factory):
    X, y = load_wine(return_X_y=True)
    path = train_bundle(
        X, tmp_path_factory.mktemp("scaling") / "wine", name="wine", y=y, params={"map_points": 0}
    )
    return path, X


@pytest.mark.slow
def test_bundle_records_the_choice_and_takes_raw_rows(wine_bundle):
    path, X = wine_bundle
    bundle = load_bundle(path)
    section = bundle.manifest["input_scaling"]
    assert section["method"] == "standard" and section["requested"] == "auto"
    assert section["feature_range_ratio"] > section["range_ratio_limit"]
    assert SCALING_FILE in bundle.manifest["files"]
    assert bundle.manifest["training"]["params"]["input_scaling"] == "auto"

    exact = bundle.load_exact()
    expected = exact.estimator.transform(bundle.input_scaling.transform(X[:30]))
    expected = np.asarray(expected, dtype=np.float32)
    np.testing.assert_array_equal(bundle.embed(X[:30], mode="exact"), expected)
    # The fast path's graph scales the raw rows itself: the same as the distilled MLP
    # given rows scaled outside it.
    unscaled_graph = onnx.load_from_string((path / "compressor.onnx").read_bytes())
    assert [n.op_type for n in unscaled_graph.graph.node[:2]] == ["Sub", "Mul"]
    del unscaled_graph.graph.node[:2]
    for node in unscaled_graph.graph.node:
        node.input[:] = ["input" if name == "mbn_scaled_input" else name for name in node.input]
    inner = OnnxEmbedder(unscaled_graph.SerializeToString())
    np.testing.assert_array_equal(
        bundle.embed(X[:30]), inner.run(bundle.input_scaling.transform(X[:30]))[0]
    )


@pytest.mark.slow
def test_novelty_scores_raw_rows_in_the_models_units(wine_bundle):
    path, X = wine_bundle
    novelty = load_novelty(load_bundle(path))
    assert novelty is not None
    assert novelty.is_novel(X).mean() < 0.1
    shifted = X[:20].copy()
    shifted[:, 12] *= 10  # proline ten times its range
    assert novelty.out_of_range(shifted).all()
    assert novelty.is_novel(shifted).mean() > 0.9


@pytest.mark.slow
def test_the_choice_can_be_overridden(tmp_path):
    X, y = load_wine(return_X_y=True)
    path = train_bundle(
        X, tmp_path / "raw", name="raw", y=y, params={"map_points": 0, "input_scaling": "none"}
    )
    bundle = load_bundle(path)
    assert bundle.manifest["input_scaling"]["method"] == "none"
    assert SCALING_FILE not in bundle.manifest["files"]
    assert bundle.input_scaling.is_identity


def _rewrite(path, change):
    manifest = json.loads((path / MANIFEST).read_text())
    change(manifest)
    write_manifest(path, manifest)


@pytest.mark.slow
def test_a_bundle_whose_scaling_disagrees_with_its_files_is_refused(wine_bundle, tmp_path):
    path, _ = wine_bundle
    missing = tmp_path / "missing"
    shutil.copytree(path, missing)
    _rewrite(missing, lambda m: m["files"].pop(SCALING_FILE))
    with pytest.raises(BundleError, match=r"needs input_scaling\.npz"):
        load_bundle(missing)

    unscaled = tmp_path / "unscaled"
    shutil.copytree(path, unscaled)
    _rewrite(unscaled, lambda m: m["input_scaling"].update(method="none"))
    with pytest.raises(BundleError, match=r"takes no input_scaling\.npz"):
        load_bundle(unscaled)

    damaged = tmp_path / "damaged"
    shutil.copytree(path, damaged)
    (damaged / SCALING_FILE).write_bytes(b"PK\x03\x04 not an archive")
    with pytest.raises(BundleError, match=SCALING_FILE):
        load_bundle(damaged)


# ---------------------------------------------------------------------- the range check


def test_rows_the_scaling_takes_beyond_float32_are_named():
    rng = np.random.RandomState(0)
    X = (rng.rand(50, 4) * [1, 10, 1e3, 1e-3]).astype(np.float32)
    scaling = InputScaling.fit(X, "standard")
    check_scaled_range(scaling, X)  # the training rows are in range
    check_scaled_range(InputScaling("none"), np.full((2, 4), 3e38, np.float32))
    hostile = X[:6].copy()
    hostile[2, 3] = 3e38  # the narrowest feature: its factor is in the thousands
    hostile[4, 0] = -3e38
    hostile[5, 1] = 1e37  # large, yet in range once scaled
    with pytest.raises(OutOfRangeInput, match=r"^2 row\(s\) \(2, 4\) overflow float32") as caught:
        check_scaled_range(scaling, hostile)
    assert caught.value.rows.tolist() == [2, 4]
    assert np.isfinite(scaling.transform(hostile[[0, 1, 3, 5]])).all()
    # Exactly what the scaling computes decides, not the bounds that clear most batches.
    edge = np.array([[0, 0, 0, 0]], np.float32)
    edge[0, 3] = np.float32(np.finfo(np.float32).max / scaling.factor[3] * 0.99)
    assert np.isfinite(scaling.transform(edge)).all()
    check_scaled_range(scaling, edge)


@pytest.mark.slow
def test_both_paths_refuse_rows_scaled_out_of_range_alike(wine_bundle):
    path, X = wine_bundle
    bundle = load_bundle(path)
    rows = np.vstack([X[:2], np.full((1, X.shape[1]), 3e38)]).astype(np.float32)
    messages = []
    for mode in ("fast", "exact"):
        with pytest.raises(OutOfRangeInput) as caught:
            bundle.embed(rows, mode=mode)
        assert caught.value.rows.tolist() == [2]
        messages.append(str(caught.value))
    assert messages[0] == messages[1] and "once scaled" in messages[0]
    exact = bundle.load_exact()  # the exact model alone (a runtime of its own) refuses too
    with pytest.raises(OutOfRangeInput, match="once scaled"):
        exact.embed_with_clusters(rows)
    np.testing.assert_array_equal(
        bundle.embed(rows[:2], mode="exact"), bundle.embed(X[:2], "exact")
    )


def test_a_column_too_narrow_for_standard_scaling_is_named():
    """Its factor overflowed float32: the job failed deep in the fit on infinity."""
    rng = np.random.RandomState(0)
    X = rng.rand(60, 4).astype(np.float32)
    X[:, 2] = rng.rand(60).astype(np.float32) * np.float32(1e-41)
    with pytest.raises(ValueError, match=r"column 3 varies by a standard deviation of .*too small"):
        InputScaling.fit(X, "standard")
    with pytest.raises(ValueError, match="too small"):
        train_bundle(X, "unused", name="x", params={"input_scaling": "standard"})
    assert InputScaling.fit(X, "none").is_identity  # 'none' takes it as it is
