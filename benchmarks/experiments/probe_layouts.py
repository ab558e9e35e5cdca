"""Probe: UMAP's layout of MBN's own graphs instead of PCA of the top codes.

    python benchmarks/experiments/probe_layouts.py [--datasets moons circles ...] [--seeds 3]
        [--heldout]

The default network (``MBN(n_classes=c, random_state=seed)``) is fitted, and its bottom
co-association (the share of bottom clusterings that put two rows in one cell) and the product
of that with the top layer's co-association (``bench_mbn.coassociations``) become graphs for
UMAP's layout optimisation (``umap.umap_.simplicial_set_embedding``, c dimensions, spectral
start, 500 epochs, UMAP's default spread and min_dist) in two ways:

- "layout": the graph's own weights, each row's 15 strongest edges kept, symmetrised by the
  larger weight and scaled to at most 1;
- "UMAP": UMAP's fuzzy simplicial set of each row's 15 nearest rows at distance
  1 - co-association (UMAP with MBN's similarity in place of Euclidean distance);
- "every row placed": the fitted rows re-embedded as ``--heldout`` places new rows (their
  own co-association included), which would let a model's transform of its training rows
  reproduce its fit.

Each embedding is scored as in ``bench_mbn.py quality``: k-means with c clusters, lowest
inertia of 20 runs, NMI against the labels, mean ± sd over seeds, beside today's PCA output
and plain UMAP (``umap.UMAP(n_components=c, random_state=seed)``, Euclidean) in the same run.
``--heldout`` asks what a user of the service would get: per seed a random 80% of the rows
(``bench_mbn.py heldout``'s split) is fitted and laid out; each remaining row is placed at the
co-association-weighted mean of the layout positions of its 15 most co-associated fitted rows
(deterministic, one row at a time; its bottom co-association when it shares no top cluster
with them), k-means (c clusters, 20 runs) on the fitted rows' embedding, and the new rows are
assigned to the nearest centroid. UMAP places new rows by its own ``transform``.

Exploratory, not a product feature.

Decision record: docs/decisions/0004-output-auto.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared harness

from harness import (
    QUALITY_DATA,
    coassociations,
    kmeans_nmi,
    mean_sd,
    quality_data,
    quality_umap,
    split_rows,
)
from sklearn.cluster import KMeans
from sklearn.metrics import normalized_mutual_info_score

from mbn_core import MBN
from mbn_core.mbn.coassociation import one_hot

N_NEIGHBORS = 15
N_EPOCHS = 500


def strongest_edges(K: sp.csr_matrix, n_neighbors: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``n_neighbors`` rows of largest co-association, itself first at distance 0,
    as UMAP's (indices, distances) with distance 1 - co-association; ties go to the lower
    index. A row co-clustered with too few others is padded with itself at distance 1."""
    n_rows = K.shape[0]
    indices = np.repeat(np.arange(n_rows)[:, None], n_neighbors, axis=1)
    distances = np.ones((n_rows, n_neighbors))
    distances[:, 0] = 0.0
    for row in range(n_rows):
        start, end = K.indptr[row], K.indptr[row + 1]
        columns, values = K.indices[start:end], K.data[start:end]
        others = columns != row
        columns, values = columns[others], values[others]
        order = np.lexsort((columns, -values))[: n_neighbors - 1]
        indices[row, 1 : 1 + len(order)] = columns[order]
        distances[row, 1 : 1 + len(order)] = 1.0 - values[order]
    return indices, distances


def graph_of_weights(K: sp.csr_matrix, n_neighbors: int) -> sp.coo_matrix:
    indices, distances = strongest_edges(K, n_neighbors + 1)
    rows = np.repeat(np.arange(K.shape[0]), n_neighbors)
    weights = 1.0 - distances[:, 1:].ravel()
    graph = sp.csr_matrix((weights, (rows, indices[:, 1:].ravel())), shape=K.shape)
    graph.eliminate_zeros()
    graph = graph.maximum(graph.T)
    return (graph / graph.max()).tocoo()


def fuzzy_graph(K: sp.csr_matrix, n_neighbors: int, seed: int) -> sp.coo_matrix:
    import umap.umap_ as umap_internals

    indices, distances = strongest_edges(K, n_neighbors)
    graph, _, _ = umap_internals.fuzzy_simplicial_set(
        np.zeros((K.shape[0], 1)),
        n_neighbors,
        np.random.RandomState(seed),
        "euclidean",
        knn_indices=indices,
        knn_dists=distances,
    )
    return graph.tocoo()


def layout(graph: sp.coo_matrix, n_components: int, seed: int) -> np.ndarray:
    import umap.umap_ as umap_internals

    a, b = umap_internals.find_ab_params(1.0, 0.1)
    embedding, _ = umap_internals.simplicial_set_embedding(
        None, graph, n_components, 1.0, a, b, 1.0, 5, N_EPOCHS, "spectral",
        np.random.RandomState(seed), "euclidean", {}, False, {}, False,
    )  # fmt: skip
    return embedding


def codes_one_hot(model: MBN, X: np.ndarray) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    return one_hot(model.encode(X, layer=0), model.ks_[0]), one_hot(model.encode(X), model.ks_[-1])


