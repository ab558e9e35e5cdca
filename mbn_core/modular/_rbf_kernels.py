"""Hot loop of the RBF-landmark maps (modular kernel PCA and its baselines), compiled with numba.

Pure functions, no validation ("prior validation of data is assumed"), GIL released so the
caller can run row blocks on several threads.

Why not BLAS: a GEMM's summation order depends on how the batch is tiled, so a row embedded
alone and the same row inside a batch can differ in the last bits. Here every output entry
is summed in one fixed order (over input dimensions, then over landmarks) whatever rows
share its tile, so ``transform`` is batch independent bit for bit. Rows are tiled only to
reuse each landmark column from cache; the loops run along contiguous landmark/output axes,
which vectorises without reassociating any sum.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Rows computed together: the landmark matrix is streamed once per tile.
_TILE = 16


@njit(nogil=True, cache=True)
def rbf_linear_map(X, landmarks_t, gamma, weights_t, offset, scale, out, start, stop):
    """``out[i] = scale * (weights_t.T @ exp(-gamma * |X[i] - z_r|^2) - offset)``, rows start..stop.

    Parameters
    ----------
    X : float64 (n, d)
    landmarks_t : float64 (d, R), landmarks as columns
    gamma : float
    weights_t : float64 (R, D)
    offset : float64 (D,)
    scale : float
    out : float64 (n, D), written in rows start..stop
    """
    n_features, n_landmarks = landmarks_t.shape
    n_out = weights_t.shape[1]
    sq = np.empty((_TILE, n_landmarks))
    acc = np.empty((_TILE, n_out))
    for lo in range(start, stop, _TILE):
        hi = min(lo + _TILE, stop)
        rows = hi - lo
        sq[:rows] = 0.0
        for k in range(n_features):
            column = landmarks_t[k]
            for i in range(rows):
                x = X[lo + i, k]
                row = sq[i]
                for r in range(n_landmarks):
                    diff = x - column[r]
                    row[r] += diff * diff
        acc[:rows] = 0.0
        for r in range(n_landmarks):
            weight = weights_t[r]
            for i in range(rows):
                value = np.exp(-gamma * sq[i, r])
                target = acc[i]
                for j in range(n_out):
                    target[j] += value * weight[j]
        for i in range(rows):
            for j in range(n_out):
                out[lo + i, j] = scale * (acc[i, j] - offset[j])
