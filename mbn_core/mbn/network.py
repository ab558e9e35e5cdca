"""Multilayer Bootstrap Network estimator (scikit-learn API)."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, RealNotInt, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data
from threadpoolctl import threadpool_limits

from mbn_core.data.checks import check_magnitude
from mbn_core.exceptions import TrainingStopped
from mbn_core.mbn import _kernels
from mbn_core.mbn.auto import (
    bottom_feature_count,
    choose_delta,
    choose_output,
    least_bottom_features,
    thin_manifold_is_measurable,
)
from mbn_core.mbn.backends.base import LayerBackend, ProgressCallback, get_backend
from mbn_core.mbn.coassociation import CodesTop, one_hot
from mbn_core.mbn.encoders import UpperClusterings
from mbn_core.mbn.layers import (
    BottomLayer,
    UpperLayer,
    canonical_sparse,
    compact_values,
    input_row_norms,
    smallest_uint,
)
from mbn_core.mbn.umap_output import OutputProgress, UmapTop, fit_umap, require_umap
from mbn_core.params import CheckedParams, check_int_items
from mbn_core.utils.pca import fit_pca

METRICS = ("euclidean", "cosine")
OUTPUTS = ("auto", "pca", "umap", "umap-bottom")
# Requests of up to this many dense rows are encoded row by row over the stored centers
# (``BottomLayer.codes_few``, ``UpperLayer.codes_few``); larger batches share GEMMs and
# posting lists between their rows.
FEW_ROWS = 16
# Above this many one-hot entries the top PCA runs sparse (ARPACK) instead of dense.
_DENSE_PCA_MAX_ENTRIES = 5_000_000


@dataclass(frozen=True)
class _Top:
    """PCA of the last layer's one-hot codes, as a lookup table."""

    table: np.ndarray  # (V, k_L, n_components) float64
    offset: np.ndarray  # (n_components,) float64
    explained_variance_ratio: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.table.nbytes + self.offset.nbytes

    @property
    def n_components(self) -> int:
        return int(self.table.shape[2])


