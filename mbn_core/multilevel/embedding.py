"""Multilevel manifold learning and multilevel K-means (scikit-learn API).

Fang, Sakellaridi and Saad, "Multilevel nonlinear dimensionality reduction for manifold
learning" (2009): coarsen the k-NN graph by maximal independent sets that stay connected,
embed the coarsest graph with Isomap, LLE or Laplacian eigenmaps, and refine level by level
with one sparse SPD solve each. docs/MULTILEVEL.md explains the algorithm and the choices.
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Integral

import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin, TransformerMixin
from sklearn.cluster import KMeans
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from mbn_core.exceptions import TrainingStopped
from mbn_core.multilevel import _solvers as _multilevel
from mbn_core.multilevel.neighbors import exact_kneighbors, knn_graph
from mbn_core.params import Interval, StrOptions, fit_context

ProgressCallback = Callable[[int, int, int], object]

METHODS = ("isomap", "lle", "eigenmaps")
# Progress stages reported to the callback, in order.
STAGES = ("coarsen", "embed", "refine")

_COMMON_CONSTRAINTS: dict = {
    "method": [StrOptions(set(METHODS))],
    "n_neighbors": [Interval(Integral, 1, None, closed="left")],
    "n_levels": [Interval(Integral, 1, None, closed="left"), None],
    "max_coarse_size": [Interval(Integral, 1, None, closed="left"), None],
    "order": [StrOptions({"random", "fixed"})],
    "weights": [StrOptions({"heat", "simple"})],
    "random_state": ["random_state"],
    "callback": [callable, None],
}


class MultilevelEmbedding(TransformerMixin, BaseEstimator):
    """Multilevel Isomap, LLE or Laplacian eigenmaps.

    The symmetrised k-NN graph (components joined by their shortest edges) is coarsened by
    maximal independent sets chosen so the coarse graph stays connected; coarse points are a
    subset of the data and coarse edges join points two hops apart, with the shortest 2-hop
    length. The coarsest graph is embedded by ``method``; every finer level is then embedded
    by harmonic interpolation (each new point at the weighted mean of its neighbours), one
    sparse SPD solve per level.

    Parameters
    ----------
    method : {"isomap", "lle", "eigenmaps"}, default="isomap"
        Embedding of the coarsest level.
    n_neighbors : int, default=10
        Neighbours per point in the level-1 graph; also the neighbours of a new point.
    n_components : int, default=2
        Dimension of the embedding.
    n_levels : int or None, default=2
        Most levels, the data's own included (1 means plain ``method`` on the k-NN graph).
        None means no limit (then ``max_coarse_size`` must be given).
    max_coarse_size : int or None, default=None
        Stop coarsening once a level has at most this many points.
    order : {"random", "fixed"}, default="random"
        Vertex order of the independent set: random (seeded by ``random_state``), or fixed
        (start at row 0, expand vertices in the order they were found), as in the paper's
        figures.
    weights : {"heat", "simple"}, default="heat"
        Edge weights of refinement, eigenmaps and new points: exp(-d^2 / sigma^2) with sigma
        each level's median edge length, or 1 on every edge.
    random_state : int, RandomState instance or None, default=None
        Seed of the random order and of the eigensolvers' start vectors.
    callback : callable, default=None
        Called as ``callback(stage, done, total)``: stage 0 coarsening (``done`` levels made
        out of at most ``total``), 1 embedding the coarsest level, 2 refinement. Returning
        True stops training: ``fit`` raises ``TrainingStopped`` and the estimator stays as it
        was.

    Attributes
    ----------
    embedding_ : ndarray of shape (n_samples, n_components)
        Embedding of the training rows.
    level_sizes_ : list of int
        Points per level, finest first.
    level_vertices_ : list of ndarray or None
        Training-row indices of each level, finest first. A model saved by a version that
        did not keep them gets them redrawn on loading; None where that cannot give the
        fitted levels (``random_state=None``).
    n_components_ : int
        Dimension of the embedding.
    sigma_ : float
        Heat-kernel width of level 1 (inf for simple weights), used for new points.
    X_fit_ : ndarray of shape (n_samples, n_features)
        Training rows, for the neighbours of new points.
    n_features_in_ : int
        Number of input features.

    Examples
    --------
    >>> from sklearn.datasets import make_swiss_roll
    >>> from mbn_core import MultilevelEmbedding
    >>> X, t = make_swiss_roll(1000, random_state=0)
    >>> model = MultilevelEmbedding(n_neighbors=8, n_levels=3, random_state=0)
    >>> model.fit_transform(X).shape
    (1000, 2)
    """

    _parameter_constraints: dict = {
        **_COMMON_CONSTRAINTS,
        "n_components": [Interval(Integral, 1, None, closed="left")],
    }

    def __init__(
        self,
        method: str = "isomap",
        n_neighbors: int = 10,
        n_components: int = 2,
        n_levels: int | None = 2,
        max_coarse_size: int | None = None,
        order: str = "random",
        weights: str = "heat",
        random_state: int | np.random.RandomState | None = None,
        callback: ProgressCallback | None = None,
    ) -> None:
        self.method = method
        self.n_neighbors = n_neighbors
        self.n_components = n_components
        self.n_levels = n_levels
        self.max_coarse_size = max_coarse_size
        self.order = order
        self.weights = weights
        self.random_state = random_state
        self.callback = callback

    def fit(self, X, y=None):
        """Fit the embedding to X.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : ignored

        Returns
        -------
        self : MultilevelEmbedding
        """
        self.fit_transform(X)
        return self

    @fit_context(prefer_skip_nested_validation=True)
    def fit_transform(self, X, y=None):
        """Fit the embedding and return the training rows' embedding ``embedding_``."""
        previous_state = dict(self.__dict__)
        try:
            self._fit(X, min_size=0)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(previous_state)
            raise
        return self.embedding_.copy()

    def _fit(self, X, *, min_size: int) -> list[_multilevel.Level]:
        X = validate_data(self, X, dtype=np.float64, ensure_min_samples=2, reset=True)
        n_samples = X.shape[0]
        if self.n_levels is None and self.max_coarse_size is None:
            raise ValueError("n_levels and max_coarse_size cannot both be None")
        if self.n_neighbors >= n_samples:
            raise ValueError(f"n_neighbors={self.n_neighbors} must be < n_samples={n_samples}")
        if self.n_components + 1 >= n_samples:
            raise ValueError(
                f"n_components={self.n_components} must be < n_samples - 1 = {n_samples - 1}"
            )
        rng = check_random_state(self.random_state)
        report = _Reporter(self.callback)
        graph = knn_graph(X, self.n_neighbors)
        # Never coarsen below what the coarse problem needs: d + 2 points for the
        # eigenproblems, k + 1 so a coarse point can have k neighbours.
        floor = max(self.n_components + 2, self.n_neighbors + 1, min_size)
        max_coarsenings = None if self.n_levels is None else self.n_levels - 1
        levels = _multilevel.build_levels(
            graph,
            max_levels=self.n_levels,
            max_coarse_size=self.max_coarse_size,
            min_size=floor,
            order=self.order,
            rng=rng,
            progress=lambda done: report(0, done, max(done, max_coarsenings or done)),
        )
        bottom = levels[-1]
        embedding = self._embed_bottom(bottom, X, rng)
        report(1, 1, 1)
        n_refine = len(levels) - 1
        for done, level in enumerate(reversed(levels[:-1]), start=1):
            weights, _ = _multilevel.edge_weights(level.graph, self.weights)
            assert level.coarse is not None
            embedding = _multilevel.refine(weights, level.coarse, embedding)
            report(2, done, n_refine)
        _, sigma = _multilevel.edge_weights(graph, self.weights)
        self.embedding_ = embedding
        self.level_sizes_ = [len(level.vertices) for level in levels]
        self.level_vertices_: list[np.ndarray] | None = [level.vertices for level in levels]
        self.sigma_ = sigma
        self.X_fit_ = X
        self.n_components_ = self.n_components
        return levels

    def _embed_bottom(self, level: _multilevel.Level, X, rng) -> np.ndarray:
        seed = int(rng.randint(np.iinfo(np.int32).max))
        if self.method == "isomap":
            return _multilevel.embed_isomap(level.graph, self.n_components, seed)
        if self.method == "lle":
            return _multilevel.embed_lle(level.graph, X[level.vertices], self.n_components, rng)
        weights, _ = _multilevel.edge_weights(level.graph, self.weights)
        return _multilevel.embed_eigenmaps(weights, self.n_components, seed)

    def transform(self, X):
        """Embed rows by one more refinement step over their k nearest training rows.

        A new row lands at the weighted mean of its ``n_neighbors`` exact nearest training
        rows' embeddings (eq. 12 with a single unknown); a row equal to a training row gets
        that row's stored embedding. Deterministic and batch independent.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        embedding : ndarray of shape (n_samples, n_components)
        """
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        distances, indices = exact_kneighbors(self.X_fit_, X, self.n_neighbors)
        return interpolate(self.embedding_, distances, indices, self.sigma_)

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "embedding_")


