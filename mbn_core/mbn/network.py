"""Multilayer Bootstrap Network estimator (scikit-learn API)."""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
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
from mbn_core.mbn._integer_scores import IntegerRows, integer_codes
from mbn_core.mbn.auto import (
    bottom_feature_count,
    choose_delta,
    choose_output,
    least_bottom_features,
    thin_manifold_is_measurable,
)
from mbn_core.mbn.coassociation import CodesTop, expected_pairs, one_hot
from mbn_core.mbn.layers import (
    BottomLayer,
    PointPostings,
    Postings,
    UpperLayer,
    bottom_codes_leave_self_out,
    bottom_codes_sparse_leave_self_out,
    bottom_input,
    canonical_sparse,
    compact_values,
    input_row_norms,
    smallest_uint,
    upper_clustering_codes,
)
from mbn_core.mbn.spectral import MAX_COASSOCIATION_PAIRS, SpectralTop, fit_spectral
from mbn_core.mbn.umap_output import OutputProgress, UmapTop, fit_umap, require_umap
from mbn_core.params import CheckedParams, check_int_items
from mbn_core.utils.pca import fit_pca

ProgressCallback = Callable[[int, int, int], object]

METRICS = ("euclidean", "cosine")
OUTPUTS = ("auto", "pca", "spectral", "umap", "umap-bottom")
# Requests of up to this many dense rows are encoded row by row over the stored centers
# (``BottomLayer.codes_few``, ``UpperLayer.codes_few``); larger batches share GEMMs and
# posting lists between their rows.
FEW_ROWS = 16
# Above this many one-hot entries the top PCA runs sparse (ARPACK) instead of dense.
_DENSE_PCA_MAX_ENTRIES = 5_000_000


