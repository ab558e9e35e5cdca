"""The fast path of a method that exports its own map to ONNX (``Method.export``).

The pipeline's method-specific step for such a method (``mbn_core.pipeline.run``): fit the
estimator on the rows of the fit; its exported graph is the fast path, run by onnxruntime
as a bundle runs it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mbn_core.methods import Method
from mbn_core.pipeline.report import FittedPath
from mbn_core.pipeline.split import Split


@dataclass(frozen=True)
class ExportedFastPath:
    """Fits ``estimator`` (unfitted, of ``method``) and exports it
    (``mbn_core.pipeline.run.FastPathMaker``)."""

    method: Method
    estimator: Any
    # Nothing is trained on the fitted rows, so none of them is kept for validation.
    validation_fraction = 0.0
    # The head clusters the fitted rows only: the held-out ones test the export.
    head_on_heldout = False
    holdout_label = None

    def fit(
        self,
        X,
        split: Split,
        rng,
        *,
        model: Any = None,
        method_fitted: Callable[[Any], None] | None = None,
    ) -> FittedPath:
        """Fit the estimator on every row of X (a report of an exported method is never
        cross-fitted, so ``model`` is always None). ``method_fitted(estimator)`` once the
        export is made too: nothing of the method's runs beside its own export."""
        from mbn_core.distill.onnx import OnnxEmbedder, add_cluster_head

        assert self.method.export is not None and model is None
        started = time.perf_counter()
        embedding = np.asarray(self.estimator.fit_transform(X[split.train]), dtype=np.float64)
        detach_callback(self.estimator)
        seconds = time.perf_counter() - started
        embedder = OnnxEmbedder(add_cluster_head(self.method.export(self.estimator), None))
        if method_fitted is not None:
            method_fitted(self.estimator)
        return FittedPath(
            estimator=self.estimator,
            embedding=embedding,
            fast=embedder.embed,
            seconds={"fit": seconds},
        )


def detach_callback(estimator: Any) -> None:
    """Drop a progress callback from a fitted estimator: it is not a hyperparameter."""
    if "callback" in estimator.get_params(deep=False):
        estimator.set_params(callback=None)