def interpolate(
    embedding: np.ndarray, distances: np.ndarray, indices: np.ndarray, sigma: float
) -> np.ndarray:
    """Weighted means of neighbours' embeddings; exact matches return the stored row.

    Parameters
    ----------
    embedding : ndarray of shape (n_train, n_components)
    distances, indices : ndarray of shape (n_queries, k)
        Each query's nearest training rows, ascending.
    sigma : float
        Heat-kernel width; inf gives equal weights.
    """
    if np.isinf(sigma):
        weights = np.ones_like(distances)
    else:
        # Shifting by the nearest distance leaves the normalised weights unchanged and
        # keeps far-away rows from underflowing every weight to zero.
        squared = distances**2
        weights = np.exp(-(squared - squared[:, :1]) / sigma**2)
    weights /= weights.sum(axis=1, keepdims=True)
    out = np.einsum("ik,ikj->ij", weights, embedding[indices])
    exact = distances[:, 0] == 0.0
    out[exact] = embedding[indices[exact, 0]]
    return out


class MultilevelKMeans(ClusterMixin, BaseEstimator):
    """Multilevel K-means (the paper's Algorithm 2).

    Embeds the data with ``MultilevelEmbedding``, runs K-means (one random initialisation)
    on the coarsest level's embedding, then on each finer level starting from the centroids
    of the level below, ending on all points.

    Parameters
    ----------
    n_clusters : int, default=8
        Number of clusters K. Coarsening keeps at least 2K points per level.
    method, n_neighbors, n_levels, max_coarse_size, order, weights, random_state, callback
        As in ``MultilevelEmbedding``.
    n_components : int or None, default=None
        Dimension of the embedding clustered; None means ``n_clusters``.

    Attributes
    ----------
    labels_ : ndarray of shape (n_samples,)
        Cluster of each training row.
    cluster_centers_ : ndarray of shape (n_clusters, n_components)
        Centroids in the embedding space.
    n_iter_ : int
        K-means iterations on the finest level (the paper's "# iterations").
    n_iter_levels_ : list of int
        K-means iterations per level, finest first.
    embedding_ : ndarray of shape (n_samples, n_components)
        The clustered embedding.
    embedder_ : MultilevelEmbedding
        The fitted embedding, used by ``predict``.

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from mbn_core import MultilevelKMeans
    >>> X, _ = load_digits(return_X_y=True)
    >>> MultilevelKMeans(n_clusters=10, random_state=0).fit(X).labels_.shape
    (1797,)
    """

    _parameter_constraints: dict = {
        **_COMMON_CONSTRAINTS,
        "n_clusters": [Interval(Integral, 1, None, closed="left")],
        "n_components": [Interval(Integral, 1, None, closed="left"), None],
    }

    def __init__(
        self,
        n_clusters: int = 8,
        method: str = "isomap",
        n_neighbors: int = 10,
        n_components: int | None = None,
        n_levels: int | None = 2,
        max_coarse_size: int | None = None,
        order: str = "random",
        weights: str = "heat",
        random_state: int | np.random.RandomState | None = None,
        callback: ProgressCallback | None = None,
    ) -> None:
        self.n_clusters = n_clusters
        self.method = method
        self.n_neighbors = n_neighbors
        self.n_components = n_components
        self.n_levels = n_levels
        self.max_coarse_size = max_coarse_size
        self.order = order
        self.weights = weights
        self.random_state = random_state
        self.callback = callback

    @fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Cluster X.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : ignored

        Returns
        -------
        self : MultilevelKMeans
        """
        X = validate_data(self, X, dtype=np.float64, ensure_min_samples=2, reset=True)
        if self.n_clusters > X.shape[0]:
            raise ValueError(f"n_clusters={self.n_clusters} must be <= n_samples={X.shape[0]}")
        rng = check_random_state(self.random_state)
        embedder = MultilevelEmbedding(
            method=self.method,
            n_neighbors=self.n_neighbors,
            n_components=self.n_clusters if self.n_components is None else self.n_components,
            n_levels=self.n_levels,
            max_coarse_size=self.max_coarse_size,
            order=self.order,
            weights=self.weights,
            random_state=rng,
            callback=self.callback,
        )
        levels = embedder._fit(X, min_size=2 * self.n_clusters)
        embedding = embedder.embedding_
        seed = int(rng.randint(np.iinfo(np.int32).max))
        init: np.ndarray | str = "random"
        n_iter: list[int] = []
        for level in reversed(levels):
            kmeans = KMeans(self.n_clusters, init=init, n_init=1, random_state=seed)
            kmeans.fit(embedding[level.vertices])
            init = kmeans.cluster_centers_
            n_iter.append(int(kmeans.n_iter_))
        self.embedder_ = embedder
        self.embedding_ = embedding
        self.labels_ = kmeans.labels_
        self.cluster_centers_ = kmeans.cluster_centers_
        self.n_iter_levels_ = n_iter[::-1]
        self.n_iter_ = n_iter[-1]
        return self

    def predict(self, X):
        """Nearest centroid of each row's out-of-sample embedding."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        embedded = self.embedder_.transform(X)
        squared = ((embedded[:, None, :] - self.cluster_centers_[None]) ** 2).sum(axis=2)
        return np.argmin(squared, axis=1)