class MBN(CheckedParams, TransformerMixin, BaseEstimator):
    """Multilayer Bootstrap Network for nonlinear dimensionality reduction.

    Each layer is ``n_clusterings`` k-centers clusterings. A clustering picks a random subset
    of its input dimensions and k random training points as centers (without replacement),
    and codes every point by its nearest center. The one-hot codes of a layer feed the next,
    smaller layer; PCA of the top layer's codes gives the embedding (Zhang, "Multilayer
    bootstrap networks", Neural Networks 2018).

    Parameters
    ----------
    n_components : int, default=None
        Dimension of the embedding. None means ``n_classes``.
    n_clusterings : int, default=400
        Clusterings per layer (V). Robust for V >= 100.
    feature_fraction : float in (0, 1] or "auto", default="auto"
        Fraction of input dimensions each clustering chooses (a). "auto" is 0.5, except that
        the bottom layer chooses more of the d input dimensions when random halves of them
        do not keep the input's neighbourhoods (2-D or 3-D manifolds, a few unrelated
        measurements), and never fewer than min(2, d): measured on a sample of the training
        rows with every input at unit scale, never on labels (see ``mbn_core.mbn.auto``).
        At the bottom exactly ``round(a * d)`` dimensions are chosen without replacement; at
        the upper layers each of the V * k one-hot dimensions is chosen independently with
        probability a (the same in distribution for their thousands of dimensions, and it
        never has to be materialised).
    n_classes : int, default=10
        Guessed number of classes c: layers stop before k < 1.5 c, and the default
        ``n_components`` is c.
    ks : sequence of int, default=None
        Explicit centers per layer, bottom first; overrides ``k1``, ``delta`` and ``k_max``.
    k_max : int, default=None
        Cap on ``k1`` (the paper's hardware limit). None means no cap. Fit time grows
        linearly with k1: a bottom-layer clustering costs ``2 * n * a*d * k1`` flops.
    metric : {"euclidean", "cosine"}, default="euclidean"
        Bottom-layer similarity: squared Euclidean distance, or cosine similarity on the
        chosen dimensions (for bag-of-words text, and for images whose rows differ in overall
        intensity). Upper layers always
        count shared codes.
    output : {"auto", "pca", "umap", "umap-bottom"}, default="auto"
        How the top of the network becomes the embedding. "pca": PCA of the top layer's
        one-hot codes (the paper). "umap": UMAP's layout (umap-learn) of the bottom x top
        co-association (rows alike when they share fine bottom cells and coarse top
        clusters), every row placed at the weighted mean of its 15 most co-associated
        training rows' layout (see ``mbn_core.mbn.umap_output``); it separates thin manifolds
        and keeps neighbourhoods, and keeps the training rows' codes. "umap-bottom": the same
        layout of the bottom layer's co-association alone, from a network of that one layer
        (``ks_`` has one entry): for thin manifolds, whose coarse layers merge the manifold's
        branches. It takes neither a number for ``delta`` nor more than one layer in ``ks``.
        "auto" is "umap-bottom" on thin manifolds and "pca" otherwise, decided by the
        measurement behind ``delta="auto"`` (the paper's 0.5 would leave more than 1% of
        the points sharing no code with the second layer's centers: two moons, rings,
        rolls), never by labels; where the upper layers are given (a number for ``delta``,
        several ``ks``) it keeps them and is "umap" on thin manifolds. It is "pca" wherever
        that measurement was not calibrated (fewer than 400 clusterings, k1 above n / 2) and
        where the co-association would exceed ``auto.UMAP_OUTPUT_MAX_PAIRS`` (see
        ``mbn_core.mbn.auto``). ``output_`` says which was used.
    k1 : int, float in (0, 1] or "auto", default="auto"
        Centers per clustering in the bottom layer. "auto" is ``0.5 * n_samples``; a float is
        that fraction of ``n_samples``. Capped by ``k_max``.
    delta : float in (0, 1) or "auto", default="auto"
        Each layer has ``floor(delta * k)`` centers, k being the layer below's. "auto" is
        the smallest of 0.5, 0.7 and 0.9 whose second layer leaves at most 1% of the
        points sharing no code with any of its centers (a point that shares nothing gets
        an arbitrary code, which glues distant points together in every layer above). It
        is measured on the bottom layer's codes of the training data (over 400 of its
        clusterings when there are more), never on labels: images and text keep the
        paper's 0.5; thin manifolds, which would get more, get the one-layer network of
        ``output="umap-bottom"`` when ``output="auto"`` (see ``mbn_core.mbn.auto``).
    shift_fraction : float in [0, 1), default=0.0
        Random reconstruction (r, arXiv version): for this fraction of each bottom
        clustering's chosen dimensions, the centers' values are shifted cyclically by one
        center. 0 disables it; around 0.5 can help on tiny data sets.
    random_state : int, RandomState instance or None, default=None
        Seed of every random choice. The same seed gives the same model.
    n_jobs : int, default=None
        Threads running clusterings in parallel; BLAS is held to one thread meanwhile so the
        cores are not oversubscribed. None or -1 uses every available core.
    callback : callable, default=None
        Called as ``callback(layer, clustering, total)`` after each clustering with the
        0-based layer index, the clusterings of that layer finished so far, and the
        layer's total. Returning True stops training: ``fit`` raises ``TrainingStopped``
        and the estimator stays as it was. Two optional methods of the callback hear the
        rest of the fit, and their returning True stops it too:

        - ``fit_plan(ks, output)``: the layers and the output the fit settled on, once the
          bottom layer is done (``delta`` and ``output`` "auto" decide them there);
        - ``output_progress(stage, done, total)``: the UMAP outputs' fit after the layers,
          ``"neighbours"`` (rows searched) then ``"layout"`` (epochs).

    Attributes
    ----------
    ks_ : list of int
        Centers per layer, bottom first.
    n_components_ : int
        Dimension of the embedding.
    delta_ : float or None
        The shrink factor used (measured when ``delta="auto"``); None with explicit ``ks``
        and for the one-layer network of ``output_`` "umap-bottom".
    output_ : {"pca", "umap", "umap-bottom"}
        The output used (chosen when ``output="auto"``).
    bottom_layer_ : BottomLayer
        The fitted bottom layer.
    upper_layers_ : list of UpperLayer
        The fitted upper layers, lowest first.
    explained_variance_ratio_ : ndarray of shape (n_components_,) or None
        Variance of the top codes explained by each embedding dimension (None unless
        ``output_`` is "pca").
    n_features_in_ : int
        Number of input features.

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from mbn_core import MBN
    >>> X, _ = load_digits(return_X_y=True)
    >>> mbn = MBN(n_components=2, n_clusterings=50, random_state=0)
    >>> mbn.fit_transform(X).shape
    (1797, 2)
    """

    _parameter_constraints: dict[str, list] = {
        "n_components": [Interval(Integral, 1, None, closed="left"), None],
        "n_clusterings": [Interval(Integral, 1, None, closed="left")],
        "feature_fraction": [Interval(Real, 0, 1, closed="right"), StrOptions({"auto"})],
        "k1": [
            Interval(Integral, 2, None, closed="left"),
            Interval(RealNotInt, 0, 1, closed="right"),
            StrOptions({"auto"}),
        ],
        "delta": [Interval(Real, 0, 1, closed="neither"), StrOptions({"auto"})],
        "n_classes": [Interval(Integral, 1, None, closed="left")],
        "ks": ["array-like", None],
        "k_max": [Interval(Integral, 2, None, closed="left"), None],
        "metric": [StrOptions(set(METRICS))],
        "output": [StrOptions(set(OUTPUTS))],
        "shift_fraction": [Interval(Real, 0, 1, closed="left")],
        "random_state": ["random_state"],
        "n_jobs": [
            Interval(Integral, 1, None, closed="left"),
            Interval(Integral, None, -1, closed="right"),
            None,
        ],
        "callback": [callable, None],
    }

    def __init__(
        self,
        n_components: int | None = None,
        n_clusterings: int = 400,
        feature_fraction: float | str = "auto",
        k1: int | float | str = "auto",
        delta: float | str = "auto",
        n_classes: int = 10,
        ks: Sequence[int] | None = None,
        k_max: int | None = None,
        metric: str = "euclidean",
        output: str = "auto",
        shift_fraction: float = 0.0,
        random_state: int | np.random.RandomState | None = None,
        n_jobs: int | None = None,
        callback: ProgressCallback | None = None,
    ) -> None:
        self.n_components = n_components
        self.n_clusterings = n_clusterings
        self.feature_fraction = feature_fraction
        self.k1 = k1
        self.delta = delta
        self.n_classes = n_classes
        self.ks = ks
        self.k_max = k_max
        self.metric = metric
        self.output = output
        self.shift_fraction = shift_fraction
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.callback = callback

    # ------------------------------------------------------------------ fitting

    def fit(self, X, y=None):
        """Fit the network to X.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)
            Training data. Any real dtype (computed in float32); sparse input is kept sparse.
        y : ignored

        Returns
        -------
        self : MBN
        """
        self._fit(X)
        return self

    def fit_transform(self, X, y=None):
        """Fit the network and return the embedding of X (equal to ``fit(X).transform(X)``)."""
        return self._fit(X)

    def _fit(self, X) -> np.ndarray:
        # A stopped or failed fit leaves the estimator exactly as it was.
        previous_state = dict(self.__dict__)
        try:
            return self._fit_network(X)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(previous_state)
            raise

    def _fit_network(self, X) -> np.ndarray:
        self._validate_params()
        self._check_output_layers()
        X = validate_data(
            self,
            X,
            accept_sparse="csr",
            dtype=[np.float64, np.float32],
            ensure_min_samples=2,
            reset=True,
        )
        X = canonical_sparse(X)
        check_magnitude(X)  # beyond it, float32 center scores overflow
        n_samples = X.shape[0]
        ks = self.layer_sizes(n_samples)
        n_components = self.n_classes if self.n_components is None else self.n_components
        n_top = self.n_clusterings * ks[-1]
        if n_components > min(n_samples, n_top):
            raise ValueError(
                f"n_components={n_components} must be <= min(n_samples, n_clusterings * "
                f"ks[-1]) = {min(n_samples, n_top)}"
            )
        if self.output in ("umap", "umap-bottom"):
            require_umap()
        rng = check_random_state(self.random_state)
        n_chosen = self._n_bottom_features(X, rng)
        backend = get_backend(n_jobs=self.n_jobs, callback=self.callback)
        # One BLAS thread for the whole fit: the backend's workers do not oversubscribe the
        # cores, and the top's PCA sums in the same order wherever the layers ran.
        with threadpool_limits(limits=1, user_api="blas"), backend:
            bottom, codes = self._fit_bottom(X, ks[0], n_chosen, rng, backend)
            bottom_codes = codes
            delta = measured_delta = None
            delta_is_measured = (
                self.delta == "auto" and self.ks is None and self.output != "umap-bottom"
            )
            output_is_measured = self.output == "auto" and thin_manifold_is_measurable(
                n_samples, self.n_clusterings, ks[0]
            )
            if delta_is_measured or output_is_measured:
                min_k = 1.5 * self.n_classes
                measured_delta = choose_delta(codes, ks[0], self._upper_fraction(), min_k, rng)
            output = self.output
            if output == "auto":
                output = "pca"
                if output_is_measured and measured_delta is not None:
                    output = choose_output(measured_delta, self._upper_layers_are_given())
            if output == "umap-bottom":
                ks, delta_is_measured = ks[:1], False
            if delta_is_measured:
                delta = measured_delta
                chosen = self.layer_sizes(n_samples, delta)
                # A larger delta may end on a smaller top layer: keep the one that was
                # checked against n_components when it no longer fits.
                if n_components <= min(n_samples, self.n_clusterings * chosen[-1]):
                    ks = chosen
                else:
                    delta = 0.5
            fit_plan = getattr(self.callback, "fit_plan", None)
            if fit_plan is not None and fit_plan(list(ks), output):  # "auto" settles them here
                raise TrainingStopped("training stopped by the callback after the bottom layer")
            upper: list[UpperLayer] = []
            for index, k in enumerate(ks[1:], start=1):
                layer, codes = self._fit_upper(codes, ks[index - 1], k, rng, backend, index)
                upper.append(layer)
            top: _Top | UmapTop
            if output in ("umap", "umap-bottom"):
                seed = rng.randint(np.iinfo(np.int32).max)
                # "umap-bottom" lays out the bottom layer's co-association alone
                top_codes = None if output == "umap-bottom" else codes
                top, embedding = fit_umap(
                    bottom_codes, top_codes, ks[0], n_components, seed,
                    _output_progress(self.callback),
                )  # fmt: skip
            else:
                top = _fit_top(codes, ks[-1], n_components, rng)
                embedding = _project(codes, top)

        self.ks_ = list(ks)
        if delta is None and self.ks is None and output != "umap-bottom":
            delta = 0.5 if self.delta == "auto" else float(self.delta)
        self.delta_ = delta
        self.output_ = output
        self.n_components_ = n_components
        self.bottom_layer_ = bottom
        self.upper_layers_ = upper
        self.top_ = top
        self._set_output_attributes()
        return embedding

    def _set_output_attributes(self) -> None:
        top = self.top_
        self.explained_variance_ratio_: np.ndarray | None
        if isinstance(top, UmapTop):
            self.explained_variance_ratio_ = None
        else:
            self.explained_variance_ratio_ = top.explained_variance_ratio

    def _check_output_layers(self) -> None:
        """ValueError when the output cannot have the layers asked for."""
        if self.output == "umap-bottom" and self._upper_layers_are_given():
            raise ValueError(
                'output="umap-bottom" is a network of the bottom layer alone: give at most one '
                'layer in ks (ks=[k1]) and leave delta at "auto", or use output="umap"'
            )

    def _upper_layers_are_given(self) -> bool:
        """Whether the caller fixed the upper layers (several ``ks``, or a number for delta)."""
        return self.delta != "auto" or (self.ks is not None and len(self.ks) > 1)

    def layer_sizes(self, n_samples: int, delta: float | None = None) -> list[int]:
        """Centers per layer that ``fit`` uses for ``n_samples`` training points.

        With ``delta="auto"`` the shrink factor is measured during ``fit`` (``delta_``);
        pass it as ``delta`` to get the sizes it chose. Without it, "auto" assumes 0.5,
        the choice of high-dimensional data. ``output="auto"`` may choose "umap-bottom",
        whose network is the first of these layers alone (``ks_``).
        """
        ks = self._network_sizes(n_samples, delta)
        return ks[:1] if self.output == "umap-bottom" else ks

    def _network_sizes(self, n_samples: int, delta: float | None) -> list[int]:
        if self.ks is not None:
            ks = [int(k) for k in self.ks]
            too_many = [k for k in ks if k > n_samples]
            if too_many:
                raise ValueError(
                    f"ks={list(self.ks)} asks for {too_many[0]} centers but there are only "
                    f"{n_samples} samples"
                )
            return ks
        if self.k1 == "auto":
            k1 = round(0.5 * n_samples)
        elif isinstance(self.k1, numbers.Integral):
            k1 = int(self.k1)
            if k1 > n_samples:
                raise ValueError(f"k1={k1} centers is more than the {n_samples} samples")
        else:
            k1 = round(float(self.k1) * n_samples)
        if self.k_max is not None:
            k1 = min(k1, int(self.k_max))
        k1 = max(2, min(k1, n_samples))
        ks = [k1]
        if delta is None:
            delta = 0.5 if self.delta == "auto" else float(self.delta)
        shrink = delta
        while (k := int(shrink * ks[-1])) >= 1.5 * self.n_classes:
            ks.append(k)
        return ks

    def _expected_bottom_features(self, n_features: int) -> int:
        """Bottom-layer dimensions per clustering before seeing the data ("auto": at least
        half, the most common choice, and at least min(2, d)), for cost estimates."""
        if self.feature_fraction == "auto":
            return least_bottom_features(n_features)
        return max(1, round(float(self.feature_fraction) * n_features))

    def _n_bottom_features(self, X, rng) -> int:
        if self.feature_fraction == "auto":
            return bottom_feature_count(X, rng)
        return max(1, round(float(self.feature_fraction) * X.shape[1]))

    def _upper_fraction(self) -> float:
        return 0.5 if self.feature_fraction == "auto" else float(self.feature_fraction)

    def _fit_bottom(self, X, k, n_chosen, rng, backend: LayerBackend):
        n_samples, n_features = X.shape
        V = self.n_clusterings
        # Packed row by row: a (V, d) boolean matrix is V bytes per input feature, 40 GB for
        # a sparse vocabulary of 10^8 words at V = 400.
        packed_width = (n_features + 7) // 8
        feature_masks = np.zeros((V, packed_width), dtype=np.uint8)
        shift_masks = (
            np.zeros((V, packed_width), dtype=np.uint8) if self.shift_fraction > 0 else None
        )
        centers = np.empty((V, k), dtype=np.int64)
        row = np.zeros(n_features, dtype=bool)
        for v in range(V):
            chosen = rng.choice(n_features, n_chosen, replace=False)
            row[:] = False
            row[chosen] = True
            feature_masks[v] = np.packbits(row)
            centers[v] = rng.choice(n_samples, k, replace=False)
            if shift_masks is not None:
                n_shift = round(self.shift_fraction * n_chosen)
                row[:] = False
                row[rng.choice(chosen, n_shift, replace=False)] = True
                shift_masks[v] = np.packbits(row)
        rows, local = np.unique(centers, return_inverse=True)
        if sp.issparse(X):
            center_data = sp.csr_matrix(X[rows], dtype=np.float32)
            center_data.sort_indices()
        else:
            center_data = compact_values(X[rows])
        layer = BottomLayer(
            feature_masks=feature_masks,
            shift_masks=shift_masks,
            centers=local.reshape(V, k).astype(smallest_uint(len(rows) - 1)),
            center_data=center_data,
            metric=self.metric,
        )
        return layer, backend.bottom_codes(layer, X)

    def _fit_upper(self, codes, n_values, k, rng, backend: LayerBackend, index):
        n_samples = codes.shape[0]
        V = self.n_clusterings
        fraction = self._upper_fraction()
        centers = np.stack([rng.choice(n_samples, k, replace=False) for _ in range(V)])
        seeds = rng.randint(0, 2**63, size=V, dtype=np.int64).astype(np.uint64)
        clusterings = UpperClusterings(centers.astype(np.int32), seeds, n_values, fraction)
        new_codes = backend.fit_upper_codes(index, codes, clusterings)
        rows, local = np.unique(centers, return_inverse=True)
        layer = UpperLayer.create(
            centers=local.reshape(V, k).astype(smallest_uint(len(rows) - 1)),
            center_codes=codes[rows].astype(smallest_uint(n_values - 1)),
            seeds=seeds,
            n_values=n_values,
            feature_fraction=fraction,
        )
        return layer, new_codes

    # ------------------------------------------------------------------ inference

    def transform(self, X):
        """Embed X with the fitted network.

        Deterministic and batch independent: row i of ``transform(X)`` equals
        ``transform(X[i:i+1])[0]`` bit for bit, and ``transform`` of the training data
        reproduces ``fit_transform``.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)

        Returns
        -------
        embedding : ndarray of shape (n_samples, n_components_), float64
        """
        check_is_fitted(self)
        if isinstance(self.top_, CodesTop):
            bottom_codes, codes = self._encode_layers(X, len(self.ks_))
            return self.top_.embed(bottom_codes, codes)
        codes = self._encode(X, len(self.ks_))
        return _project(codes, self.top_)

    def encode(self, X, layer: int = -1) -> np.ndarray:
        """Integer codes of X at one layer: column v is the center index in clustering v.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)
        layer : int, default=-1
            0-based layer index; negative values count from the top.

        Returns
        -------
        codes : ndarray of shape (n_samples, n_clusterings), smallest unsigned dtype
        """
        check_is_fitted(self)
        n_layers = len(self.ks_)
        if not isinstance(layer, numbers.Integral) or not -n_layers <= layer < n_layers:
            raise ValueError(f"layer={layer!r} must be an integer in [{-n_layers}, {n_layers})")
        depth = layer % n_layers + 1
        return self._encode(X, depth)

    def _encode(self, X, depth: int) -> np.ndarray:
        return self._encode_layers(X, depth)[1]

    def _encode_layers(self, X, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """The bottom layer's codes of X and those of layer ``depth - 1``."""
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=[np.float64, np.float32], reset=False)
        X = canonical_sparse(X)
        n_samples = X.shape[0]
        bottom = self.bottom_layer_
        if n_samples <= FEW_ROWS and not sp.issparse(X) and bottom.few_rows_supported:
            # A request of a few rows: one pass over each layer's centers, on this thread.
            codes = bottom.codes_few(np.asarray(X, dtype=np.float32), input_row_norms(X))
            bottom_codes = codes
            for layer in self.upper_layers_[: depth - 1]:
                codes = layer.codes_few(codes)
            return bottom_codes, codes
        backend = get_backend(n_jobs=self.n_jobs)
        with threadpool_limits(limits=1, user_api="blas"), backend:
            codes = backend.bottom_codes(self.bottom_layer_, X)
            bottom_codes = codes
            for index, layer in enumerate(self.upper_layers_[: depth - 1], start=1):
                codes = backend.upper_codes(index, codes, layer)
        return bottom_codes, codes

    # ------------------------------------------------------------------ helpers

    @property
    def layers_(self) -> list[BottomLayer | UpperLayer]:
        """The fitted layers, bottom first."""
        check_is_fitted(self)
        return [self.bottom_layer_, *self.upper_layers_]

    @property
    def nbytes(self) -> int:
        """Bytes held by the fitted model's arrays (what exact prediction needs)."""
        check_is_fitted(self)
        return sum(layer.nbytes for layer in self.layers_) + self.top_.nbytes

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "top_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    def _check_params(self) -> None:
        if self.ks is not None:
            check_int_items(type(self).__name__, "ks", self.ks, 2)


