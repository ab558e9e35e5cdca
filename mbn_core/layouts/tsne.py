"""t-SNE by openTSNE (Poličar, Stražar and Zupan 2024), with its ``transform`` as exact map.

openTSNE's ``transform`` places each new row against the fixed layout: affinities to its
nearest training rows at a small perplexity, started at the median of their positions, then
gradient steps (``transform_iter``). Here the neighbours are found exactly among the stored
training rows, and each call starts from the stored layout (openTSNE recentres its layout in
place on every call), so a model rebuilt from its arrays places rows as the fitted one did.
"""

from __future__ import annotations

from numbers import Integral, Real
from types import ModuleType
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.neighbors import NearestNeighbors
from sklearn.utils import check_random_state

from mbn_core.exceptions import TrainingStopped
from mbn_core.layouts.base import LayoutMethod, matrix_array
from mbn_core.params import Interval, StrOptions

# openTSNE's own defaults for placing new rows.
_TRANSFORM_K = 25
_TRANSFORM_STEP = 0.1
_TRANSFORM_EXAGGERATION = 1.5
_TRANSFORM_MOMENTUM = 0.8
_TRANSFORM_MAX_GRAD_NORM = 0.25
# The callback is told every this many iterations.
_CALLBACK_EVERY = 10
_SEED_RANGE = 2**31 - 1


class TSNE(LayoutMethod):
    """t-SNE by openTSNE, as a transformer whose ``transform`` is openTSNE's.

    Parameters
    ----------
    n_components : int, default=2
        Dimension of the layout (1 to 3; above 2, Barnes-Hut gradients instead of FFT).
    perplexity : float, default=30.0
        Effective number of neighbours each row keeps (needs 3 * perplexity + 1 rows).
    early_exaggeration : float, default=12.0
        Attraction factor of the first phase, which forms the clusters.
    early_exaggeration_iter : int, default=250
        Iterations of the first phase.
    n_iter : int, default=500
        Iterations of the second phase.
    exaggeration : float or None, default=None
        Attraction factor of the second phase; None is 1 (plain t-SNE); above 1 packs
        clusters tighter, as for large data sets.
    dof : float, default=1.0
        Degrees of freedom of the Student-t kernel; below 1, heavier tails and finer
        clusters.
    layout_learning_rate : float or "auto", default="auto"
        Step size of the layout's gradient descent; "auto" is rows / early exaggeration.
    initialization : {"pca", "spectral", "random"}, default="pca"
        Starting positions of the layout.
    metric : {"euclidean", "cosine"}, default="euclidean"
        Distance between input rows.
    neighbors : {"auto", "exact", "annoy", "pynndescent"}, default="auto"
        Nearest-neighbour search of the fit ("auto": exact below 1,000 rows, Annoy above).
        New rows always search exactly.
    transform_perplexity : float, default=5.0
        Perplexity of a new row's affinities to the training rows (exact mode).
    transform_iter : int, default=250
        Gradient steps placing new rows (exact mode).
    random_state : int, RandomState instance or None, default=None
        Seed of the initialization and the neighbour search.
    n_jobs : int or None, default=None
        Threads; None means one.
    callback : callable, default=None
        Called as ``callback(done, total)`` every few iterations; returning True stops the
        fit with ``TrainingStopped``.
    """

    title = "t-SNE (openTSNE)"
    library = "openTSNE"
    distribution = "openTSNE"

    _parameter_constraints: dict = {
        "n_components": [Interval(Integral, 1, 3, closed="both")],
        "perplexity": [Interval(Real, 0, 1e4, closed="neither")],
        "early_exaggeration": [Interval(Real, 0, 1e4, closed="neither")],
        "early_exaggeration_iter": [Interval(Integral, 0, 100_000, closed="both")],
        "n_iter": [Interval(Integral, 1, 100_000, closed="both")],
        "exaggeration": [Interval(Real, 0, 1e4, closed="neither"), None],
        "dof": [Interval(Real, 0, 100, closed="neither")],
        "layout_learning_rate": [Interval(Real, 0, 1e8, closed="neither"), StrOptions({"auto"})],
        "initialization": [StrOptions({"pca", "spectral", "random"})],
        "metric": [StrOptions({"euclidean", "cosine"})],
        "neighbors": [StrOptions({"auto", "exact", "annoy", "pynndescent"})],
        "transform_perplexity": [Interval(Real, 0, 1e4, closed="neither")],
        "transform_iter": [Interval(Integral, 0, 100_000, closed="both")],
        "random_state": ["random_state"],
        "n_jobs": [Interval(Integral, 1, None, closed="left"), None],
        "callback": [callable, None],
    }

    def __init__(
        self,
        n_components: int = 2,
        perplexity: float = 30.0,
        early_exaggeration: float = 12.0,
        early_exaggeration_iter: int = 250,
        n_iter: int = 500,
        exaggeration: float | None = None,
        dof: float = 1.0,
        layout_learning_rate: float | str = "auto",
        initialization: str = "pca",
        metric: str = "euclidean",
        neighbors: str = "auto",
        transform_perplexity: float = 5.0,
        transform_iter: int = 250,
        random_state: int | np.random.RandomState | None = None,
        n_jobs: int | None = None,
        callback=None,
    ) -> None:
        self.n_components = n_components
        self.perplexity = perplexity
        self.early_exaggeration = early_exaggeration
        self.early_exaggeration_iter = early_exaggeration_iter
        self.n_iter = n_iter
        self.exaggeration = exaggeration
        self.dof = dof
        self.layout_learning_rate = layout_learning_rate
        self.initialization = initialization
        self.metric = metric
        self.neighbors = neighbors
        self.transform_perplexity = transform_perplexity
        self.transform_iter = transform_iter
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.callback = callback

    def _rows_needed(self) -> tuple[int, str]:
        return int(3 * self.perplexity) + 1, f"perplexity={self.perplexity:g}"

    def _check_features(self, n_features: int) -> None:
        if self.initialization == "pca":
            self._check_pca_start(n_features, 'initialization="pca"')

    def _fit_layout(self, module: ModuleType, X: np.ndarray) -> np.ndarray:
        progress = _Progress(self.callback, self.early_exaggeration_iter + self.n_iter)
        seed = self.random_state
        if not (seed is None or isinstance(seed, Integral)):
            seed = check_random_state(seed).randint(_SEED_RANGE)
        tsne = module.TSNE(
            n_components=self.n_components,
            perplexity=self.perplexity,
            learning_rate=self.layout_learning_rate,
            early_exaggeration_iter=self.early_exaggeration_iter,
            early_exaggeration=self.early_exaggeration,
            n_iter=self.n_iter,
            exaggeration=self.exaggeration,
            dof=self.dof,
            initialization=self.initialization,
            metric=self.metric,
            neighbors=self.neighbors,
            negative_gradient_method=self._gradient_method(),
            n_jobs=self._thread_count(),
            random_state=seed,
            callbacks=None if self.callback is None else [progress],
            callbacks_every_iters=_CALLBACK_EVERY,
        )
        embedding = tsne.fit(X)
        if progress.stopped:
            raise TrainingStopped(f"t-SNE stopped by the callback after {progress.done} iterations")
        self.X_fit_ = X
        return np.asarray(embedding, dtype=np.float64)

    def _transform(self, module: ModuleType, X: np.ndarray) -> np.ndarray:
        affinities = _exact_affinities(module, self.X_fit_, self.metric, self._thread_count())
        layout = module.TSNEEmbedding(
            self.embedding_.copy(),
            affinities,
            dof=self.dof,
            negative_gradient_method=self._gradient_method(),
            random_state=0,
            n_jobs=self._thread_count(),
        )
        placed = layout.transform(
            X,
            perplexity=min(self.transform_perplexity, len(self.X_fit_) / 3),
            k=min(_TRANSFORM_K, len(self.X_fit_)),
            learning_rate=_TRANSFORM_STEP,
            exaggeration=_TRANSFORM_EXAGGERATION,
            n_iter=self.transform_iter,
            initial_momentum=_TRANSFORM_MOMENTUM,
            final_momentum=_TRANSFORM_MOMENTUM,
            max_grad_norm=_TRANSFORM_MAX_GRAD_NORM,
        )
        # openTSNE centres the layout before placing rows: the rows' places, in the stored
        # layout's coordinates.
        shift = (self.embedding_.max(axis=0) + self.embedding_.min(axis=0)) / 2
        return np.asarray(placed, dtype=np.float64) + shift

    def _gradient_method(self) -> str:
        # FFT interpolation exists for 1 and 2 dimensions only.
        return "fft" if self.n_components <= 2 else "bh"

    def _thread_count(self) -> int:
        return 1 if self.n_jobs is None else int(self.n_jobs)

    def _state(self) -> dict[str, np.ndarray]:
        return {"X_fit": self.X_fit_, "embedding": self.embedding_}

    def _restore(self, arrays: dict[str, np.ndarray]) -> None:
        X_fit = matrix_array(arrays, "X_fit", columns=self.n_features_in_)
        self.X_fit_ = np.ascontiguousarray(X_fit, dtype=np.float32)
        embedding = matrix_array(arrays, "embedding", rows=len(X_fit), columns=self.n_components_)
        self.embedding_ = np.ascontiguousarray(embedding, dtype=np.float64)


