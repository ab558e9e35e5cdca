"""The distiller's step of the training pipeline, and what it needs to know of a teacher.

``Distillation`` is ``DistilledEmbedding``'s method-specific step (a
``mbn_core.pipeline.run.FastPathMaker``): fit the teacher, then distil it into a student. It is
handed the estimator's own fitting functions, so this module knows nothing of the estimator.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sklearn.base import clone

from mbn_core.methods import method_of
from mbn_core.pipeline.report import FittedPath
from mbn_core.pipeline.split import Split


@dataclass(frozen=True)
class Distillation:
    """Fit the teacher, then distil it into a student on the split's training rows.

    ``fit_teacher(X, rng, quiet=, model_teacher=)`` gives (teacher, its embedding of X);
    ``distiller()`` the ``mbn_core.distill.student.Distiller`` to train with."""

    fit_teacher: Callable[..., tuple[Any, Any]]
    distiller: Callable[[], Any]
    validation_fraction: float
    prefit: bool
    callback: Any

    # The head clusters the exact embedding as new rows get it: held-out rows too.
    head_on_heldout = True

    @property
    def holdout_label(self) -> str:
        return "prefit teacher" if self.prefit else "outside the teacher's fit"

    def fit(
        self,
        X,
        split: Split,
        rng,
        *,
        model: Any = None,
        method_fitted: Callable[[Any], None] | None = None,
    ) -> FittedPath:
        """Teacher on X, then the student on its ``split.train`` rows (best epoch on
        ``split.validation``). ``model``: the model's teacher, given for a fold of the
        report, which reports no progress. ``method_fitted(teacher)`` before the student."""
        started = time.perf_counter()
        teacher, embedding = self.fit_teacher(X, rng, quiet=model is not None, model_teacher=model)
        teacher_seconds = time.perf_counter() - started
        if method_fitted is not None:
            method_fitted(teacher)
        callback = self.callback if model is None else None
        # The model's own embedding is known now: a caller may start work on it (the
        # training job's map) beside the MLP and the report.
        teacher_fitted = getattr(callback, "teacher_fitted", None)
        if teacher_fitted is not None:
            teacher_fitted(embedding)
        student = self.distiller().distil(
            X, embedding, split.validation, split.train, rng, callback
        )
        return FittedPath(
            estimator=teacher,
            embedding=embedding,
            fast=student.embed,
            seconds={"teacher": teacher_seconds, "compressor": student.seconds},
            parts=student,
        )


def lays_out(teacher: Any) -> bool:
    """Whether ``teacher`` is a registered layout method's estimator (``Method.layout``)."""
    if teacher is None:
        return False
    try:
        return method_of(teacher).layout
    except ValueError:  # not a registered method's: distilled as any transformer
        return False


def fresh_copy(teacher: Any) -> Any:
    """An unfitted clone that shares the callback instead of deep-copying it.

    ``sklearn.base.clone`` deep-copies parameters; a bound-method callback (a progress bar's
    update) would be copied together with its object and report to nobody.
    """
    params = teacher.get_params(deep=False)
    if "callback" not in params:
        return clone(teacher)
    callback = params.pop("callback")
    fresh = clone(type(teacher)(**params))
    fresh.set_params(callback=callback)
    return fresh
