"""What the compressor's MLP sees of an input row: an affine map fitted on the training rows.

Narrow input is standardised feature by feature, as any MLP's input is. Wide input, dense or
sparse, is projected onto its leading principal directions instead, with one scale for all of
them. That keeps the input's Euclidean geometry, which is what the teacher's distances
measure, and it leaves the MLP a first layer small enough to learn from a few thousand rows:
standardised pixels fed in full let the MLP fit the training rows' noise, and the projected
input tracks the teacher better on new rows with far fewer weights
(docs/decisions/0010-compressor-defaults.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from sklearn.preprocessing import StandardScaler

from mbn_core.utils.pca import fit_pca

# A feature whose training spread is tiny (a pixel that is almost always blank) would be
# blown up by a plain standard scaler on the rare test point where it is set; no feature is
# scaled by less than this fraction of the typical (median) feature spread.
_MIN_SCALE_FRACTION = 0.1
# Principal directions with less variance than this fraction of the largest are rounding
# noise of a low-rank input (or of having few rows): kept, they would get an arbitrary
# direction's values on new rows and shrink the shared scale.
_MIN_VARIANCE_FRACTION = 1e-6
# Up to this many features the principal directions come from the eigenvectors of the
# d x d covariance: exact, and quicker on a few thousand rows of MNIST's width (one BLAS
# thread) than the randomized SVD that scikit-learn's "auto" picks below 10 * d rows. Wider
# input keeps "auto": there the covariance would cost d^3.
_COVARIANCE_MAX_FEATURES = 1000


def projected_width(n_features: int, max_features: int | None) -> int | None:
    """How many principal directions input of ``n_features`` is projected onto, or None
    when it is standardised instead (``max_features`` None, or no more features than it)."""
    if max_features is None or n_features <= max_features:
        return None
    return max_features


@dataclass(frozen=True)
class InputMap:
    """``(X - mean) / scale``, or ``(X - mean) @ projection``; float32 throughout.

    Attributes
    ----------
    mean : ndarray of shape (n_features,) or None
        Subtracted first; None for standardised sparse input, which is scaled but not centred
        so that it stays sparse. Sparse rows meet a projection's mean after it (``X @
        projection - mean @ projection``), so they are never made dense.
    scale : ndarray of shape (n_features,) or None
        Each feature's spread (floored) when standardising, else None.
    projection : ndarray of shape (n_features, n_outputs) or None
        Principal directions of the training rows, each divided by their common spread, or
        None when standardising.
    """

    mean: np.ndarray | None
    scale: np.ndarray | None
    projection: np.ndarray | None

    @classmethod
    def fit(cls, X, max_features: int | None) -> InputMap:
        """Standardise ``X``'s features, or project ``X`` with more than ``max_features``
        features onto at most that many principal directions (those with variance: fewer for
        few rows or low-rank input). None always standardises."""
        width = projected_width(X.shape[1], max_features)
        if width is None or X.shape[0] < 2 or _constant(X):
            return cls._standardising(X)
        # After centring n rows span at most n - 1 directions.
        # The seed only steers a randomized SVD's (or ARPACK's) numerics; the directions are
        # the data's. ARPACK centres sparse rows implicitly, without making them dense.
        if X.shape[1] <= _COVARIANCE_MAX_FEATURES:
            solver = "covariance_eigh"
        else:
            solver = "arpack" if sp.issparse(X) else "auto"
        pca = fit_pca(X, min(width, X.shape[0] - 1), svd_solver=solver, random_state=0)
        variance = pca.explained_variance_
        kept = variance >= _MIN_VARIANCE_FRACTION * variance[0]
        spread = float(np.sqrt(np.mean(variance[kept])))
        return cls(
            mean=pca.mean_.astype(np.float32),
            scale=None,
            projection=(pca.components_[kept].T / spread).astype(np.float32),
        )

    @classmethod
    def _standardising(cls, X) -> InputMap:
        sparse = sp.issparse(X)
        scaler = StandardScaler(with_mean=not sparse).fit(X)
        assert scaler.scale_ is not None and scaler.var_ is not None
        positive = scaler.scale_[scaler.var_ > 0]
        typical = float(np.median(positive)) if positive.size else 1.0
        scale = np.maximum(scaler.scale_, _MIN_SCALE_FRACTION * typical)
        mean = None if sparse else np.asarray(scaler.mean_, dtype=np.float32)
        return cls(mean=mean, scale=scale.astype(np.float32), projection=None)

    @property
    def n_outputs(self) -> int:
        if self.projection is not None:
            return self.projection.shape[1]
        assert self.scale is not None
        return len(self.scale)

    def transform(self, X):
        """The MLP's input for the rows of ``X``; sparse rows stay sparse for a map fitted on
        sparse rows, projected without being made dense, and made dense for a standardising
        map fitted on dense rows (as the ONNX graph does)."""
        if sp.issparse(X):
            if self.mean is None:
                assert self.scale is not None
                return sp.csr_matrix(X.multiply(1.0 / self.scale).astype(np.float32))
            if self.projection is not None:
                # In float64: X @ P and mean @ P can be large and nearly equal (a column
                # with a large mean), and float32 would lose their difference.
                projection = self.projection.astype(np.float64)
                projected = np.asarray(X.astype(np.float64) @ projection)
                projected -= self.mean.astype(np.float64) @ projection
                return projected.astype(np.float32)
            X = X.toarray()
        X = np.asarray(X, dtype=np.float32)
        if self.mean is not None:
            X = X - self.mean
        if self.projection is not None:
            return X @ self.projection
        assert self.scale is not None
        return X / self.scale


def _constant(X) -> bool:
    """Whether every feature of ``X`` has one value in all rows (nothing to project)."""
    if sp.issparse(X):
        spread = X.max(axis=0) - X.min(axis=0)
        return not spread.count_nonzero()
    return not np.ptp(X, axis=0).any()
