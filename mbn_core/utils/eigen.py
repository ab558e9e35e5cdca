"""Eigenpairs of a symmetric matrix by index, surviving LAPACK's ``syevr`` returning none.

``scipy.linalg.eigh(A, subset_by_index=...)`` uses LAPACK's ``syevr``. With SciPy 1.17.1's
OpenBLAS (0.3.30) it returned *no* eigenpairs, without an error, for matrices whose wanted
eigenvalues are tied: the centred Gram matrix of equidistant points (one-hot rows), or of
constant data, as degenerate training sets give. The full divide-and-conquer decomposition
(``syevd``) of the same matrix is right, so it is the fallback when ``syevr`` comes back short.
"""

from __future__ import annotations

import logging

import numpy as np
import scipy.linalg

log = logging.getLogger(__name__)


def eigh_by_index(matrix: np.ndarray, first: int, last: int) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues ``first..last`` (ascending, inclusive) of a symmetric ``matrix`` and their
    eigenvectors as columns, as ``scipy.linalg.eigh(matrix, subset_by_index=[first, last])``."""
    wanted = last - first + 1
    values, vectors = scipy.linalg.eigh(matrix, subset_by_index=[first, last], driver="evr")
    if len(values) == wanted:
        return values, vectors
    log.warning(
        "LAPACK's syevr returned %d of %d eigenpairs of a %d x %d matrix; using syevd",
        len(values),
        wanted,
        *matrix.shape,
    )
    values, vectors = scipy.linalg.eigh(matrix, driver="evd")
    return values[first : last + 1], vectors[:, first : last + 1]