class _Reporter:
    """Calls the progress callback and turns a True answer into ``TrainingStopped``."""

    def __init__(self, callback: ProgressCallback | None) -> None:
        self.callback = callback

    def __call__(self, stage: int, done: int, total: int) -> None:
        if self.callback is not None and self.callback(stage, done, total):
            raise TrainingStopped(
                f"training stopped by the callback during {STAGES[stage]} ({done} of {total})"
            )


# ---------------------------------------------------------------------- persistence


def embedding_to_arrays(model: MultilevelEmbedding) -> dict[str, np.ndarray]:
    """Every array ``transform`` needs, keyed by name (for ``np.savez``, no pickle), and the
    levels' training rows.

    The hyperparameters are not included: store ``model.get_params()`` (minus ``callback``)
    beside the arrays and pass them back to ``embedding_from_arrays``.
    """
    check_is_fitted(model)
    arrays = {
        "X_fit": model.X_fit_,
        "embedding": model.embedding_,
        "sigma": np.asarray(model.sigma_, dtype=np.float64),
        "level_sizes": np.asarray(model.level_sizes_, dtype=np.int64),
    }
    if model.level_vertices_ is not None:
        arrays["level_vertices"] = np.concatenate(model.level_vertices_).astype(np.int64)
    return arrays


