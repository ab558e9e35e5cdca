"""ONNX export of an exact landmark map (modular kernel PCA and its baselines).

The map is already "an RBF layer and a linear layer", so the fast path is the exact function
in float32, not a distilled network:

    input - μ -> |x|^2 + |z_r|^2 - 2 x·z_r (clipped at 0) -> exp(-γ ·) -> @ (scale A)^T - scale b

with μ the landmarks' mean: centring both sides first keeps the squared norms small, so the
float32 expansion of the distances loses less to cancellation. The graph has the same input
and output names as the compressive MBN's (``mbn_core.distill.onnx``), so ``OnnxEmbedder`` runs it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mbn_core.methods import EMBEDDING, INPUT
from mbn_core.modular.kernel_map import LandmarkMap

OPSET = 17


def landmark_map_to_onnx(
    landmark_map: LandmarkMap, method: str = "modular_kpca"
) -> onnx.ModelProto:
    """The exact map as one self-contained float32 ONNX graph (``input`` -> ``embedding``)."""
    landmarks = np.asarray(landmark_map.landmarks, dtype=np.float64)
    centre = landmarks.mean(axis=0)
    shifted = landmarks - centre
    scale = float(landmark_map.scale)
    n_in, n_out = landmark_map.n_features_in, landmark_map.n_components
    initializers = {
        "centre": centre,
        "landmarks_t": shifted.T,
        "landmark_sq_norms": np.sum(shifted * shifted, axis=1)[None, :],
        "minus_two": np.array(-2.0),
        "zero": np.array(0.0),
        "minus_gamma": np.array(-float(landmark_map.gamma)),
        "weights_t": scale * np.asarray(landmark_map.weights).T,
        "offset": scale * np.asarray(landmark_map.offset),
        "axes": np.array([1], dtype=np.int64),
    }
    tensors = [
        numpy_helper.from_array(
            value if value.dtype == np.int64 else value.astype(np.float32), name=name
        )
        for name, value in initializers.items()
    ]
    nodes = [
        helper.make_node("Sub", [INPUT, "centre"], ["x"]),
        helper.make_node("Mul", ["x", "x"], ["x_sq"]),
        helper.make_node("ReduceSum", ["x_sq", "axes"], ["x_sq_norms"], keepdims=1),
        helper.make_node("MatMul", ["x", "landmarks_t"], ["cross"]),
        helper.make_node("Mul", ["cross", "minus_two"], ["minus_two_cross"]),
        helper.make_node("Add", ["minus_two_cross", "x_sq_norms"], ["partial"]),
        helper.make_node("Add", ["partial", "landmark_sq_norms"], ["sq_raw"]),
        # Rounding can make a tiny distance negative; the exact one never is.
        helper.make_node("Max", ["sq_raw", "zero"], ["sq_distances"]),
        helper.make_node("Mul", ["sq_distances", "minus_gamma"], ["exponent"]),
        helper.make_node("Exp", ["exponent"], ["kernel"]),
        helper.make_node("MatMul", ["kernel", "weights_t"], ["projected"]),
        helper.make_node("Sub", ["projected", "offset"], [EMBEDDING]),
    ]
    graph = helper.make_graph(
        nodes,
        f"{method}_exact_map",
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, [None, n_in])],
        [helper.make_tensor_value_info(EMBEDDING, TensorProto.FLOAT, [None, n_out])],
        initializer=tensors,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    proto.doc_string = f"{method}: the exact RBF-landmark map (kernel to landmarks, linear map)"
    helper.set_model_props(
        proto,
        {
            "mbn.method": method,
            "mbn.input_dim": str(n_in),
            "mbn.output_dim": str(n_out),
            "mbn.n_modules": str(landmark_map.n_modules),
            "mbn.module_dim": str(landmark_map.module_dim),
        },
    )
    onnx.checker.check_model(proto, full_check=True)
    return proto


def to_onnx(model) -> onnx.ModelProto:
    """The fast path of a fitted ``ModularKPCA`` or ``ModularBaseline``."""
    from sklearn.utils.validation import check_is_fitted

    check_is_fitted(model)
    method = getattr(model, "method", "modular_kpca")
    return landmark_map_to_onnx(model.map_, method=method)
