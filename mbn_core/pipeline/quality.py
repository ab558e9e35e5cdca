"""A label-free quality report: how faithfully an embedding keeps each point's neighbours.

Users of an embedding service rarely have labels, so the report every model carries measures
what can be measured without them, on rows held out of training:

- **trustworthiness** (Venna and Kaski, 2001): are a point's k nearest neighbours in the
  embedding also near it in the input? Low when the embedding tears distant points together.
- **continuity**: are its k nearest neighbours in the input still near it in the embedding?
  Low when the embedding tears neighbours apart. It is trustworthiness with the roles of the
  two spaces swapped (``sklearn.manifold.trustworthiness(Z, X)``).

Both lie in [0, 1], 1 being every neighbourhood kept. The same measures for PCA with as many
components, fitted on the training rows and applied to the same held-out rows, stand beside
them, so a user sees what the nonlinear model buys over a linear one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.manifold import trustworthiness
from sklearn.preprocessing import normalize
from sklearn.utils import check_random_state

from mbn_core.utils.pca import fit_pca

N_NEIGHBORS = 10
# Trustworthiness ranks every pair of rows (O(n^2) memory and time): a sample this large
# measures it closely enough in seconds.
MAX_ROWS = 1000
# PCA is fitted on at most this many training rows: its leading components are settled
# long before, and the report must stay a small part of training.
MAX_PCA_ROWS = 10_000


def neighbourhood_scores(X, Z: np.ndarray, n_neighbors: int, metric: str) -> dict[str, float]:
    """Trustworthiness and continuity of embedding ``Z`` of rows ``X``.

    Parameters
    ----------
    X : ndarray or sparse matrix of shape (n, d)
        The input rows.
    Z : ndarray of shape (n, p)
        Their embedding.
    n_neighbors : int
        Neighbourhood size k; must be below ``n / 2`` (sklearn's condition).
    metric : {"euclidean", "cosine"}
        Distance between input rows (the embedding is always Euclidean).

    Returns
    -------
    dict with ``trustworthiness`` and ``continuity``, floats in [0, 1].
    """
    if metric == "cosine":
        # On unit rows Euclidean distance ranks pairs as cosine similarity does, and the
        # swapped call (continuity) measures input neighbours in Euclidean distance only.
        X = normalize(X)
    # sklearn ranks sparse rows as they are (pairwise distances, brute-force neighbours).
    X = sp.csr_matrix(X, dtype=np.float64) if sp.issparse(X) else np.asarray(X, np.float64)
    Z = np.asarray(Z, dtype=np.float64)
    return {
        "trustworthiness": float(trustworthiness(X, Z, n_neighbors=n_neighbors)),
        "continuity": float(trustworthiness(Z, X, n_neighbors=n_neighbors)),
    }


def quality_report(
    X_fit,
    X_heldout,
    embeddings: dict[str, np.ndarray],
    *,
    n_components: int,
    metric: str = "euclidean",
    n_neighbors: int = N_NEIGHBORS,
    random_state: int | np.random.RandomState | None = None,
) -> dict[str, Any]:
    """Label-free quality of embeddings of held-out rows, with PCA beside them.

    Parameters
    ----------
    X_fit : ndarray or sparse matrix of shape (n_fit, d)
        Training rows: PCA (the baseline) is fitted on a sample of them.
    X_heldout : ndarray or sparse matrix of shape (n, d)
        Rows the model never saw; a sample of at most ``MAX_ROWS`` is scored.
    embeddings : dict of str to ndarray of shape (n, p)
        The model's embeddings of ``X_heldout`` by name (e.g. ``"exact"``, ``"fast"``).
    n_components : int
        Components of the PCA baseline (capped by the input's dimension and rows).
    metric : {"euclidean", "cosine"}, default="euclidean"
        The model's input similarity.
    n_neighbors : int, default=10
        Neighbourhood size k. Fewer held-out rows than ``2 k + 1`` lower it to what they
        allow (reported as ``n_neighbors``).
    random_state : int, RandomState instance or None, default=None
        Seeds the samples and the PCA.

    Returns
    -------
    dict
        ``n_rows`` and ``n_neighbors`` scored; per name in ``embeddings`` and for ``"pca"``
        a dict of ``trustworthiness`` and ``continuity`` (``pca`` also has its
        ``n_components``). With fewer than 3 held-out rows nothing can be ranked: the
        scores are None and ``reason`` says why.
    """
    rng = check_random_state(random_state)
    n_rows = X_heldout.shape[0]
    rows = np.arange(n_rows)
    if n_rows > MAX_ROWS:
        rows = np.sort(rng.choice(n_rows, MAX_ROWS, replace=False))
    k = min(n_neighbors, (len(rows) - 1) // 2)
    names = [*embeddings, "pca"]
    if k < 1:
        report: dict[str, Any] = {"n_rows": len(rows), "n_neighbors": None}
        report.update({name: {"trustworthiness": None, "continuity": None} for name in names})
        report["reason"] = f"{len(rows)} held-out rows are too few to rank neighbours"
        return report
    X_rows = X_heldout[rows]
    pca_embedding, pca_components = _pca_baseline(X_fit, X_rows, n_components, rng)
    report = {"n_rows": len(rows), "n_neighbors": k}
    for name, Z in embeddings.items():
        report[name] = neighbourhood_scores(X_rows, np.asarray(Z)[rows], k, metric)
    report["pca"] = {
        **neighbourhood_scores(X_rows, pca_embedding, k, metric),
        "n_components": pca_components,
    }
    return report


def _pca_baseline(X_fit, X_rows, n_components: int, rng) -> tuple[np.ndarray, int]:
    """PCA fitted on (a sample of) the training rows, applied to the scored rows."""
    n_fit = X_fit.shape[0]
    if n_fit > MAX_PCA_ROWS:
        X_fit = X_fit[np.sort(rng.choice(n_fit, MAX_PCA_ROWS, replace=False))]
    components = max(1, min(n_components, X_fit.shape[0], X_fit.shape[1]))
    solver = "auto"
    if sp.issparse(X_fit):
        # ARPACK centres sparse input implicitly; it needs fewer components than rank.
        if components < min(X_fit.shape):
            solver = "arpack"
        else:
            X_fit, X_rows = X_fit.toarray(), X_rows.toarray()
    seed = rng.randint(np.iinfo(np.int32).max)
    pca = fit_pca(X_fit.astype(np.float64), components, svd_solver=solver, random_state=seed)
    return pca.transform(X_rows.astype(np.float64)), components


# What each report says, in the order a user acts on them: `mbn info` prints it, the console
# and the guide say the same.
MEASURES = {
    "clusters": "NMI of k-means clusters of the embedding against the labels, on rows new to "
    "the model (1 = the classes exactly): with labels, the figure to choose a model by",
    "fast path": "how closely the fast path follows the exact model on rows new to both (1 = "
    "the same); where it is low, use exact mode",
    "neighbourhoods": "trustworthiness / continuity: whether rows near each other in the input "
    "stay near in the embedding, and the reverse (1 = every neighbour kept). PCA with as many "
    "components is a projection of the input, so it keeps input neighbourhoods by "
    "construction and usually scores higher; MBN gives up detail inside clusters to pull "
    "clusters apart, so a lower score beside PCA's is no loss when clusters are what you use",
}


def clusters_summary(fidelity: dict[str, Any]) -> str | None:
    """The clusters line of ``mbn info`` (None without labels): each path's NMI against the
    labels on rows new to the model."""
    exact, fast = fidelity.get("nmi_labels_exact"), fidelity.get("nmi_labels_fast")
    if not isinstance(exact, int | float) or not isinstance(fast, int | float):
        return None
    return (
        f"NMI with the labels, on {fidelity.get('n_holdout', '?')} rows new to the model: "
        f"exact {exact:.3f}, fast {fast:.3f}"
    )


def fast_path_summary(fidelity: dict[str, Any]) -> str | None:
    """The fast-path line of ``mbn info``: cluster agreement, R^2 and median cosine."""
    parts = []
    for key, label in (
        ("cluster_agreement", "cluster agreement"),
        ("r2", "R^2"),
        ("cosine_median", "median cosine"),
    ):
        value = fidelity.get(key)
        if isinstance(value, int | float):
            parts.append(f"{label} {value:.3f}")
    return f"against the exact model: {', '.join(parts)}" if parts else None


def quality_summary(report: dict[str, Any]) -> str:
    """One line summarising a ``quality_report``, for logs and the CLI."""
    if report.get("n_neighbors") is None:
        return f"not measured: {report.get('reason', 'no held-out rows')}"
    parts = []
    for name, scores in report.items():
        if isinstance(scores, dict):
            parts.append(f"{name} {scores['trustworthiness']:.3f} / {scores['continuity']:.3f}")
    return (
        f"trustworthiness / continuity (k={report['n_neighbors']}, on {report['n_rows']} "
        f"held-out rows): {', '.join(parts)}"
    )
