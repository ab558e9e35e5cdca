"""The clustering head: k-means centroids of the exact embedding, and the nearest one.

A bundle's fast path and its exact model both answer a cluster id per row: the nearest of
these centroids to the row's embedding, computed the same way as the ONNX graph does.
"""

from __future__ import annotations

import numpy as np
from sklearn.cluster import KMeans

from mbn_core.utils.blas import limited_threads
from mbn_core.utils.seeds import draw_seed

# k-means restarts when fitting the clustering head.
HEAD_KMEANS_INIT = 10


def kmeans(embedding: np.ndarray, n_clusters: int, seed: int, n_init: int) -> KMeans:
    """k-means of an embedding, lowest inertia of ``n_init`` runs."""
    # Low-dimensional embeddings make small problems: one thread is as fast, and extra
    # OpenMP threads only spin against the other work of a busy machine.
    with limited_threads(1):
        return KMeans(n_clusters, n_init=n_init, random_state=seed).fit(embedding)


def fit_head(embedding: np.ndarray, n_clusters: int | None, rng) -> np.ndarray | None:
    """float32 centroids of ``n_clusters`` k-means clusters of ``embedding``, or None
    without a head (then nothing is drawn from ``rng``)."""
    if n_clusters is None:
        return None
    centers = kmeans(embedding, n_clusters, draw_seed(rng), HEAD_KMEANS_INIT).cluster_centers_
    return centers.astype(np.float32)


def nearest(embedding: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """Index (int64) of the nearest center of each row, computed as the ONNX graph does."""
    scores = embedding @ (-2.0 * centers.T) + np.sum(centers * centers, axis=1)
    return np.argmin(scores, axis=1).astype(np.int64)
