"""Where MBN's coarse layers lose two moons: a NumPy replica of the network, per layer.

    python benchmarks/experiments/probe_coarsening.py [--data moons] [--seeds 0 1 2] [--delta 0.7]
        [--orphans zero|random] [--projection pca|njw] [--layers N]
        [--feature-fraction 1.0] [--affinities]

A small, slow copy of ``mbn_core.MBN`` (dense pairwise distances, one-hot products), so every
layer's codes can be inspected and the two choices the product makes can be swapped:
- ``--orphans``: the center of a point that shares no kept code with any center (the product
  takes center 0, the lowest index of a tie at zero; ``random`` draws one);
- ``--projection``: PCA of the codes (the product) or a spectral embedding of their
  co-association matrix (Ng-Jordan-Weiss).
Per seed and layer it prints k, the share of co-clustered pairs whose labels differ, the share
of orphan (point, clustering) pairs, and the NMI of k-means (c clusters, 20 runs) on the
c-dimensional projection of that layer's codes, then the mean NMI of each layer over the seeds.
``--layers 1 --projection njw`` is spectral clustering on the bottom layer's co-association.
``--affinities`` prints instead, per seed, the NMI of spectral clustering (Ng-Jordan-Weiss)
on three co-association matrices: the bottom layer's, the top layer's, and their elementwise
product (pairs that fall together both in the fine cells and in the coarse ones); beside each,
in brackets, its label-free eigengap (c-th minus (c+1)-th eigenvalue of the normalised matrix:
large when the affinity splits into c well-separated groups).
Labels are read only to score.

Decision record: docs/decisions/0004-output-auto.md.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared harness

from harness import QUALITY_DATA, kmeans_nmi, one_hot, spectral_embedding
from sklearn.decomposition import PCA

N_CLUSTERINGS = 400
AFFINITIES = ("bottom", "top", "product")
UPPER_FRACTION = 0.5


def layer_sizes(n: int, c: int, delta: float) -> list[int]:
    ks = [round(0.5 * n)]
    while (k := int(delta * ks[-1])) >= 1.5 * c:
        ks.append(k)
    return ks


def network_codes(X, ks, fraction: float, orphans: str, rng) -> list[tuple[np.ndarray, float]]:
    """Each layer's (n, V) codes and its share of orphan pairs; each bottom clustering keeps
    ``fraction`` of the inputs (all of them is the auto rule's choice on 2-D and 3-D data)."""
    n, d = X.shape
    codes = np.empty((n, N_CLUSTERINGS), np.int64)
    for v in range(N_CLUSTERINGS):
        X_v = X[:, rng.choice(d, max(1, round(fraction * d)), replace=False)]
        W = X_v[rng.choice(n, ks[0], replace=False)]
        codes[:, v] = ((X_v**2).sum(1)[:, None] - 2 * X_v @ W.T + (W**2).sum(1)).argmin(1)
    layers = [(codes, 0.0)]
    for k_prev, k in itertools.pairwise(ks):
        H = one_hot(codes, k_prev)
        codes, n_orphans = np.empty((n, N_CLUSTERINGS), np.int64), 0
        for v in range(N_CLUSTERINGS):
            centers = rng.choice(n, k, replace=False)
            kept = rng.random_sample(H.shape[1]) < UPPER_FRACTION
            shared = (H[:, kept] @ H[centers][:, kept].T).toarray()
            codes[:, v] = shared.argmax(1)
            orphan = shared.max(1) == 0
            n_orphans += int(orphan.sum())
            if orphans == "random":
                codes[orphan, v] = rng.randint(k, size=int(orphan.sum()))
        layers.append((codes, n_orphans / codes.size))
    return layers


def co_association(codes: np.ndarray, k: int) -> np.ndarray:
    """(n, n) share of the clusterings that put each pair of points together."""
    H = one_hot(codes, k)
    return (H @ H.T).toarray().astype(np.float64) / codes.shape[1]


def project(codes: np.ndarray, k: int, c: int, projection: str) -> np.ndarray:
    if projection == "pca":
        return PCA(c).fit_transform(one_hot(codes, k).toarray())
    return spectral_embedding(co_association(codes, k), c)[0]


def score(Z: np.ndarray, y: np.ndarray) -> float:
    return kmeans_nmi(Z, y, seed=0, n_init=20)


def compare_affinities(X, y, c, ks, args) -> None:
    scores = []
    for seed in args.seeds:
        rng = np.random.RandomState(seed)
        layers = network_codes(X, ks, args.feature_fraction, args.orphans, rng)
        bottom, top = co_association(layers[0][0], ks[0]), co_association(layers[-1][0], ks[-1])
        fits = [spectral_embedding(K, c) for K in (bottom, top, bottom * top)]
        scores.append([score(Z, y) for Z, _ in fits])
        cells = [
            f"{name} {score:.3f} [{gap:.3f}]"
            for name, score, (_, gap) in zip(AFFINITIES, scores[-1], fits, strict=True)
        ]
        print(f"seed {seed}: " + "  ".join(cells), flush=True)
    mean, sd = np.mean(scores, axis=0), np.std(scores, axis=0)
    cells = [f"{n} {m:.3f} ± {s:.3f}" for n, m, s in zip(AFFINITIES, mean, sd, strict=True)]
    print("mean: " + "  ".join(cells))


def cross_label_share(codes: np.ndarray, k: int, y: np.ndarray) -> float:
    """Share of (same code) pairs, over all clusterings, whose labels differ."""
    per_code = (one_hot(codes, k).T @ sp.csr_matrix(np.eye(y.max() + 1)[y])).toarray()
    return 1.0 - (per_code**2).sum() / (per_code.sum(1) ** 2).sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default="moons", choices=list(QUALITY_DATA))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--delta", type=float, default=0.7)
    parser.add_argument("--orphans", default="zero", choices=["zero", "random"])
    parser.add_argument("--projection", default="pca", choices=["pca", "njw"])
    parser.add_argument("--layers", type=int, help="stop after this many layers")
    parser.add_argument("--feature-fraction", type=float, default=1.0)
    parser.add_argument("--affinities", action="store_true")
    args = parser.parse_args()
    X, y = QUALITY_DATA[args.data]()
    X, c = np.asarray(X, dtype=np.float64), len(np.unique(y))
    ks = layer_sizes(len(X), c, args.delta)[: args.layers]
    if args.affinities:
        print(f"{args.data}: layers {'-'.join(map(str, ks))}; NMI of spectral clustering")
        compare_affinities(X, y, c, ks, args)
        return
    print(f"{args.data}: layers {'-'.join(map(str, ks))}; cell: cross-label share / orphans / NMI")
    nmis = []
    for seed in args.seeds:
        rng = np.random.RandomState(seed)
        layers = network_codes(X, ks, args.feature_fraction, args.orphans, rng)
        cells = []
        nmis.append([])
        for k, (codes, orphans) in zip(ks, layers, strict=True):
            nmis[-1].append(score(project(codes, k, c, args.projection), y))
            cells.append(
                f"k={k}: {cross_label_share(codes, k, y):.3f}/{orphans:.3f}/{nmis[-1][-1]:.2f}"
            )
        print(f"seed {seed}: " + "  ".join(cells), flush=True)
    mean, sd = np.mean(nmis, axis=0), np.std(nmis, axis=0)
    print(
        "mean NMI: "
        + "  ".join(f"k={k}: {m:.3f} ± {s:.3f}" for k, m, s in zip(ks, mean, sd, strict=True))
    )


if __name__ == "__main__":
    main()
