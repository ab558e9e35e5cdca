"""A trained model as the bundle stores it: method, exact estimator, fast path, facts.

Whatever the method and however its fast path was made (exported or distilled), training
ends in a ``TrainedModel``; ``mbn_core.bundle.save.save_bundle`` writes one, or any model
that describes itself as one (``Bundleable``: a fitted
``mbn_core.pipeline.distilled.DistilledEmbedding``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from mbn_core.data.scaling import InputScaling
from mbn_core.methods import NOT_OPTIONS, Method


@dataclass
class TrainedModel:
    """Everything a bundle holds about one trained model.

    Attributes
    ----------
    method : Method
        The registered method.
    estimator : object
        The fitted exact estimator (``method.estimator``).
    fast_path : onnx.ModelProto
        The fast path with its clustering head: input ``input``, outputs ``embedding`` and
        (with a head) ``cluster``.
    cluster_centers : ndarray of shape (n_clusters, n_components) or None
        The clustering head's centroids.
    fidelity : dict
        Fast against exact on held-out rows (``mbn_core.pipeline.fidelity.measure_fidelity``).
    quality : dict
        Label-free quality of both on held-out rows (``mbn_core.pipeline.quality.quality_report``).
    hyperparameters : dict
        Parameters by part: the method's under its name, ``compressor`` for a distilled
        fast path, ``pipeline`` (held-out share, clusters, seed).
    facts : dict
        JSON-able training facts: rows, sparse input, seconds per phase, the method's facts.
    n_features_in, n_components : int
    training_embedding : ndarray of shape (n_rows, n_components) or None
        The exact embedding of the training rows ``training_rows`` (for the bundle's map).
    training_rows : ndarray of shape (n_rows,) or None
        Their row numbers in the training data.
    input_scaling : InputScaling
        What the model does to raw rows before the method sees them (the fast path holds it
        too; ``mbn_core.data.scaling``).
    """

    method: Method
    estimator: Any
    fast_path: Any
    cluster_centers: np.ndarray | None
    fidelity: dict[str, Any]
    quality: dict[str, Any]
    hyperparameters: dict[str, dict[str, Any]]
    facts: dict[str, Any] = field(default_factory=dict)
    n_features_in: int = 0
    n_components: int = 0
    training_embedding: np.ndarray | None = None
    training_rows: np.ndarray | None = None
    input_scaling: InputScaling = field(default_factory=lambda: InputScaling("none"))


@runtime_checkable
class Bundleable(Protocol):
    """A fitted model that ``save_bundle`` takes besides a ``TrainedModel``."""

    def as_trained_model(self) -> TrainedModel:
        """The model as a bundle stores it."""
        ...


def estimator_hyperparameters(estimator: Any) -> dict[str, Any]:
    """The parameters a bundle stores for an estimator: all but callbacks and generators."""
    params = estimator.get_params(deep=False)
    for key in NOT_OPTIONS:
        params.pop(key, None)
    # Where the layers ran is the machine's, not the model's: every device gives the same
    # model, a reader embeds on its own (the facts record the device a fit used).
    params.pop("device", None)
    if isinstance(params.get("random_state"), np.random.RandomState):
        params["random_state"] = None  # a generator's state is not a hyperparameter
    return params