def _output_progress(callback: ProgressCallback | None) -> OutputProgress | None:
    """The UMAP output's progress function for this callback: it tells the callback's
    ``output_progress`` and stops the fit when that returns True."""
    report = getattr(callback, "output_progress", None)
    if report is None:
        return None

    def progress(stage: str, done: int, total: int) -> None:
        if report(stage, done, total):
            raise TrainingStopped(
                f"training stopped by the callback in the output's {stage} ({done} of {total})"
            )

    return progress


def _fit_top(codes: np.ndarray, n_values: int, n_components: int, rng) -> _Top:
    """PCA of the one-hot top codes, returned as a (V, k, n_components) lookup table."""
    n_samples, n_clusterings = codes.shape
    n_dims = n_clusterings * n_values
    onehot = one_hot(codes, n_values, dtype=np.float64)
    seed = rng.randint(np.iinfo(np.int32).max)
    if n_samples * n_dims <= _DENSE_PCA_MAX_ENTRIES or n_components >= min(n_samples, n_dims):
        pca = fit_pca(onehot.toarray(), n_components, svd_solver="full", random_state=seed)
    else:
        pca = fit_pca(onehot, n_components, svd_solver="arpack", random_state=seed)
    components = pca.components_
    table = np.ascontiguousarray(components.T.reshape(n_clusterings, n_values, n_components))
    offset = components @ pca.mean_
    ratio = np.nan_to_num(pca.explained_variance_ratio_)
    return _Top(table=table, offset=offset, explained_variance_ratio=ratio)


