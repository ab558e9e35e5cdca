"""Versions whose vectors stay comparable: a new model's embedding mapped into an old one's.

Retraining moves every vector: an embedding is defined up to a rotation (PCA's signs, MBN's
random clusterings), so vectors stored from the old version cannot be compared with the new
one's. ``align_model`` fits an orthogonal Procrustes map with a uniform scale and a shift,
``y = scale * x @ rotation + shift``, that takes the new model's exact embedding of the
*reference rows* onto the old model's, and applies it to every path of the new model:

- the exact path, through the manifest's ``alignment`` section (``matrix`` = scale x
  rotation, and ``shift``), which ``Bundle`` applies after the estimator;
- the fast path, folded into the ONNX graph's output layer (``fold_into_graph``);
- the clustering head's centroids, mapped too (a similarity keeps every nearest centroid).

Reference rows are a sample of a model's training rows kept in its bundle
(``reference.npz``, with the model's own exact embedding of them). A new version aligns on
the old model's reference rows, so training sets may differ, and keeps them as its own, so
a chain of versions shares one reference set. The residual (relative root mean squared
distance after the map) goes into the manifest.

``compare_embeddings`` says how comparable two versions are on the same rows: median cosine,
10-NN overlap and cluster agreement (clusters matched one to one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import scipy.sparse as sp
from onnx import helper, numpy_helper
from scipy.optimize import linear_sum_assignment
from sklearn.utils import check_random_state

from mbn_core.bundle import REFERENCE_FILE, Bundle, BundleError
from mbn_core.bundle.trained import TrainedModel
from mbn_core.distill.onnx import EMBEDDING
from mbn_core.pipeline.fidelity import knn_overlap
from mbn_core.utils.npz import arrays_from_npz, npz_bytes

# Reference rows kept in a bundle: enough for a c x c rotation many times over and for a
# 10-NN overlap, small beside the exact model.
REFERENCE_ROWS = 500
_KNN = 10
# Reference rows are kept dense: a sparse model keeps none, and has none to align on.
SPARSE_ALIGNMENT = (
    "aligning a model trained on sparse input is not supported (no reference rows are kept "
    "of sparse input)"
)
# Node names of the distilled graph's output layer (mbn_core.distill.onnx.to_onnx).
_TARGET_SCALE, _TARGET_MEAN = "mbn_target_scale", "mbn_target_mean"
_CENTERS_T, _CENTER_NORMS = "mbn_centers_t", "mbn_center_norms"


@dataclass(frozen=True)
class Alignment:
    """``y = x @ matrix + shift`` with ``matrix = scale * rotation`` (rotation orthogonal)."""

    rotation: np.ndarray
    scale: float
    shift: np.ndarray

    @property
    def matrix(self) -> np.ndarray:
        return self.scale * self.rotation

    def apply(self, X) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        return X @ self.matrix + self.shift

    @classmethod
    def fit(cls, source, target, *, scale: bool = True, shift: bool = True) -> Alignment:
        """The map taking ``source`` rows closest to ``target`` rows (least squares):
        orthogonal Procrustes on the centred rows (or raw rows without ``shift``)."""
        A = np.asarray(source, dtype=np.float64)
        B = np.asarray(target, dtype=np.float64)
        if A.shape != B.shape or A.ndim != 2 or len(A) < 2:
            raise ValueError(
                f"alignment needs the same rows in both embeddings, got {A.shape} and {B.shape}"
            )
        mean_a = A.mean(axis=0) if shift else np.zeros(A.shape[1])
        mean_b = B.mean(axis=0) if shift else np.zeros(B.shape[1])
        a, b = A - mean_a, B - mean_b
        u, s, vt = np.linalg.svd(a.T @ b)
        rotation = u @ vt
        factor = float(s.sum() / np.sum(a * a)) if scale and np.sum(a * a) > 0 else 1.0
        return cls(rotation=rotation, scale=factor, shift=mean_b - factor * mean_a @ rotation)

    def residual(self, source, target) -> float:
        """Root mean squared distance after the map over the target's root mean squared
        spread about its mean: 0 is a perfect fit, 1 no better than the mean row."""
        B = np.asarray(target, dtype=np.float64)
        spread = np.sqrt(np.mean(np.sum((B - B.mean(axis=0)) ** 2, axis=1)))
        error = np.sqrt(np.mean(np.sum((self.apply(source) - B) ** 2, axis=1)))
        return float(error / spread) if spread > 0 else 0.0

    def section(self) -> dict[str, Any]:
        """What the manifest's ``alignment`` section holds of the map."""
        return {
            "matrix": self.matrix.tolist(),
            "shift": self.shift.tolist(),
            "scale": self.scale,
        }


