"""Spectral output of an MBN: an embedding from the bottom x top co-association ``K``
(``mbn_core.mbn.coassociation``).

The embedding follows Ng, Jordan & Weiss (2001) with the eigenvalue weighting of diffusion
maps (one step): with ``D`` the row sums of ``K`` over the training rows and ``U`` the leading
eigenvectors of ``D^-1/2 K D^-1/2``, eigenvalues ``L``, a training row's embedding is its row
of ``U L``, scaled to unit length. Any row, new or not, gets
``normalise(sum_j K(x, j) D_j^-1/2 U_j)`` (the Nystrom extension; on a training row it equals
the row of ``U L`` exactly). Weighting by ``L`` rather than dividing by it keeps directions with
eigenvalues near zero harmless.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import eigsh

from mbn_core.mbn.coassociation import CodesTop, cell_index, coassociation

# Below this many training rows the eigenproblem is solved dense (exact, all eigenvalues).
_DENSE_EIGEN_MAX_ROWS = 1500
# The eigenproblem holds the whole co-association: refused above this many (row, row) pairs
# (about 12 bytes each while fitting); at MNIST's 70,000 rows with k1 = 8,000 the estimate
# (``expected_pairs``) is 245 million.
MAX_COASSOCIATION_PAIRS = 20_000_000


@dataclass(frozen=True)
class SpectralTop(CodesTop):
    """What the spectral output needs to embed any row: the training rows' codes and basis."""

    basis: np.ndarray  # (n, n_components) float64: D^-1/2 U
    eigenvalues: np.ndarray  # (n_components,) float64, largest first

    @property
    def n_components(self) -> int:
        return int(self.eigenvalues.size)

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.basis.nbytes + self.eigenvalues.nbytes

    def embed_affinities(self, affinity: sp.csr_matrix) -> np.ndarray:
        return _unit_rows(affinity @ self.basis)


def fit_spectral(
    bottom_codes: np.ndarray,
    top_codes: np.ndarray,
    n_bottom_values: int,
    n_components: int,
    seed: int,
) -> tuple[SpectralTop, np.ndarray]:
    """The spectral output of the training rows' codes, and their embedding."""
    n_samples = bottom_codes.shape[0]
    cells = cell_index(bottom_codes, n_bottom_values)
    affinity = coassociation(bottom_codes, top_codes, cells, top_codes, exclude_self=False)
    degrees = np.asarray(affinity.sum(axis=1)).ravel()  # >= 1: each row meets itself
    inverse_root = 1.0 / np.sqrt(degrees)
    normalised = sp.diags(inverse_root) @ affinity @ sp.diags(inverse_root)
    normalised = (normalised + normalised.T) * 0.5  # exact symmetry for the solvers
    if n_samples <= _DENSE_EIGEN_MAX_ROWS or n_components + 1 >= n_samples:
        values, vectors = np.linalg.eigh(normalised.toarray())
    else:
        start = np.random.RandomState(seed).uniform(0.5, 1.5, n_samples)
        values, vectors = eigsh(normalised, k=n_components, which="LA", v0=start)
    order = np.argsort(-values, kind="stable")[:n_components]
    values, vectors = values[order], vectors[:, order]
    # Fix each eigenvector's sign (solvers may return either): largest entry positive.
    signs = np.sign(vectors[np.abs(vectors).argmax(axis=0), np.arange(n_components)])
    vectors = vectors * np.where(signs == 0, 1.0, signs)
    top = SpectralTop(
        bottom_codes=bottom_codes,
        top_codes=top_codes,
        n_bottom_values=n_bottom_values,
        basis=vectors * inverse_root[:, None],
        eigenvalues=values.astype(np.float64),
        cells=cells,
    )
    # The affinity ``embed`` would compute for these rows, already at hand.
    return top, top.embed_affinities(affinity)


def _unit_rows(Z: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(Z, axis=1, keepdims=True)
    return Z / np.where(norms > 0, norms, 1.0)
