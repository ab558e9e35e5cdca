"""ONNX export of a distilled fast path and an onnxruntime embedder for it.

The graph takes ``input`` (float32, n x d) and answers ``embedding`` (float32, n x c) and,
with a clustering head, ``cluster`` (int64, n): input centring, the projection of wide input
(``DistilledEmbedding.input_components``), the MLP as skl2onnx converts it (the input scale
folded into the projection or the MLP's first layer; with the atom head, its softmax output
times the atoms), then the inverse target scaling and the nearest k-means centroid. The
input's and the embedding's names are the method contract's (``mbn_core.methods.INPUT`` and
``EMBEDDING``).
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx
import onnxruntime as ort
import scipy.sparse as sp
from onnx import TensorProto, helper, numpy_helper
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.utils.validation import check_is_fitted

from mbn_core.distill.input_map import InputMap
from mbn_core.methods import EMBEDDING, INPUT

log = logging.getLogger(__name__)

CLUSTER = "cluster"
# Opset 17 runs on every onnxruntime of the last few years; ai.onnx.ml 3 has the Scaler
# of bundles exported before the scale was folded into the first layer.
TARGET_OPSET = {"": 17, "ai.onnx.ml": 3}
_DOMAINS = ("", "ai.onnx.ml")
# Rows per session run: bounds the activations held at once for very large batches.
_CHUNK_ROWS = 16384


class DistilledPath(Protocol):
    """What ``to_onnx`` reads of a fitted distilled model
    (``mbn_core.pipeline.distilled.DistilledEmbedding``)."""

    n_features_in_: int
    n_components_: int
    input_map_: InputMap
    mlp_: MLPRegressor | MLPClassifier
    atoms_: np.ndarray | None
    target_mean_: np.ndarray
    target_scale_: np.ndarray
    cluster_centers_: np.ndarray | None


def to_onnx(model: DistilledPath) -> onnx.ModelProto:
    """The whole fast path of a fitted distilled model as one float32 ONNX graph.

    Parameters
    ----------
    model : DistilledEmbedding
        A fitted model.

    Returns
    -------
    onnx.ModelProto
        Inputs ``input`` (n, n_features_in_); outputs ``embedding`` (n, n_components_) and,
        when the model has a clustering head, ``cluster`` (n,) int64. All weights are inside
        the graph (no external data).
    """
    # skl2onnx is needed to export only; loading it costs every reader half a second.
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    check_is_fitted(model)
    n_in, n_out = int(model.n_features_in_), int(model.n_components_)
    input_map = model.input_map_
    atoms = getattr(model, "atoms_", None)
    network = model.mlp_ if atoms is None else _softmax_network(model.mlp_)
    mlp = _fold_input_scale(input_map, network)
    n_mlp_out = n_out if atoms is None else len(atoms)
    proto = convert_sklearn(
        mlp,
        initial_types=[(INPUT, FloatTensorType([None, input_map.n_outputs]))],
        target_opset=TARGET_OPSET,
    )
    graph = proto.graph
    (mlp_output,) = [output.name for output in graph.output]
    del graph.output[:]

    def constant(name: str, value: np.ndarray) -> str:
        graph.initializer.append(numpy_helper.from_array(value, name=name))
        return name

    # Centre first, in float32 as InputMap does: folding the mean into the bias instead
    # would cancel large terms for inputs far from the origin. Then project.
    steps = []
    if input_map.mean is not None:
        steps.append(("Sub", "mbn_input_mean", input_map.mean, "mbn_centered"))
    if input_map.projection is not None:
        steps.append(("MatMul", "mbn_projection", input_map.projection, "mbn_projected"))
    current = INPUT
    for position, (op, weights, value, output) in enumerate(steps):
        node = helper.make_node(op, [current, constant(weights, value)], [output], name=weights)
        graph.node.insert(position, node)
        current = output
    for node in graph.node[len(steps) :]:
        node.input[:] = [current if name == INPUT else name for name in node.input]
    graph.input[0].type.tensor_type.shape.dim[1].dim_value = n_in

    # skl2onnx reshapes every MLPRegressor output to (-1, 1), which flattens a multi-output
    # regressor row by row (onnx/sklearn-onnx#474); reshaping back to (-1, n_out) undoes it
    # exactly and stays correct once the converter is fixed.
    shape = constant("mbn_output_shape", np.array([-1, n_mlp_out], dtype=np.int64))
    nodes = [
        helper.make_node(
            "Reshape",
            [mlp_output, shape],
            ["mbn_scaled" if atoms is None else "mbn_atom_probabilities"],
            name="mbn_unflatten",
        )
    ]
    if atoms is not None:
        nodes.append(
            helper.make_node(
                "MatMul",
                ["mbn_atom_probabilities", constant("mbn_atoms", atoms.astype(np.float32))],
                ["mbn_scaled"],
                name="mbn_atoms",
            )
        )
    nodes += [
        helper.make_node(
            "Mul",
            ["mbn_scaled", constant("mbn_target_scale", model.target_scale_)],
            ["mbn_unscaled"],
            name="mbn_target_scale",
        ),
        helper.make_node(
            "Add",
            ["mbn_unscaled", constant("mbn_target_mean", model.target_mean_)],
            [EMBEDDING],
            name="mbn_target_mean",
        ),
    ]
    graph.node.extend(nodes)
    graph.output.append(helper.make_tensor_value_info(EMBEDDING, TensorProto.FLOAT, [None, n_out]))
    graph.name = "compressive_mbn"
    proto.doc_string = (
        "Compressive MBN fast path: input centring and scaling or projection, MLP, "
        "inverse target scaling"
    )
    return add_cluster_head(proto, model.cluster_centers_)


def add_cluster_head(proto: onnx.ModelProto, centers: np.ndarray | None) -> onnx.ModelProto:
    """Add the nearest-centroid output ``cluster`` to an embedding graph, and its metadata.

    Parameters
    ----------
    proto : onnx.ModelProto
        A graph with input ``input`` (n, d) float32 and output ``embedding`` (n, c) float32:
        a distilled compressor or a method's own exported map. Changed in place.
    centers : ndarray of shape (n_clusters, c) or None
        k-means centroids of the embedding; None adds no head (only the metadata).

    Returns
    -------
    onnx.ModelProto
        ``proto``, checked.
    """
    graph = proto.graph
    inputs = [value for value in graph.input if value.name == INPUT]
    outputs = [value for value in graph.output if value.name == EMBEDDING]
    if len(inputs) != 1 or len(outputs) != 1 or CLUSTER in {o.name for o in graph.output}:
        raise ValueError(
            f"an embedding graph needs input {INPUT!r} and output {EMBEDDING!r} (and no "
            f"{CLUSTER!r} yet)"
        )
    n_in = _value_dim(inputs[0], INPUT)
    n_out = _value_dim(outputs[0], EMBEDDING)
    if centers is not None:
        centers = np.asarray(centers, dtype=np.float32)

        def constant(name: str, value: np.ndarray) -> str:
            graph.initializer.append(numpy_helper.from_array(value, name=name))
            return name

        # argmin_j |e - c_j|^2 = argmin_j (|c_j|^2 - 2 e.c_j): |e|^2 is the same for every j.
        graph.node.extend(
            [
                helper.make_node(
                    "MatMul",
                    [EMBEDDING, constant("mbn_centers_t", (-2.0 * centers.T).astype(np.float32))],
                    ["mbn_cross"],
                    name="mbn_cross",
                ),
                helper.make_node(
                    "Add",
                    [
                        "mbn_cross",
                        constant("mbn_center_norms", np.sum(centers * centers, axis=1)),
                    ],
                    ["mbn_scores"],
                    name="mbn_scores",
                ),
                helper.make_node(
                    "ArgMin", ["mbn_scores"], [CLUSTER], axis=1, keepdims=0, name="mbn_cluster"
                ),
            ]
        )
        graph.output.append(helper.make_tensor_value_info(CLUSTER, TensorProto.INT64, [None]))
    helper.set_model_props(
        proto,
        {
            "mbn.input_dim": str(n_in),
            "mbn.output_dim": str(n_out),
            "mbn.n_clusters": "" if centers is None else str(len(centers)),
        },
    )
    onnx.checker.check_model(proto, full_check=True)
    return proto


class OnnxEmbedder:
    """Runs an exported compressive MBN with onnxruntime on the CPU.

    Parameters
    ----------
    model : bytes, path or onnx.ModelProto
        The serialised graph of ``to_onnx``. Graphs that reference external data files or
        operators outside the standard domains are refused.
    threads : int, default=1
        Threads inside one operator (``intra_op_num_threads``). Operators run one after the
        other (sequential execution, one inter-op thread): a service runs several requests
        side by side, so each request's threads must stay bounded and predictable.

    Examples
    --------
    >>> embedder = OnnxEmbedder(to_onnx(model).SerializeToString())  # doctest: +SKIP
    >>> embedder.embed(X[:2]).shape  # doctest: +SKIP
    (2, 10)
    """

    def __init__(self, model: bytes | str | Path | onnx.ModelProto, *, threads: int = 1) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
        if isinstance(model, onnx.ModelProto):
            proto = model
        else:
            data = model if isinstance(model, bytes) else Path(model).read_bytes()
            try:
                proto = onnx.load_from_string(data)
            except Exception as error:  # protobuf's DecodeError and friends
                raise ValueError(f"not a loadable ONNX graph: {error}") from None
        _check_self_contained(proto)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Idle spinning would burn the cores that concurrent requests and the exact path need.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        try:
            self._session = ort.InferenceSession(
                proto.SerializeToString(),
                sess_options=options,
                providers=["CPUExecutionProvider"],
            )
        except Exception as error:  # onnxruntime's own exception types
            raise ValueError(f"not a loadable ONNX graph: {error}") from None
        inputs = self._session.get_inputs()
        outputs = {output.name: output for output in self._session.get_outputs()}
        if [i.name for i in inputs] != [INPUT] or EMBEDDING not in outputs:
            raise ValueError(
                f"not a compressive MBN graph: inputs {[i.name for i in inputs]}, "
                f"outputs {sorted(outputs)}"
            )
        self.input_dim = _static_dim(inputs[0].shape, "input")
        self.output_dim = _static_dim(outputs[EMBEDDING].shape, "embedding")
        self.has_clusters = CLUSTER in outputs
        self.threads = threads

    def run(self, X) -> tuple[np.ndarray, np.ndarray | None]:
        """Embedding (float32) and cluster ids (int64, or None without a head) of X."""
        X = self._check_input(X)
        names = [EMBEDDING, CLUSTER] if self.has_clusters else [EMBEDDING]
        embeddings, clusters = [], []
        for start in range(0, max(X.shape[0], 1), _CHUNK_ROWS):
            chunk = X[start : start + _CHUNK_ROWS]
            if sp.issparse(chunk):
                chunk = chunk.toarray()
            result = self._session.run(names, {INPUT: np.ascontiguousarray(chunk)})
            embeddings.append(result[0])
            if self.has_clusters:
                clusters.append(result[1])
        embedding = np.concatenate(embeddings).astype(np.float32, copy=False)
        if not self.has_clusters:
            return embedding, None
        return embedding, np.concatenate(clusters).astype(np.int64, copy=False)

    def embed(self, X) -> np.ndarray:
        """Fast embedding of X, float32 of shape (n_samples, output_dim)."""
        return self.run(X)[0]

    def predict_clusters(self, X) -> np.ndarray:
        """Cluster id of each row of X (int64); ValueError when the graph has no head."""
        if not self.has_clusters:
            raise ValueError("this model has no clustering head")
        clusters = self.run(X)[1]
        assert clusters is not None
        return clusters

    def _check_input(self, X):
        if sp.issparse(X):
            X = sp.csr_matrix(X, dtype=np.float32)
            values = X.data
        else:
            X = np.asarray(X, dtype=np.float32)
            values = X
        if X.ndim != 2 or X.shape[1] != self.input_dim:
            raise ValueError(
                f"X must have shape (n_samples, {self.input_dim}), got {tuple(X.shape)}"
            )
        if not np.isfinite(values).all():
            raise ValueError("X contains NaN or infinity")
        return X


def _softmax_network(classifier: MLPClassifier) -> MLPRegressor:
    """The atom head's classifier as a network skl2onnx converts to a plain tensor: a regressor
    with the same layers and a softmax output (its class probabilities; the classifier's own
    converter adds labels and a map of them)."""
    if classifier.out_activation_ != "softmax":
        raise ValueError("the atom head needs a classifier of three atoms or more")
    network = MLPRegressor(
        hidden_layer_sizes=classifier.hidden_layer_sizes, activation=classifier.activation
    )
    network.coefs_ = list(classifier.coefs_)
    network.intercepts_ = list(classifier.intercepts_)
    network.n_layers_ = classifier.n_layers_
    network.n_outputs_ = classifier.n_outputs_
    network.n_features_in_ = classifier.n_features_in_
    network.out_activation_ = "softmax"
    return network


def _fold_input_scale(input_map: InputMap, mlp: MLPRegressor) -> MLPRegressor:
    """``mlp``, or when ``input_map`` does not project, a copy whose first layer divides by
    its scale.

    ai.onnx.ml's Scaler runs element by element, and took about as long as the whole first
    MatMul; a Sub and scaled weights give the same numbers.
    """
    if input_map.scale is None:
        return mlp  # projected: the scale is in the projection
    folded = copy.deepcopy(mlp)
    first = folded.coefs_[0]
    scale = input_map.scale.astype(np.float64)
    folded.coefs_[0] = (first / scale[:, None]).astype(first.dtype)
    return folded


def _check_self_contained(proto: onnx.ModelProto) -> None:
    """Refuse graphs that would read other files or need custom operators."""
    for tensor in _all_tensors(proto.graph):
        if tensor.data_location == TensorProto.EXTERNAL:
            raise ValueError(f"ONNX tensor {tensor.name!r} refers to external data")
    for opset in proto.opset_import:
        if opset.domain not in _DOMAINS:
            raise ValueError(f"ONNX graph uses the operator domain {opset.domain!r}")


def _all_tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _all_tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _all_tensors(subgraph)


def _static_dim(shape, name: str) -> int:
    if len(shape) != 2 or not isinstance(shape[1], int):
        raise ValueError(f"ONNX {name} must have a fixed second dimension, got {shape}")
    return int(shape[1])


def _value_dim(value: onnx.ValueInfoProto, name: str) -> int:
    dims = value.type.tensor_type.shape.dim
    if len(dims) != 2 or not dims[1].HasField("dim_value"):
        raise ValueError(f"ONNX {name} must be 2-D with a fixed second dimension")
    return int(dims[1].dim_value)
