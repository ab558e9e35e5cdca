"""The PCA output (the paper's): PCA of the top layer's one-hot codes.

The fitted PCA is kept as a lookup table: a row's embedding is the sum over clusterings of
the table's entry for its code there, minus an offset, so embedding costs V additions per
dimension and never builds the one-hot matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mbn_core.mbn import _kernels
from mbn_core.mbn.coassociation import one_hot
from mbn_core.mbn.outputs.base import (
    FittedOutput,
    Output,
    OutputProgress,
    StoredArrays,
)
from mbn_core.utils.pca import fit_pca

# Above this many one-hot entries the PCA runs sparse (ARPACK) instead of dense.
DENSE_PCA_MAX_ENTRIES = 5_000_000


@dataclass(frozen=True)
class PcaTop(FittedOutput):
    """PCA of the last layer's one-hot codes, as a lookup table."""

    table: np.ndarray  # (V, k_L, n_components) float64
    offset: np.ndarray  # (n_components,) float64
    variance_ratio: np.ndarray

    @property
    def n_components(self) -> int:
        return int(self.table.shape[2])

    @property
    def nbytes(self) -> int:
        return self.table.nbytes + self.offset.nbytes

    @property
    def explained_variance_ratio(self) -> np.ndarray:
        return self.variance_ratio

    def embed(self, bottom_codes: np.ndarray, top_codes: np.ndarray) -> np.ndarray:
        out = np.empty((top_codes.shape[0], self.table.shape[2]), dtype=np.float64)
        _kernels.project_codes(top_codes, self.table, self.offset, out)
        return out

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "top.table": self.table,
            "top.offset": self.offset,
            "top.explained_variance_ratio": self.variance_ratio,
        }


class PcaOutput(Output):
    """PCA of the top layer's one-hot codes (see the module docstring)."""

    name = "pca"
    array_prefix = "top."

    def fit(
        self,
        bottom_codes: np.ndarray,
        top_codes: np.ndarray,
        ks: list[int],
        n_components: int,
        rng: np.random.RandomState,
        progress: OutputProgress | None = None,
    ) -> tuple[PcaTop, np.ndarray]:
        top = fit_pca_top(top_codes, ks[-1], n_components, rng)
        return top, top.embed(bottom_codes, top_codes)

    def from_arrays(self, stored: StoredArrays, ks: list[int], n_clusterings: int) -> PcaTop:
        top = PcaTop(
            table=np.ascontiguousarray(stored.get("top.table"), dtype=np.float64),
            offset=np.asarray(stored.get("top.offset"), dtype=np.float64),
            variance_ratio=stored.get("top.explained_variance_ratio"),
        )
        if top.table.ndim != 3 or top.table.shape[:2] != (n_clusterings, ks[-1]):
            raise ValueError(f"model array 'top.table' has shape {top.table.shape}")
        if top.offset.shape != (top.table.shape[2],):
            raise ValueError(f"model array 'top.offset' has shape {top.offset.shape}")
        return top


def fit_pca_top(codes: np.ndarray, n_values: int, n_components: int, rng) -> PcaTop:
    """PCA of the one-hot top codes, returned as a (V, k, n_components) lookup table."""
    n_samples, n_clusterings = codes.shape
    n_dims = n_clusterings * n_values
    onehot = one_hot(codes, n_values, dtype=np.float64)
    seed = rng.randint(np.iinfo(np.int32).max)
    if n_samples * n_dims <= DENSE_PCA_MAX_ENTRIES or n_components >= min(n_samples, n_dims):
        pca = fit_pca(onehot.toarray(), n_components, svd_solver="full", random_state=seed)
    else:
        pca = fit_pca(onehot, n_components, svd_solver="arpack", random_state=seed)
    components = pca.components_
    table = np.ascontiguousarray(components.T.reshape(n_clusterings, n_values, n_components))
    offset = components @ pca.mean_
    ratio = np.nan_to_num(pca.explained_variance_ratio_)
    return PcaTop(table=table, offset=offset, variance_ratio=ratio)
