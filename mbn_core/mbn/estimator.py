"""Multilayer Bootstrap Network estimator (scikit-learn API)."""

from __future__ import annotations

import copy
import functools
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from mbn_core.data.checks import check_magnitude
from mbn_core.exceptions import TrainingStopped
from mbn_core.mbn.backends import FIT, TRANSFORM, ProgressCallback, choose_backend
from mbn_core.mbn.backends.base import DEVICE_CHOICES
from mbn_core.mbn.bottom import BottomLayer, canonical_sparse, input_row_norms
from mbn_core.mbn.layer_draws import DrawsAhead, draw_upper, fit_upper_layer
from mbn_core.mbn.network import MAX_LAYERS, Network
from mbn_core.mbn.outputs import AUTO, FittedOutput, OutputProgress, get_output, output_names
from mbn_core.mbn.phases import phase
from mbn_core.mbn.plan import Plan, settle
from mbn_core.mbn.upper import UpperLayer
from mbn_core.params import CheckedParams, Interval, RealNotInt, StrOptions, check_int_items
from mbn_core.utils.blas import one_blas_thread

METRICS = ("euclidean", "cosine")
OUTPUTS = (AUTO, *output_names())
# Requests of up to this many dense rows are encoded straight from the stored centers
# (``BottomLayer.codes_few``, ``UpperLayer.codes_few``), on the calling thread; larger
# batches share GEMMs and posting lists between their rows. About where the two cost the same
# per row on an MNIST model (k = 2000 bottom centers): the GEMM path pays a fixed cost for
# gathering every clustering's centers that fewer rows do not recover.
FEW_ROWS = 64


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
        training rows' layout (see ``mbn_core.mbn.outputs.umap``); it separates thin manifolds
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
    device : {"cpu", "cuda", "auto"}, default="cpu"
        Where the layers are computed. "cuda" fits every layer on one NVIDIA GPU and
        encodes batches of more than a few rows there (the "cuda" backend: needs the ``gpu``
        extra, CuPy, and a visible GPU, else ``fit`` raises ValueError); "auto" uses a GPU
        when one is present. "cpu" runs the layers on this machine's threads (or on the
        backend ``use_backend`` set). The codes and the embedding are the same bit for bit on
        every device; sparse input stays on the CPU. ``device_`` says which was used.
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
    device_ : {"cpu", "cuda"}
        The device the fit ran on.
    fallbacks_ : list of str
        What the fit computed elsewhere than ``device_``, a sentence each (on a GPU, sparse
        input's bottom layer runs on the CPU); empty when nothing was.

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
        "device": [StrOptions(set(DEVICE_CHOICES))],
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

    def plan(self, X) -> Plan:
        """What ``fit(X)`` will build, every "auto" choice settled, without fitting.

        Side-effect free: the estimator is left as it was (a ``RandomState`` given as
        ``random_state`` is copied, not advanced), and ``fit`` reaches the same choices by the
        same code (``mbn_core.mbn.plan.settle``): with an int ``random_state``, ``plan(X).ks``
        is the fitted ``ks_``, and likewise ``delta_``, ``output_`` and ``n_components_``.
        With ``random_state=None`` each call draws anew, so the plan may differ from a fit.

        ``feature_fraction="auto"`` is measured on a sample of the rows, quickly.
        ``delta="auto"`` and ``output="auto"`` are measured on the bottom layer's codes, so
        planning them costs a fit of the bottom layer (most of a fit's time on wide data),
        whose result is then dropped; given values cost nothing.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)
            The training data ``fit`` would get.

        Returns
        -------
        plan : Plan
            ``str(plan)`` reads as a short report.
        """
        self._validate_params()
        network = self.network()
        network.check_output_layers()
        X = check_array(
            X, accept_sparse="csr", dtype=[np.float64, np.float32], ensure_min_samples=2
        )
        X = canonical_sparse(X)
        check_magnitude(X)
        seed = self.random_state
        rng = check_random_state(
            copy.deepcopy(seed) if isinstance(seed, np.random.RandomState) else seed
        )
        backend = choose_backend(FIT, self.device).factory(n_jobs=self.n_jobs)
        with backend:
            return settle(network, X, rng, backend, keep_bottom=False).plan

    def network(self) -> Network:
        """The network these parameters describe, before any data: its layer sizes, the
        features each clustering chooses, the embedding's dimension (see ``Network``)."""
        return Network(
            n_clusterings=self.n_clusterings,
            feature_fraction=self.feature_fraction,
            k1=self.k1,
            delta=self.delta,
            n_classes=self.n_classes,
            ks=self.ks,
            k_max=self.k_max,
            output=self.output,
            n_components=self.n_components,
            metric=self.metric,
            shift_fraction=self.shift_fraction,
        )

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
        network = self.network()
        network.check_output_layers()
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
        rng = check_random_state(self.random_state)
        backend = choose_backend(FIT, self.device).factory(
            n_jobs=self.n_jobs, callback=self.callback
        )
        with backend:
            settled = settle(network, X, rng, backend, keep_bottom=True)
            plan, bottom, codes = settled.plan, settled.bottom, settled.bottom_codes
            assert bottom is not None and codes is not None
            bottom_codes, ks, output = codes, list(plan.ks), plan.output
            fit_plan = getattr(self.callback, "fit_plan", None)
            if fit_plan is not None and fit_plan(list(ks), output):  # "auto" settles them here
                raise TrainingStopped("training stopped by the callback after the bottom layer")
            # One BLAS thread (as while settling): the backend's workers do not oversubscribe
            # the cores, and the top's PCA sums in the same order wherever the layers ran.
            with one_blas_thread():
                upper: list[UpperLayer] = []
                fraction = network.upper_feature_fraction
                draw = functools.partial(draw_upper, self.n_clusterings, plan.n_samples, rng)
                with DrawsAhead(draw, ks[1:]) as draws, phase("upper"):
                    for index, drawn in enumerate(draws, start=1):
                        layer, codes = fit_upper_layer(
                            codes, ks[index - 1], drawn, fraction, backend, index
                        )
                        upper.append(layer)
                with phase("output"):
                    top, embedding = get_output(output).fit(
                        bottom_codes, codes, ks, plan.n_components, rng,
                        _output_progress(self.callback),
                    )  # fmt: skip
        set_fitted_state(
            self,
            FittedState(
                ks=ks,
                n_features_in=X.shape[1],
                delta=plan.delta,
                output=output,
                device=backend.device,
                fallbacks=tuple(backend.fallbacks),
                bottom_layer=bottom,
                upper_layers=upper,
                top=top,
            ),
        )
        return embedding

    def layer_sizes(self, n_samples: int, delta: float | None = None) -> list[int]:
        """Centers per layer that ``fit`` uses for ``n_samples`` training points.

        With ``delta="auto"`` the shrink factor is measured during ``fit`` (``delta_``);
        pass it as ``delta`` to get the sizes it chose. Without it, "auto" assumes 0.5,
        the choice of high-dimensional data. ``output="auto"`` may choose "umap-bottom",
        whose network is the first of these layers alone (``ks_``).
        """
        return self.network().layer_sizes(n_samples, delta)

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
        bottom_codes, codes = self._encode_layers(X, len(self.ks_))
        return self.top_.embed(bottom_codes, codes)

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
        backend = choose_backend(TRANSFORM, self.device).factory(n_jobs=self.n_jobs)
        with one_blas_thread(), backend:
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
            check_int_items(type(self).__name__, "ks", self.ks, 2, MAX_LAYERS)


@dataclass(frozen=True)
class FittedState:
    """Everything a fitted ``MBN`` holds besides its parameters: what ``fit`` computed, or
    what a saved model gives back (``mbn_core.mbn.persistence``)."""

    ks: list[int]
    n_features_in: int
    delta: float | None
    output: str
    device: str
    fallbacks: tuple[str, ...]
    bottom_layer: BottomLayer
    upper_layers: list[UpperLayer]
    top: FittedOutput


def set_fitted_state(model: MBN, state: FittedState) -> None:
    """Give ``model`` every fitted attribute its docstring lists, from ``state``: the one
    place they are set, by ``fit`` and by loading alike."""
    model.ks_ = list(state.ks)
    model.n_features_in_ = int(state.n_features_in)
    model.n_components_ = state.top.n_components
    model.delta_ = state.delta
    model.output_ = state.output
    model.device_ = state.device
    model.fallbacks_ = list(state.fallbacks)
    model.bottom_layer_ = state.bottom_layer
    model.upper_layers_ = list(state.upper_layers)
    model.top_ = state.top
    model.explained_variance_ratio_ = state.top.explained_variance_ratio


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
