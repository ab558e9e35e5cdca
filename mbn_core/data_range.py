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


def check_magnitude(X, source: str = "X") -> None:
    """ValueError if a value of ``X`` (dense or sparse) is beyond +-``MAX_TRAINING_MAGNITUDE``."""
    values = X.data if sp.issparse(X) else np.asarray(X)
    largest = float(np.abs(values).max()) if values.size else 0.0
    if largest > MAX_TRAINING_MAGNITUDE:
        raise ValueError(
            f"{source}: has values as large as {largest:.3g}; training needs them within "
            f"+-{MAX_TRAINING_MAGNITUDE:.0e} (the models compute in float32): rescale the data"
        )


def check_spread(X, source: str = "X") -> None:
    """ValueError unless ``X`` (dense or CSR) is trainable: values within
    +-``MAX_TRAINING_MAGNITUDE``, rows that differ, and a root mean squared distance from the
    mean row of at least ``MIN_TRAINING_SPREAD``."""
    check_magnitude(X, source)
    if sp.issparse(X):
        X = sp.csr_matrix(X)
        mean = np.asarray(X.mean(axis=0, dtype=np.float64)).ravel()
        mean_square = np.asarray(X.multiply(X).mean(axis=0, dtype=np.float64)).ravel()
        variances = np.maximum(mean_square - mean**2, 0.0)
        differ = bool((X.max(axis=0) != X.min(axis=0)).nnz)
    else:
        variances = np.var(X, axis=0, dtype=np.float64)
        differ = bool(np.ptp(X, axis=0).max() > 0)
    if not differ:
        raise ValueError(f"{source}: every row is the same; an embedding needs rows that differ")
    spread = float(np.sqrt(variances.sum()))
    if spread < MIN_TRAINING_SPREAD:
        raise ValueError(
            f"{source}: its rows lie within {spread:.3g} of their mean; training needs a spread "
            f"of at least {MIN_TRAINING_SPREAD:.0e} (the models compute in float32): "
            "rescale the data"
        )
