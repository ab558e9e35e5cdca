"""Spectral output of an MBN: an embedding from the bottom x top co-association.

Two training rows are alike when they share many bottom-layer cells (fine, local) *and* many
top-layer clusters (coarse, global). The affinity of rows x and j is the product of the two
shares, ``K(x, j) = (shared bottom codes / V) * (shared top codes / V)``. PCA of the top codes
(the paper's output) sees only the coarse half, which merges the two half-moons of
``make_moons`` when a top cluster straddles them; the product keeps pairs that are close at
the bottom apart when the top separates them, and vice versa.

The embedding follows Ng, Jordan & Weiss (2001) with the eigenvalue weighting of diffusion
maps (one step): with ``D`` the row sums of ``K`` over the training rows and ``U`` the leading
eigenvectors of ``D^-1/2 K D^-1/2``, eigenvalues ``L``, a training row's embedding is its row
of ``U L``, scaled to unit length. Any row, new or not, gets
``normalise(sum_j K(x, j) D_j^-1/2 U_j)`` (the Nystrom extension; on a training row it equals
the row of ``U L`` exactly). Weighting by ``L`` rather than dividing by it keeps directions with
eigenvalues near zero harmless.

Every new row shares a bottom cell with at least that cell's center, a training row, so its
bottom share is never all zero; if it shares no top cluster with any of those rows, the bottom
share alone is its affinity (the product would be zero).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from numba import njit
from scipy.sparse.linalg import eigsh

# Below this many training rows the eigenproblem is solved dense (exact, all eigenvalues).
_DENSE_EIGEN_MAX_ROWS = 1500
# The spectral output's eigenproblem holds the whole co-association: refused above this many
# (row, row) pairs (about 12 bytes each while fitting); at MNIST's 70,000 rows with k1 = 8,000
# the bound would be about 250 million.
MAX_COASSOCIATION_PAIRS = 20_000_000
# Embedding computes the co-association a block of query rows at a time, blocks of about this
# many pairs (by ``expected_pairs``' bound), so memory does not grow with the batch.
BLOCK_PAIRS = 4_000_000


def expected_pairs(n_samples: int, n_clusterings: int, k1: int) -> int:
    """Upper bound on the co-association's stored pairs: each row meets ``n / k1`` rows per
    bottom clustering on average."""
    return int(n_samples * n_clusterings * max(1.0, n_samples / k1))


@dataclass(frozen=True)
class SpectralTop:
    """What the spectral output needs to embed any row: the training rows' codes and basis."""

    bottom_codes: np.ndarray  # (n, V) training rows' bottom-layer codes
    top_codes: np.ndarray  # (n, V) training rows' top-layer codes
    n_bottom_values: int  # k1
    basis: np.ndarray  # (n, n_components) float64: D^-1/2 U
    eigenvalues: np.ndarray  # (n_components,) float64, largest first
    # (V * k1, n): the training rows in each bottom cell, from bottom_codes (see ``restore``).
    cells: sp.csr_matrix = field(repr=False, compare=False)

    @classmethod
    def restore(
        cls,
        bottom_codes: np.ndarray,
        top_codes: np.ndarray,
        n_bottom_values: int,
        basis: np.ndarray,
        eigenvalues: np.ndarray,
    ) -> SpectralTop:
        """The top of a stored model: its cells index is rebuilt from the bottom codes."""
        cells = cell_index(bottom_codes, n_bottom_values)
        return cls(bottom_codes, top_codes, n_bottom_values, basis, eigenvalues, cells)

    @property
    def n_components(self) -> int:
        return int(self.eigenvalues.size)

    @property
    def nbytes(self) -> int:
        return (
            self.bottom_codes.nbytes
            + self.top_codes.nbytes
            + self.basis.nbytes
            + self.eigenvalues.nbytes
        )

    def embed(
        self, bottom_codes: np.ndarray, top_codes: np.ndarray, exclude_self: bool = False
    ) -> np.ndarray:
        """(m, n_components) embedding of rows with these bottom and top codes.

        ``exclude_self``: the rows are the training rows (in order), coded as new rows
        (leave-self-out); each row's affinity to itself is dropped.
        """
        blocks = coassociation_blocks(
            bottom_codes, top_codes, self.cells, self.top_codes, exclude_self
        )
        embedded = [_unit_rows(affinity @ self.basis) for _, affinity in blocks]
        return np.vstack(embedded) if embedded else np.empty((0, self.n_components))


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
    return top, _unit_rows(affinity @ top.basis)


