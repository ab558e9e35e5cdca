"""Probe: what the UMAP output's graph lacks against UMAP's own, neighbours or weights.

    python benchmarks/experiments/probe_graph_weights.py neighbours [--datasets swiss-roll ...]
        [--counts 15 20 30 45] [--seeds 5] [--clusterings 400]
    python benchmarks/experiments/probe_graph_weights.py swaps [--datasets swiss-roll ...]
        [--seeds 5]
        [--clusterings 400]
    python benchmarks/experiments/probe_graph_weights.py purity [--datasets blobs-stretched ...]
    python benchmarks/experiments/probe_graph_weights.py layouts [--datasets swiss-roll ...]
        [--seeds 5]
        [--layouts 6]

``neighbours`` and ``swaps`` fit ``MBN(n_classes=c, n_clusterings=V, random_state=seed)`` (V:
``--clusterings``), build UMAP graphs of the fitted rows, lay them out with the UMAP output's
own ``_layout`` into c dimensions and score the layout as ``bench_mbn.py quality`` does
(k-means with c clusters, best of 20, NMI, mean ± sd over seeds).

- ``neighbours``: the UMAP output's graph (each row's strongest bottom x top co-associations at
  distance 1 - K, short rows padded with the row itself at distance 1) asking for each count
  of neighbours in ``--counts``.
- ``swaps``: four graphs of 15 neighbours. "co-association" is the UMAP output's; "its rows,
  Euclidean distances" keeps its neighbours and measures them in the input; "Euclidean" is
  the input's exact 15 nearest rows; "Euclidean rows, 1 - K" keeps those and weighs them by
  the co-association. So a gap is traced to which rows are neighbours or to their weights,
  with the layout, its seeds and the scoring held fixed.

``purity`` (seed 0) describes the graph with the labels, which choose nothing: per class, the
share of each row's 14 strongest co-associations that are in the row's class, against the
share of its 14 nearest rows in the input; and the bottom layer's inputs per clustering under
``feature_fraction="auto"``.

``layouts`` separates the layout's seed from the network's: each network (seeds as above) is
laid out ``--layouts`` times with other layout seeds. It prints the NMI over all layouts, the
mean spread within a network, and the NMI of the layout with the lowest UMAP cross-entropy
against its own fuzzy graph (a label-free pick among layouts), beside plain UMAP over as many
seeds as there are layouts in all.

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

from harness import KNOWN_DATA, QUALITY_DATA, kmeans_nmi, mean_sd, quality_data, quality_umap
from probe_graph_fill import neighbour_lists, others
from scipy.spatial.distance import pdist, squareform
from sklearn.neighbors import NearestNeighbors

from mbn_core import MBN
from mbn_core.mbn.coassociation import cell_index, coassociation
from mbn_core.mbn.outputs import umap as umap_output


def fitted_affinity(X: np.ndarray, c: int, seed: int, n_clusterings: int) -> sp.csr_matrix:
    """The network's bottom x top co-association of its training rows."""
    network = MBN(n_classes=c, n_clusterings=n_clusterings, random_state=seed).fit(X)
    bottom, top = network.encode(X, layer=0), network.encode(X, layer=-1)
    return coassociation(bottom, top, cell_index(bottom, network.ks_[0]), top).tocsr()


def coassociation_lists(K: sp.csr_matrix, n_neighbors: int) -> tuple[np.ndarray, np.ndarray]:
    """UMAP's (knn_indices, knn_dists) as ``umap_output.fit_umap`` builds them."""
    indices, distances, _ = neighbour_lists(K, None, n_neighbors)
    return indices, distances


def swapped_graphs(X: np.ndarray, K: sp.csr_matrix) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    n_rows, n_neighbors = X.shape[0], umap_output.N_NEIGHBORS
    co_indices, co_distances = coassociation_lists(K, n_neighbors)
    measured = np.linalg.norm(X[co_indices] - X[:, None, :], axis=2)
    padded = co_indices == np.arange(n_rows)[:, None]
    padded[:, 0] = False
    measured[padded] = measured[~padded].max()  # as the co-association: beyond every real one
    eu_distances, eu_indices = NearestNeighbors(n_neighbors=n_neighbors).fit(X).kneighbors(X)
    weights = np.asarray(K[np.repeat(np.arange(n_rows), n_neighbors), eu_indices.ravel()])
    by_affinity = 1.0 - weights.reshape(n_rows, n_neighbors)
    by_affinity[:, 0] = 0.0
    return {
        "co-association": (co_indices, co_distances),
        "its rows, Euclidean distances": (co_indices, measured),
        "Euclidean": (eu_indices, eu_distances),
        "Euclidean rows, 1 - K": (eu_indices, by_affinity),
    }


def class_purity(name: str) -> tuple[int, str]:
    X, y = quality_data(name, 0)
    c = len(np.unique(y))
    K = fitted_affinity(X, c, 0, MBN().n_clusterings)
    count = umap_output.N_NEIGHBORS - 1
    by_affinity = [np.mean(y[others(K, row, count)[0]] == y[row]) for row in range(X.shape[0])]
    nearest = NearestNeighbors(n_neighbors=count + 1).fit(X).kneighbors(X)[1][:, 1:]
    by_input = (y[nearest] == y[:, None]).mean(axis=1)
    inputs = MBN()._n_bottom_features(X, np.random.RandomState(0))
    cells = [
        f"{np.mean(np.array(by_affinity)[y == label]):.3f} / {by_input[y == label].mean():.3f}"
        for label in np.unique(y)
    ]
    return len(cells), f"| {name} | {inputs} of {X.shape[1]} | {' | '.join(cells)} |"


