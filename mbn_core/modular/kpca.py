"""Modular kernel PCA trained module by module (Reeve, Mu & Brown, "Modular Dimensionality
Reduction"), as a scikit-learn transformer. The algorithm and its corrected formulas are in
docs/MODULAR_KPCA.md.
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from mbn_core.exceptions import TrainingStopped
from mbn_core.modular import _mbm
from mbn_core.modular.evaluation import input_neighbours, modular_neighbours, retrieval_precision
from mbn_core.modular.kernel_map import (
    KernelFeatures,
    LandmarkMap,
    fit_kernel_features,
    map_from_arrays,
    map_to_arrays,
)
from mbn_core.params import Interval, StrOptions, fit_context
from mbn_core.utils.blas import one_blas_thread

ProgressCallback = Callable[[int, int, int], object]

# λ candidates of diversity="validate" (the paper's grid).
DIVERSITY_GRID = (0.0, 0.2, 0.5, 0.8, 0.9, 0.95, 0.99, 0.999, 1.0)
# diversity="validate" holds out this share of the rows (at most _MAX_VALIDATION) as queries.
_VALIDATION_SHARE = 1 / 6
_MAX_VALIDATION = 2000
_VALIDATION_KAPPA = 10


class LandmarkMapTransformer(TransformerMixin, BaseEstimator):
    """Shared inference of the estimators that end in a ``LandmarkMap`` (``map_``)."""

    map_: LandmarkMap

    def transform(self, X):
        """Embed X with the fitted map.

        Exact (float64), deterministic and batch independent: row i of ``transform(X)``
        equals ``transform(X[i:i+1])[0]`` bit for bit.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        embedding : ndarray of shape (n_samples, n_components_)
            The modules' outputs side by side, times ``n_modules ** -0.5`` for modular maps,
            so Euclidean distance is the paper's re-ranking distance.
        """
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, order="C", reset=False)
        return self.map_.transform(X)

    def transform_modules(self, X) -> np.ndarray:
        """Per-module embeddings φ_m(X), shape (n_samples, n_modules, module_dim)."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, order="C", reset=False)
        return self.map_.transform_modules(X)

    @property
    def n_components_(self) -> int:
        check_is_fitted(self)
        return self.map_.n_components

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "map_")


