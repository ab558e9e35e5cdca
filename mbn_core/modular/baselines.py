"""The four baselines of "Modular Dimensionality Reduction" (Section 6.2), on the same features.

Every baseline is a linear map of the centred Nyström features ψ_c that ``ModularKPCA`` uses
(the same landmarks for the same ``random_state``), so it ends in the same exact
``LandmarkMap``, ``transform`` and ONNX export:

* ``"monolithic"``: one module, the top ``n_modules * module_dim`` kernel principal components
  (PCA of ψ_c, from the same covariance eigendecomposition as modular kernel PCA).
* ``"partition"``: those components, randomly permuted and split into modules of
  ``module_dim``.
* ``"bootstrap"``: module m is the ``module_dim``-dimensional PCA of ψ on a bootstrap sample
  of the rows, centred on that sample.
* ``"random"``: module m is a random ``module_dim`` x R matrix with unit-norm Gaussian rows.
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Integral, Real

import numpy as np
from sklearn.utils import check_random_state, resample
from sklearn.utils.validation import validate_data

from mbn_core.modular.kernel_map import KernelFeatures, LandmarkMap, fit_kernel_features
from mbn_core.modular.kpca import LandmarkMapTransformer
from mbn_core.params import Interval, StrOptions, fit_context
from mbn_core.utils.pca import fit_pca


def _top_components(features: KernelFeatures, count: int) -> np.ndarray:
    """The top ``count`` principal directions of ψ_c as rows (count x R), zero rows past ρ."""
    rows = np.zeros((count, features.mean.shape[0]))
    kept = min(count, features.rank)
    rows[:kept] = features.eigenvectors[:, :kept].T
    return rows


def monolithic(features: KernelFeatures, n_modules: int, module_dim: int, rng, X) -> LandmarkMap:
    """Top ``n_modules * module_dim`` kernel PCA as one module."""
    width = n_modules * module_dim
    return features.landmark_map(_top_components(features, width), 1, width, scale=1.0)


def partition(features: KernelFeatures, n_modules: int, module_dim: int, rng, X) -> LandmarkMap:
    """The top components, randomly permuted and split into modules."""
    width = n_modules * module_dim
    rows = _top_components(features, width)[rng.permutation(width)]
    return features.landmark_map(rows, n_modules, module_dim, scale=n_modules**-0.5)


def bootstrap(features: KernelFeatures, n_modules: int, module_dim: int, rng, X) -> LandmarkMap:
    """One PCA of ψ per bootstrap sample, each centred on its own sample."""
    psi = features.raw(X)
    n_samples, n_landmarks = psi.shape
    kept = min(module_dim, n_samples, n_landmarks)
    projections = np.zeros((n_modules, module_dim, n_landmarks))
    centres = np.zeros((n_modules, n_landmarks))
    for m in range(n_modules):
        sample = resample(psi, replace=True, n_samples=n_samples, random_state=rng)
        pca = fit_pca(sample, kept, random_state=rng)
        projections[m, :kept] = pca.components_
        centres[m] = pca.mean_
    return features.landmark_map(
        projections, n_modules, module_dim, scale=n_modules**-0.5, centre=centres
    )


def random_projection(
    features: KernelFeatures, n_modules: int, module_dim: int, rng, X
) -> LandmarkMap:
    """Random Gaussian rows of unit norm applied to ψ_c."""
    n_landmarks = features.mean.shape[0]
    rows = rng.standard_normal((n_modules * module_dim, n_landmarks))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return features.landmark_map(rows, n_modules, module_dim, scale=n_modules**-0.5)


Builder = Callable[[KernelFeatures, int, int, np.random.RandomState, np.ndarray], LandmarkMap]
BASELINES: dict[str, Builder] = {
    "monolithic": monolithic,
    "partition": partition,
    "bootstrap": bootstrap,
    "random": random_projection,
}


class ModularBaseline(LandmarkMapTransformer):
    """A baseline of modular kernel PCA (``BASELINES``), on the same Nyström features.

    Parameters
    ----------
    method : {"monolithic", "partition", "bootstrap", "random"}, default="partition"
        The baseline (module docstring).
    n_modules, module_dim : int, default=15, 20
        As in ``ModularKPCA``; "monolithic" has one module of ``n_modules * module_dim``.
    n_landmarks : int, default=1000
        Nyström rank R, capped at n_samples.
    gamma : float > 0 or "auto", default="auto"
        Gaussian kernel width, as in ``ModularKPCA``.
    random_state : int, RandomState instance or None, default=None
        Seed. The same integer seed as a ``ModularKPCA`` gives the same landmarks.

    Attributes
    ----------
    map_ : LandmarkMap
        The exact embedding.
    gamma_ : float
        Kernel width used.
    n_components_ : int
        n_modules * module_dim.
    n_features_in_ : int
        Number of input features.

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from mbn_core.modular.baselines import ModularBaseline
    >>> X, _ = load_digits(return_X_y=True)
    >>> model = ModularBaseline("random", n_modules=3, module_dim=4, n_landmarks=100)
    >>> model.fit(X).transform_modules(X[:2]).shape
    (2, 3, 4)
    """

    _parameter_constraints: dict = {
        "method": [StrOptions(set(BASELINES))],
        "n_modules": [Interval(Integral, 1, None, closed="left")],
        "module_dim": [Interval(Integral, 1, None, closed="left")],
        "n_landmarks": [Interval(Integral, 1, None, closed="left")],
        "gamma": [Interval(Real, 0, None, closed="neither"), StrOptions({"auto"})],
        "random_state": ["random_state"],
    }

    def __init__(
        self,
        method: str = "partition",
        n_modules: int = 15,
        module_dim: int = 20,
        n_landmarks: int = 1000,
        gamma: float | str = "auto",
        random_state: int | np.random.RandomState | None = None,
    ) -> None:
        self.method = method
        self.n_modules = n_modules
        self.module_dim = module_dim
        self.n_landmarks = n_landmarks
        self.gamma = gamma
        self.random_state = random_state

    @fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Fit the baseline to X (array-like (n_samples, n_features), at least 2 rows)."""
        X = validate_data(self, X, dtype=np.float64, order="C", ensure_min_samples=2)
        rng = check_random_state(self.random_state)
        features = fit_kernel_features(X, self.n_landmarks, self.gamma, rng)
        self.map_ = BASELINES[self.method](features, self.n_modules, self.module_dim, rng, X)
        self.gamma_ = features.gamma
        return self