def cross_entropy(graph: sp.spmatrix, layout: np.ndarray) -> float:
    """UMAP's objective: the fuzzy graph's cross-entropy against the layout's memberships
    1 / (1 + a d^2b), over every pair of rows (dense: for the small data sets only)."""
    umap_internals = umap_output._umap_internals()
    a, b = umap_internals.find_ab_params(umap_output.SPREAD, umap_output.MIN_DIST)
    memberships = 1.0 / (1.0 + a * squareform(pdist(layout)) ** (2 * b))
    weights = graph.toarray()
    off_diagonal = ~np.eye(len(layout), dtype=bool)
    q = np.clip(memberships, 1e-4, 1 - 1e-4)[off_diagonal]
    w = weights[off_diagonal]
    return float(-(w * np.log(q) + (1 - w) * np.log(1 - q)).sum())


def layout_seeds(name: str, seeds: int, n_layouts: int, n_clusterings: int) -> str:
    every, spreads, picked, umap_scores = [], [], [], []
    for seed in range(seeds):
        X, y = quality_data(name, seed)
        c = len(np.unique(y))
        indices, distances = coassociation_lists(
            fitted_affinity(X, c, seed, n_clusterings), umap_output.GRAPH_NEIGHBORS
        )
        graph = umap_output.fuzzy_graph(indices, distances, seed)
        scored = []
        for layout_seed in range(n_layouts):
            layout = umap_output._layout(indices, distances, c, 1000 * seed + layout_seed)
            scored.append((cross_entropy(graph, layout), kmeans_nmi(layout, y, seed, n_init=20)))
        nmis = [nmi for _, nmi in scored]
        every += nmis
        spreads.append(np.std(nmis))
        picked.append(min(scored)[1])
    X, y = quality_data(name, 0)  # the fixed data sets: one draw serves every seed
    for seed in range(seeds * n_layouts):
        umap_scores.append(kmeans_nmi(quality_umap(X, len(np.unique(y)), seed), y, seed, 20))
    return (
        f"| {name} | {mean_sd(every)} | {np.mean(spreads):.3f} | {mean_sd(picked)} "
        f"| {mean_sd(umap_scores)} |"
    )


def probe(name: str, seeds: int, n_clusterings: int, graphs_of) -> dict[str, str]:
    scores: dict[str, list[float]] = {}
    for seed in range(seeds):
        X, y = quality_data(name, seed)
        c = len(np.unique(y))
        K = fitted_affinity(X, c, seed, n_clusterings)
        for graph, (indices, distances) in graphs_of(X, K).items():
            layout = umap_output._layout(indices, distances, c, seed)
            scores.setdefault(graph, []).append(kmeans_nmi(layout, y, seed, n_init=20))
    return {graph: mean_sd(values) for graph, values in scores.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["neighbours", "swaps", "purity", "layouts"])
    parser.add_argument("--datasets", nargs="+", default=list(QUALITY_DATA))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--counts", nargs="+", type=int, default=[15, 20, 30, 45])
    parser.add_argument("--clusterings", type=int, default=400)
    parser.add_argument("--layouts", type=int, default=6)
    args = parser.parse_args()
    unknown = set(args.datasets) - set(KNOWN_DATA)
    if unknown:
        raise SystemExit(f"unknown data sets: {sorted(unknown)}")
    if args.mode == "purity":
        print("per class: share of co-association / input neighbours in the row's class")
        for name in args.datasets:
            n_classes, row = class_purity(name)
            print()
            classes = " | ".join(f"class {label}" for label in range(n_classes))
            print(f"| data | bottom inputs | {classes} |")
            print(f"|---|---|{'---|' * n_classes}")
            print(row, flush=True)
        return
    if args.mode == "layouts":
        print(
            f"V = {args.clusterings}; {args.seeds} networks x {args.layouts} layout seeds, "
            "NMI of the fitted rows' layout"
        )
        print()
        print(
            "| data | all layouts | spread within a network (mean sd) "
            "| lowest cross-entropy per network | UMAP, as many seeds |"
        )
        print("|---|---|---|---|---|")
        for name in args.datasets:
            print(layout_seeds(name, args.seeds, args.layouts, args.clusterings), flush=True)
        return
    if args.mode == "neighbours":

        def graphs_of(X, K):
            return {f"{count} neighbours": coassociation_lists(K, count) for count in args.counts}

    else:
        graphs_of = swapped_graphs
    header = None
    for name in args.datasets:
        cells = probe(name, args.seeds, args.clusterings, graphs_of)
        if header is None:
            header = list(cells)
            print(f"V = {args.clusterings}, {args.seeds} seeds; NMI of the fitted rows' layout")
            print()
            print(f"| data | {' | '.join(header)} |")
            print(f"|---|{'---|' * len(header)}")
        print(f"| {name} | {' | '.join(cells[graph] for graph in header)} |", flush=True)


if __name__ == "__main__":
    main()
