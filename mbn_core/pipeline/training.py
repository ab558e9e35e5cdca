"""Training a bundle end to end: checks, method fit + fast path, report and export (the
parameters, ``TrainingParams``, are ``mbn_core.pipeline.options``').

Both the ``mbn train`` command and the service's worker call ``train_bundle``; it reports
progress as one fraction 0..1 over the whole job, weighted by the expected cost of each step,
and stops (writing nothing) when the progress callback returns True. Nothing here names a
method: the registry (``mbn_core.methods``) says what each one needs.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.utils import check_random_state

from mbn_core.bundle import (
    Bundle,
    check_target,
    load_bundle,
    save_bundle,
    validate_model_id,
    validate_name,
)
from mbn_core.bundle.embedding_map import (
    MAP_FILE,
    MAP_POINTS,
    EmbeddingMap,
    MapLayout,
    build_map,
)
from mbn_core.bundle.trained import TrainedModel, estimator_hyperparameters
from mbn_core.data.checks import check_spread
from mbn_core.data.readers import check_labels, check_matrix
from mbn_core.data.scaling import INPUT_SCALING, choose_scaling, scale_graph_input
from mbn_core.distill.input_map import projected_width
from mbn_core.exceptions import TrainingStopped
from mbn_core.methods import Method
from mbn_core.pipeline.alignment import check_compatible, reference_files
from mbn_core.pipeline.background_map import BackgroundMap
from mbn_core.pipeline.distilled import DistilledEmbedding
from mbn_core.pipeline.exported import ExportedFastPath, detach_callback
from mbn_core.pipeline.novelty import novelty_section
from mbn_core.pipeline.options import TrainingParams
from mbn_core.pipeline.run import run_pipeline
from mbn_core.pipeline.split import (
    fold_fit_rows,
    measured_fold_count,
    report_fold_count,
    teacher_fit_rows,
)
from mbn_core.utils.memory import memory_limit

log = logging.getLogger(__name__)

PHASES = ("fit", "compressor", "report", "export")
ProgressCallback = Callable[[str, float], object]

# An MLP weight costs about this many bottom-layer multiply-adds per point and epoch (forward,
# backward and update, on one BLAS thread against the bottom layer's two;
# docs/decisions/0024-training-progress.md).
_MLP_COST = 7.0
# Share of the whole job left to the fidelity evaluation and the export.
_EXPORT_SHARE = 0.02


@dataclass(frozen=True)
class TrainingEvent:
    """A detailed progress report (for progress bars).

    Attributes
    ----------
    phase : {"fit", "compressor", "report", "export"}
    fraction : float
        Of the whole job, 0..1 (what ``progress`` receives).
    phase_fraction : float
        Of the current phase, 0..1.
    message : str
        What just finished, e.g. "layer 2/7 (k=1000): clustering 40/400".
    """

    phase: str
    fraction: float
    phase_fraction: float
    message: str


def check_feasible(
    params: TrainingParams, n_rows: int, *, sparse: bool = False, n_features: int | None = None
) -> None:
    """ValueError unless ``params`` can train on ``n_rows`` rows (``sparse``: of a sparse
    matrix; ``n_features``: of that many features, when known): what ``train_bundle`` would
    otherwise find out only in the fit (the compressor needs 4 rows, the clustering head
    ``n_clusters``, and the method its own: ``Method.check_rows`` and
    ``Method.check_features``)."""
    minimum = 4  # rows are held out for validation and fidelity
    if n_rows < minimum:
        raise ValueError(f"training needs at least {minimum} rows, got {n_rows}")
    method = params.spec
    if sparse and not method.sparse:
        raise ValueError(f"method {method.name!r} does not take sparse input")
    if sparse and params[INPUT_SCALING.name] == "standard":
        raise ValueError(
            "input_scaling='standard' centres every feature, which would make sparse input "
            "dense; weight sparse features yourself (tf-idf, say) and use 'none' or 'auto'"
        )
    if method.export is None:
        folds = report_fold_count(n_rows, params["holdout_fraction"], params["report_folds"])
        if folds is not None and folds > n_rows:
            raise ValueError(
                f"report_folds={folds} is more than the {n_rows} rows (a cross-fitted "
                "report needs a row in every fold)"
            )
    if n_features is not None and method.check_features is not None:
        method.check_features(params.estimator(), n_features)
    if method.check_rows is not None:
        method.check_rows(params.estimator(), fit_shape(params, (n_rows, 1))[0])
        if method.export is None and not method.layout:
            # A cross-fitted report fits the method on fewer rows, once per fold.
            smallest = fold_fit_rows(n_rows, params["holdout_fraction"], params["report_folds"])
            method.check_rows(params.estimator(), smallest)
    n_clusters = params["n_clusters"]
    # A distilled method's head clusters every row's embedding; an exported one's only the
    # rows its method is fitted on (the held-out ones test the export).
    head_rows = n_rows if method.export is None else fit_shape(params, (n_rows, 1))[0]
    if n_clusters is not None and n_clusters > head_rows:
        of = f" (of {n_rows})" if head_rows < n_rows else ""
        raise ValueError(
            f"n_clusters={n_clusters} is more than the {head_rows} rows the clustering head "
            f"is fitted on{of}"
        )


def training_memory(params: TrainingParams, shape: tuple[int, int]) -> dict[str, float]:
    """An upper estimate of the bytes a job of ``params`` on ``shape`` rows holds at its
    peak, by part: the rows (as read and as scaled), the method's fit (``Method.memory``)
    and a distilled method's MLP (float64 weights with their gradients, Adam's two moments
    and the best epoch's copy, and the activations of a batch and of a prediction)."""
    n, d = shape
    method = params.spec
    estimator = params.estimator()
    parts = {"data": 2.0 * n * d * 4}
    if method.memory is not None:
        parts[method.name] = float(method.memory(estimator, fit_shape(params, shape)))
    if method.export is None:
        values = params.values
        hidden = [int(h) for h in values["hidden_layer_sizes"]]
        n_out: int = (
            getattr(estimator, "n_components", None) or getattr(estimator, "n_classes", None) or 10
        )
        width = projected_width(d, values["input_components"])
        first = d if width is None else width
        sizes: tuple[int, ...] = (first, *hidden, n_out)
        weights = (0 if width is None else d * width) + sum(
            a * b for a, b in itertools.pairwise(sizes)
        )
        widest = max(sizes[1:])
        batch = min(int(values["batch_size"]), n) * sum(sizes[1:])
        parts["mlp"] = 5.0 * 8 * weights + 3.0 * 8 * batch + 2.0 * 8 * n * widest
    return parts