class _Progress:
    """openTSNE's callback: tells ``callback(done, total)`` and stops when it says so."""

    def __init__(self, callback, total: int) -> None:
        self.callback, self.total = callback, max(total, 1)
        self.done, self.stopped = 0, False

    def __call__(self, iteration: int, error: float, embedding: Any) -> bool:
        # openTSNE counts each phase from 1: count every call instead.
        self.done = min(self.total, self.done + _CALLBACK_EVERY)
        if self.callback is not None and self.callback(self.done, self.total):
            self.stopped = True
        return self.stopped


def _exact_affinities(module: ModuleType, X_fit: np.ndarray, metric: str, n_jobs: int):
    """An openTSNE affinity object whose new rows' neighbours are found exactly."""
    affinity: Any = module.affinity
    n_samples = len(X_fit)

    class ExactNeighbours(affinity.Affinities):
        def __init__(self) -> None:
            super().__init__()
            self.P = sp.csr_matrix((n_samples, n_samples))  # only its shape is read
            self.index = NearestNeighbors(algorithm="brute", metric=metric, n_jobs=1).fit(X_fit)

        def to_new(self, data, perplexity=5.0, return_distances=False):
            k = min(n_samples, int(3 * perplexity))
            distances, neighbors = self.index.kneighbors(data, k)
            P = affinity.joint_probabilities_nn(
                neighbors,
                distances,
                [perplexity],
                symmetrize=False,
                normalization="point-wise",
                n_reference_samples=n_samples,
                n_jobs=n_jobs,
            )
            if return_distances:
                return P, neighbors, distances
            return P

    return ExactNeighbours()