def embedding_from_arrays(
    arrays: dict[str, np.ndarray],
    params: dict,
    *,
    estimator: MultilevelEmbedding | None = None,
) -> MultilevelEmbedding:
    """Rebuild a fitted ``MultilevelEmbedding`` (for ``transform``) from its arrays: every
    fitted attribute the class documents.

    ``estimator``, when given, is the unfitted estimator to fill (a subclass, made with its
    own parameters); otherwise one is made from ``params``. Raises ``ValueError`` naming
    the array when one is missing or inconsistent.
    """

    def get(name: str) -> np.ndarray:
        if name not in arrays:
            raise ValueError(f"model array {name!r} is missing")
        return np.asarray(arrays[name])

    model = estimator
    if model is None:
        model = MultilevelEmbedding(
            **{key: value for key, value in params.items() if key != "callback"}
        )
    model._validate_params()
    X_fit = get("X_fit").astype(np.float64, copy=False)
    embedding = get("embedding").astype(np.float64, copy=False)
    sigma = float(get("sigma"))
    level_sizes = [int(size) for size in get("level_sizes")]
    if X_fit.ndim != 2 or X_fit.shape[0] <= model.n_neighbors:
        raise ValueError(f"model array 'X_fit' has shape {X_fit.shape}")
    if embedding.shape != (X_fit.shape[0], model.n_components):
        raise ValueError(f"model array 'embedding' has shape {embedding.shape}")
    if not (sigma > 0):
        raise ValueError(f"model array 'sigma' must be positive, got {sigma}")
    if not level_sizes or level_sizes[0] != X_fit.shape[0] or min(level_sizes) < 1:
        raise ValueError(f"model array 'level_sizes' holds {level_sizes}")
    if not (np.all(np.isfinite(X_fit)) and np.all(np.isfinite(embedding))):
        raise ValueError("model arrays 'X_fit' and 'embedding' must be finite")
    level_vertices: list[np.ndarray] | None
    if "level_vertices" in arrays:
        level_vertices = _split_levels(get("level_vertices"), level_sizes, X_fit.shape[0])
    else:
        level_vertices = _redrawn_levels(model, X_fit, level_sizes)
    model.X_fit_ = X_fit
    model.embedding_ = embedding
    model.sigma_ = sigma
    model.level_sizes_ = level_sizes
    model.level_vertices_ = level_vertices
    model.n_features_in_ = X_fit.shape[1]
    model.n_components_ = model.n_components
    return model


