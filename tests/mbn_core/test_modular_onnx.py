"""The exact landmark map as an ONNX graph, run by real onnxruntime, against float64."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from mbn_core import ModularBaseline, ModularKPCA
from mbn_core.distill.onnx import OnnxEmbedder
from mbn_core.modular.export import to_onnx
from mbn_core.modular.kpca import modular_from_arrays, modular_to_arrays

PARAMS = {"n_modules": 4, "module_dim": 5, "n_landmarks": 120, "random_state": 0}


@pytest.fixture(scope="module")
def data(digits):
    X, _ = digits
    return X[:500], X[500:800]


@pytest.mark.parametrize(
    "model",
    [ModularKPCA(**PARAMS, max_epochs=20), ModularBaseline("monolithic", **PARAMS)],
    ids=["modular_kpca", "monolithic"],
)
def test_onnx_float32_matches_the_float64_map(model, data):
    # A6.9: parity <= 1e-4 of the embedding's scale on rows the model never saw.
    train, unseen = data
    model.fit(train)
    embedder = OnnxEmbedder(to_onnx(model).SerializeToString())
    assert (embedder.input_dim, embedder.output_dim) == (64, 20)
    exact = model.transform(unseen)
    fast = embedder.embed(unseen.astype(np.float32))
    assert fast.dtype == np.float32
    assert np.abs(fast - exact).max() <= 1e-4 * np.abs(exact).max()
    r2 = 1 - np.sum((fast - exact) ** 2) / np.sum((exact - exact.mean(0)) ** 2)
    assert r2 > 0.9999


def test_onnx_graph_states_the_method_and_shapes(data):
    model = ModularKPCA(**PARAMS, max_epochs=5).fit(data[0])
    proto = to_onnx(model)
    props = {p.key: p.value for p in proto.metadata_props}
    assert props["mbn.method"] == "modular_kpca"
    assert (props["mbn.n_modules"], props["mbn.module_dim"]) == ("4", "5")
    assert {o.domain for o in proto.opset_import} == {""}
    onnx.checker.check_model(proto, full_check=True)


def test_arrays_round_trip_gives_the_same_transform(data):
    train, unseen = data
    model = ModularKPCA(**PARAMS, max_epochs=5).fit(train)
    arrays = modular_to_arrays(model)
    assert all(isinstance(v, np.ndarray) and v.dtype != object for v in arrays.values())
    restored = modular_from_arrays(arrays, model.get_params())
    assert np.array_equal(restored.transform(unseen), model.transform(unseen))
    assert restored.loss_curve_ == model.loss_curve_
    broken = {**arrays, "offset": arrays["offset"][:-1]}
    with pytest.raises(ValueError, match="offset"):
        modular_from_arrays(broken, model.get_params())
    with pytest.raises(ValueError, match="missing"):
        modular_from_arrays({k: v for k, v in arrays.items() if k != "weights"}, {})
