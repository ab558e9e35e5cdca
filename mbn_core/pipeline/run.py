"""The training pipeline every method goes through: split, fit, clustering head, report.

Only one step depends on the method: fitting it and its fast path on some rows (a
``FastPathMaker``: a distilled MLP, ``mbn_core.distill``, or the method's own exported graph,
``mbn_core.pipeline.exported``). The rest is the same for every method:

1. ``split_rows``: rows held out of the fit (or none, when the report is cross-fitted);
2. the maker fits the method and its fast path on the other rows;
3. ``fit_head``: the clustering head, k-means on the exact embedding;
4. ``holdout_report`` or ``cross_fitted_report``: fidelity and quality on rows new to the fit.

Each step is a small function of its own, so that a step added later (a calibration on the
held-out rows, say) slots in between them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from mbn_core.pipeline.background_embedding import BackgroundEmbedding
from mbn_core.pipeline.head import fit_head
from mbn_core.pipeline.report import (
    FittedPath,
    FoldCallback,
    cross_fitted_report,
    holdout_report,
)
from mbn_core.pipeline.split import Split, split_rows


class FastPathMaker(Protocol):
    """Fits a method and its fast path on some rows: the pipeline's one method-specific step.

    Attributes
    ----------
    validation_fraction : float
        Share of the fitted rows the fast path keeps to validate its own training on (0 when
        it does not train).
    head_on_heldout : bool
        Whether the clustering head clusters the held-out rows' exact embedding too (as new
        rows get it), or only the fitted rows'.
    holdout_label : str or None
        What the held-out rows were new to, for the fidelity report's ``holdout`` (None
        leaves it out).
    """

    @property
    def validation_fraction(self) -> float: ...

    @property
    def head_on_heldout(self) -> bool: ...

    @property
    def holdout_label(self) -> str | None: ...

    def fit(
        self,
        X,
        split: Split,
        rng,
        *,
        model: Any = None,
        method_fitted: Callable[[Any], None] | None = None,
    ) -> FittedPath:
        """Fit on rows X (``split``: their validation and train rows). ``model``: the
        estimator of the model's own fit, given when this is a fold of the report (quiet,
        and making the same choices as the model). ``method_fitted(estimator)``, when
        given, is called as soon as the method is fitted, before its fast path."""
        ...


@dataclass(frozen=True)
class PipelineResult:
    """What ``run_pipeline`` made.

    Attributes
    ----------
    fitted : FittedPath
        The model: the method and its fast path, fitted on ``fitted_rows``.
    fitted_rows : ndarray of int
        Rows of X the model was fitted on (sorted).
    holdout : ndarray of int
        Rows of X kept out of it (empty when the report is cross-fitted).
    centers : ndarray of shape (n_clusters, n_components), float32, or None
        The clustering head's centroids.
    fidelity, quality : dict
        The report (``mbn_core.pipeline.report``).
    evaluation_seconds : float
        Seconds spent on the head and the report.
    """

    fitted: FittedPath
    fitted_rows: np.ndarray
    holdout: np.ndarray
    centers: np.ndarray | None
    fidelity: dict[str, Any]
    quality: dict[str, Any]
    evaluation_seconds: float


def run_pipeline(
    X,
    labels,
    maker: FastPathMaker,
    *,
    holdout_fraction: float,
    n_folds: int | None,
    n_clusters: int | None,
    rng,
    fold_done: FoldCallback | None = None,
    n_measured: int | None = None,
) -> PipelineResult:
    """Split X, fit ``maker`` on the fitted rows, fit the clustering head, and report.

    Parameters
    ----------
    X : ndarray or CSR matrix of shape (n_samples, n_features), float32
        Checked training rows.
    labels : ndarray of shape (n_samples,) or None
        Classes, only for the report's NMI.
    maker : FastPathMaker
    holdout_fraction : float
        Share of rows held out of the fit, when ``n_folds`` is None.
    n_folds : int or None
        Cross-fit the report with this many folds (the model is then fitted on every row).
    n_clusters : int or None
        Clusters of the head; None: no head.
    rng : RandomState
        The job's generator: every step draws from it in turn.
    fold_done : callable, default=None
        ``fold_done(done, total)`` after each fold of a cross-fitted report; True stops.
    n_measured : int or None, default=None
        Folds of a cross-fitted report that are fitted and measured (None: all of them).
    """
    n_samples = X.shape[0]
    if n_folds is not None and n_samples < n_folds:
        raise ValueError(f"report_folds={n_folds} is more than the {n_samples} rows")
    split = split_rows(
        n_samples,
        holdout_fraction if n_folds is None else None,
        maker.validation_fraction,
        rng,
    )
    fitted_rows = split.fitted
    X_fitted = X[fitted_rows]
    # The maker sees its rows in the order of ``fitted_rows``: positions in them.
    own_split = Split(
        holdout=split.holdout[:0],
        validation=np.searchsorted(fitted_rows, split.validation),
        train=np.searchsorted(fitted_rows, split.train),
    )
    holdout = split.holdout
    # The held-out rows' exact embedding starts once the method is fitted, beside its fast
    # path's training.
    held_out = BackgroundEmbedding(X[holdout]) if len(holdout) else None
    fitted = maker.fit(
        X_fitted, own_split, rng, method_fitted=None if held_out is None else held_out.start
    )

    started = time.perf_counter()
    exact = None if held_out is None else held_out.result(fitted.estimator)
    centers = fit_head(_head_rows(fitted.embedding, exact, maker.head_on_heldout), n_clusters, rng)
    if n_folds is None:
        assert exact is not None
        holdout_labels = None if labels is None else labels[holdout]
        fidelity, quality = holdout_report(
            X_fitted[own_split.train],
            X[holdout],
            exact,
            fitted.fast(X[holdout]),
            holdout_labels,
            n_clusters=n_clusters,
            centers=centers,
            estimator=fitted.estimator,
            rng=rng,
        )
        if maker.holdout_label is not None:
            fidelity["holdout"] = maker.holdout_label
    else:
        fidelity, quality = cross_fitted_report(
            X,
            labels,
            # The model's embedding as it is kept (float32), row i for X's row i.
            fitted.embedding.astype(np.float32).astype(np.float64),
            n_folds,
            lambda X_rest, fold_split, fold_rng: maker.fit(
                X_rest, fold_split, fold_rng, model=fitted.estimator
            ),
            validation_fraction=maker.validation_fraction,
            n_clusters=n_clusters,
            centers=centers,
            estimator=fitted.estimator,
            rng=rng,
            fold_done=fold_done,
            n_measured=n_measured,
        )
    return PipelineResult(
        fitted=fitted,
        fitted_rows=fitted_rows,
        holdout=holdout,
        centers=centers,
        fidelity=fidelity,
        quality=quality,
        evaluation_seconds=time.perf_counter() - started,
    )


def _head_rows(embedding: np.ndarray, exact: np.ndarray | None, with_heldout: bool):
    """The exact embedding the clustering head is fitted on."""
    if exact is None or not with_heldout:
        return embedding
    return np.concatenate([embedding, exact])
