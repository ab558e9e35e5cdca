"""ONNX export of the fast path: parity with the in-memory model, real onnxruntime."""

import numpy as np
import onnx
import pytest
import scipy.sparse as sp
from onnx import TensorProto, helper, numpy_helper

from mbn_core import MBN, CompressiveMBN
from mbn_core.distill.onnx import CLUSTER, EMBEDDING, INPUT, OnnxEmbedder, to_onnx


def fit_model(X, **params):
    return CompressiveMBN(
        MBN(n_clusterings=30, k1=0.1, random_state=0, n_components=params.pop("n_components", 10)),
        hidden_layer_sizes=(32, 32),
        max_epochs=5,
        random_state=0,
        **params,
    ).fit(X)


@pytest.fixture(scope="module")
def X(digits):
    return digits.X


@pytest.fixture(scope="module")
def with_head(X):
    return fit_model(X, n_clusters=8)


@pytest.fixture(scope="module")
def exported(with_head):
    return to_onnx(with_head)


def assert_parity(expected, actual):
    scale = np.abs(expected).max()
    assert np.abs(expected - actual).max() <= 1e-4 * scale


@pytest.mark.slow
def test_embedding_parity(with_head, exported, X):
    embedder = OnnxEmbedder(exported.SerializeToString())
    result = embedder.embed(X)
    assert result.dtype == np.float32
    assert result.shape == (len(X), 10)
    assert_parity(with_head.transform(X), result)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("input_components", "sparse"),
    [(None, False), (None, True), (16, False), (16, True)],
    ids=str,
)
def test_parity_for_every_input_map(X, input_components, sparse):
    # Standardised dense input (the scale folded into the first layer), standardised sparse
    # input (scaled, not centred) and projected input, dense or sparse (Sub + MatMul), each
    # export to the same numbers.
    data = sp.csr_matrix(X) if sparse else X
    model = fit_model(data, input_components=input_components)
    assert (model.input_map_.projection is not None) == (input_components is not None)
    embedder = OnnxEmbedder(to_onnx(model))
    assert_parity(model.transform(data), embedder.embed(data))
    assert_parity(model.transform(X), embedder.embed(X))


@pytest.mark.slow
def test_cluster_parity(with_head, exported, X):
    embedder = OnnxEmbedder(exported)
    clusters = embedder.predict_clusters(X)
    assert clusters.dtype == np.int64
    # Only near-ties between two centroids may round differently.
    assert np.mean(clusters == with_head.predict_clusters(X)) >= 0.995


@pytest.mark.slow
def test_graph_is_float32_and_self_contained(exported):
    (graph_input,) = exported.graph.input
    assert graph_input.name == INPUT
    assert graph_input.type.tensor_type.elem_type == TensorProto.FLOAT
    outputs = {o.name: o.type.tensor_type.elem_type for o in exported.graph.output}
    assert outputs == {EMBEDDING: TensorProto.FLOAT, CLUSTER: TensorProto.INT64}
    assert all(t.data_location != TensorProto.EXTERNAL for t in exported.graph.initializer)
    onnx.checker.check_model(exported, full_check=True)


@pytest.mark.slow
def test_thread_settings_do_not_change_results(exported, X):
    one = OnnxEmbedder(exported, threads=1).embed(X[:300])
    two = OnnxEmbedder(exported, threads=2).embed(X[:300])
    assert_parity(one, two)
    with pytest.raises(ValueError, match="threads"):
        OnnxEmbedder(exported, threads=0)


@pytest.mark.slow
def test_from_file(exported, X, tmp_path):
    path = tmp_path / "compressor.onnx"
    path.write_bytes(exported.SerializeToString())
    embedder = OnnxEmbedder(path)
    assert (embedder.input_dim, embedder.output_dim, embedder.has_clusters) == (64, 10, True)


@pytest.mark.slow
def test_without_head_and_one_output_dimension(X):
    # One output dimension exercises skl2onnx's (-1, 1) reshape of MLPRegressor outputs.
    model = fit_model(X, n_components=1)
    embedder = OnnxEmbedder(to_onnx(model))
    assert not embedder.has_clusters
    assert [o.name for o in to_onnx(model).graph.output] == [EMBEDDING]
    result = embedder.embed(X[:40])
    assert result.shape == (40, 1)
    assert_parity(model.transform(X[:40]), result)
    with pytest.raises(ValueError, match="clustering head"):
        embedder.predict_clusters(X[:2])


@pytest.mark.slow
def test_sparse_and_chunked_input(with_head, exported, X, monkeypatch):
    import mbn_core.distill.onnx as onnx_module

    monkeypatch.setattr(onnx_module, "_CHUNK_ROWS", 100)
    embedder = OnnxEmbedder(exported)
    assert_parity(with_head.transform(X), embedder.embed(sp.csr_matrix(X)))


@pytest.mark.slow
def test_bad_input(exported, X):
    embedder = OnnxEmbedder(exported)
    with pytest.raises(ValueError, match="shape"):
        embedder.embed(X[:3, :10])
    with pytest.raises(ValueError, match="shape"):
        embedder.embed(X[0])
    bad = X[:3].copy()
    bad[1, 1] = np.inf
    with pytest.raises(ValueError, match="NaN or infinity"):
        embedder.embed(bad)


@pytest.mark.slow
def test_external_data_is_refused(exported):
    proto = onnx.ModelProto()
    proto.CopyFrom(exported)
    tensor = proto.graph.initializer[0]
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "../../etc/passwd"
    with pytest.raises(ValueError, match="external data"):
        OnnxEmbedder(proto)


def test_foreign_graphs_are_refused():
    weights = numpy_helper.from_array(np.eye(3, dtype=np.float32), name="w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "foreign",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])],
        [weights],
    )
    with pytest.raises(ValueError, match="not a compressive MBN graph"):
        OnnxEmbedder(
            helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        )
    custom = helper.make_model(graph, opset_imports=[helper.make_opsetid("com.evil", 1)])
    with pytest.raises(ValueError, match="domain"):
        OnnxEmbedder(custom)
    with pytest.raises(ValueError, match="not a loadable ONNX graph"):
        OnnxEmbedder(b"definitely not protobuf \xff\xfe")