def check_memory(params: TrainingParams, shape: tuple[int, int], limit: int | None = None) -> None:
    """ValueError when ``training_memory`` exceeds ``limit`` bytes (None: this host's or
    container's memory, ``mbn_core.utils.memory``), naming the largest part."""
    if limit is None:
        limit = memory_limit()
        if limit is None:
            return
    parts = training_memory(params, shape)
    total = sum(parts.values())
    if total <= limit:
        return
    largest = max(parts, key=parts.__getitem__)
    raise ValueError(
        f"these parameters would need about {_gib(total)} to train on {shape[0]} x {shape[1]} "
        f"rows ({largest}: {_gib(parts[largest])}), more than the {_gib(limit)} this host "
        "allows; use smaller layers, fewer clusterings or fewer rows"
    )


def _gib(size: float) -> str:
    return f"{size / 2**30:,.1f} GiB"


# ---------------------------------------------------------------------- training


def train_bundle(
    X,
    out_dir: str | os.PathLike[str],
    *,
    name: str,
    params: TrainingParams | Mapping[str, Any] | None = None,
    y=None,
    model_id: str | None = None,
    progress: ProgressCallback | None = None,
    events: Callable[[TrainingEvent], object] | None = None,
    overwrite: bool = False,
    align_to: str | os.PathLike[str] | Bundle | None = None,
) -> Path:
    """Train a method and its fast path on X and write the bundle to ``out_dir``.

    Parameters
    ----------
    X : array-like or sparse matrix of shape (n_samples, n_features)
    out_dir : path
        The bundle directory to create (its parent must exist).
    name : str
        Human-readable model name.
    params : TrainingParams or dict, default=None
        None means the default method (MBN) with its defaults.
    y : array-like of shape (n_samples,), default=None
        Labels, used only for the fidelity report.
    model_id : str, default=None
        None means ``out_dir``'s name.
    progress : callable, default=None
        ``progress(phase, fraction)`` with phase in ``PHASES`` ("fit", "compressor",
        "report", "export") and fraction of the whole job in 0..1, called as the method
        reports, after every MLP epoch and after each fold of a cross-fitted report.
        Returning True stops: ``TrainingStopped`` is raised and nothing is written. The last
        call, ``("export", 1.0)``, comes after the bundle is written and cannot stop it.
    events : callable, default=None
        Receives a ``TrainingEvent`` at the same moments (for progress bars); returning
        True stops too.
    overwrite : bool, default=False
        Replace an existing bundle at ``out_dir``.
    align_to : path or Bundle, default=None
        An earlier model (its bundle) whose embedding space the new model's is mapped into
        (``mbn_core.pipeline.alignment``), so vectors of both stay comparable. It must take
        the same features and embed in as many dimensions.

    Returns
    -------
    Path
        The bundle directory.
    """
    if not isinstance(params, TrainingParams):
        params = TrainingParams.from_dict(params)
    out_dir = Path(out_dir)
    # Everything checkable is checked before hours of training, not after.
    validate_model_id(out_dir.name if model_id is None else model_id)
    validate_name(name)
    check_target(out_dir, overwrite=overwrite)
    X = check_matrix(X)
    old = None
    if align_to is not None:
        old = align_to if isinstance(align_to, Bundle) else load_bundle(align_to)
        n_components = params.values.get("n_components")
        check_compatible(
            old,
            X.shape[1],
            n_components if isinstance(n_components, int) else None,
            sparse=sp.issparse(X),
        )
    check_spread(X)
    labels = check_labels(y, X.shape[0], "y")
    method = params.spec
    if old is not None and method.no_exact_map is not None:
        raise ValueError(
            f"align_to maps the new model's exact embedding of the old model's reference rows "
            f"into the old space, and method {method.name!r} has no exact map: "
            f"{method.no_exact_map}"
        )
    check_feasible(params, X.shape[0], sparse=sp.issparse(X), n_features=X.shape[1])
    check_memory(params, X.shape)
    estimator = params.estimator()
    scaling = choose_scaling(X, params[INPUT_SCALING.name])
    if scaling.method != "none":
        log.info("input scaling %r (feature range ratio %.3g)", scaling.method, scaling.range_ratio)

    # The map's layout starts on a thread of its own once the teacher's embedding is known
    # (not for an aligned model, whose embedding alignment moves afterwards).
    background = None
    if params[MAP_POINTS.name] and old is None:
        background = BackgroundMap(
            max_points=max(2, params[MAP_POINTS.name]),
            random_state=params.pipeline()["random_state"],
            n_jobs=params.pipeline()["n_jobs"],
        )
    tracker = _Tracker(
        params,
        estimator,
        X.shape,
        progress,
        events,
        teacher_fitted=None if background is None else background.start,
    )
    started = time.perf_counter()
    log.info("training %r with %s on %d x %d points", name, method.name, *X.shape)
    # The method, its fast path and the novelty model see scaled rows; the bundle takes raw
    # ones (its graph and its exact path scale them), and so do the reference rows.
    scaled = scaling.transform(X)
    model = fit_model(params, scaled, labels, estimator=estimator, tracker=tracker)
    model.input_scaling = scaling
    model.fast_path = scale_graph_input(model.fast_path, scaling)
    extra_files, sections = reference_files(model, X, old, params.pipeline()["random_state"])
    if params[MAP_POINTS.name] and model.training_embedding is not None:
        if tracker.report("export", 0.0, "2-D map of the training embedding (t-SNE)"):
            raise TrainingStopped("training stopped by the progress callback before the map")
        map_started = time.perf_counter()
        layout = None
        if background is not None:
            layout = background.layout(model.training_embedding)
        embedding_map = training_map(model, labels, params, layout=layout)
        extra_files[MAP_FILE] = embedding_map.to_bytes()
        waited = time.perf_counter() - map_started
        sections["map"] = {
            **embedding_map.summary(),
            # The layout's own time, and how long the job waited for it at the end.
            "seconds": round(waited if layout is None else layout.seconds, 3),
            "waited_seconds": round(waited, 3),
        }
    novelty_files, novelty_manifest = novelty_section(
        scaled, model.training_rows, params.pipeline()["random_state"]
    )
    extra_files.update(novelty_files)
    sections.update(novelty_manifest)
    if tracker.report("export", 0.5, "writing the bundle"):
        raise TrainingStopped("training stopped by the progress callback before export")
    seconds = time.perf_counter() - started
    path = save_bundle(
        model,
        out_dir,
        name=name,
        model_id=model_id,
        overwrite=overwrite,
        extra={"total_seconds": round(seconds, 3), "params": params.to_dict()},
        extra_files=extra_files,
        manifest_sections=sections,
    )
    tracker.report("export", 1.0, "bundle written")
    return path


