"""The label-free quality report: trustworthiness and continuity beside PCA's."""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import make_swiss_roll
from sklearn.manifold import trustworthiness

from mbn_core.pipeline.quality import neighbourhood_scores, quality_report, quality_summary


@pytest.fixture(scope="module")
def roll():
    X, t = make_swiss_roll(600, noise=0.05, random_state=0)
    return X, t


def unroll(X, t):
    """The roll's isometric 2-D coordinates: arc length along the spiral, and height."""
    arc = 0.5 * (t * np.sqrt(1 + t**2) + np.arcsinh(t))
    return np.column_stack([arc, X[:, 1]])


def test_scores_are_sklearns_trustworthiness_and_its_swap(roll):
    X, t = roll
    Z = unroll(X, t)
    scores = neighbourhood_scores(X, Z, 10, "euclidean")
    assert scores["trustworthiness"] == trustworthiness(X, Z, n_neighbors=10)
    assert scores["continuity"] == trustworthiness(Z, X, n_neighbors=10)


def test_a_rotation_keeps_every_neighbourhood_and_a_shuffle_keeps_none(roll):
    X, _ = roll
    rotation, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(3, 3)))
    kept = neighbourhood_scores(X, X @ rotation, 10, "euclidean")
    assert kept == {"trustworthiness": 1.0, "continuity": 1.0}
    shuffled = X[np.random.default_rng(1).permutation(len(X))]
    lost = neighbourhood_scores(X, shuffled, 10, "euclidean")
    assert lost["trustworthiness"] < 0.6 and lost["continuity"] < 0.6


def test_report_puts_pca_beside_the_embedding_on_unseen_rows(roll):
    X, t = roll
    unrolled = unroll(X, t)
    report = quality_report(
        X[:400], X[400:], {"exact": unrolled[400:]}, n_components=2, random_state=0
    )
    assert report["n_rows"] == 200 and report["n_neighbors"] == 10
    # PCA squashes the roll onto a plane, folding distant turns together: the unrolled
    # coordinates are more trustworthy than PCA's.
    assert report["exact"]["trustworthiness"] > report["pca"]["trustworthiness"]
    assert report["pca"]["n_components"] == 2
    assert report == quality_report(
        X[:400], X[400:], {"exact": unrolled[400:]}, n_components=2, random_state=0
    )
    line = quality_summary(report)
    assert "k=10, on 200 held-out rows" in line and "pca" in line and "exact" in line


def test_large_holdouts_are_sampled_and_small_ones_shrink_k(roll):
    X, _ = roll
    big = quality_report(X, X, {"exact": X[:, :2]}, n_components=2, random_state=0)
    assert big["n_rows"] == 600
    report = quality_report(X[:100], X[100:109], {"exact": X[100:109, :2]}, n_components=2)
    assert report["n_rows"] == 9 and report["n_neighbors"] == 4
    assert 0 <= report["exact"]["continuity"] <= 1


def test_too_few_rows_say_why_instead_of_failing(roll):
    X, _ = roll
    report = quality_report(X[:10], X[10:12], {"exact": X[10:12, :2]}, n_components=2)
    assert report["n_neighbors"] is None and report["exact"]["trustworthiness"] is None
    assert "too few" in report["reason"] and "too few" in quality_summary(report)


def test_pca_keeps_what_the_input_has_when_asked_for_more():
    X = np.random.default_rng(0).normal(size=(80, 1))
    report = quality_report(X[:50], X[50:], {"exact": np.hstack([X, X])[50:]}, n_components=10)
    assert report["pca"]["n_components"] == 1
    assert report["pca"]["trustworthiness"] == pytest.approx(1.0)


def test_sparse_cosine_input():
    rng = np.random.default_rng(0)
    # Dense enough that no two rows tie in distance (ties may rank either way).
    X = sp.random(300, 200, density=0.3, random_state=0, format="csr") * 10
    Z = rng.normal(size=(300, 3))
    report = quality_report(
        X[:200], X[200:], {"exact": Z[200:]}, n_components=3, metric="cosine", random_state=0
    )
    dense = quality_report(
        X[:200].toarray(), X[200:].toarray(), {"exact": Z[200:]}, n_components=3,
        metric="cosine", random_state=0,
    )  # fmt: skip
    assert report["exact"] == pytest.approx(dense["exact"])
    # ARPACK (sparse) and LAPACK (dense) find the same components to rounding.
    pca, dense_pca = report["pca"], dense["pca"]
    assert pca["trustworthiness"] == pytest.approx(dense_pca["trustworthiness"], abs=0.01)
