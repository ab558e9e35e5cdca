"""Probe: does the UMAP output's graph starve on low-dimensional data?

    python benchmarks/experiments/probe_graph_fill.py [--datasets swiss-roll moons ...] [--seeds 5]
        [--fill-layer 1] [--k1 0.25]

``MBN(output="umap")`` gives UMAP each training row's 14 most co-associated other rows. On 2-D
and 3-D data at k1 = n / 2 a bottom cell holds about two rows, so over 400 clusterings a row
may share a cell with fewer than 14 others: its neighbour list is padded with itself, which
UMAP ignores. This probe measures how many rows are padded, and lays out two graphs of the
same network (``MBN(n_classes=c, random_state=seed)``, or ``--k1``):

- "product": the UMAP output's graph, each row's strongest bottom x top co-associations
  (``mbn_core.mbn.coassociation``) at distance 1 - K;
- "filled": the same, but a row with fewer than 14 such rows takes the rest from layer
  ``--fill-layer``'s co-association (larger cells: more rows meet), ranked by it, at distance
  1 (K is 0 for them: they share no bottom cell, or no top cluster; the upper layer only
  picks which rows).

Both are laid out by the UMAP output's own ``_layout`` into c dimensions and scored as in
``bench_mbn.py quality`` (k-means with c clusters, best of 20, NMI, mean ± sd over seeds), on
the fitted rows' layout itself.

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

from harness import QUALITY_DATA, kmeans_nmi, mean_sd, quality_data

from mbn_core import MBN
from mbn_core.mbn.coassociation import cell_index, coassociation, one_hot
from mbn_core.mbn.outputs import umap as umap_output


def others(K: sp.csr_matrix, row: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """A row's ``count`` strongest positive affinities to other rows, as the UMAP output
    ranks them (``umap_output.ranked``)."""
    return umap_output.other_rows(*umap_output.ranked(K, row), row, count)


def neighbour_lists(
    K: sp.csr_matrix, fill: sp.csr_matrix | None, n_neighbors: int = umap_output.N_NEIGHBORS
) -> tuple[np.ndarray, np.ndarray, float]:
    """UMAP's (knn_indices, knn_dists) from K as the UMAP output builds them, each short row
    filled from ``fill`` when given; and the share of rows left padded with themselves."""
    n_rows = K.shape[0]
    indices = np.repeat(np.arange(n_rows)[:, None], n_neighbors, axis=1)
    distances = np.ones((n_rows, n_neighbors))
    distances[:, 0] = 0.0
    padded = 0
    for row in range(n_rows):
        columns, values = others(K, row, n_neighbors - 1)
        indices[row, 1 : 1 + columns.size] = columns
        distances[row, 1 : 1 + columns.size] = 1.0 - values
        missing = n_neighbors - 1 - columns.size
        if missing and fill is not None:
            extra, _ = others(fill, row, n_neighbors - 1)
            extra = extra[~np.isin(extra, columns)][:missing]
            indices[row, 1 + columns.size : 1 + columns.size + extra.size] = extra
            missing -= extra.size
        padded += missing > 0
    return indices, distances, padded / n_rows


def probe(name: str, seeds: int, fill_layer: int, k1) -> str:
    scores: dict[str, list[float]] = {"product": [], "filled": []}
    padded = []
    for seed in range(seeds):
        X, y = quality_data(name, seed)
        c = len(np.unique(y))
        network = MBN(n_classes=c, k1=k1, random_state=seed).fit(X)
        bottom, top = network.encode(X, layer=0), network.encode(X, layer=-1)
        upper = one_hot(network.encode(X, layer=fill_layer), network.ks_[fill_layer])
        V = bottom.shape[1]
        K = coassociation(bottom, top, cell_index(bottom, network.ks_[0]), top)
        fill = ((upper @ upper.T) / V).tocsr()
        for graph, fill_with in (("product", None), ("filled", fill)):
            indices, distances, share = neighbour_lists(K, fill_with)
            if fill_with is None:
                padded.append(share)
            Z = umap_output._layout(indices, distances, c, seed)
            scores[graph].append(kmeans_nmi(Z, y, seed, n_init=20))
    return (
        f"| {name} | {k1} | {100 * np.mean(padded):.1f}% | {mean_sd(scores['product'])} "
        f"| {mean_sd(scores['filled'])} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=list(QUALITY_DATA))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--fill-layer", type=int, default=1)
    parser.add_argument("--k1", type=float, default=None, help="bottom centers as a fraction")
    args = parser.parse_args()
    k1 = "auto" if args.k1 is None else args.k1
    print(f"fill from layer {args.fill_layer}; {args.seeds} seeds")
    print()
    print("| data | k1 | rows padded (product) | NMI, product | NMI, filled |")
    print("|---|---|---|---|---|")
    for name in args.datasets:
        print(probe(name, args.seeds, args.fill_layer, k1), flush=True)


if __name__ == "__main__":
    main()