def fit_model(
    params: TrainingParams,
    X,
    y=None,
    *,
    estimator: Any = None,
    tracker: _Tracker | None = None,
) -> TrainedModel:
    """Fit ``params``' method and make its fast path: a ``TrainedModel`` for ``save_bundle``.

    A distilled method is the teacher of a ``DistilledEmbedding``. An exported one is fitted on
    all rows but the held-out ones; its own ONNX graph (plus the clustering head) is the fast
    path, and fidelity compares that graph with the estimator on the held-out rows.
    """
    method = params.spec
    estimator = params.estimator() if estimator is None else estimator
    if tracker is not None and method.track is not None:
        shape = fit_shape(params, X.shape)
        method.track(estimator, shape, lambda f, message: tracker.report("fit", f, message))
    if method.export is None:
        compressor = DistilledEmbedding(
            estimator,
            **params.compressor_kwargs(),
            callback=tracker,
        )
        compressor.fit(X, y)
        detach_callback(estimator)
        model = compressor.as_trained_model()
        model.training_embedding = compressor.embedding_
        model.training_rows = np.setdiff1d(np.arange(X.shape[0]), compressor.holdout_)
        model.hyperparameters[method.name] = estimator_hyperparameters(compressor.teacher_)
        return model
    return _fit_exported(method, params, estimator, X, y)