def _split_levels(flat: np.ndarray, level_sizes: list[int], n_rows: int) -> list[np.ndarray]:
    """The saved levels' training rows (concatenated, finest first), checked."""
    if flat.dtype.kind not in "ui" or flat.shape != (sum(level_sizes),):
        raise ValueError(f"model array 'level_vertices' has shape {flat.shape} ({flat.dtype})")
    if flat.size and (flat.min() < 0 or flat.max() >= n_rows):
        raise ValueError(f"model array 'level_vertices' holds rows outside [0, {n_rows})")
    bounds = np.cumsum(level_sizes)[:-1]
    return [level.astype(np.intp) for level in np.split(flat, bounds)]


def _redrawn_levels(
    model: MultilevelEmbedding, X_fit: np.ndarray, level_sizes: list[int]
) -> list[np.ndarray] | None:
    """The levels of a model saved without them: the coarsening drawn again from the
    training rows, as the fit drew it (the same seed gives the same levels). None when the
    drawn levels are not the saved sizes (a fit of ``random_state=None``)."""
    if not isinstance(model.random_state, Integral):
        return None
    rng = check_random_state(model.random_state)
    floor = max(model.n_components + 2, model.n_neighbors + 1)
    levels = _multilevel.build_levels(
        knn_graph(X_fit, model.n_neighbors),
        max_levels=model.n_levels,
        max_coarse_size=model.max_coarse_size,
        min_size=floor,
        order=model.order,
        rng=rng,
        progress=lambda done: None,
    )
    if [len(level.vertices) for level in levels] != level_sizes:
        return None
    return [level.vertices for level in levels]
