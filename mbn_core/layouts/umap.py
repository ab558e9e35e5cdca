"""UMAP by umap-learn (McInnes, Healy and Melville 2018), with its ``transform`` as exact map.

umap-learn's ``transform`` joins each new row to its nearest training rows by UMAP's fuzzy
membership, starts it at their weighted mean and runs a third of the fit's epochs against the
fixed layout. Its fitted object cannot be stored as plain arrays (it holds a search index of
Python objects), so a model is rebuilt from the training rows, the layout and the curve's
``a`` and ``b``, with an exact neighbour search in place of the approximate index: the
procedure is umap-learn's own, the neighbours exact, and a rebuilt model answers as the
fitted one did. The answer for a row depends on the rows sent with it (umap-learn prunes
weak edges and draws negative samples over the whole batch).
"""

from __future__ import annotations

import warnings
from numbers import Integral, Real
from types import ModuleType
from typing import Any

import numpy as np
from sklearn.neighbors import NearestNeighbors

from mbn_core.layouts.base import LayoutMethod, matrix_array
from mbn_core.params import Interval, StrOptions

METRICS = ("euclidean", "cosine", "manhattan", "correlation")
# The seed of umap-learn's transform (its default).
_TRANSFORM_SEED = 42


class UMAPLayout(LayoutMethod):
    """What UMAP and densMAP share: umap-learn's parameters and fit."""

    title = "UMAP (umap-learn)"
    library = "umap"
    distribution = "umap-learn"
    densmap = False

    _parameter_constraints: dict = {
        "n_neighbors": [Interval(Integral, 2, 10_000, closed="both")],
        "n_components": [Interval(Integral, 1, 100, closed="both")],
        "min_dist": [Interval(Real, 0, None, closed="left")],
        "spread": [Interval(Real, 0, None, closed="neither")],
        "metric": [StrOptions(set(METRICS))],
        "n_epochs": [Interval(Integral, 1, 100_000, closed="both"), None],
        "init": [StrOptions({"spectral", "pca", "random"})],
        "layout_learning_rate": [Interval(Real, 0, 1e4, closed="neither")],
        "repulsion_strength": [Interval(Real, 0, 1e4, closed="neither")],
        "negative_sample_rate": [Interval(Integral, 1, 1000, closed="both")],
        "local_connectivity": [Interval(Real, 0, 1e4, closed="neither")],
        "set_op_mix_ratio": [Interval(Real, 0, 1, closed="both")],
        "random_state": ["random_state"],
        "n_jobs": [Interval(Integral, 1, None, closed="left"), None],
    }

    n_neighbors: int
    min_dist: float
    spread: float
    metric: str
    n_epochs: int | None
    init: str
    layout_learning_rate: float
    repulsion_strength: float
    negative_sample_rate: int
    local_connectivity: float
    set_op_mix_ratio: float
    random_state: Any

    def _check_params(self) -> None:
        if self.min_dist > self.spread:
            raise ValueError(f"min_dist={self.min_dist:g} must be at most spread={self.spread:g}")

    def _rows_needed(self) -> tuple[int, str]:
        # Each row needs n_neighbors others, and the spectral start n_components + 2 rows.
        return max(self.n_neighbors + 1, self.n_components + 2), (
            f"n_neighbors={self.n_neighbors} (and n_components={self.n_components})"
        )

    def _check_features(self, n_features: int) -> None:
        if self.init == "pca":
            self._check_pca_start(n_features, 'init="pca"')

    def _library_params(self) -> dict[str, Any]:
        return {
            "n_neighbors": self.n_neighbors,
            "n_components": self.n_components,
            "min_dist": self.min_dist,
            "spread": self.spread,
            "metric": self.metric,
            "n_epochs": self.n_epochs,
            "init": self.init,
            "learning_rate": self.layout_learning_rate,
            "repulsion_strength": self.repulsion_strength,
            "negative_sample_rate": self.negative_sample_rate,
            "local_connectivity": self.local_connectivity,
            "set_op_mix_ratio": self.set_op_mix_ratio,
            "random_state": self.random_state,
            "n_jobs": 1 if self.n_jobs is None else int(self.n_jobs),
            "transform_seed": _TRANSFORM_SEED,
            "densmap": self.densmap,
        }

    def _fit_layout(self, module: ModuleType, X: np.ndarray) -> np.ndarray:
        with warnings.catch_warnings():
            # "n_jobs overridden to 1 by setting random_state": a seed makes the fit serial,
            # as a reproducible job wants.
            warnings.filterwarnings("ignore", ".*n_jobs.*overridden.*", UserWarning)
            reducer = module.UMAP(**self._library_params())
            embedding = reducer.fit_transform(X)
        if self.exact_map is None:  # the exact map's state
            self.X_fit_ = X
            self.curve_ = np.array([reducer._a, reducer._b], dtype=np.float64)
        return np.asarray(embedding, dtype=np.float32)


