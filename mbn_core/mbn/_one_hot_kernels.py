"""The one-hot code matrix of MBN's top layer as an operator, compiled with numba: products
with a vector and its column counts, without building the matrix (the PCA output's
``OneHotCodes``, the neighbour scan's list sizes).

Pure functions that release the GIL, as the other kernels (``_kernels``).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def one_hot_matvec(codes_t, n_values, vector, out):
    """out[i] = sum over clusterings w (in order) of vector[w * n_values + codes_t[w, i]]: the
    one-hot code matrix times ``vector``, without building it. ``codes_t`` is the (V, n)
    transpose of the codes: each clustering's pass reads its codes in a run and gathers
    from its own n_values entries of ``vector``."""
    n_clusterings, n_rows = codes_t.shape
    out[:] = 0.0
    for w in range(n_clusterings):
        entries = vector[w * n_values : (w + 1) * n_values]
        column = codes_t[w]
        for i in range(n_rows):
            out[i] += entries[column[i]]


@njit(nogil=True, cache=True)
def one_hot_rmatvec(codes_t, n_values, vector, out):
    """out[w * n_values + c] = sum over the rows i whose code in w is c (in increasing i) of
    vector[i]: the transpose of the one-hot code matrix times ``vector``."""
    n_clusterings, n_rows = codes_t.shape
    sums = np.zeros(n_values)
    for w in range(n_clusterings):
        sums[:] = 0.0
        column = codes_t[w]
        for i in range(n_rows):
            sums[column[i]] += vector[i]
        out[w * n_values : (w + 1) * n_values] = sums


@njit(nogil=True, cache=True)
def one_hot_counts(codes_t, n_values, out):
    """out[w * n_values + c] = the rows whose code in clustering w is c."""
    n_clusterings, n_rows = codes_t.shape
    out[:] = 0
    for w in range(n_clusterings):
        column = codes_t[w]
        for i in range(n_rows):
            out[w * n_values + np.int64(column[i])] += 1