class ModularKPCA(LandmarkMapTransformer):
    """Modular kernel PCA: M small kernel-PCA modules made complementary by a diversity weight.

    Each module φ_m maps x to ``module_dim`` coordinates, a linear map of centred Nyström
    features of a Gaussian kernel. The modules jointly minimise the modular inner-product
    loss (1 - λ) mean_m L(φ_m) + λ L(Φ̄), where L is the mean squared error of the modules'
    inner products against the kernel and Φ̄ the modules side by side: λ = 0 makes every
    module the same top kernel PCA, λ = 1 splits the top ``n_modules * module_dim``
    components among them. Training is the paper's module-by-module (MBM) optimiser: each
    step solves one module exactly with an eigendecomposition, so there is no learning rate
    and the loss never increases.

    Parameters
    ----------
    n_modules : int, default=15
        Number of modules M.
    module_dim : int, default=20
        Dimensions per module H; the embedding has M * H.
    diversity : float in [0, 1] or "validate", default=0.99
        Diversity weight λ. "validate" holds out a sixth of the rows (at most 2,000) as
        queries and picks from ``DIVERSITY_GRID`` the λ with the best label-free retrieval
        precision (κ = 10, neighbours in input space), then refits on every row.
    n_landmarks : int, default=1000
        Nyström rank R (landmarks drawn uniformly from the training rows); capped at
        n_samples.
    gamma : float > 0 or "auto", default="auto"
        Width of the Gaussian kernel exp(-gamma d^2), d the Euclidean distance. "auto" is
        the Kwok-Tsang heuristic 1 / (mean squared distance between training rows).
    epsilon : float > 0, default=1e-6
        Proximal weight of each block step (keeps the descent strict; smaller is faster).
    max_epochs : int, default=200
        Epochs (passes over all modules) at most.
    tol : float >= 0, default=1e-6
        Stop when an epoch lowers the loss by at most ``tol`` times the loss.
    random_state : int, RandomState instance or None, default=None
        Seed of the landmarks and the initial modules. The same seed gives the same model.
    callback : callable, default=None
        Called as ``callback(epoch, module, n_modules)`` after each module update, with the
        0-based epoch and the modules updated so far in it (also during the candidate fits
        of ``diversity="validate"``, whose epochs count from 0 again). Returning True
        stops training: ``fit`` raises ``TrainingStopped`` and the estimator stays as it
        was.

    Attributes
    ----------
    map_ : LandmarkMap
        The exact embedding: landmarks, gamma, the folded linear map and its offset.
    gamma_ : float
        Kernel width used.
    diversity_ : float
        λ used (the chosen one with "validate").
    validation_scores_ : dict or None
        Retrieval precision of each λ candidate with "validate", else None.
    rank_ : int
        Rank ρ of the centred Nyström features (the compressed problem's size).
    loss_curve_ : list of float
        Modular inner-product loss L^λ (mean over pairs of training points) at the random
        start and after each epoch; never increasing.
    n_iter_ : int
        Epochs run.
    n_components_ : int
        n_modules * module_dim.
    n_features_in_ : int
        Number of input features.

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from mbn_core import ModularKPCA
    >>> X, _ = load_digits(return_X_y=True)
    >>> model = ModularKPCA(n_modules=3, module_dim=4, n_landmarks=100, random_state=0)
    >>> model.fit_transform(X).shape
    (1797, 12)
    >>> model.transform_modules(X[:5]).shape
    (5, 3, 4)
    """

    _parameter_constraints: dict = {
        "n_modules": [Interval(Integral, 1, None, closed="left")],
        "module_dim": [Interval(Integral, 1, None, closed="left")],
        "diversity": [Interval(Real, 0, 1, closed="both"), StrOptions({"validate"})],
        "n_landmarks": [Interval(Integral, 1, None, closed="left")],
        "gamma": [Interval(Real, 0, None, closed="neither"), StrOptions({"auto"})],
        "epsilon": [Interval(Real, 0, None, closed="neither")],
        "max_epochs": [Interval(Integral, 0, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "random_state": ["random_state"],
        "callback": [callable, None],
    }

    def __init__(
        self,
        n_modules: int = 15,
        module_dim: int = 20,
        diversity: float | str = 0.99,
        n_landmarks: int = 1000,
        gamma: float | str = "auto",
        epsilon: float = 1e-6,
        max_epochs: int = 200,
        tol: float = 1e-6,
        random_state: int | np.random.RandomState | None = None,
        callback: ProgressCallback | None = None,
    ) -> None:
        self.n_modules = n_modules
        self.module_dim = module_dim
        self.diversity = diversity
        self.n_landmarks = n_landmarks
        self.gamma = gamma
        self.epsilon = epsilon
        self.max_epochs = max_epochs
        self.tol = tol
        self.random_state = random_state
        self.callback = callback

    @fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Fit the modules to X.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data, at least 2 rows (12 with ``diversity="validate"``).
        y : ignored

        Returns
        -------
        self : ModularKPCA
        """
        X = validate_data(self, X, dtype=np.float64, order="C", ensure_min_samples=2)
        rng = check_random_state(self.random_state)
        scores: dict[float, float] | None = None
        # One BLAS thread for the whole fit: OpenBLAS splits some reductions (dot products,
        # LAPACK's inner steps) by its thread count, so the same rows gave a model that
        # differed in the last bits between one, two and three threads; one thread is the
        # count every machine has, and the MBM epochs already ran on it.
        with one_blas_thread():
            if self.diversity == "validate":
                diversity, scores = self._validate_diversity(X, rng)
            else:
                diversity = float(self.diversity)
            features = fit_kernel_features(X, self.n_landmarks, self.gamma, rng)
            factors, losses = self._optimise(features, diversity, rng)
            self.map_ = module_map(features, factors)
        n_pairs = float(features.n_samples) ** 2
        self.gamma_ = features.gamma
        self.diversity_ = diversity
        self.validation_scores_ = scores
        self.rank_ = features.rank
        self.loss_curve_ = [loss / n_pairs for loss in losses]
        self.n_iter_ = len(losses) - 1
        return self

    def _optimise(
        self, features: KernelFeatures, diversity: float, rng: np.random.RandomState
    ) -> tuple[np.ndarray, list[float]]:
        q = features.eigenvalues
        factors = _mbm.initial_factors(q, self.n_modules, self.module_dim, rng)
        callback = self.callback

        def on_update(epoch: int, module: int, _factors: np.ndarray) -> bool:
            return callback is not None and bool(callback(epoch, module + 1, self.n_modules))

        factors, losses, stopped = _mbm.optimise(
            q, factors, diversity, self.epsilon, self.max_epochs, self.tol, on_update
        )
        if stopped:
            raise TrainingStopped(
                f"training stopped by the callback in epoch {len(losses) - 1} "
                "(the estimator is unchanged)"
            )
        return factors, losses

    def _validate_diversity(
        self, X: np.ndarray, rng: np.random.RandomState
    ) -> tuple[float, dict[float, float]]:
        n = X.shape[0]
        n_queries = min(_MAX_VALIDATION, int(n * _VALIDATION_SHARE))
        if n_queries < 2:
            raise ValueError(
                f'diversity="validate" needs at least 12 samples to hold out queries, got {n}'
            )
        order = rng.permutation(n)
        fit_rows, query_rows = np.sort(order[n_queries:]), np.sort(order[:n_queries])
        X_fit, X_query = X[fit_rows], X[query_rows]
        kappa = min(_VALIDATION_KAPPA, len(fit_rows))
        truth = input_neighbours(X_fit, X_query, kappa)
        features = fit_kernel_features(X_fit, self.n_landmarks, self.gamma, rng)
        start = _mbm.initial_factors(
            features.eigenvalues, self.n_modules, self.module_dim, rng
        ).copy()
        scores: dict[float, float] = {}
        for diversity in DIVERSITY_GRID:
            factors = start.copy()
            factors, _, stopped = _mbm.optimise(
                features.eigenvalues,
                factors,
                diversity,
                self.epsilon,
                self.max_epochs,
                self.tol,
                self._validation_hook(),
            )
            if stopped:
                raise TrainingStopped(
                    f"training stopped by the callback while validating diversity={diversity}"
                )
            candidate = module_map(features, factors)
            retrieved = modular_neighbours(
                candidate.transform_modules(X_fit), candidate.transform_modules(X_query), kappa
            )
            scores[diversity] = retrieval_precision(retrieved, truth)
        best = max(scores.values())
        # The largest λ among equal scores: more diverse modules at no cost in precision.
        chosen = max(d for d, score in scores.items() if score == best)
        return chosen, scores

    def _validation_hook(self) -> _mbm.UpdateHook | None:
        callback = self.callback
        if callback is None:
            return None
        return lambda epoch, module, _f: bool(callback(epoch, module + 1, self.n_modules))


def module_map(features: KernelFeatures, factors: np.ndarray) -> LandmarkMap:
    """The exact map of compressed factors F_m (M, H, ρ): φ_m(x) = F_m Σ^{-1} U^T ψ_c(x).

    On a training point x_i this gives F_m v_i, the training embedding of the compressed
    problem (Ψ = U Σ V^T).
    """
    n_modules, module_dim, _ = factors.shape
    sigma = np.sqrt(features.eigenvalues)
    projection = (factors / sigma) @ features.eigenvectors.T if sigma.size else None
    if projection is None:  # constant features: every module is 0
        projection = np.zeros((n_modules, module_dim, features.mean.shape[0]))
    return features.landmark_map(
        projection.reshape(n_modules * module_dim, -1),
        n_modules=n_modules,
        module_dim=module_dim,
        scale=n_modules**-0.5,
    )


def modular_to_arrays(model: LandmarkMapTransformer) -> dict[str, np.ndarray]:
    """The fitted map of a ``ModularKPCA`` (or baseline) as plain arrays for a bundle.

    Hyper-parameters are not included: store ``get_params()`` (minus ``callback``) beside.
    """
    check_is_fitted(model)
    arrays = map_to_arrays(model.map_)
    if isinstance(model, ModularKPCA):
        arrays["loss_curve"] = np.asarray(model.loss_curve_, dtype=np.float64)
        arrays["diversity"] = np.array(model.diversity_, dtype=np.float64)
        arrays["rank"] = np.array(model.rank_, dtype=np.int64)
    return arrays


def modular_from_arrays(arrays: dict[str, np.ndarray], params: dict) -> ModularKPCA:
    """A fitted ``ModularKPCA`` from ``modular_to_arrays`` output and its ``get_params()``.

    ``transform`` of the result equals the original's bit for bit.
    """
    model = ModularKPCA(**{key: value for key, value in params.items() if key != "callback"})
    landmark_map = map_from_arrays(arrays)
    for name in ("loss_curve", "diversity", "rank"):
        if name not in arrays:
            raise ValueError(f"modular kernel PCA arrays are missing {name!r}")
    model.map_ = landmark_map
    model.n_features_in_ = landmark_map.n_features_in
    model.gamma_ = landmark_map.gamma
    model.diversity_ = float(arrays["diversity"])
    model.validation_scores_ = None
    model.rank_ = int(arrays["rank"])
    model.loss_curve_ = [float(v) for v in np.asarray(arrays["loss_curve"]).ravel()]
    model.n_iter_ = len(model.loss_curve_) - 1
    return model
