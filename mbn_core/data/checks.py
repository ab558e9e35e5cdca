"""The range of values the methods can train on, checked before any training starts.

The methods compute in float32 (MBN's scores, the kernels' widths, the distilled MLP), so
training data must keep its squared distances inside float32's range: values up to
``MAX_TRAINING_MAGNITUDE``, rows spread at least ``MIN_TRAINING_SPREAD`` around their mean,
and rows that differ at all. Outside it a method failed deep inside with an unrelated message
(an empty argmin, NaN in k-means, an empty reshape); here the message names the problem.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

# Squared distances of values beyond 1e15 overflow float32 once summed over features, and
# a spread under 1e-15 makes a kernel width (1 / mean squared distance) that does. Both are
# far outside the units any measurement comes in.
MAX_TRAINING_MAGNITUDE = 1e15
MIN_TRAINING_SPREAD = 1e-15


# Columns whose variance is taken at a time: the float64 temporary stays at n x 64.
_VARIANCE_BLOCK = 64


def check_magnitude(X, source: str = "X") -> None:
    """ValueError if a value of ``X`` (dense or sparse) is beyond +-``MAX_TRAINING_MAGNITUDE``."""
    values = X.data if sp.issparse(X) else np.asarray(X)
    if values.size == 0:
        return
    check_largest(max(float(values.max()), -float(values.min())), source)  # no |X| copy


def check_largest(largest: float, source: str = "X") -> None:
    """ValueError if ``largest``, the largest absolute value, is beyond
    +-``MAX_TRAINING_MAGNITUDE``."""
    if largest > MAX_TRAINING_MAGNITUDE:
        raise ValueError(
            f"{source}: has values as large as {largest:.3g}; training needs them within "
            f"+-{MAX_TRAINING_MAGNITUDE:.0e} (the models compute in float32): rescale the data"
        )


def check_spread(X, source: str = "X") -> None:
    """ValueError unless ``X`` (dense or sparse, of any real dtype) is trainable: values
    within +-``MAX_TRAINING_MAGNITUDE``, rows that differ, and a root mean squared distance
    from the mean row of at least ``MIN_TRAINING_SPREAD``."""
    check_magnitude(X, source)
    variances = _sparse_variances(sp.csr_matrix(X)) if sp.issparse(X) else _dense_variances(X)
    check_variances(variances, source)


def check_variances(variances: np.ndarray, source: str = "X") -> None:
    """ValueError unless the columns' ``variances`` make rows that differ, spread at least
    ``MIN_TRAINING_SPREAD`` around their mean."""
    if not variances.max() > 0:  # exactly 0 for identical rows, in any dtype
        raise ValueError(f"{source}: every row is the same; an embedding needs rows that differ")
    spread = float(np.sqrt(variances.sum()))
    if spread < MIN_TRAINING_SPREAD:
        raise ValueError(
            f"{source}: its rows lie within {spread:.3g} of their mean; training needs a spread "
            f"of at least {MIN_TRAINING_SPREAD:.0e} (the models compute in float32): "
            "rescale the data"
        )


def _dense_variances(X) -> np.ndarray:
    X = np.asarray(X)
    return np.concatenate(
        [
            np.var(X[:, start : start + _VARIANCE_BLOCK], axis=0, dtype=np.float64)
            for start in range(0, X.shape[1], _VARIANCE_BLOCK)
        ]
    )


def _sparse_variances(X: sp.csr_matrix) -> np.ndarray:
    """Column variances in two float64 passes (E[x^2] - E[x]^2 cancels for large values)."""
    n_rows, n_columns = X.shape
    values = X.data.astype(np.float64)
    mean = np.bincount(X.indices, values, minlength=n_columns) / n_rows
    deviations = values - mean[X.indices]
    implicit_zeros = n_rows - np.bincount(X.indices, minlength=n_columns)
    squares = np.bincount(X.indices, deviations**2, minlength=n_columns)
    return (squares + implicit_zeros * mean**2) / n_rows