# ---------------------------------------------------------------------- reference rows


@dataclass(frozen=True)
class ReferenceRows:
    """Rows of a model's input and the model's exact embedding of them."""

    rows: np.ndarray
    embedding: np.ndarray

    def to_bytes(self) -> bytes:
        return npz_bytes(
            {"rows": self.rows.astype(np.float32), "embedding": self.embedding.astype(np.float32)}
        )

    @classmethod
    def from_bytes(cls, data: bytes, source: str = REFERENCE_FILE) -> ReferenceRows:
        arrays = arrays_from_npz(data, source, "set of reference rows", ("rows", "embedding"))
        rows, embedding = arrays["rows"], arrays["embedding"]
        if rows.ndim != 2 or embedding.ndim != 2 or len(rows) != len(embedding) or len(rows) < 2:
            raise ValueError(f"{source}: reference rows of inconsistent shapes")
        return cls(rows.astype(np.float32), embedding.astype(np.float32))


def sample_reference_rows(X, rows, random_state) -> np.ndarray:
    """Up to ``REFERENCE_ROWS`` of the training rows ``X[rows]``, dense float32."""
    rows = np.arange(X.shape[0]) if rows is None else np.asarray(rows)
    rng = check_random_state(random_state)
    chosen = np.sort(rng.permutation(rows)[:REFERENCE_ROWS])
    sample = X[chosen]
    if hasattr(sample, "toarray"):
        sample = sample.toarray()
    return np.asarray(sample, dtype=np.float32)


def load_reference(bundle: Bundle) -> ReferenceRows | None:
    """``bundle``'s reference rows, or None when it has none (trained before them)."""
    reference = bundle.read_optional(REFERENCE_FILE, ReferenceRows.from_bytes)
    if reference is None:
        return None
    if reference.rows.shape[1] != bundle.input_dim or (
        reference.embedding.shape[1] != bundle.output_dim
    ):
        raise BundleError(f"{bundle.id}/{REFERENCE_FILE}: dimensions disagree with the model")
    return reference


def check_compatible(
    old: Bundle, n_features: int, n_components: int | None, *, sparse: bool = False
) -> None:
    """ValueError unless a model of ``n_features`` inputs (and ``n_components`` outputs,
    when known), trained on ``sparse`` input or not, can be aligned to ``old``."""
    if sparse:
        raise ValueError(SPARSE_ALIGNMENT)
    if n_features != old.input_dim:
        raise ValueError(
            f"cannot align to model {old.id!r}: it takes {old.input_dim} features, the new "
            f"data has {n_features}"
        )
    if n_components is not None and n_components != old.output_dim:
        raise ValueError(
            f"cannot align to model {old.id!r}: it embeds in {old.output_dim} dimensions, "
            f"the new model in {n_components}"
        )


# ---------------------------------------------------------------------- training