class UMAP(UMAPLayout):
    """UMAP by umap-learn, as a transformer whose ``transform`` is umap-learn's.

    Parameters
    ----------
    n_neighbors : int, default=15
        Neighbours of each row in the fuzzy graph: larger keeps more global structure
        (needs n_neighbors + 1 rows).
    n_components : int, default=2
        Dimension of the layout.
    min_dist : float, default=0.1
        Closest distance of points in the layout: smaller packs clusters tighter.
    spread : float, default=1.0
        Scale of the layout's distances, with ``min_dist``.
    metric : {"euclidean", "cosine", "manhattan", "correlation"}, default="euclidean"
        Distance between input rows.
    n_epochs : int or None, default=None
        Epochs of the layout; None is 500 below 10,000 rows and 200 above.
    init : {"spectral", "pca", "random"}, default="spectral"
        Starting positions of the layout.
    layout_learning_rate : float, default=1.0
        First step size of the layout's optimisation.
    repulsion_strength : float, default=1.0
        Weight of the negative samples' repulsion.
    negative_sample_rate : int, default=5
        Negative samples per positive edge and epoch.
    local_connectivity : float, default=1.0
        Neighbours each row is assumed connected to.
    set_op_mix_ratio : float, default=1.0
        Fuzzy union (1) or intersection (0) of the directed graphs.
    random_state : int, RandomState instance or None, default=None
        Seed; set, the fit runs on one thread and is reproducible.
    n_jobs : int or None, default=None
        Threads when ``random_state`` is None; None means one.
    """

    def __init__(
        self,
        n_neighbors: int = 15,
        n_components: int = 2,
        min_dist: float = 0.1,
        spread: float = 1.0,
        metric: str = "euclidean",
        n_epochs: int | None = None,
        init: str = "spectral",
        layout_learning_rate: float = 1.0,
        repulsion_strength: float = 1.0,
        negative_sample_rate: int = 5,
        local_connectivity: float = 1.0,
        set_op_mix_ratio: float = 1.0,
        random_state: int | np.random.RandomState | None = None,
        n_jobs: int | None = None,
    ) -> None:
        self.n_neighbors = n_neighbors
        self.n_components = n_components
        self.min_dist = min_dist
        self.spread = spread
        self.metric = metric
        self.n_epochs = n_epochs
        self.init = init
        self.layout_learning_rate = layout_learning_rate
        self.repulsion_strength = repulsion_strength
        self.negative_sample_rate = negative_sample_rate
        self.local_connectivity = local_connectivity
        self.set_op_mix_ratio = set_op_mix_ratio
        self.random_state = random_state
        self.n_jobs = n_jobs

    def _transform(self, module: ModuleType, X: np.ndarray) -> np.ndarray:
        reducer = self._rebuilt(module)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning)
            return np.asarray(reducer.transform(X), dtype=np.float32)

    def _rebuilt(self, module: ModuleType) -> Any:
        """A umap-learn model in the fitted state ``transform`` reads, from the arrays."""
        from umap import distances
        from umap.umap_ import DISCONNECTION_DISTANCES

        reducer = module.UMAP(**self._library_params())
        reducer._raw_data = self.X_fit_
        reducer.embedding_ = self.embedding_
        reducer._small_data = False
        reducer._sparse_data = False
        reducer._knn_search_index = _ExactIndex(self.X_fit_, self.metric)
        reducer._input_hash = None  # never short-circuit: every row is placed as new
        reducer._metric_kwds = {}
        reducer._output_metric_kwds = {}
        reducer._n_neighbors = self.n_neighbors
        reducer._disconnection_distance = DISCONNECTION_DISTANCES.get(self.metric, np.inf)
        reducer._a, reducer._b = float(self.curve_[0]), float(self.curve_[1])
        reducer._initial_alpha = self.layout_learning_rate
        reducer._output_distance_func = distances.named_distances_with_gradients["euclidean"]
        return reducer

    def _state(self) -> dict[str, np.ndarray]:
        return {"X_fit": self.X_fit_, "embedding": self.embedding_, "curve": self.curve_}

    def _restore(self, arrays: dict[str, np.ndarray]) -> None:
        X_fit = matrix_array(arrays, "X_fit", columns=self.n_features_in_)
        self.X_fit_ = np.ascontiguousarray(X_fit, dtype=np.float32)
        embedding = matrix_array(arrays, "embedding", rows=len(X_fit), columns=self.n_components_)
        self.embedding_ = np.ascontiguousarray(embedding, dtype=np.float32)
        curve = np.asarray(arrays.get("curve", np.zeros(0)), dtype=np.float64)
        if curve.shape != (2,) or not np.all(np.isfinite(curve)) or np.any(curve <= 0):
            raise ValueError("array 'curve' must hold UMAP's two positive curve parameters")
        self.curve_ = curve


class _ExactIndex:
    """What umap-learn's ``transform`` asks of its search index, answered exactly."""

    _angular_trees = False

    def __init__(self, X_fit: np.ndarray, metric: str) -> None:
        self.index = NearestNeighbors(algorithm="brute", metric=metric, n_jobs=1).fit(X_fit)

    def query(self, X, k: int, epsilon: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.index.n_samples_fit_)
        distances, indices = self.index.kneighbors(X, k)
        return indices.astype(np.int32), distances.astype(np.float32)
