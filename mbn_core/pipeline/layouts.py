"""The pipeline of a layout method (t-SNE, UMAP, PaCMAP, ...): one fit, students cross-fitted.

A layout method places the rows it is fitted on; most have no map for new rows at all, and
those that have one (openTSNE's and umap-learn's ``transform``) place a row differently from
the fit that laid out its neighbours. So the report cannot compare the fast path with the
method on rows new to the method, as MBN's does. It compares the student with the method on
rows new to the *student*:

1. the method is fitted once, on every row: its layout is the model;
2. the rows are split into folds (``report_folds``; or one held-out share of
   ``holdout_fraction`` on large data); for each fold a student is trained on the other
   folds' rows and their layout, and predicts the fold's rows, which it never saw;
3. the report compares those predictions with the layout of the same rows, in the same
   coordinates (no rotation: one layout): R^2, 10-NN overlap, k-means NMI (against the labels
   when given), the clustering head's agreement, and trustworthiness of both;
4. the model's own student is trained on every row.

So the report says how well a student trained on a layout places rows it has not seen
*where the method itself put them*: the fidelity a user's new rows get, as far as the method's
own answer for them can be known.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from sklearn.model_selection import KFold

from mbn_core.exceptions import TrainingStopped
from mbn_core.pipeline.fidelity import LAYOUT_CROSS_FITTED, LAYOUT_HELD_OUT
from mbn_core.pipeline.head import fit_head
from mbn_core.pipeline.report import FittedPath, FoldCallback, fidelity_of, quality_of
from mbn_core.pipeline.run import PipelineResult
from mbn_core.pipeline.split import Split, split_rows
from mbn_core.utils.seeds import draw_seed

# What the report's ``holdout`` says the rows were new to.
CROSS_FITTED = LAYOUT_CROSS_FITTED
HELD_OUT = LAYOUT_HELD_OUT

# (rows, their layout, the split of those rows into validation and train, generator,
# whether this is the model's own student: it reports progress) -> the student's
# (fast path, parts).
StudentFit = Callable[[Any, np.ndarray, Split, Any, bool], tuple[Callable[[Any], np.ndarray], Any]]


def run_layout_pipeline(
    X,
    labels,
    estimator: Any,
    fit_student: StudentFit,
    *,
    holdout_fraction: float,
    n_folds: int | None,
    validation_fraction: float,
    n_clusters: int | None,
    rng,
    fold_done: FoldCallback | None = None,
) -> PipelineResult:
    """Fit ``estimator`` (a layout method) on every row of X, its student on every row, and
    report students cross-fitted against the one layout.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features), float32
        Checked training rows.
    labels : ndarray of shape (n_samples,) or None
        Classes, only for the report's NMI.
    estimator : transformer
        The unfitted layout method; ``fit_transform`` gives its layout of X.
    fit_student : callable
        Trains a student (``StudentFit``).
    holdout_fraction : float
        With ``n_folds`` None, the share of rows one student is measured on.
    n_folds : int or None
        Students of the report: one per fold; None, one (``holdout_fraction``).
    validation_fraction : float
        Share of a student's rows on which it chooses its best epoch.
    n_clusters : int or None
        Clusters of the head (k-means on the layout); None, no head.
    rng : RandomState
        The job's generator.
    fold_done : callable, default=None
        ``fold_done(done, total)`` after each student of the report; True stops.
    """
    n_samples = X.shape[0]
    if n_folds is not None and n_samples < n_folds:
        raise ValueError(f"report_folds={n_folds} is more than the {n_samples} rows")
    started = time.perf_counter()
    layout = np.asarray(estimator.fit_transform(X), dtype=np.float64)
    fit_seconds = time.perf_counter() - started

    started = time.perf_counter()
    own_split = split_rows(n_samples, None, validation_fraction, rng)
    fast, student = fit_student(X, layout, own_split, rng, True)
    student_seconds = time.perf_counter() - started

    started = time.perf_counter()
    centers = fit_head(layout, n_clusters, rng)
    fidelity, quality = _students_report(
        X,
        labels,
        layout,
        fit_student,
        holdout_fraction=holdout_fraction,
        n_folds=n_folds,
        validation_fraction=validation_fraction,
        n_clusters=n_clusters,
        centers=centers,
        estimator=estimator,
        rng=rng,
        fold_done=fold_done,
    )
    return PipelineResult(
        fitted=FittedPath(
            estimator=estimator,
            embedding=layout,
            fast=fast,
            seconds={"teacher": fit_seconds, "compressor": student_seconds},
            parts=student,
        ),
        fitted_rows=np.arange(n_samples),
        holdout=np.arange(0),
        centers=centers,
        fidelity=fidelity,
        quality=quality,
        evaluation_seconds=time.perf_counter() - started,
    )


def _students_report(
    X,
    labels,
    layout: np.ndarray,
    fit_student: StudentFit,
    *,
    holdout_fraction: float,
    n_folds: int | None,
    validation_fraction: float,
    n_clusters: int | None,
    centers,
    estimator: Any,
    rng,
    fold_done: FoldCallback | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(fidelity, quality) of students on rows they never saw, against the layout."""
    n_samples = X.shape[0]
    if n_folds is None:
        split = split_rows(n_samples, holdout_fraction, 0.0, rng)
        folds = [(split.fitted, split.holdout)]
    else:
        splitter = KFold(n_splits=n_folds, shuffle=True, random_state=draw_seed(rng))
        folds = list(splitter.split(X))
    predicted = np.full_like(layout, np.nan)
    quality: dict[str, Any] = {}
    for number, (rest, fold) in enumerate(folds):
        split = split_rows(len(rest), None, validation_fraction, rng)
        fast, _ = fit_student(X[rest], layout[rest], split, rng, False)
        predicted[fold] = np.asarray(fast(X[fold]), dtype=np.float64)
        if number == 0:
            # Trustworthiness of the layout itself (the rows were laid out by the method)
            # and of the student's placing of rows it never saw, beside PCA's.
            quality = quality_of(
                X[rest], X[fold], layout[fold], predicted[fold], estimator=estimator, rng=rng
            )
        if fold_done is not None and fold_done(number + 1, len(folds)):
            raise TrainingStopped(
                f"training stopped by the callback after student {number + 1} of "
                f"{len(folds)} of the fidelity report"
            )
    measured = np.sort(np.concatenate([fold for _, fold in folds]))
    fidelity = fidelity_of(
        layout[measured],
        predicted[measured],
        None if labels is None else np.asarray(labels)[measured],
        n_clusters=n_clusters,
        centers=centers,
        estimator=estimator,
        rng=rng,
    )
    fidelity.update(holdout=CROSS_FITTED if n_folds is not None else HELD_OUT)
    if n_folds is not None:
        fidelity["folds"] = n_folds
    return fidelity, quality