def reference_files(
    model: TrainedModel, X, old: Bundle | None, random_state
) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Align ``model`` (in place) to ``old`` when given, and make its reference rows.

    Returns the bundle files (``reference.npz``) and manifest sections (``alignment`` when
    aligned). ValueError when ``old`` is incompatible.
    """
    sections: dict[str, Any] = {}
    if sp.issparse(X):
        if old is not None:
            raise ValueError(SPARSE_ALIGNMENT)
        return {}, sections  # dense reference rows of a wide vocabulary would be large
    reference = None if old is None else load_reference(old)
    if old is not None:
        check_compatible(old, int(model.n_features_in), int(model.n_components))
        source = "reference rows of the old model"
        if reference is None:  # an old bundle without reference rows: the new data's
            rows = sample_reference_rows(X, model.training_rows, random_state)
            reference = ReferenceRows(rows, old.embed(rows, mode="exact"))
            source = "training rows of the new model, embedded by the old one"
        new = _exact(model, reference.rows)
        alignment = Alignment.fit(new, reference.embedding)
        apply_to_model(model, alignment)
        sections["alignment"] = {
            "reference_model": old.id,
            "reference_name": old.name,
            "reference_rows": len(reference.rows),
            "reference_source": source,
            "residual": alignment.residual(new, reference.embedding),
            "unaligned_residual": _unaligned_residual(new, reference.embedding),
            **alignment.section(),
            "fidelity_note": "the fidelity report was measured before alignment (R^2 is "
            "unchanged by it)",
        }
        rows, embedding = reference.rows, alignment.apply(new)
    else:
        rows, embedding = _training_reference(X, model, random_state)
    files = {REFERENCE_FILE: ReferenceRows(rows, embedding).to_bytes()}
    return files, sections


def _training_reference(X, model: TrainedModel, random_state) -> tuple[np.ndarray, np.ndarray]:
    """Reference rows sampled from the training rows, and their exact embedding: a layout
    method's own layout of them (it places only the rows it laid out), else ``transform``."""
    if not model.method.layout or model.training_embedding is None:
        rows = sample_reference_rows(X, model.training_rows, random_state)
        return rows, _exact(model, rows)
    fitted = np.arange(X.shape[0]) if model.training_rows is None else model.training_rows
    chosen = np.sort(check_random_state(random_state).permutation(fitted)[:REFERENCE_ROWS])
    embedding = model.training_embedding[np.searchsorted(fitted, chosen)]
    rows = np.asarray(X[chosen], dtype=np.float32)
    return rows, np.asarray(embedding, dtype=np.float64)


def _exact(model: TrainedModel, rows: np.ndarray) -> np.ndarray:
    """The model's exact embedding of raw ``rows`` (scaled as the model scales them; before
    any alignment)."""
    scaled = model.input_scaling.transform(rows)
    return np.asarray(model.estimator.transform(scaled), dtype=np.float64)


def _unaligned_residual(source: np.ndarray, target: np.ndarray) -> float:
    identity = Alignment(np.eye(source.shape[1]), 1.0, np.zeros(source.shape[1]))
    return identity.residual(source, target)


def apply_to_model(model: TrainedModel, alignment: Alignment) -> None:
    """Map ``model``'s fast path, clustering head and training embedding by ``alignment``;
    its exact path follows through the manifest's ``alignment`` section."""
    centers = None
    if model.cluster_centers is not None:
        centers = alignment.apply(model.cluster_centers).astype(np.float32)
        model.cluster_centers = centers
    model.fast_path = fold_into_graph(model.fast_path, alignment, centers)
    if model.training_embedding is not None:
        model.training_embedding = alignment.apply(model.training_embedding).astype(np.float32)


