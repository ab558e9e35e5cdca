"""The co-association of an MBN's codes, which the UMAP output embeds by.

Two training rows are alike when they share many bottom-layer cells (fine, local) *and* many
top-layer clusters (coarse, global). The affinity of rows x and j is the product of the two
shares, ``K(x, j) = (shared bottom codes / V) * (shared top codes / V)``. PCA of the top codes
(the paper's output) sees only the coarse half, which merges the two half-moons of
``make_moons`` when a top cluster straddles them; the product keeps pairs that are close at
the bottom apart when the top separates them, and vice versa.

Every new row shares a bottom cell with at least that cell's center, a training row, so its
bottom share is never all zero; if it shares no top cluster with any of those rows, the bottom
share alone is its affinity (the product would be zero).

Without top codes the affinity is the bottom share alone: the UMAP output on thin manifolds,
where the coarse layers' clusters straddle the manifold's branches (``mbn_core.mbn.auto``).

``CodesTop`` is what such an output keeps: the training rows' codes, against which any row's
affinities are computed a block of rows at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Self

import numpy as np
import scipy.sparse as sp
from numba import njit

# Affinities are computed a block of query rows at a time, blocks of at most about this many
# pairs by ``expected_pairs``' estimate (30-40 bytes each while computed; the estimate counts
# every shared cell, so real blocks hold several times fewer), so memory does not grow with
# the batch.
BLOCK_PAIRS = 4_000_000


def expected_pairs(n_samples: int, n_clusterings: int, k1: int) -> int:
    """Estimate of the co-association's stored pairs, in practice far above them: each row
    meets ``n / k1`` rows per bottom clustering on average, counted once per clustering."""
    return int(n_samples * n_clusterings * max(1.0, n_samples / k1))


@dataclass(frozen=True)
class CodesTop:
    """The top of an output that embeds a row by its affinities to the training rows."""

    bottom_codes: np.ndarray  # (n, V) training rows' bottom-layer codes
    top_codes: np.ndarray | None  # (n, V) training rows' top-layer codes; None: bottom only
    n_bottom_values: int  # k1
    # (V * k1, n): the training rows in each bottom cell, from bottom_codes (see ``restore``).
    cells: sp.csr_matrix = field(repr=False, compare=False)

    @classmethod
    def restore(
        cls, bottom_codes: np.ndarray, top_codes: np.ndarray | None, n_bottom_values: int, **arrays
    ) -> Self:
        """The top of a stored model: its cells index is rebuilt from the bottom codes."""
        cells = cell_index(bottom_codes, n_bottom_values)
        return cls(
            bottom_codes=bottom_codes,
            top_codes=top_codes,
            n_bottom_values=n_bottom_values,
            cells=cells,
            **arrays,
        )

    @property
    def n_components(self) -> int:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        # With the cells index, which a loaded model rebuilds: about 8 bytes x n x V.
        cells = self.cells.data.nbytes + self.cells.indices.nbytes + self.cells.indptr.nbytes
        top = 0 if self.top_codes is None else self.top_codes.nbytes
        return self.bottom_codes.nbytes + top + cells

    def embed(self, bottom_codes: np.ndarray, top_codes: np.ndarray | None) -> np.ndarray:
        """(m, n_components) embedding of rows with these bottom and top codes (the top codes
        are not read when this top keeps none)."""
        blocks = coassociation_blocks(bottom_codes, top_codes, self.cells, self.top_codes)
        embedded = [self.embed_affinities(affinity) for _, affinity in blocks]
        return np.vstack(embedded) if embedded else np.empty((0, self.n_components))

    def embed_affinities(self, affinity: sp.csr_matrix) -> np.ndarray:
        """(m, n_components) embedding of rows with these (m, n) affinities."""
        raise NotImplementedError


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


def coassociation(bottom_codes, top_codes, cells, train_top_codes):
    """(m, n) CSR of K(x, j) for query rows x against the training rows j (``cells``:
    ``cell_index`` of the training rows' bottom codes). ``train_top_codes`` None: the bottom
    share alone."""
    n_clusterings = bottom_codes.shape[1]
    n_values = cells.shape[0] // n_clusterings
    shared_bottom = (one_hot(bottom_codes, n_values) @ cells).tocsr()
    bottom_share = shared_bottom.data.astype(np.float64) / n_clusterings
    if train_top_codes is None:
        data = bottom_share
    else:
        shared_top = np.empty(shared_bottom.nnz, dtype=np.float64)
        _shared_codes(
            shared_bottom.indptr, shared_bottom.indices, top_codes, train_top_codes, shared_top
        )
        data = bottom_share * (shared_top / n_clusterings)
        _fall_back_to_bottom(shared_bottom.indptr, data, bottom_share)
    return sp.csr_matrix(
        (data, shared_bottom.indices, shared_bottom.indptr), shape=shared_bottom.shape
    )


def coassociation_blocks(
    bottom_codes, top_codes, cells, train_top_codes
) -> Iterator[tuple[int, sp.csr_matrix]]:
    """``coassociation`` of consecutive blocks of query rows: (first row, block). Each row's
    affinities do not depend on the other rows, so blocking changes no value."""
    n_clusterings, n_train = bottom_codes.shape[1], cells.shape[1]
    per_row = expected_pairs(n_train, n_clusterings, cells.shape[0] // n_clusterings) / n_train
    block_rows = max(1, int(BLOCK_PAIRS // per_row))
    for start in range(0, bottom_codes.shape[0], block_rows):
        stop = start + block_rows
        top_block = None if train_top_codes is None else top_codes[start:stop]
        yield start, coassociation(bottom_codes[start:stop], top_block, cells, train_top_codes)


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
