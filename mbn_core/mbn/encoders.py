"""Per-clustering encoders: ``encode(v)`` gives every row's code in clustering v.

A layer's clusterings are independent once the network has made its random choices, so a
backend may run them on any worker in any order. What they share (the float32 working copy
of the input and its row norms at the bottom, the posting lists of the previous layer's codes
above) is built once per layer and batch, here, and closed over by the encoder.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from mbn_core.mbn.bottom import BottomLayer, bottom_input, input_row_norms
from mbn_core.mbn.upper import PointPostings, Postings, UpperLayer, upper_clustering_codes

Encoder = Callable[[int], np.ndarray]


@dataclass(frozen=True)
class UpperClusterings:
    """The random choices of an upper layer's V clusterings during ``fit``.

    Attributes
    ----------
    centers : ndarray of shape (V, k), int32
        Each clustering's centers, as training points (rows of the previous layer's codes).
    seeds : ndarray of shape (V,), uint64
        Seeds of each clustering's choice of one-hot dimensions.
    n_values : int
        k of the previous layer.
    feature_fraction : float
    """

    centers: np.ndarray
    seeds: np.ndarray
    n_values: int
    feature_fraction: float

    @property
    def n_centers(self) -> int:
        return int(self.centers.shape[1])

    def encoder(self, codes: np.ndarray, pool: Executor | None = None) -> Encoder:
        """``encode(v)``: the codes of every training point for clustering v.

        Builds the layer's posting lists once (the shared, per-layer cost); each call then
        runs one clustering's kernel.
        """
        postings = Postings.build(codes, codes, self.n_values, centers_are_points=True, pool=pool)

        def encode(v: int) -> np.ndarray:
            return upper_clustering_codes(
                postings, codes, self.centers[v], self.n_values, self.seeds[v],
                self.feature_fraction,
            )  # fmt: skip

        return encode


def bottom_encoder(layer: BottomLayer, X, norms: np.ndarray | None = None) -> Encoder:
    """``encode(v)``: the codes of every row of X for bottom clustering v.

    X is the validated input (dense or CSR); its working copy (``bottom_input``: integers for
    small-integer data, else float32), shared by all clusterings, is built here once, and so
    are its row norms unless given.
    """
    X_work = bottom_input(X, layer)
    if norms is None:
        norms = input_row_norms(X)
    return lambda v: layer.clustering_codes(X_work, v, norms)


def upper_encoder(layer: UpperLayer, codes: np.ndarray, pool: Executor | None = None) -> Encoder:
    """``encode(v)``: the codes of new rows, from their previous-layer ``codes``, for
    clustering v of the fitted ``layer``."""
    center_codes = layer.center_codes
    n_clusterings = len(layer.centers)
    postings: Postings | PointPostings
    if PointPostings.cheaper(
        codes.shape[0],
        center_codes.shape[0],
        layer.n_values,
        layer.n_centers,
        n_clusterings,
        layer.feature_fraction,
    ):
        postings = PointPostings.build(codes, center_codes, layer.n_values)
    else:
        postings = Postings.build(codes, center_codes, layer.n_values, pool=pool)
    centers = layer.centers.astype(np.int32)

    def encode(v: int) -> np.ndarray:
        return upper_clustering_codes(
            postings, center_codes, centers[v], layer.n_values, layer.seeds[v],
            layer.feature_fraction,
        )  # fmt: skip

    return encode


def float32_csr(X) -> sp.csr_matrix:
    """Sparse X as the bottom layer reads it: float32 CSR with sorted indices."""
    X = sp.csr_matrix(X, dtype=np.float32)
    X.sort_indices()
    return X
