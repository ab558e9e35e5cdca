"""The student's heads (mbn_core.distill.student): the regression and the atom classifier,
their ONNX export, and which head a teacher gets by default."""

import copy

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import make_blobs
from sklearn.decomposition import PCA
from sklearn.neural_network import MLPClassifier, MLPRegressor

import mbn_core.distill.student as student_module
from mbn_core import MBN, CompressiveMBN
from mbn_core.distill.onnx import OnnxEmbedder, to_onnx
from mbn_core.distill.student import (
    ATOM_TARGETS,
    ATOM_TEMPERATURE,
    MIN_ATOMS,
    ROWS_PER_ATOM,
    Distiller,
    atom_targets,
)
from mbn_core.layouts import UMAP
from mbn_core.pipeline.split import split_rows


def distiller(**params) -> Distiller:
    values = {
        "hidden_layer_sizes": (32,),
        "max_epochs": 30,
        "batch_size": 64,
        "learning_rate": 1e-2,
        "alpha": 1e-5,
        "n_iter_no_change": None,
        "input_noise": 0.0,
        "input_components": None,
        "tol": 1e-4,
        "threads": 1,
        **params,
    }
    return Distiller(**values)


def two_clusters(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two overlapping Gaussian clouds in 5-D laid out as two tight clusters far apart, as a
    layout method lays out classes: rows near the boundary belong to one or the other, and
    no layout row lies between them."""
    X, y = make_blobs(n, n_features=5, centers=[[0.0] * 5, [1.5] * 5], random_state=seed)
    rng = np.random.RandomState(seed)
    layout = np.where(y[:, None] == 0, -10.0, 10.0) + rng.normal(0, 0.5, (n, 2))
    return X.astype(np.float32), layout


def fit(head: str, X, layout, **params):
    split = split_rows(X.shape[0], None, 0.1, np.random.RandomState(0))
    return distiller(head=head, **params).distil(
        X, layout, split.validation, split.train, np.random.RandomState(1), None
    )


def test_the_atom_head_commits_to_a_cluster_where_a_regression_falls_between():
    X, layout = two_clusters(1200)
    new, _ = two_clusters(600, seed=1)
    regression, atoms = fit("regression", X, layout), fit("atoms", X, layout)
    assert isinstance(regression.mlp, MLPRegressor) and regression.atoms is None
    assert isinstance(atoms.mlp, MLPClassifier) and atoms.head == "atoms"
    assert atoms.atoms is not None and atoms.atoms.shape == (100, 2)

    def in_the_gap(student) -> float:
        return float(np.mean(np.abs(student.embed(new)[:, 0]) < 5))

    # Where no layout row lies: the regressor puts its unsure rows there.
    assert in_the_gap(atoms) < 0.5 * in_the_gap(regression)


def test_the_atom_embedding_is_the_atoms_weighted_by_sharpened_probabilities():
    X, layout = two_clusters(400)
    student = fit("atoms", X, layout, n_atoms=12)
    assert student.atoms is not None and len(student.atoms) == 12
    probabilities = student.mlp.predict_proba(student.input_map.transform(X[:50]))
    expected = (probabilities @ student.atoms) * student.target_scale + student.target_mean
    np.testing.assert_allclose(student.embed(X[:50]), expected, rtol=1e-5, atol=1e-5)
    # The temperature is in the last layer: the network as trained (weights times T) gives
    # probabilities q, and p = q^(1/T) renormalised.
    trained = copy.deepcopy(student.mlp)
    trained.coefs_[-1] = trained.coefs_[-1] * ATOM_TEMPERATURE
    trained.intercepts_[-1] = trained.intercepts_[-1] * ATOM_TEMPERATURE
    q = trained.predict_proba(student.input_map.transform(X[:50])).astype(np.float64)
    sharpened = q ** (1 / ATOM_TEMPERATURE)
    sharpened /= sharpened.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(probabilities, sharpened, atol=1e-5)
    assert ATOM_TEMPERATURE < 1


def test_too_few_rows_for_atoms_regress():
    X, layout = two_clusters(ROWS_PER_ATOM * MIN_ATOMS - 1)  # 13 training rows
    student = fit("atoms", X, layout)
    assert student.head == "regression" and isinstance(student.mlp, MLPRegressor)


def test_the_atom_head_exports_to_onnx_with_the_same_numbers():
    X, y = make_blobs(300, n_features=12, centers=4, random_state=0)
    model = CompressiveMBN(
        MBN(n_clusterings=10, n_components=2, random_state=0),
        student_head="atoms",
        n_atoms=20,
        hidden_layer_sizes=(16,),
        max_epochs=5,
        report_folds=None,
        n_clusters=4,
        random_state=0,
    ).fit(X, y)
    assert model.student_head_ == "atoms" and model.atoms_.shape == (20, 2)
    embedder = OnnxEmbedder(to_onnx(model).SerializeToString())
    fast = model.transform(X)
    np.testing.assert_allclose(embedder.embed(X), fast, atol=1e-4 * np.abs(fast).max())
    assert model.as_trained_model().facts["n_atoms"] == 20


def test_auto_gives_a_layout_atoms_and_every_other_teacher_a_regression():
    X, _ = make_blobs(200, n_features=6, centers=3, random_state=0)
    mbn = CompressiveMBN(
        MBN(n_clusterings=10, random_state=0), max_epochs=2, report_folds=None, random_state=0
    ).fit(X)
    assert mbn.student_head_ == "regression" and mbn.atoms_ is None
    assert mbn.as_trained_model().facts["student_head"] == "regression"
    assert CompressiveMBN(UMAP())._resolved_head() == "atoms"
    assert CompressiveMBN(UMAP(), student_head="regression")._resolved_head() == "regression"


def test_the_head_is_a_checked_option():
    X, _ = make_blobs(60, n_features=4, random_state=0)
    with pytest.raises(ValueError, match="student_head"):
        CompressiveMBN(PCA(2), student_head="knn").fit(X)
    with pytest.raises(ValueError, match="n_atoms"):
        CompressiveMBN(PCA(2), n_atoms=2).fit(X)


def test_atom_targets_teach_a_row_on_a_border_both_atoms():
    atoms = np.array([[0.0, 0.0], [10.0, 0.0], [100.0, 0.0]], dtype=np.float32)
    # Most rows a unit from their atom (the bandwidth: median squared distance 1), one on
    # an atom, one halfway between the first two.
    Y = np.array([[0.0, 1.0]] * 5 + [[10.0, 1.0]] * 4 + [[0.0, 0.0], [5.0, 0.0]])
    targets = atom_targets(Y, atoms)
    assert targets.atoms.shape == targets.weights.shape == (len(Y), ATOM_TARGETS)
    np.testing.assert_array_equal(targets.atoms[0], [0, 1, 2])
    np.testing.assert_allclose(targets.weights.sum(axis=1), ATOM_TARGETS)
    on_atom, border = targets.weights[-2], targets.weights[-1]
    assert on_atom[0] > 0.99 * ATOM_TARGETS and on_atom[1] < 1e-6
    np.testing.assert_allclose(border[:2], ATOM_TARGETS / 2, rtol=1e-6)
    assert border[2] < 1e-6  # a far atom is taught nothing


def test_the_classifier_sees_each_row_once_per_target_atom_with_its_weight(monkeypatch):
    calls = []
    original = MLPClassifier.partial_fit

    def recording(self, X, y, classes=None, sample_weight=None):
        calls.append((X.shape[0], np.asarray(sample_weight).sum()))
        return original(self, X, y, classes=classes, sample_weight=sample_weight)

    monkeypatch.setattr(MLPClassifier, "partial_fit", recording)
    # At most 300 repeated rows per call: the epoch's 270 training rows in 3 calls of 90.
    monkeypatch.setattr(student_module, "ATOM_CHUNK_ROWS", 300)
    X, layout = two_clusters(300)
    student = fit("atoms", X, layout, n_atoms=12, max_epochs=2)
    assert student.head == "atoms"
    per_epoch = [rows for rows, _ in calls[: len(calls) // 2]]
    assert per_epoch == [90 * ATOM_TARGETS] * 3
    # Each row's weights sum to ATOM_TARGETS.
    np.testing.assert_allclose(sum(w for _, w in calls[: len(calls) // 2]), 270 * ATOM_TARGETS)


def test_the_atom_head_trains_on_sparse_rows():
    X, layout = two_clusters(400)
    X = sp.csr_matrix(np.where(X > 1, X, 0).astype(np.float32))
    student = fit("atoms", X, layout, n_atoms=12)
    assert student.head == "atoms" and student.embed(X[:5]).shape == (5, 2)