# Builds the object that maps each layer's clusterings during ``fit``: ``_LayerRunner`` (a
# thread pool) unless ``mbn_core.mbn.backends.dask.use_dask`` set a factory for this context.
LayerRunnerFactory = Callable[[ThreadPoolExecutor, "ProgressCallback | None"], "_LayerRunner"]
layer_runner_factory: ContextVar[LayerRunnerFactory | None] = ContextVar(
    "mbn_layer_runner_factory", default=None
)


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
        intensity: NMI +0.03 on 5,000 MNIST digits, +0.013 on 70,000). Upper layers always
        count shared codes.
    output : {"auto", "pca", "spectral", "umap", "umap-bottom"}, default="auto"
        How the top of the network becomes the embedding. "pca": PCA of the top layer's
        one-hot codes (the paper). "spectral": the leading eigenvectors of the bottom x top
        co-association (rows alike when they share fine bottom cells and coarse top
        clusters), new rows placed by the Nystrom extension (see ``mbn_core.mbn.spectral``).
        It suits clustering more than maps: it separates thin manifolds (two moons) but
        pulls each cluster together, which lowers continuity. "umap": UMAP's layout of the
        same co-association (umap-learn), every row placed at the weighted mean of its 15
        most co-associated training rows' layout (see ``mbn_core.mbn.umap_output``); it
        separates thin manifolds and keeps neighbourhoods. Both keep the training rows'
        codes. "spectral" solves an eigenproblem over the whole co-association and refuses
        training sets whose co-association would hold more than 20 million pairs (about
        25,000 rows at k1 = n / 2; 10,000 at k1 = 2,000); "umap" keeps only each row's
        strongest pairs and takes any size. "umap-bottom": the same layout of the bottom
        layer's co-association alone, from a network of that one layer (``ks_`` has one
        entry): for thin manifolds, whose coarse layers merge the manifold's branches.
        It takes neither a number for ``delta`` nor more than one layer in ``ks``.
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
    device : {"cpu", "cuda", "auto"}, default="cpu"
        Where the layers are computed. "cuda" fits every layer on one NVIDIA GPU and
        encodes batches of more than a few rows there (needs the ``gpu`` extra, CuPy, and a
        visible GPU, else ``fit`` raises ValueError); "auto" uses a GPU when one is present.
        The codes and the embedding are the CPU's, bit for bit, on every device; sparse input
        stays on the CPU. ``device_`` says which was used.
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
    output_ : {"pca", "spectral", "umap", "umap-bottom"}
        The output used (chosen when ``output="auto"``).
    bottom_layer_ : BottomLayer
        The fitted bottom layer.
    upper_layers_ : list of UpperLayer
        The fitted upper layers, lowest first.
    explained_variance_ratio_ : ndarray of shape (n_components_,) or None
        Variance of the top codes explained by each embedding dimension (None unless
        ``output_`` is "pca").
    eigenvalues_ : ndarray of shape (n_components_,) or None
        Eigenvalues of the normalised co-association behind each embedding dimension,
        largest first (None unless ``output_`` is "spectral").
    n_features_in_ : int
        Number of input features.
    device_ : {"cpu", "cuda"}
        The device the fit ran on.

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
        "device": [StrOptions({"cpu", "cuda", "auto"})],
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
        device: str = "cpu",
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
        self.device = device
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
        return self._fit(X)[0]

    def fit_transform_leave_self_out(self, X) -> tuple[np.ndarray, np.ndarray]:
        """Fit the network; return the embedding of X and its leave-self-out embedding.

        A training row that is also a center matches itself at distance 0 (bottom layer) or
        shares all its codes with itself (upper layers), which no new row does. The
        leave-self-out embedding codes each training row with every center that is that row
        left out, layer after layer: a training row seen as new data, the target a student
        network (``CompressiveMBN``) should learn. It costs one more pass over the upper
        layers; the bottom layer's scores are shared.

        Returns
        -------
        embedding : ndarray of shape (n_samples, n_components_), float64
            Equal to ``fit_transform(X)``.
        left_out : ndarray of shape (n_samples, n_components_), float64
        """
        embedding, left_out = self._fit(X, leave_self_out=True)
        assert left_out is not None
        return embedding, left_out

    def _fit(self, X, leave_self_out: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        # A stopped or failed fit leaves the estimator exactly as it was.
        previous_state = dict(self.__dict__)
        try:
            return self._fit_network(X, leave_self_out)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(previous_state)
            raise

    def _fit_network(self, X, leave_self_out: bool) -> tuple[np.ndarray, np.ndarray | None]:
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
        if self.output == "spectral":
            pairs = expected_pairs(n_samples, self.n_clusterings, ks[0])
            if pairs > MAX_COASSOCIATION_PAIRS:
                raise ValueError(
                    f"output='spectral' would store about {pairs:,} co-association pairs for "
                    f"{n_samples} rows with k1={ks[0]} and n_clusterings={self.n_clusterings} "
                    f'(the limit is {MAX_COASSOCIATION_PAIRS:,}); use output="umap" or "pca", '
                    "fewer rows, more bottom centers or fewer clusterings"
                )
        device = _resolve_device(self.device)
        rng = check_random_state(self.random_state)
        n_chosen = self._n_bottom_features(X, rng)
        n_threads = _effective_threads(self.n_jobs)
        factory = layer_runner_factory.get() or _device_runner(device)

        with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(n_threads) as pool:
            runner = factory(pool, self.callback)
            bottom, codes, left_codes = self._fit_bottom(
                X, ks[0], n_chosen, rng, runner, leave_self_out
            )
            bottom_codes, bottom_left_codes = codes, left_codes
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
                layer, codes, left_codes = self._fit_upper(
                    codes, left_codes, ks[index - 1], k, rng, runner, index
                )
                upper.append(layer)
            top: _Top | SpectralTop | UmapTop
            if output in ("spectral", "umap", "umap-bottom"):
                seed = rng.randint(np.iinfo(np.int32).max)
                if output == "spectral":
                    top, embedding = fit_spectral(bottom_codes, codes, ks[0], n_components, seed)
                else:  # "umap-bottom" lays out the bottom layer's co-association alone
                    top_codes = None if output == "umap-bottom" else codes
                    top, embedding = fit_umap(
                        bottom_codes, top_codes, ks[0], n_components, seed,
                        _output_progress(self.callback),
                    )  # fmt: skip
                left_out = None
                if left_codes is not None:
                    left_out = top.embed(bottom_left_codes, left_codes, exclude_self=True)
            else:
                top = _fit_top(codes, ks[-1], n_components, rng)
                embedding = _project(codes, top)
                left_out = None if left_codes is None else _project(left_codes, top)

        self.ks_ = list(ks)
        self.device_ = device
        if delta is None and self.ks is None and output != "umap-bottom":
            delta = 0.5 if self.delta == "auto" else float(self.delta)
        self.delta_ = delta
        self.output_ = output
        self.n_components_ = n_components
        self.bottom_layer_ = bottom
        self.upper_layers_ = upper
        self.top_ = top
        self._set_output_attributes()
        return embedding, left_out

    def _set_output_attributes(self) -> None:
        top = self.top_
        self.explained_variance_ratio_: np.ndarray | None
        self.eigenvalues_: np.ndarray | None
        if isinstance(top, SpectralTop):
            self.explained_variance_ratio_, self.eigenvalues_ = None, top.eigenvalues
        elif isinstance(top, UmapTop):
            self.explained_variance_ratio_, self.eigenvalues_ = None, None
        else:
            self.explained_variance_ratio_, self.eigenvalues_ = top.explained_variance_ratio, None

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

    def _fit_bottom(self, X, k, n_chosen, rng, runner, leave_self_out):
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
        if not leave_self_out:
            return layer, runner.bottom_codes(layer, X, smallest_uint(k - 1)), None
        codes, left_codes = runner.bottom_codes_leave_self_out(
            layer, X, centers, smallest_uint(k - 1)
        )
        return layer, codes, left_codes

    def _fit_upper(self, codes, left_codes, n_values, k, rng, runner, index):
        n_samples = codes.shape[0]
        V = self.n_clusterings
        fraction = self._upper_fraction()
        centers = np.stack([rng.choice(n_samples, k, replace=False) for _ in range(V)])
        seeds = rng.randint(0, 2**63, size=V, dtype=np.int64).astype(np.uint64)
        clusterings = UpperClusterings(centers.astype(np.int32), seeds, n_values, fraction)
        new_left = None
        if left_codes is None:
            new_codes = runner.upper_codes(index, codes, clusterings, smallest_uint(k - 1))
        else:
            new_codes, new_left = runner.upper_codes_leave_self_out(
                index, codes, left_codes, clusterings, smallest_uint(k - 1)
            )
        rows, local = np.unique(centers, return_inverse=True)
        layer = UpperLayer.create(
            centers=local.reshape(V, k).astype(smallest_uint(len(rows) - 1)),
            center_codes=codes[rows].astype(smallest_uint(n_values - 1)),
            seeds=seeds,
            n_values=n_values,
            feature_fraction=fraction,
        )
        return layer, new_codes, new_left

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
        if codes.shape[0] > FEW_ROWS and _resolve_device(self.device) == "cuda":
            from mbn_core.mbn.backends.cuda import project

            return project(codes, self.top_.table, self.top_.offset)
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
        dense = not sp.issparse(X) and not sp.issparse(bottom.center_data)
        if n_samples > FEW_ROWS and dense and _resolve_device(self.device) == "cuda":
            from mbn_core.mbn.backends.cuda import encode_layers

            return encode_layers(bottom, self.upper_layers_, X, depth)
        if n_samples <= FEW_ROWS and not sp.issparse(X) and bottom.few_rows_supported:
            # A request of a few rows: one pass over each layer's centers, on this thread.
            codes = bottom.codes_few(np.asarray(X, dtype=np.float32), input_row_norms(X))
            bottom_codes = codes
            for layer in self.upper_layers_[: depth - 1]:
                codes = layer.codes_few(codes)
            return bottom_codes, codes
        n_threads = _effective_threads(self.n_jobs)
        X_work = bottom_input(X, bottom)
        with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(n_threads) as pool:
            runner = _LayerRunner(pool, None)
            bottom = self.bottom_layer_
            norms = input_row_norms(X)
            codes = runner.run_layer(
                0,
                len(bottom.centers),
                lambda v: bottom.clustering_codes(X_work, v, norms),
                n_samples,
                smallest_uint(bottom.n_centers - 1),
            )
            bottom_codes = codes
            for index, layer in enumerate(self.upper_layers_[: depth - 1], start=1):
                codes = _encode_upper(codes, layer, runner, index)
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


@dataclass(frozen=True)
class UpperClusterings:
    """The random choices of an upper layer's V clusterings during ``fit``.

    Attributes
    ----------
    centers : ndarray of shape (V, k), int32
        Each clustering's centers, as training points (rows of the previous layer's codes).
    seeds : ndarray of shape (V,), uint64
        Seeds of each clustering's choice of one-hot dimensions.
    n_values : int
        k of the previous layer.
    feature_fraction : float
    """

    centers: np.ndarray
    seeds: np.ndarray
    n_values: int
    feature_fraction: float

    def encoder(
        self, codes: np.ndarray, pool: ThreadPoolExecutor | None = None
    ) -> Callable[[int], np.ndarray]:
        """``encode(v)``: the codes of every training point for clustering v.

        Builds the layer's posting lists once (the shared, per-layer cost); each call then
        runs one clustering's kernel.
        """
        postings = Postings.build(codes, codes, self.n_values, centers_are_points=True, pool=pool)

        def encode(v: int) -> np.ndarray:
            return upper_clustering_codes(
                postings, codes, self.centers[v], self.n_values, self.seeds[v],
                self.feature_fraction,
            )  # fmt: skip

        return encode

    def left_out_encoder(
        self, codes: np.ndarray, left_codes: np.ndarray, pool: ThreadPoolExecutor | None = None
    ) -> Callable[[int], np.ndarray]:
        """``encode(v)``: the leave-self-out codes of every training point for clustering v.

        ``left_codes`` are the points' previous-layer leave-self-out codes; the centers keep
        their own (in-sample) ``codes``, as the fitted layer stores them, and no point may
        take a center that is itself.
        """
        postings = Postings.build(left_codes, codes, self.n_values, pool=pool)

        def encode(v: int) -> np.ndarray:
            return upper_clustering_codes(
                postings, codes, self.centers[v], self.n_values, self.seeds[v],
                self.feature_fraction, exclude_self=True,
            )  # fmt: skip

        return encode


def bottom_encoder(
    layer: BottomLayer, X, norms: np.ndarray | None = None
) -> Callable[[int], np.ndarray]:
    """``encode(v)``: the codes of every row of X for bottom clustering v.

    X is the validated input (dense or CSR); its float32 working copy, shared by all
    clusterings, is built here once, and so are its row norms unless given.
    """
    X_work = bottom_input(X, layer)
    if norms is None:
        norms = input_row_norms(X)
    return lambda v: layer.clustering_codes(X_work, v, norms)


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


class _LayerRunner:
    """Runs a layer's clusterings on a thread pool, reporting progress to the callback.

    ``bottom_codes`` and ``upper_codes`` are what ``fit`` calls per layer; a subclass can map
    the same per-clustering kernels elsewhere (``mbn_core.mbn.backends.dask``).
    """

    def __init__(self, pool: ThreadPoolExecutor, callback: ProgressCallback | None) -> None:
        self.pool = pool
        self.callback = callback

    def bottom_codes(
        self, layer: BottomLayer, X, code_dtype: type[np.unsignedinteger]
    ) -> np.ndarray:
        """(n, V) codes of the training data X for the bottom layer."""
        encode = bottom_encoder(layer, X)
        return self.run_layer(0, len(layer.centers), encode, X.shape[0], code_dtype)

    def upper_codes(
        self,
        index: int,
        codes: np.ndarray,
        clusterings: UpperClusterings,
        code_dtype: type[np.unsignedinteger],
    ) -> np.ndarray:
        """(n, V) codes of upper layer ``index`` from the previous layer's (n, V_prev) codes."""
        encode = clusterings.encoder(codes, self.pool)
        n_clusterings = len(clusterings.centers)
        return self.run_layer(index, n_clusterings, encode, codes.shape[0], code_dtype)

    def bottom_codes_leave_self_out(
        self, layer: BottomLayer, X, centers: np.ndarray, code_dtype: type[np.unsignedinteger]
    ) -> tuple[np.ndarray, np.ndarray]:
        """``bottom_codes`` and the leave-self-out codes: in clustering v, training row
        ``centers[v, j]`` may not take center j (one GEMM per clustering gives both)."""
        X_work = bottom_input(X, layer)
        norms = input_row_norms(X)
        n_rows, (n_clusterings, k) = X.shape[0], centers.shape
        left = np.empty((n_rows, n_clusterings), dtype=code_dtype)

        # Sparse rows against sparse centers take the masked route, as bottom_codes does.
        sparse = sp.issparse(X_work) and sp.issparse(layer.center_data)
        sparse = sparse and layer.shift_masks is None

        def encode(v: int) -> np.ndarray:
            exclude = np.full(n_rows, -1, dtype=np.int64)
            exclude[centers[v]] = np.arange(k)
            if sparse:
                codes, left[:, v] = bottom_codes_sparse_leave_self_out(
                    X_work, layer, v, norms, exclude
                )
                return codes
            if isinstance(X_work, IntegerRows):
                features, values = layer.features(v), layer.center_values(v)
                codes, left[:, v] = integer_codes(X_work, features, values, layer.metric, exclude)
                return codes
            codes, left[:, v] = bottom_codes_leave_self_out(
                X_work, layer.features(v), layer.center_values(v), layer.metric, norms, exclude
            )
            return codes

        return self.run_layer(0, n_clusterings, encode, n_rows, code_dtype), left

    def upper_codes_leave_self_out(
        self,
        index: int,
        codes: np.ndarray,
        left_codes: np.ndarray,
        clusterings: UpperClusterings,
        code_dtype: type[np.unsignedinteger],
    ) -> tuple[np.ndarray, np.ndarray]:
        """``upper_codes`` and, from the previous layer's leave-self-out ``left_codes``,
        this layer's (both clusterings run in one task, so progress counts them once)."""
        encode = clusterings.encoder(codes, self.pool)
        encode_left = clusterings.left_out_encoder(codes, left_codes, self.pool)
        n_rows, n_clusterings = codes.shape[0], len(clusterings.centers)
        left = np.empty((n_rows, n_clusterings), dtype=code_dtype)

        def both(v: int) -> np.ndarray:
            left[:, v] = encode_left(v)
            return encode(v)

        return self.run_layer(index, n_clusterings, both, n_rows, code_dtype), left

    def stop_message(self, layer: int, done: int, n_clusterings: int) -> str:
        return (
            f"training stopped by the callback in layer {layer} after {done} "
            f"of {n_clusterings} clusterings"
        )

    def run_layer(
        self,
        layer: int,
        n_clusterings: int,
        encode: Callable[[int], np.ndarray],
        n_rows: int,
        code_dtype: type[np.unsignedinteger],
    ) -> np.ndarray:
        codes = np.empty((n_rows, n_clusterings), dtype=code_dtype)
        stopped = False

        def task(v: int) -> None:
            if not stopped:
                codes[:, v] = encode(v)

        futures: list[Future[None]] = [self.pool.submit(task, v) for v in range(n_clusterings)]
        try:
            for done, future in enumerate(futures, start=1):
                future.result()
                if self.callback is not None and self.callback(layer, done, n_clusterings):
                    stopped = True
                    raise TrainingStopped(self.stop_message(layer, done, n_clusterings))
        finally:
            for future in futures:
                future.cancel()
        return codes


def _encode_upper(codes, layer: UpperLayer, runner: _LayerRunner, index: int) -> np.ndarray:
    center_codes = layer.center_codes
    n_clusterings = len(layer.centers)
    postings: Postings | PointPostings
    if PointPostings.cheaper(
        codes.shape[0],
        center_codes.shape[0],
        layer.n_values,
        layer.n_centers,
        n_clusterings,
        layer.feature_fraction,
    ):
        postings = PointPostings.build(codes, center_codes, layer.n_values)
    else:
        postings = Postings.build(codes, center_codes, layer.n_values, pool=runner.pool)
    centers = layer.centers.astype(np.int32)

    def encode(v: int) -> np.ndarray:
        return upper_clustering_codes(
            postings,
            center_codes,
            centers[v],
            layer.n_values,
            layer.seeds[v],
            layer.feature_fraction,
        )

    return runner.run_layer(
        index, n_clusterings, encode, codes.shape[0], smallest_uint(layer.n_centers - 1)
    )


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


def float32_csr(X) -> sp.csr_matrix:
    """Sparse X as the bottom layer reads it: float32 CSR with sorted indices."""
    X = sp.csr_matrix(X, dtype=np.float32)
    X.sort_indices()
    return X


def _resolve_device(device: str) -> str:
    """ "cpu" or "cuda" for the ``device`` parameter (ValueError when "cuda" cannot run)."""
    if device == "cpu":
        return "cpu"
    from mbn_core.mbn.backends.cuda import resolve_device

    return resolve_device(device)


def _device_runner(device: str) -> LayerRunnerFactory:
    if device == "cpu":
        return _LayerRunner
    from mbn_core.mbn.backends.cuda import runner_factory

    return runner_factory()


def _effective_threads(n_jobs: int | None) -> int:
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    available = available or 1
    if n_jobs is None:
        return available
    if n_jobs < 0:
        return max(1, available + 1 + n_jobs)
    return int(n_jobs)


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
    if isinstance(top, SpectralTop):
        arrays.update(_codes_arrays("spectral", top))
        arrays["spectral.basis"] = top.basis
        arrays["spectral.eigenvalues"] = top.eigenvalues
    elif isinstance(top, UmapTop):
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
    top: _Top | SpectralTop | UmapTop
    if output == "spectral":
        top = _spectral_top(get, ks, V)
    elif output in ("umap", "umap-bottom"):
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
    """The training rows' bottom and top codes that the spectral and UMAP outputs keep."""
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


def _spectral_top(get: Callable[[str], np.ndarray], ks: list[int], V: int) -> SpectralTop:
    bottom_codes, top_codes = _training_codes(get, "spectral", ks, V)
    basis = np.ascontiguousarray(get("spectral.basis"), dtype=np.float64)
    eigenvalues = np.asarray(get("spectral.eigenvalues"), dtype=np.float64)
    if eigenvalues.ndim != 1 or eigenvalues.size < 1:
        raise ValueError(f"model array 'spectral.eigenvalues' has shape {eigenvalues.shape}")
    _expect_shape("spectral.basis", basis, (len(bottom_codes), eigenvalues.size))
    if not (np.isfinite(basis).all() and np.isfinite(eigenvalues).all()):
        raise ValueError("model arrays 'spectral.basis' and 'spectral.eigenvalues' must be finite")
    return SpectralTop.restore(
        bottom_codes=bottom_codes,
        top_codes=top_codes,
        n_bottom_values=ks[0],
        basis=basis,
        eigenvalues=eigenvalues,
    )


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
