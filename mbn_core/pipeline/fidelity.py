"""How faithfully a fast path reproduces the exact embedding, on rows new to both.

The numbers every bundle's manifest carries under ``fidelity``: R^2, row cosines, k-NN
overlap, and agreement of k-means clusterings (with each other, with labels when given, and
with the clustering head's).
"""

from __future__ import annotations

from numbers import Integral
from typing import Any

import numpy as np
from sklearn.metrics import normalized_mutual_info_score, r2_score
from sklearn.neighbors import NearestNeighbors

from mbn_core.pipeline.head import kmeans, nearest

# The NMI gap between fast and exact should not be k-means noise: the lowest inertia of
# this many runs.
REPORT_KMEANS_INIT = 20
# Neighbours compared by the k-NN overlap.
KNN = 10
# The figures of a report that are measures (a cross-fitted report states their standard
# errors).
FIGURES = (
    "r2",
    "cosine",
    "cosine_median",
    "knn_overlap",
    "nmi_fast_exact",
    "nmi_labels_exact",
    "nmi_labels_fast",
    "cluster_agreement",
)
# What a layout method's report (mbn_core.pipeline.layouts) says its rows were new to.
LAYOUT_CROSS_FITTED = "cross-fitted students"
LAYOUT_HELD_OUT = "held out of the student"
# What such a report means, for ``mbn info`` and the console.
LAYOUT_REPORT_MEANING = (
    "the method laid out every training row and has no map of its own that a new row could "
    "be compared with, so each measured row was placed by a student network that never saw "
    "it and compared with where the method put it (exact = the method's layout of those "
    "rows, fast = the student): the fidelity a new row gets from the fast path"
)