def fold_into_graph(
    proto: onnx.ModelProto, alignment: Alignment, centers: np.ndarray | None
) -> onnx.ModelProto:
    """``proto`` with its ``embedding`` output mapped by ``alignment``.

    In a distilled graph the map is folded into the output layer (the inverse target
    scaling becomes a matrix product, its shift the map's); any other graph gets the
    product and the shift appended. A clustering head's centroids are replaced by
    ``centers`` (the aligned ones).
    """
    proto = _copy(proto)
    graph = proto.graph
    nodes = {node.name: node for node in graph.node}
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    matrix = alignment.matrix
    if _TARGET_SCALE in nodes and _TARGET_MEAN in nodes and _TARGET_SCALE in initializers:
        scale = numpy_helper.to_array(initializers[_TARGET_SCALE]).astype(np.float64)
        mean = numpy_helper.to_array(initializers[_TARGET_MEAN]).astype(np.float64)
        # (h * scale + mean) @ M + t = h @ (diag(scale) M) + (mean @ M + t)
        _replace(graph, _TARGET_SCALE, scale[:, None] * matrix)
        _replace(graph, _TARGET_MEAN, mean @ matrix + alignment.shift)
        nodes[_TARGET_SCALE].op_type = "MatMul"
    else:
        producer = next(node for node in graph.node if EMBEDDING in node.output)
        producer.output[:] = ["mbn_unaligned" if o == EMBEDDING else o for o in producer.output]
        graph.initializer.append(
            numpy_helper.from_array(matrix.astype(np.float32), name="mbn_alignment_matrix")
        )
        graph.initializer.append(
            numpy_helper.from_array(alignment.shift.astype(np.float32), name="mbn_alignment_shift")
        )
        position = list(graph.node).index(producer) + 1
        graph.node.insert(
            position,
            helper.make_node(
                "MatMul", ["mbn_unaligned", "mbn_alignment_matrix"], ["mbn_rotated"],
                name="mbn_alignment_matrix",
            ),
        )  # fmt: skip
        graph.node.insert(
            position + 1,
            helper.make_node(
                "Add", ["mbn_rotated", "mbn_alignment_shift"], [EMBEDDING],
                name="mbn_alignment_shift",
            ),
        )  # fmt: skip
    if centers is not None and _CENTERS_T in initializers:
        centers = np.asarray(centers, dtype=np.float32)
        _replace(graph, _CENTERS_T, -2.0 * centers.T)
        _replace(graph, _CENTER_NORMS, np.sum(centers * centers, axis=1))
    onnx.checker.check_model(proto, full_check=True)
    return proto


def _copy(proto: onnx.ModelProto) -> onnx.ModelProto:
    copied = onnx.ModelProto()
    copied.CopyFrom(proto)
    return copied


def _replace(graph: onnx.GraphProto, name: str, value: np.ndarray) -> None:
    for position, tensor in enumerate(graph.initializer):
        if tensor.name == name:
            graph.initializer[position].CopyFrom(
                numpy_helper.from_array(np.asarray(value, dtype=np.float32), name=name)
            )
            return
    raise ValueError(f"the graph has no initializer {name!r}")


# ---------------------------------------------------------------------- comparing


def compare_embeddings(
    a: np.ndarray,
    b: np.ndarray,
    clusters_a: np.ndarray | None = None,
    clusters_b: np.ndarray | None = None,
) -> dict[str, Any]:
    """How comparable two embeddings of the same rows are.

    Returns ``n_rows``, ``cosine_median`` (of each row's two vectors), ``knn_overlap``
    (10-NN, None with 10 rows or fewer) and ``cluster_agreement``: the share of rows whose
    clusters correspond under the best one-to-one matching of the two models' clusters
    (None without both clustering heads).
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"embeddings of different shapes {a.shape} and {b.shape}")
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cosine = np.sum(a * b, axis=1) / np.maximum(norms, np.finfo(np.float64).tiny)
    agreement = None
    if clusters_a is not None and clusters_b is not None:
        agreement = matched_agreement(np.asarray(clusters_a), np.asarray(clusters_b))
    return {
        "n_rows": len(a),
        "cosine_median": float(np.median(cosine)),
        "knn_overlap": knn_overlap(a, b, _KNN),
        "cluster_agreement": agreement,
    }


def matched_agreement(labels_a: np.ndarray, labels_b: np.ndarray) -> float:
    """Share of rows whose labels correspond under the one-to-one matching of the two
    labellings that maximises it (Hungarian algorithm on the contingency table)."""
    values_a, index_a = np.unique(labels_a, return_inverse=True)
    values_b, index_b = np.unique(labels_b, return_inverse=True)
    table = np.zeros((len(values_a), len(values_b)))
    np.add.at(table, (index_a, index_b), 1)
    rows, cols = linear_sum_assignment(-table)
    return float(table[rows, cols].sum() / len(labels_a))
