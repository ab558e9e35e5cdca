"""What the compressor's MLP sees of an input row: an affine map fitted on the training rows.

Narrow or sparse input is standardised feature by feature, as any MLP's input is. Wide dense
input is projected onto its leading principal directions instead, with one scale for all of
them. That keeps the input's Euclidean geometry, which is what the teacher's distances
measure, and it leaves the MLP a first layer small enough to learn from a few thousand rows.
Measured on rows new to the MBN (benchmarks/RESULTS.md, issue 12): MNIST-5k R^2 of the fast
path 0.846 -> 0.904, MNIST-10k 0.886 -> 0.926, digits 0.925 -> 0.937, at a third fewer
weights; standardised pixels fed in full let the MLP fit the training rows' noise instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler

# A feature whose training spread is tiny (a pixel that is almost always blank) would be
# blown up by a plain standard scaler on the rare test point where it is set; no feature is
# scaled by less than this fraction of the typical (median) feature spread.
_MIN_SCALE_FRACTION = 0.1


@dataclass(frozen=True)
class InputMap:
    """``(X - mean) / scale``, then ``@ projection`` when there is one; float32 throughout.

    Attributes
    ----------
    mean : ndarray of shape (n_features,) or None
        Subtracted first; None for sparse input, which is scaled but not centred so that it
        stays sparse.
    scale : ndarray of shape (n_features,)
        Divisors: each feature's spread (floored), or one spread repeated when projecting.
    projection : ndarray of shape (n_features, n_outputs) or None
        Orthonormal principal directions of the training rows, or None (standardised only).
    """

    mean: np.ndarray | None
    scale: np.ndarray
    projection: np.ndarray | None

    @classmethod
    def fit(cls, X, max_features: int | None) -> InputMap:
        """Standardise ``X``'s features, or project dense ``X`` with more than
        ``max_features`` features onto that many principal directions (fewer when ``X`` has
        fewer rows). None always standardises."""
        n_rows, n_features = X.shape
        if sp.issparse(X) or max_features is None or n_features <= max_features:
            return cls._standardising(X)
        if not np.ptp(X, axis=0).any():  # constant rows: no direction to keep
            return cls._standardising(X)
        # The seed only steers the randomized SVD's numerics; the directions are the data's.
        pca = PCA(min(max_features, n_rows), random_state=0).fit(X)
        variance = float(np.mean(pca.explained_variance_))
        spread = np.sqrt(variance) if variance > 0 else 1.0
        return cls(
            mean=pca.mean_.astype(np.float32),
            scale=np.full(n_features, spread, dtype=np.float32),
            projection=pca.components_.T.astype(np.float32),
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
        return len(self.scale) if self.projection is None else self.projection.shape[1]

    def transform(self, X):
        """The MLP's input for the rows of ``X`` (sparse stays sparse when not projected)."""
        if sp.issparse(X):
            if self.mean is not None:
                raise ValueError("the model was trained on dense rows: send X dense")
            return sp.csr_matrix(X.multiply(1.0 / self.scale).astype(np.float32))
        X = np.asarray(X, dtype=np.float32)
        if self.mean is not None:
            X = X - self.mean
        return X / self.scale if self.projection is None else X @ self.scaled_projection()

    def scaled_projection(self) -> np.ndarray:
        """``projection`` with ``scale`` folded in: one product per row (as the ONNX graph)."""
        assert self.projection is not None
        return (self.projection / self.scale[:, None]).astype(np.float32)