def one_hot(codes: np.ndarray, n_values: int, dtype=np.float32) -> sp.csr_matrix:
    """(n, V * n_values) one-hot form of (n, V) codes."""
    n_rows, n_clusterings = codes.shape
    columns = (codes.astype(np.int64) + np.arange(n_clusterings) * n_values).ravel()
    indptr = np.arange(0, columns.size + 1, n_clusterings)
    return sp.csr_matrix(
        (np.ones(columns.size, dtype), columns, indptr),
        shape=(n_rows, n_clusterings * n_values),
    )


def cell_index(bottom_codes: np.ndarray, n_values: int) -> sp.csr_matrix:
    """(V * n_values, n): the training rows in each bottom cell."""
    return one_hot(bottom_codes, n_values).T.tocsr()


def coassociation(
    bottom_codes, top_codes, cells, train_top_codes, exclude_self: bool, first_row: int = 0
):
    """(m, n) CSR of K(x, j) for query rows x against the training rows j (``cells``:
    ``cell_index`` of the training rows' bottom codes). Shared by the UMAP output.

    ``exclude_self``: query row i is training row ``first_row + i``; that pair is dropped.
    """
    n_clusterings = bottom_codes.shape[1]
    n_values = cells.shape[0] // n_clusterings
    shared_bottom = (one_hot(bottom_codes, n_values) @ cells).tocsr()
    if exclude_self:
        shared_bottom.setdiag(0, k=first_row)
        shared_bottom.eliminate_zeros()
    shared_top = np.empty(shared_bottom.nnz, dtype=np.float64)
    _shared_codes(
        shared_bottom.indptr, shared_bottom.indices, top_codes, train_top_codes, shared_top
    )
    bottom_share = shared_bottom.data.astype(np.float64) / n_clusterings
    data = bottom_share * (shared_top / n_clusterings)
    _fall_back_to_bottom(shared_bottom.indptr, data, bottom_share)
    return sp.csr_matrix(
        (data, shared_bottom.indices, shared_bottom.indptr), shape=shared_bottom.shape
    )


def coassociation_blocks(
    bottom_codes, top_codes, cells, train_top_codes, exclude_self: bool
) -> Iterator[tuple[int, sp.csr_matrix]]:
    """``coassociation`` of consecutive blocks of query rows: (first row, block). Each row's
    affinities do not depend on the other rows, so blocking changes no value."""
    n_clusterings = bottom_codes.shape[1]
    n_values = cells.shape[0] // n_clusterings
    # A query row meets about n / k1 training rows per bottom clustering, as in expected_pairs.
    per_row = n_clusterings * max(1.0, cells.shape[1] / n_values)
    block_rows = max(1, int(BLOCK_PAIRS // per_row))
    for start in range(0, bottom_codes.shape[0], block_rows):
        stop = start + block_rows
        yield start, coassociation(
            bottom_codes[start:stop], top_codes[start:stop], cells, train_top_codes,
            exclude_self, first_row=start,
        )  # fmt: skip


def _unit_rows(Z: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(Z, axis=1, keepdims=True)
    return Z / np.where(norms > 0, norms, 1.0)


@njit(nogil=True, cache=True)
def _shared_codes(indptr, indices, query_codes, train_codes, out):
    """out[p] = number of clusterings in which query row i and training row indices[p] share
    a code, for every stored pair p of row i."""
    n_clusterings = query_codes.shape[1]
    for i in range(len(indptr) - 1):
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            count = 0
            for v in range(n_clusterings):
                if query_codes[i, v] == train_codes[j, v]:
                    count += 1
            out[p] = count


@njit(nogil=True, cache=True)
def _fall_back_to_bottom(indptr, data, bottom_share):
    """Rows whose product affinity is zero everywhere take their bottom share instead."""
    for i in range(len(indptr) - 1):
        total = 0.0
        for p in range(indptr[i], indptr[i + 1]):
            total += data[p]
        if total == 0.0:
            for p in range(indptr[i], indptr[i + 1]):
                data[p] = bottom_share[p]