def cross_coassociations(
    model: MBN, X_new: np.ndarray, X_fit: np.ndarray
) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """``coassociations`` between new rows and fitted rows (rows: new, columns: fitted)."""
    (bottom_new, top_new), (bottom_fit, top_fit) = (
        codes_one_hot(model, X_new),
        codes_one_hot(model, X_fit),
    )
    V = model.n_clusterings
    K_bottom = ((bottom_new @ bottom_fit.T) / V).tocsr()
    return K_bottom, K_bottom.multiply((top_new @ top_fit.T) / V).tocsr()


def place(K_new: sp.csr_matrix, fallback: sp.csr_matrix, Y_fit: np.ndarray) -> np.ndarray:
    """Each new row at the weighted mean of its ``N_NEIGHBORS`` most co-associated fitted
    rows' positions (weights: the co-association), ``fallback``'s row when it has none."""
    placed = np.empty((K_new.shape[0], Y_fit.shape[1]))
    for row in range(K_new.shape[0]):
        K = K_new if K_new.indptr[row + 1] > K_new.indptr[row] else fallback
        start, end = K.indptr[row], K.indptr[row + 1]
        columns, values = K.indices[start:end], K.data[start:end]
        order = np.lexsort((columns, -values))[:N_NEIGHBORS]
        weights = values[order]
        placed[row] = weights @ Y_fit[columns[order]] / weights.sum()
    return placed


FITTED_COLUMNS = [
    "PCA of the top codes (today)",
    "layout, bottom",
    "layout, bottom x top",
    "UMAP, bottom",
    "UMAP, bottom x top",
    "UMAP, bottom x top, every row placed",
    "UMAP (Euclidean)",
]
HELDOUT_COLUMNS = [
    "PCA of the top codes (today)",
    "UMAP, bottom",
    "UMAP, bottom x top",
    "UMAP (Euclidean)",
]


def fitted_scores(X: np.ndarray, y: np.ndarray, seed: int) -> list[float]:
    """NMI of each of ``FITTED_COLUMNS`` on the rows it was fitted on."""
    c = len(np.unique(y))
    model = MBN(n_classes=c, random_state=seed)
    embeddings = [model.fit_transform(X)]
    graphs = coassociations(model, X)
    embeddings += [layout(graph_of_weights(K, N_NEIGHBORS), c, seed) for K in graphs]
    embeddings += [layout(fuzzy_graph(K, N_NEIGHBORS, seed), c, seed) for K in graphs]
    # The fitted rows placed as new rows are (their own co-association included), so that
    # a model's transform of its training rows would reproduce its fit.
    embeddings.append(place(graphs[1], graphs[0], embeddings[-1]))
    embeddings.append(quality_umap(X, c, seed))
    return [kmeans_nmi(Z, y, seed, n_init=20) for Z in embeddings]


def heldout_scores(X: np.ndarray, y: np.ndarray, seed: int) -> list[float]:
    """NMI of each of ``HELDOUT_COLUMNS`` on rows new to it (``bench_mbn.split_rows``)."""
    import umap

    X = np.asarray(X, np.float32)
    c = len(np.unique(y))
    fit_rows, new_rows = split_rows(len(X), seed)
    X_fit, X_new = X[fit_rows], X[new_rows]
    model = MBN(n_classes=c, random_state=seed)
    reference = umap.UMAP(n_components=c, random_state=seed)
    pairs = [(model.fit_transform(X_fit), model.transform(X_new))]
    K_bottom_new, K_product_new = cross_coassociations(model, X_new, X_fit)
    for K, K_new in zip(coassociations(model, X_fit), (K_bottom_new, K_product_new), strict=True):
        Y_fit = layout(fuzzy_graph(K, N_NEIGHBORS, seed), c, seed)
        pairs.append((Y_fit, place(K_new, K_bottom_new, Y_fit)))
    pairs.append((reference.fit_transform(X_fit), reference.transform(X_new)))
    scores = []
    for Y_fit, Y_new in pairs:
        kmeans = KMeans(c, n_init=20, random_state=seed).fit(np.float64(Y_fit))
        scores.append(normalized_mutual_info_score(y[new_rows], kmeans.predict(np.float64(Y_new))))
    return scores


def print_table(heading: str, columns: list[str], args: argparse.Namespace, scores_of) -> None:
    print(f"{heading}; NMI mean ± sd over seeds 0..{args.seeds - 1}\n")
    print(f"| data | {' | '.join(columns)} |")
    print(f"|---|{'---|' * len(columns)}")
    for name in args.datasets:
        scores: list[list[float]] = []
        for seed in range(args.seeds):
            scores.append(scores_of(*quality_data(name, seed), seed))
            print(f"{name} seed {seed}: {np.round(scores[-1], 4)}", file=sys.stderr, flush=True)
        cells = " | ".join(mean_sd(column) for column in zip(*scores, strict=True))
        print(f"| {name} | {cells} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", nargs="+", default=list(QUALITY_DATA))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--heldout", action="store_true", help="new rows, not fitted ones")
    args = parser.parse_args()
    if args.heldout:
        print_table("New rows (80/20 split per seed)", HELDOUT_COLUMNS, args, heldout_scores)
    else:
        print_table("Fitted rows", FITTED_COLUMNS, args, fitted_scores)


if __name__ == "__main__":
    main()
