"""Multilevel manifold learning (paper B) as a registered method, ``"multilevel"``.

The fast path is distilled (``CompressiveMBN`` with this teacher): the exact map is a k-NN
search over every training row, O(n d) per row, which an MLP replaces. The exact state is the
training rows, their embedding and the heat-kernel width (``embedding_to_arrays``).

In training requests ``method`` names the registered method, so the library's ``method``
parameter (the coarsest level's method) is called ``coarse_method`` here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mbn_core.methods import Method, Reporter, register
from mbn_core.multilevel.embedding import (
    METHODS,
    STAGES,
    MultilevelEmbedding,
    embedding_from_arrays,
    embedding_to_arrays,
)
from mbn_core.params import CheckedParams, StrOptions

# Share of a fit's time before the coarsest level is embedded (k-NN graph and coarsening:
# the k-NN search dominates on high-dimensional data) and spent embedding it.
_GRAPH_SHARE = 0.6
_BOTTOM_SHARE = 0.2


class MultilevelMethod(CheckedParams, MultilevelEmbedding):
    """``MultilevelEmbedding`` with its bottom method named ``coarse_method``.

    Parameters
    ----------
    coarse_method : {"isomap", "lle", "eigenmaps"}, default="isomap"
        Embedding of the coarsest level.
    n_neighbors : int, default=10
        Neighbours per point in the k-NN graph and of a new row.
    n_components : int, default=2
        Dimension of the embedding.
    n_levels : int or None, default=2
        Most levels, the data's own included (1 means no coarsening).
    max_coarse_size : int or None, default=None
        Stop coarsening once a level has at most this many points.
    order : {"random", "fixed"}, default="random"
        Vertex order of the independent sets.
    weights : {"heat", "simple"}, default="heat"
        Edge weights: heat kernel with each level's median edge length, or 1.
    random_state : int, RandomState instance or None, default=None
        Seed of the random order and of the eigensolvers.
    callback : callable, default=None
        As in ``MultilevelEmbedding``.
    """

    _parameter_constraints: dict = {
        **{
            key: value
            for key, value in MultilevelEmbedding._parameter_constraints.items()
            if key != "method"
        },
        "coarse_method": [StrOptions(set(METHODS))],
    }

    def __init__(
        self,
        coarse_method: str = "isomap",
        n_neighbors: int = 10,
        n_components: int = 2,
        n_levels: int | None = 2,
        max_coarse_size: int | None = None,
        order: str = "random",
        weights: str = "heat",
        random_state: int | np.random.RandomState | None = None,
        callback=None,
    ) -> None:
        self.coarse_method = coarse_method
        self.n_neighbors = n_neighbors
        self.n_components = n_components
        self.n_levels = n_levels
        self.max_coarse_size = max_coarse_size
        self.order = order
        self.weights = weights
        self.random_state = random_state
        self.callback = callback

    @property
    def method(self) -> str:  # type: ignore[override]
        """The coarsest level's method (what ``MultilevelEmbedding`` reads)."""
        return self.coarse_method


def _save(model: MultilevelMethod) -> dict[str, np.ndarray]:
    arrays = embedding_to_arrays(model)
    rows = arrays["X_fit"]
    as_float32 = rows.astype(np.float32)
    # Service rows arrive as float32: storing them so halves the bundle and loses nothing.
    if np.array_equal(as_float32, rows):
        arrays["X_fit"] = as_float32
    return arrays


def _load(arrays: dict[str, np.ndarray], params: dict[str, Any]) -> MultilevelMethod:
    model = MultilevelMethod(**{key: value for key, value in params.items() if key != "callback"})
    embedding_from_arrays(arrays, params, estimator=model)
    return model


def _track(model: MultilevelMethod, shape: tuple[int, int], report: Reporter) -> None:
    def progress(stage: int, done: int, total: int) -> bool:
        share = done / max(total, 1)
        if stage == 0:
            fraction = _GRAPH_SHARE * share
        elif stage == 1:
            fraction = _GRAPH_SHARE + _BOTTOM_SHARE
        else:
            fraction = _GRAPH_SHARE + _BOTTOM_SHARE + (1 - _GRAPH_SHARE - _BOTTOM_SHARE) * share
        return report(fraction, f"{STAGES[stage]} {done}/{total}")

    model.set_params(callback=progress)


def _cost(model: MultilevelMethod, shape: tuple[int, int]) -> float:
    n, d = shape
    # The exact k-NN graph: one n x n x d product.
    return float(n) * n * d


def _check_rows(model: MultilevelMethod, n_samples: int) -> None:
    if model.n_neighbors >= n_samples:
        raise ValueError(f"n_neighbors={model.n_neighbors} must be < n_samples={n_samples}")
    if model.n_components + 1 >= n_samples:
        raise ValueError(
            f"n_components={model.n_components} must be < n_samples - 1 = {n_samples - 1}"
        )


def _facts(model: MultilevelMethod) -> dict[str, Any]:
    return {
        "level_sizes": [int(size) for size in model.level_sizes_],
        "sigma": float(model.sigma_) if np.isfinite(model.sigma_) else None,
    }


METHOD = register(
    Method(
        name="multilevel",
        estimator=MultilevelMethod,
        summary="Multilevel Isomap / LLE / eigenmaps (Fang, Sakellaridi, Saad 2009), distilled "
        "into an MLP",
        save=_save,
        load=_load,
        track=_track,
        cost=_cost,
        check_rows=_check_rows,
        facts=_facts,
    )
)
