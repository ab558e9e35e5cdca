"""Centred Nyström features of a Gaussian kernel, and the exact landmark map they lead to.

Every method of "Modular Dimensionality Reduction" (modular kernel PCA and its four
baselines) ends as a linear map of the same centred features ψ_c(x) = ψ(x) - ψ̄, with
ψ(x) = K_ZZ^{-1/2} k(Z, x) the rank-R Nyström map of scikit-learn's ``Nystroem``. Folding
K_ZZ^{-1/2} and ψ̄ into the linear map leaves one function of two steps,

    x -> scale * (A exp(-γ |x - z_r|^2)_r - b),

which ``LandmarkMap`` evaluates exactly (float64, batch independent) and ``modular_onnx``
exports as the fast path.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import scipy.linalg
from sklearn.kernel_approximation import Nystroem

from mbn_core.modular import _rbf_kernels

# Eigenvalues of the feature covariance below this fraction of the largest are dropped
# (Prop. 5's rank ρ): their directions carry rounding noise, and W = F Σ^{-1} would amplify it.
RCOND = 1e-10
# Rows per block when streaming Nyström features (bounds memory to ~ rows x R floats).
_CHUNK_ROWS = 2048
# Rows per thread task of the exact map.
_MAP_BLOCK = 256


def kwok_tsang_gamma(X: np.ndarray) -> float:
    """γ = 1 / (mean squared distance between training points), the Kwok-Tsang heuristic.

    The mean over all ordered pairs equals twice the summed per-dimension variance, so this
    costs one pass over X. Constant data (distance 0) gets γ = 1.
    """
    mean_sq_distance = 2.0 * float(np.sum(np.var(X, axis=0, dtype=np.float64)))
    return 1.0 / mean_sq_distance if mean_sq_distance > 0 else 1.0


@dataclass(frozen=True)
class LandmarkMap:
    """The exact embedding ``x -> scale * (weights @ k(Z, x) - offset)`` with an RBF kernel.

    Attributes
    ----------
    landmarks : ndarray (R, d)
        The Nyström landmarks Z.
    gamma : float
        Kernel width: k(x, z) = exp(-gamma |x - z|^2).
    weights : ndarray (D, R)
        The linear map with K_ZZ^{-1/2} folded in, D = n_modules * module_dim.
    offset : ndarray (D,)
        The linear map applied to the training mean of the features.
    n_modules, module_dim : int
        The D outputs are ``n_modules`` consecutive blocks of ``module_dim``.
    scale : float
        Factor on every output: M^{-1/2} for modular maps, so that Euclidean distance on the
        concatenation is the paper's re-ranking distance; 1 for the monolithic map.
    """

    landmarks: np.ndarray
    gamma: float
    weights: np.ndarray
    offset: np.ndarray
    n_modules: int
    module_dim: int
    scale: float

    @property
    def n_features_in(self) -> int:
        return int(self.landmarks.shape[1])

    @property
    def n_components(self) -> int:
        return int(self.weights.shape[0])

    def transform(self, X: np.ndarray) -> np.ndarray:
        """Embedding of X (validated float64, C-contiguous), float64 (n, D); batch independent."""
        n = X.shape[0]
        out = np.empty((n, self.n_components))
        landmarks_t = np.ascontiguousarray(self.landmarks.T)
        weights_t = np.ascontiguousarray(self.weights.T)
        X = np.ascontiguousarray(X, dtype=np.float64)

        def run(start: int) -> None:
            _rbf_kernels.rbf_linear_map(
                X,
                landmarks_t,
                float(self.gamma),
                weights_t,
                self.offset,
                float(self.scale),
                out,
                start,
                min(start + _MAP_BLOCK, n),
            )

        starts = range(0, n, _MAP_BLOCK)
        if n <= _MAP_BLOCK:
            for start in starts:
                run(start)
        else:
            with ThreadPoolExecutor(_n_threads()) as pool:
                list(pool.map(run, starts))
        return out

    def transform_modules(self, X: np.ndarray) -> np.ndarray:
        """Per-module embeddings φ_m(x) (without ``scale``), shape (n, n_modules, module_dim)."""
        blocks = self.transform(X) / self.scale
        return blocks.reshape(X.shape[0], self.n_modules, self.module_dim)


@dataclass(frozen=True)
class KernelFeatures:
    """Centred Nyström features of the training set and their covariance spectrum (Prop. 5).

    ``eigenvalues`` (descending, the ρ kept ones) and ``eigenvectors`` (R x ρ) are those of
    C = Σ_i ψ_c(x_i) ψ_c(x_i)^T; with Ψ = U Σ V^T, they are Σ^2 and U, so the compressed
    problem's Gram matrix is Q = diag(eigenvalues).
    """

    nystroem: Nystroem
    gamma: float
    mean: np.ndarray
    eigenvalues: np.ndarray
    eigenvectors: np.ndarray
    n_samples: int

    @property
    def rank(self) -> int:
        return int(self.eigenvalues.shape[0])

    def raw(self, X: np.ndarray) -> np.ndarray:
        """Uncentred Nyström features ψ(X), (n, R)."""
        return np.asarray(self.nystroem.transform(X), dtype=np.float64)

    def centred(self, X: np.ndarray) -> np.ndarray:
        """Centred features ψ_c(X) = ψ(X) - ψ̄, (n, R)."""
        return self.raw(X) - self.mean

    def landmark_map(
        self,
        projection: np.ndarray,
        n_modules: int,
        module_dim: int,
        scale: float,
        centre: np.ndarray | None = None,
    ) -> LandmarkMap:
        """The exact map x -> scale * projection @ (ψ(x) - centre), with K_ZZ^{-1/2} folded in.

        ``centre`` defaults to the training mean ψ̄ (Bootstrap modules use their sample's).
        """
        projection = np.asarray(projection, dtype=np.float64)
        centre = self.mean if centre is None else centre
        if projection.ndim == 3:  # (M, H, R) per-module projections
            offsets = np.einsum("mhr,mr->mh", projection, np.atleast_2d(centre)).ravel()
            projection = projection.reshape(-1, projection.shape[-1])
        else:
            offsets = projection @ centre
        normalization = np.asarray(self.nystroem.normalization_, dtype=np.float64)
        return LandmarkMap(
            landmarks=np.asarray(self.nystroem.components_, dtype=np.float64),
            gamma=float(self.gamma),
            weights=projection @ normalization,
            offset=offsets,
            n_modules=n_modules,
            module_dim=module_dim,
            scale=float(scale),
        )


def fit_kernel_features(
    X: np.ndarray, n_landmarks: int, gamma: float | str, random_state
) -> KernelFeatures:
    """Fit the Nyström map on X and stream the centred features' covariance (R x R).

    Prior validation is assumed: X is float64 (n, d) with n >= 2, ``random_state`` a
    RandomState (its first draws pick the landmarks, so methods given the same seed share
    them).
    """
    n_samples = X.shape[0]
    gamma_value = kwok_tsang_gamma(X) if gamma == "auto" else float(gamma)
    nystroem = Nystroem(
        kernel="rbf",
        gamma=gamma_value,
        n_components=min(int(n_landmarks), n_samples),
        random_state=random_state,
    ).fit(X)
    n_components = nystroem.components_.shape[0]
    # One pass, accumulated around the first block's mean (the shifted-data algorithm):
    # as accurate as a two-pass centred sum without computing the features twice.
    shift: np.ndarray | None = None
    total = np.zeros(n_components)
    scatter = np.zeros((n_components, n_components))
    for start in range(0, n_samples, _CHUNK_ROWS):
        block = np.asarray(nystroem.transform(X[start : start + _CHUNK_ROWS]), dtype=np.float64)
        if shift is None:
            shift = block.mean(axis=0)
        block -= shift
        total += block.sum(axis=0)
        scatter += block.T @ block
    assert shift is not None
    shifted_mean = total / n_samples
    covariance = scatter - n_samples * np.outer(shifted_mean, shifted_mean)
    covariance = 0.5 * (covariance + covariance.T)
    eigenvalues, eigenvectors = scipy.linalg.eigh(covariance)
    eigenvalues, eigenvectors = eigenvalues[::-1], eigenvectors[:, ::-1]
    top = eigenvalues[0] if eigenvalues.size else 0.0
    keep = int(np.sum(eigenvalues > RCOND * top)) if top > 0 else 0
    if keep == 0:
        raise ValueError("X: every row is the same, so the kernel has nothing to embed")
    return KernelFeatures(
        nystroem=nystroem,
        gamma=gamma_value,
        mean=shift + shifted_mean,
        eigenvalues=np.ascontiguousarray(eigenvalues[:keep]),
        eigenvectors=np.ascontiguousarray(eigenvectors[:, :keep]),
        n_samples=n_samples,
    )


def _n_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def map_to_arrays(landmark_map: LandmarkMap) -> dict[str, np.ndarray]:
    """Plain arrays that ``map_from_arrays`` turns back into the same map (no pickle)."""
    return {
        "landmarks": np.asarray(landmark_map.landmarks, dtype=np.float64),
        "gamma": np.array(landmark_map.gamma, dtype=np.float64),
        "weights": np.asarray(landmark_map.weights, dtype=np.float64),
        "offset": np.asarray(landmark_map.offset, dtype=np.float64),
        "modules": np.array([landmark_map.n_modules, landmark_map.module_dim], dtype=np.int64),
        "scale": np.array(landmark_map.scale, dtype=np.float64),
    }


def map_from_arrays(arrays: dict[str, np.ndarray]) -> LandmarkMap:
    """The map stored by ``map_to_arrays``; ValueError naming any missing or inconsistent array."""
    missing = sorted({"landmarks", "gamma", "weights", "offset", "modules", "scale"} - set(arrays))
    if missing:
        raise ValueError(f"landmark map arrays are missing {missing}")
    landmarks = np.asarray(arrays["landmarks"], dtype=np.float64)
    weights = np.asarray(arrays["weights"], dtype=np.float64)
    offset = np.asarray(arrays["offset"], dtype=np.float64)
    modules = np.asarray(arrays["modules"]).astype(np.int64).ravel()
    gamma, scale = float(arrays["gamma"]), float(arrays["scale"])
    if landmarks.ndim != 2 or weights.ndim != 2 or weights.shape[1] != landmarks.shape[0]:
        raise ValueError(
            f"weights {weights.shape} must be (D, R) for landmarks {landmarks.shape} (R, d)"
        )
    if offset.shape != (weights.shape[0],):
        raise ValueError(f"offset {offset.shape} must be ({weights.shape[0]},)")
    if modules.shape != (2,) or int(modules[0]) * int(modules[1]) != weights.shape[0]:
        raise ValueError(f"modules {modules.tolist()} must multiply to {weights.shape[0]}")
    if not (gamma > 0 and np.isfinite(gamma) and scale > 0 and np.isfinite(scale)):
        raise ValueError(f"gamma={gamma} and scale={scale} must be finite and positive")
    for name, array in (("landmarks", landmarks), ("weights", weights), ("offset", offset)):
        if not np.isfinite(array).all():
            raise ValueError(f"{name} contains NaN or infinity")
    return LandmarkMap(
        landmarks=landmarks,
        gamma=gamma,
        weights=weights,
        offset=offset,
        n_modules=int(modules[0]),
        module_dim=int(modules[1]),
        scale=scale,
    )