def measure_fidelity(
    exact,
    fast,
    labels=None,
    *,
    n_clusters: int,
    centers: np.ndarray | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """How faithfully a fast embedding reproduces the exact one on the same (held-out) rows.

    Parameters
    ----------
    exact, fast : array-like of shape (n_rows, n_components)
    labels : array-like of shape (n_rows,), default=None
        True classes, for NMI of k-means on each embedding against them.
    n_clusters : int
        Clusters of the k-means runs compared.
    centers : ndarray of shape (n_clusters, n_components), default=None
        The clustering head's centroids: ``cluster_agreement`` is the share of rows whose
        nearest centroid is the same in both embeddings.
    seed : int, default=0
        Seed of k-means.

    Returns
    -------
    dict
        ``n_holdout``, ``n_eval_clusters``, ``r2`` (variance weighted), ``cosine`` (mean
        row cosine), ``cosine_median``, ``knn_overlap`` (``knn_overlap`` with k = 10),
        ``nmi_fast_exact`` (between the k-means clusterings of both, lowest inertia of 20
        runs), ``nmi_labels_exact``, ``nmi_labels_fast``, ``cluster_agreement`` (None when
        not measured). See ``fidelity_report``.
    """
    exact = np.asarray(exact, dtype=np.float64)
    fast = np.asarray(fast, dtype=np.float64)
    n_clusters = max(1, min(n_clusters, len(exact)))
    exact_clusters = kmeans(exact, n_clusters, seed, REPORT_KMEANS_INIT).labels_
    fast_clusters = kmeans(fast, n_clusters, seed, REPORT_KMEANS_INIT).labels_
    norms = np.linalg.norm(exact, axis=1) * np.linalg.norm(fast, axis=1)
    cosine = np.sum(exact * fast, axis=1) / np.maximum(norms, np.finfo(np.float64).tiny)
    report: dict[str, Any] = {
        "n_holdout": len(exact),
        "n_eval_clusters": n_clusters,
        "r2": float(r2_score(exact, fast, multioutput="variance_weighted"))
        if len(exact) > 1
        else float("nan"),
        "cosine": float(np.mean(cosine)),
        "cosine_median": float(np.median(cosine)),
        "knn_overlap": knn_overlap(exact, fast, KNN),
        "nmi_fast_exact": float(normalized_mutual_info_score(exact_clusters, fast_clusters)),
        "nmi_labels_exact": None,
        "nmi_labels_fast": None,
        "cluster_agreement": None,
    }
    if labels is not None:
        report["nmi_labels_exact"] = float(normalized_mutual_info_score(labels, exact_clusters))
        report["nmi_labels_fast"] = float(normalized_mutual_info_score(labels, fast_clusters))
    if centers is not None:
        agree = nearest(exact.astype(np.float32), centers) == nearest(
            fast.astype(np.float32), centers
        )
        report["cluster_agreement"] = float(np.mean(agree))
    return report


def fidelity_report(fidelity: dict[str, Any]) -> str:
    """One line summarising a ``fidelity`` dict, for logs and the CLI (a cross-fitted
    report's figures with their standard errors)."""
    errors = fidelity.get("standard_error") or {}

    def figure(key: str) -> str:
        error = errors.get(key)
        return f"{fidelity[key]:.4f}" + ("" if error is None else f" ± {error:.4f}")

    parts = [f"R^2 {figure('r2')}", f"cosine {figure('cosine')}"]
    # Reports of older bundles lack the median cosine and the k-NN overlap.
    if fidelity.get("cosine_median") is not None:
        parts.append(f"median cosine {figure('cosine_median')}")
    if fidelity.get("knn_overlap") is not None:
        parts.append(f"{KNN}-NN overlap {figure('knn_overlap')}")
    parts.append(f"NMI(fast, exact) {figure('nmi_fast_exact')}")
    if fidelity.get("nmi_labels_exact") is not None:
        exact, fast = fidelity["nmi_labels_exact"], fidelity["nmi_labels_fast"]
        parts.append(
            f"NMI vs labels exact {figure('nmi_labels_exact')} fast {figure('nmi_labels_fast')} "
            f"(gap {fast - exact:+.4f})"
        )
    if fidelity.get("cluster_agreement") is not None:
        parts.append(f"cluster agreement {figure('cluster_agreement')}")
    where = {
        "outside the teacher's fit": "held-out points new to the teacher and the MLP",
        "prefit teacher": "held-out points new to the MLP",
    }.get(fidelity.get("holdout", ""), "held-out points")
    if fidelity.get("holdout") == "cross-fitted":
        folds = fidelity["folds"]
        measured = fidelity.get("folds_measured", folds)
        of = f"{folds}-fold" if measured == folds else f"{measured} of {folds} folds'"
        where = f"points, each new to the fit of {of} cross-fitting"
    elif fidelity.get("holdout") == LAYOUT_CROSS_FITTED:
        where = (
            f"points, each placed by a student of {fidelity['folds']}-fold cross-fitting that "
            "never saw it, against where the method laid it out"
        )
    elif fidelity.get("holdout") == LAYOUT_HELD_OUT:
        where = "points held out of the student, against where the method laid them out"
    line = f"{', '.join(parts)} (on {fidelity['n_holdout']} {where}"
    return line + ("; ± standard errors over the folds)" if errors else ")")


def knn_overlap(exact: np.ndarray, fast: np.ndarray, k: int = KNN) -> float | None:
    """Mean share of each row's k nearest neighbours in ``exact`` that are also among its k
    nearest in ``fast`` (the row itself excluded); None with k or fewer rows."""
    n = len(exact)
    if n <= k:
        return None
    neighbours = []
    for embedding in (exact, fast):
        index = NearestNeighbors(n_neighbors=k + 1).fit(embedding)
        found = index.kneighbors(embedding, return_distance=False)
        # Drop the row itself (the first hit, or wherever a tie put it).
        neighbours.append([set(row[row != i][:k]) for i, row in enumerate(found)])
    shared = [len(a & b) for a, b in zip(*neighbours, strict=True)]
    return float(np.mean(shared) / k)


def report_clusters(n_clusters: int | None, labels, estimator: Any) -> int:
    """k of the report's k-means: the head's, else as many as the labels have classes, else
    the estimator's guessed number of classes when it has one (MBN's ``n_classes``), else
    10."""
    if n_clusters is not None:
        return n_clusters
    if labels is not None:
        return len(np.unique(labels))
    n_classes = getattr(estimator, "n_classes", None)
    return int(n_classes) if isinstance(n_classes, Integral) else 10