def _fit_exported(method: Method, params: TrainingParams, estimator, X, y) -> TrainedModel:
    from mbn_core.distill.onnx import add_cluster_head

    assert method.export is not None
    pipeline = params.pipeline()
    result = run_pipeline(
        X,
        y,
        ExportedFastPath(method, estimator),
        holdout_fraction=pipeline["holdout_fraction"],
        n_folds=None,
        n_clusters=pipeline["n_clusters"],
        rng=check_random_state(pipeline["random_state"]),
    )
    estimator = result.fitted.estimator
    facts: dict[str, Any] = {
        "n_samples": int(X.shape[0]),
        "n_fit_samples": len(result.fitted_rows),
        "input_sparse": bool(sp.issparse(X)),
        "seconds": {
            "fit": round(result.fitted.seconds["fit"], 3),
            "evaluation": round(result.evaluation_seconds, 3),
        },
    }
    if method.facts is not None:
        facts.update(method.facts(estimator))
    embedding = result.fitted.embedding
    return TrainedModel(
        method=method,
        estimator=estimator,
        fast_path=add_cluster_head(method.export(estimator), result.centers),
        cluster_centers=result.centers,
        fidelity=result.fidelity,
        quality=result.quality,
        hyperparameters={
            method.name: estimator_hyperparameters(estimator),
            "pipeline": pipeline,
        },
        facts=facts,
        n_features_in=int(X.shape[1]),
        n_components=int(embedding.shape[1]),
        training_embedding=embedding.astype(np.float32),
        training_rows=result.fitted_rows,
    )


def training_map(
    model: TrainedModel, labels, params: TrainingParams, layout: MapLayout | None = None
) -> EmbeddingMap:
    """The bundle's 2-D map of ``model``'s training embedding: coloured by the labels when
    given, else by the clustering head's clusters. ``layout``: its layout, made already
    (``BackgroundMap``)."""
    embedding, rows = model.training_embedding, model.training_rows
    assert embedding is not None and rows is not None
    clusters = None
    if model.cluster_centers is not None:
        centers = model.cluster_centers
        scores = embedding @ (-2.0 * centers.T) + np.sum(centers**2, axis=1)
        clusters = np.argmin(scores, axis=1)
    pipeline = params.pipeline()
    embedding_map = build_map(
        embedding,
        clusters=clusters,
        labels=None if labels is None else np.asarray(labels)[rows],
        max_points=max(2, params[MAP_POINTS.name]),
        random_state=pipeline["random_state"],
        n_jobs=pipeline["n_jobs"],
        layout=layout,
    )
    # Row numbers of the training data, not of the rows the method was fitted on.
    return dataclasses.replace(embedding_map, row=np.asarray(rows)[embedding_map.row])