def _project(codes: np.ndarray, top: _Top) -> np.ndarray:
    out = np.empty((codes.shape[0], top.table.shape[2]), dtype=np.float64)
    _kernels.project_codes(codes, top.table, top.offset, out)
    return out


# ---------------------------------------------------------------------- persistence


def model_to_arrays(model: MBN) -> dict[str, np.ndarray]:
    """Every array exact prediction needs, keyed by name (for ``np.savez``, no pickle).

    The hyperparameters are not included: store ``model.get_params()`` (minus ``callback``)
    beside the arrays and pass them back to ``model_from_arrays``.
    """
    check_is_fitted(model)
    arrays: dict[str, np.ndarray] = {
        "ks": np.asarray(model.ks_, dtype=np.int64),
        "n_features_in": np.asarray(model.n_features_in_, dtype=np.int64),
    }
    bottom = model.bottom_layer_
    arrays["layer0.feature_masks"] = bottom.feature_masks
    arrays["layer0.centers"] = bottom.centers
    if bottom.shift_masks is not None:
        arrays["layer0.shift_masks"] = bottom.shift_masks
    data = bottom.center_data
    if isinstance(data, sp.csr_matrix):
        arrays["layer0.center_data.data"] = data.data
        arrays["layer0.center_data.indices"] = data.indices
        arrays["layer0.center_data.indptr"] = data.indptr
        arrays["layer0.center_data.shape"] = np.asarray(data.shape, dtype=np.int64)
    else:
        arrays["layer0.center_data"] = data
    for index, layer in enumerate(model.upper_layers_, start=1):
        arrays[f"layer{index}.centers"] = layer.centers
        arrays[f"layer{index}.center_codes"] = layer.center_codes
        arrays[f"layer{index}.seeds"] = layer.seeds
        arrays[f"layer{index}.feature_fraction"] = np.asarray(layer.feature_fraction)
    top = model.top_
    if isinstance(top, UmapTop):
        arrays.update(_codes_arrays("umap", top))
        arrays["umap.anchors"] = top.anchors
    else:
        arrays["top.table"] = top.table
        arrays["top.offset"] = top.offset
        arrays["top.explained_variance_ratio"] = top.explained_variance_ratio
    return arrays


