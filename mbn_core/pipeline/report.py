"""The report every trained model carries: fidelity of its fast path and label-free quality,
measured on rows new to the fit.

Two ways to get such rows (``mbn_core.pipeline.split``): one held-out share, or K-fold
cross-fitting, where each fold is embedded by a fit made without it and the folds' embeddings
are carried into the model's coordinates before they are measured together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.linalg import orthogonal_procrustes
from sklearn.model_selection import KFold

from mbn_core.exceptions import TrainingStopped
from mbn_core.pipeline.fidelity import measure_fidelity, report_clusters
from mbn_core.pipeline.quality import quality_report
from mbn_core.pipeline.split import Split, split_rows
from mbn_core.utils.seeds import draw_seed

# (fold number, folds) -> True to stop training.
FoldCallback = Callable[[int, int], object]


@dataclass(frozen=True)
class FittedPath:
    """One fit of a method and its fast path on some rows (the model's own, or a fold's).

    Attributes
    ----------
    estimator : object
        The fitted exact model.
    embedding : ndarray of shape (n_fitted, n_components), float64
        Its exact embedding of the rows it was fitted on, in their order.
    fast : callable
        The fast path of that fit: rows -> embedding.
    seconds : dict
        Seconds spent per step of the fit, by name.
    parts : object
        Whatever else the fit made that its maker needs (a distilled MLP).
    """

    estimator: Any
    embedding: np.ndarray
    fast: Callable[[Any], np.ndarray]
    seconds: dict[str, float] = field(default_factory=dict)
    parts: Any = None


# (rows to fit, their validation and train split, generator) -> a fit made on those rows:
# what ``cross_fitted_report`` needs of a method to refit it without a fold.
FoldFit = Callable[[Any, Split, Any], FittedPath]


def as_embedding(values: Any) -> np.ndarray:
    """An estimator's output as a dense float64 matrix."""
    if sp.issparse(values):
        values = values.toarray()
    return np.asarray(values, dtype=np.float64)


def fidelity_of(
    exact, fast, labels, *, n_clusters: int | None, centers, estimator: Any, rng
) -> dict[str, Any]:
    """``measure_fidelity`` of two embeddings of the same new rows, with the report's k
    (``report_clusters``) and a seed drawn from ``rng``."""
    return measure_fidelity(
        exact,
        fast,
        labels,
        n_clusters=report_clusters(n_clusters, labels, estimator),
        centers=centers,
        seed=draw_seed(rng),
    )


def quality_of(X_fit, X_new, exact, fast, *, estimator: Any, rng) -> dict[str, Any]:
    """``quality_report`` of the exact and fast embeddings of new rows ``X_new``, in the
    estimator's input metric, with PCA fitted on ``X_fit`` beside them."""
    return quality_report(
        X_fit,
        X_new,
        {"exact": exact, "fast": fast},
        n_components=int(np.shape(exact)[1]),
        metric=getattr(estimator, "metric", "euclidean"),
        random_state=rng,
    )


def holdout_report(
    X_fit, X_holdout, exact, fast, labels, *, n_clusters, centers, estimator, rng
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(fidelity, quality) on the held-out rows ``X_holdout``, embedded exactly and fast."""
    fidelity = fidelity_of(
        exact, fast, labels, n_clusters=n_clusters, centers=centers, estimator=estimator, rng=rng
    )
    quality = quality_of(X_fit, X_holdout, exact, fast, estimator=estimator, rng=rng)
    return fidelity, quality


def cross_fitted_report(
    X,
    labels,
    reference: np.ndarray,
    n_folds: int,
    fit_fold: FoldFit,
    *,
    validation_fraction: float,
    n_clusters: int | None,
    centers,
    estimator: Any,
    rng,
    fold_done: FoldCallback | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(fidelity, quality) by K-fold cross-fitting.

    Each fold's rows are embedded, exactly and fast, by a fit made without them
    (``fit_fold(X_rest, split, rng)``, ``split`` the validation and train rows of
    ``X_rest``). Each fit has its own coordinates (its own PCA or layout, signs and order),
    so both embeddings of a fold are carried into the model's by the rotation and shift that
    best map the fold fit's embedding of its rows onto the model's embedding of the same rows
    (``reference``, row i for X's row i; orthogonal Procrustes, so distances within the fold
    are unchanged). All rows are then measured together, as one test set of that size:
    k-means, neighbours and the clustering head over every row, not over small folds. The
    quality report is of the first fold, by the fit that left it out.

    ``fold_done(done, total)`` is told each fold; True stops with ``TrainingStopped``.
    """
    exact_all = np.empty_like(reference)
    fast_all = np.empty_like(reference)
    splitter = KFold(n_splits=n_folds, shuffle=True, random_state=draw_seed(rng))
    quality: dict[str, Any] = {}
    for number, (rest, fold) in enumerate(splitter.split(X)):
        split = split_rows(len(rest), None, validation_fraction, rng)
        model = fit_fold(X[rest], split, rng)
        exact = as_embedding(model.estimator.transform(X[fold]))
        fast = np.asarray(model.fast(X[fold])).astype(np.float64)
        if number == 0:
            quality = quality_of(
                X[rest][split.train], X[fold], exact, fast, estimator=model.estimator, rng=rng
            )
        source_mean = model.embedding.mean(axis=0)
        target_mean = reference[rest].mean(axis=0)
        rotation, _ = orthogonal_procrustes(
            model.embedding - source_mean, reference[rest] - target_mean
        )
        exact_all[fold] = (exact - source_mean) @ rotation + target_mean
        fast_all[fold] = (fast - source_mean) @ rotation + target_mean
        # A fold refits the method and its fast path, so the report costs several fits.
        if fold_done is not None and fold_done(number + 1, n_folds):
            raise TrainingStopped(
                f"training stopped by the callback after fold {number + 1} of {n_folds} "
                "of the fidelity report"
            )
    fidelity = fidelity_of(
        exact_all,
        fast_all,
        labels,
        n_clusters=n_clusters,
        centers=centers,
        estimator=estimator,
        rng=rng,
    )
    fidelity.update(holdout="cross-fitted", folds=n_folds)
    return fidelity, quality