def fit_shape(params: TrainingParams, shape: tuple[int, int]) -> tuple[int, int]:
    """The shape of the data ``params``' method is fitted on: all rows but the held-out ones
    (kept for the fidelity report), or all rows when a distilled method's report is
    cross-fitted (``report_folds``)."""
    method = params.spec
    if method.layout:  # laid out once, on every row (mbn_core.pipeline.layouts)
        return shape
    folds = params["report_folds"] if method.export is None else None
    return teacher_fit_rows(shape[0], params["holdout_fraction"], folds), shape[1]


class _Tracker:
    """Turns the method's and the MLP's reports into one cost-weighted fraction of the job."""

    def __init__(
        self, params: TrainingParams, estimator, shape, progress, events, teacher_fitted=None
    ) -> None:
        method = params.spec
        d = shape[1]
        fit_cost = None
        if method.cost is not None:
            fit_cost = method.cost(estimator, fit_shape(params, shape))
        mlp, folds, measured = 0.0, None, 0
        if method.export is None:
            values = params.values
            hidden = tuple(values["hidden_layer_sizes"])
            n_out = getattr(estimator, "n_components", None) or getattr(estimator, "n_classes", 10)
            # Input wider than input_components is projected first (mbn_core.distill.input_map); for
            # sparse input the projection costs nonzeros x width, counted here as dense.
            width = projected_width(d, values["input_components"])
            first = d if width is None else width
            mlp_macs = (0 if width is None else d * width) + sum(
                a * b for a, b in zip((first, *hidden), (*hidden, n_out), strict=True)
            )
            n_train = fit_shape(params, shape)[0] * (1 - values["validation_fraction"])
            mlp = _MLP_COST * mlp_macs * n_train * values["max_epochs"]
            folds = report_fold_count(shape[0], params["holdout_fraction"], params["report_folds"])
            if folds is not None:
                measured = measured_fold_count(shape[0], folds, params["report_folds"])
        # Without a cost model the fit counts as much as the MLP (or as all, without one).
        fit = fit_cost if fit_cost is not None else (mlp if mlp else 1.0)
        # Each measured fold of a cross-fitted report refits the teacher and the MLP on
        # (folds - 1) / folds of the rows, and the bottom layer's cost grows about as the rows
        # squared (k1 grows with them): 0.64 model fits per fold of 5, a little more than
        # measured.
        report = 0.0 if folds is None else measured * ((folds - 1) / folds) ** 2 * (fit + mlp)
        if method.layout:
            # A layout's report trains students only (the method is fitted once): one per
            # fold on (folds - 1) / folds of the rows, or one on all but the held-out share.
            share = 1 - params["holdout_fraction"] if folds is None else folds - 1
            report = share * mlp
        total = fit + mlp + report
        costs = (fit, mlp, report) if total > 0 else (1.0, 0.0, 0.0)
        scale = (1 - _EXPORT_SHARE) / sum(costs)
        widths = (*(cost * scale for cost in costs), _EXPORT_SHARE)
        self.widths = dict(zip(PHASES, widths, strict=True))
        starts = np.cumsum([0.0, *self.widths.values()])[:-1]
        self.starts = dict(zip(PHASES, starts.tolist(), strict=True))
        self.progress = progress
        self.events = events
        self._teacher_fitted = teacher_fitted

    def teacher_fitted(self, embedding) -> None:
        """The compressor's hook: the model's teacher embedding is known."""
        if self._teacher_fitted is not None:
            self._teacher_fitted(embedding)

    def __call__(self, epoch: int, max_epochs: int, loss: float) -> bool:
        """The compressor's callback: after each MLP epoch."""
        message = f"epoch {epoch}/{max_epochs}"
        if np.isfinite(loss):
            message += f", validation loss {loss:.4g}"
        return self.report("compressor", epoch / max_epochs, message)

    def fold_done(self, done: int, total: int) -> bool:
        """The compressor's callback: after each fold of a cross-fitted report."""
        return self.report("report", done / total, f"fidelity report: fold {done}/{total}")

    def report(self, phase: str, phase_fraction: float, message: str) -> bool:
        fraction = min(1.0, self.starts[phase] + self.widths[phase] * phase_fraction)
        stop = False
        if self.progress is not None:
            stop = bool(self.progress(phase, fraction))
        if self.events is not None:
            event = TrainingEvent(phase, fraction, phase_fraction, message)
            stop = bool(self.events(event)) or stop
        return stop