def _codes_arrays(prefix: str, top: CodesTop) -> dict[str, np.ndarray]:
    """The training rows' codes an output keeps ("umap-bottom" keeps no top codes)."""
    arrays = {f"{prefix}.bottom_codes": top.bottom_codes}
    if top.top_codes is not None:
        arrays[f"{prefix}.top_codes"] = top.top_codes
    return arrays


def model_from_arrays(arrays: dict[str, np.ndarray], params: dict) -> MBN:
    """Rebuild a fitted MBN from ``model_to_arrays`` output and its hyperparameters.

    Raises ``ValueError`` naming the array when one is missing or inconsistent.
    """

    def get(name: str) -> np.ndarray:
        if name not in arrays:
            raise ValueError(f"model array {name!r} is missing")
        return np.asarray(arrays[name])

    if params.get("output") == "spectral" or any(name.startswith("spectral.") for name in arrays):
        raise ValueError(
            'output="spectral" was removed from MBN; retrain the model with output "auto", '
            '"pca" or "umap"'
        )
    model = MBN(**{key: value for key, value in params.items() if key != "callback"})
    model._validate_params()
    ks = [int(k) for k in get("ks")]
    n_features = int(get("n_features_in"))
    if not ks or min(ks) < 2:
        raise ValueError(f"model array 'ks' holds invalid layer sizes {ks}")
    V = model.n_clusterings
    if "layer0.center_data" in arrays:
        center_data: np.ndarray | sp.csr_matrix = get("layer0.center_data")
    else:
        shape = tuple(int(s) for s in get("layer0.center_data.shape"))
        center_data = sp.csr_matrix(
            (
                get("layer0.center_data.data"),
                get("layer0.center_data.indices"),
                get("layer0.center_data.indptr"),
            ),
            shape=shape,
        )
    bottom = BottomLayer(
        feature_masks=get("layer0.feature_masks"),
        shift_masks=get("layer0.shift_masks") if "layer0.shift_masks" in arrays else None,
        centers=get("layer0.centers"),
        center_data=center_data,
        metric=model.metric,
    )
    _expect_shape("layer0.centers", bottom.centers, (V, ks[0]))
    _expect_shape("layer0.feature_masks", bottom.feature_masks, (V, (n_features + 7) // 8))
    if center_data.ndim != 2 or center_data.shape[1] != n_features:
        raise ValueError(f"model array 'layer0.center_data' has shape {center_data.shape}")
    _expect_index("layer0.centers", bottom.centers, center_data.shape[0])
    upper: list[UpperLayer] = []
    for index in range(1, len(ks)):
        centers = get(f"layer{index}.centers")
        center_codes = get(f"layer{index}.center_codes")
        seeds = get(f"layer{index}.seeds").astype(np.uint64)
        _expect_shape(f"layer{index}.centers", centers, (V, ks[index]))
        _expect_shape(f"layer{index}.seeds", seeds, (V,))
        if center_codes.ndim != 2 or center_codes.shape[1] != V:
            raise ValueError(
                f"model array 'layer{index}.center_codes' has shape {center_codes.shape}"
            )
        _expect_index(f"layer{index}.centers", centers, center_codes.shape[0])
        _expect_index(f"layer{index}.center_codes", center_codes, ks[index - 1])
        layer = UpperLayer.create(
            centers=centers,
            center_codes=center_codes,
            seeds=seeds,
            n_values=ks[index - 1],
            feature_fraction=float(get(f"layer{index}.feature_fraction")),
        )
        upper.append(layer)
    output = model.output
    if output == "auto":  # the fit's choice is the arrays it left
        output = "pca"
        if any(name.startswith("umap.") for name in arrays):
            bottom_only = len(ks) == 1 and "umap.top_codes" not in arrays
            output = "umap-bottom" if bottom_only else "umap"
    top: _Top | UmapTop
    if output in ("umap", "umap-bottom"):
        top = _umap_top(arrays, get, ks, V, bottom_only=output == "umap-bottom")
    else:
        top = _pca_top(get, ks, V)
    model.output_ = output
    model.ks_ = ks
    model.n_features_in_ = n_features
    model.n_components_ = top.n_components
    model.bottom_layer_ = bottom
    model.upper_layers_ = upper
    model.top_ = top
    model._set_output_attributes()
    return model


def _pca_top(get: Callable[[str], np.ndarray], ks: list[int], V: int) -> _Top:
    top = _Top(
        table=np.ascontiguousarray(get("top.table"), dtype=np.float64),
        offset=np.asarray(get("top.offset"), dtype=np.float64),
        explained_variance_ratio=get("top.explained_variance_ratio"),
    )
    if top.table.ndim != 3 or top.table.shape[:2] != (V, ks[-1]):
        raise ValueError(f"model array 'top.table' has shape {top.table.shape}")
    if top.offset.shape != (top.table.shape[2],):
        raise ValueError(f"model array 'top.offset' has shape {top.offset.shape}")
    return top


def _training_codes(
    get: Callable[[str], np.ndarray], prefix: str, ks: list[int], V: int
) -> tuple[np.ndarray, np.ndarray]:
    """The training rows' bottom and top codes that the UMAP output keeps."""
    bottom_codes = _training_bottom_codes(get, prefix, ks, V)
    top_codes = get(f"{prefix}.top_codes")
    _expect_shape(f"{prefix}.top_codes", top_codes, bottom_codes.shape)
    _expect_index(f"{prefix}.top_codes", top_codes, ks[-1])
    return bottom_codes, top_codes


def _training_bottom_codes(
    get: Callable[[str], np.ndarray], prefix: str, ks: list[int], V: int
) -> np.ndarray:
    bottom_codes = get(f"{prefix}.bottom_codes")
    if bottom_codes.ndim != 2 or bottom_codes.shape[1] != V or bottom_codes.shape[0] < 2:
        raise ValueError(f"model array '{prefix}.bottom_codes' has shape {bottom_codes.shape}")
    _expect_index(f"{prefix}.bottom_codes", bottom_codes, ks[0])
    return bottom_codes


def _umap_top(
    arrays: dict[str, np.ndarray],
    get: Callable[[str], np.ndarray],
    ks: list[int],
    V: int,
    bottom_only: bool,
) -> UmapTop:
    top_codes: np.ndarray | None
    if bottom_only:
        if len(ks) != 1:
            raise ValueError(f'output="umap-bottom" is a network of one layer, not {len(ks)}')
        if "umap.top_codes" in arrays:
            raise ValueError("model array 'umap.top_codes' is not part of output 'umap-bottom'")
        bottom_codes, top_codes = _training_bottom_codes(get, "umap", ks, V), None
    else:
        bottom_codes, top_codes = _training_codes(get, "umap", ks, V)
    anchors = np.ascontiguousarray(get("umap.anchors"), dtype=np.float64)
    if anchors.ndim != 2 or anchors.shape[0] != len(bottom_codes) or anchors.shape[1] < 1:
        raise ValueError(f"model array 'umap.anchors' has shape {anchors.shape}")
    if not np.isfinite(anchors).all():
        raise ValueError("model array 'umap.anchors' must be finite")
    return UmapTop.restore(bottom_codes, top_codes, ks[0], anchors=anchors)


def _expect_shape(name: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
    if array.shape != shape:
        raise ValueError(f"model array {name!r} has shape {array.shape}, expected {shape}")


def _expect_index(name: str, array: np.ndarray, bound: int) -> None:
    if array.dtype.kind not in "ui":
        raise ValueError(f"model array {name!r} must hold integers, not {array.dtype}")
    if array.size and (array.min() < 0 or array.max() >= bound):
        raise ValueError(f"model array {name!r} holds indices outside [0, {bound})")
