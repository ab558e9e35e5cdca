"""Quality, speed and scale of mbn_core.MBN (issues 2 and 17). Prints markdown tables.

    python benchmarks/bench_mbn.py quality [--datasets digits iris ...] [--seeds N]
    python benchmarks/bench_mbn.py paper [--datasets mnist5k digits wine] [--seeds N]
    python benchmarks/bench_mbn.py speed [--repeats N]
    python benchmarks/bench_mbn.py scale [--sizes 5000 ...] [--k-max N] [--metric cosine] [--seed 0]
    python benchmarks/bench_mbn.py restarts [--datasets moons circles ...] [--seeds 15] [--group 5]
    python benchmarks/bench_mbn.py affinities [--datasets moons circles ...] [--seeds 3]
    python benchmarks/bench_mbn.py heldout [--datasets moons ...] [--seeds 3] [--methods ...]
    python benchmarks/bench_mbn.py cells [--seeds 3]
    python benchmarks/bench_mbn.py orphans [--datasets moons ...] [--seeds 3]
    python benchmarks/bench_mbn.py features [--datasets wine ...] [--seeds 10]
    python benchmarks/bench_mbn.py outputs [--datasets moons ...] [--seeds 5]
    python benchmarks/bench_mbn.py progress [--datasets moons swiss-roll ...] [--output auto]

``quality`` (issue 17) compares MBN's old and new defaults with UMAP and PCA on small,
low-dimensional and tabular data and MNIST: every method embeds into c dimensions (c = number
of classes), k-means with c clusters keeps the lowest inertia of 20 runs, NMI against the
labels, mean and standard deviation over seeds (the methods' random_state; MNIST: a 5,000-image
subset per seed). Beside the NMI, the label-free report every model carries: trustworthiness
and continuity (k = 10) of the embedding against the input, on up to 1,000 of its rows.

``restarts`` asks whether a label-free score could choose among networks that differ only in
their seed: per seed the NMI and the silhouette of k-means with c clusters on the embedding,
their rank correlation, and the NMI of the best-silhouette network in each group of seeds.

``affinities`` (issue 17) clusters the same fitted networks three ways: k-means on the
embedding (PCA of the top layer's codes), and spectral clustering (Ng-Jordan-Weiss) on the
bottom layer's co-association and on its elementwise product with the top layer's (pairs that
share fine cells and coarse clusters). Exploratory: not a product feature.

``heldout`` (issue 17) measures what a user of the service gets: each method is fitted on a
random 80% of the rows, k-means with c clusters (lowest inertia of 20 runs) on that embedding,
and the held-out 20% are embedded by ``transform`` and assigned to the nearest centroid; NMI
on the held-out rows only, with their trustworthiness / continuity (k = 10).

``cells`` (issue 17) asks why cosine similarity helps MNIST: for the bottom layer of each
metric, how much of the rows' length (a digit's ink) still varies inside a cell, and how pure
the cells' labels are (labels only describe the cells; they choose nothing).

``orphans`` (issue 17) measures what ``delta="auto"`` decides on: the share of (point,
clustering) pairs that a second layer of ``delta * k1`` centers would leave sharing no code with
any center, on the default network's bottom codes, for each candidate delta (``--rows 200
--trials 8 --repeats 10``: the spread of the rule's estimate before 2026-11-25).

``quality --methods`` also takes exploratory variants:
- fixed delta ("MBN, delta 0.7") and more clusterings ("MBN, V 800");
- ensembles of networks ("MBN, 4 networks x V 100": their top codes side by side, PCA of them);
- random reconstruction ("MBN, r 0.5");
- a UMAP output whose graph asks for 30 neighbours ("MBN, UMAP output, 30-neighbour graph");
- the feature rule before it scored inputs at unit scale ("MBN, feature rule on raw units",
  also with the UMAP output);
- MBN on standardised inputs ("MBN, standardised input").

``--datasets`` of ``quality`` and ``heldout`` also take the validation sets (``VALIDATION_DATA``:
s-curve, swiss-roll-noisy, moons-noisy, circles-close, gaussian-quantiles, blobs-stretched,
classification, wine-standardised, and two with inputs of very different scales:
breast-cancer-raw, classification-rescaled). They are kept out of every choice of a default: a
rule chosen on the issue's table is checked on them.

``features`` (issue 17) prints the inputs per bottom clustering that ``feature_fraction="auto"``
chooses on each data set and seed, scoring the inputs at unit scale (the product) and as given
(the rule before it, ``RawUnitsFeatureRuleMBN``). No network is fitted.

``outputs`` (issue 17) fits the defaults (``MBN(n_classes=c, random_state=seed)``) on each data
set and seed and prints what ``delta="auto"`` and ``output="auto"`` chose, and whether the
embedding equals the one of the output asked for by name, bit for bit.

``progress`` fits each data set as a service job does (``METHOD.track``'s callback, the
service's ``k_max``) and prints the seconds of the bottom layer, the upper layers, the UMAP
output's neighbour search and its layout; the costs the progress estimate takes from them
(``mbn_core.mbn.method``: nanoseconds per unit of the bottom layer's modelled cost, and the
search's cost per cell-mate visit and the layout's per row-epoch in those units); and the
largest gap between the reported share and the share of the fit's time gone, which is what a
user watching the bar sees.

``paper`` follows the papers' protocol (Table 7 of mbn-compressive): k-means run 50 times
keeping the lowest inertia, PCA keeping 98% of the variance.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from unittest import mock

import numpy as np
import scipy.sparse as sp
from bench_data import load_mnist
from scipy.sparse.linalg import eigsh
from sklearn.cluster import KMeans
from sklearn.datasets import (
    load_breast_cancer,
    load_digits,
    load_iris,
    load_wine,
    make_blobs,
    make_circles,
    make_classification,
    make_gaussian_quantiles,
    make_moons,
    make_s_curve,
    make_swiss_roll,
)
from sklearn.decomposition import PCA
from sklearn.metrics import normalized_mutual_info_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from mbn_core import MBN
from mbn_core.mbn import auto
from mbn_core.mbn.coassociation import one_hot
from mbn_core.mbn.estimator import METRICS, OUTPUTS
from mbn_core.mbn.method import METHOD, layer_costs
from mbn_core.mbn.outputs import umap as umap_output
from mbn_core.pipeline.quality import neighbourhood_scores


def mnist_subset(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """5,000 images, 500 per digit, as in the paper's MNIST (small) subsets."""
    X, y = load_mnist()
    rng = np.random.default_rng(seed)
    rows = np.concatenate(
        [rng.choice(np.flatnonzero(y == d), 500, replace=False) for d in range(10)]
    )
    return X[rows], y[rows]


def kmeans_nmi(Z: np.ndarray, y: np.ndarray, seed: int, n_init: int = 50) -> float:
    """k-means with as many clusters as classes, lowest inertia of ``n_init`` runs (the
    papers' 50; the quality table's 20), NMI against the labels."""
    n_classes = len(np.unique(y))
    labels = KMeans(n_classes, n_init=n_init, random_state=seed).fit_predict(Z)
    return float(normalized_mutual_info_score(y, labels))


def mean_sd(values) -> str:
    return f"{np.mean(values):.3f} ± {np.std(values):.3f}"


def embed_mbn(X, y, seed, **params):
    c = len(np.unique(y))
    params = {"output": "pca", **params}  # the papers' output
    return MBN(n_components=c, n_classes=c, random_state=seed, **params).fit_transform(X)


def embed_raw(X, y, seed):
    return np.asarray(X, dtype=np.float64)


def embed_pca(X, y, seed):
    # The papers' PCA + k-means keeps the components holding 98% of the variance.
    return PCA(n_components=0.98, svd_solver="full").fit_transform(np.asarray(X, dtype=np.float64))


def embed_umap(X, y, seed):
    import umap

    c = len(np.unique(y))
    return umap.UMAP(n_components=c, random_state=seed).fit_transform(np.asarray(X, np.float32))


METHODS: dict[str, Callable] = {
    "MBN": embed_mbn,
    "k-means on raw": embed_raw,
    "PCA + k-means": embed_pca,
    "UMAP + k-means": embed_umap,
}


def datasets(names, n_seeds):
    for name in names:
        if name == "mnist5k":
            yield name, [(seed, *mnist_subset(seed)) for seed in range(n_seeds)]
        elif name == "digits":
            X, y = load_digits(return_X_y=True)
            yield name, [(seed, X, y) for seed in range(n_seeds)]
        elif name == "wine":
            X, y = load_wine(return_X_y=True)
            yield name, [(seed, X, y) for seed in range(n_seeds)]
        else:
            raise SystemExit(f"unknown dataset {name!r}")


def paper(args) -> None:
    print(f"| data | n | {' | '.join(METHODS)} |")
    print(f"|---|---|{'---|' * len(METHODS)}")
    for name, runs in datasets(args.datasets, args.seeds):
        cells = []
        for embed in METHODS.values():
            scores, seconds = [], []
            for seed, X, y in runs:
                start = time.perf_counter()
                try:
                    Z = embed(X, y, seed)
                except ImportError:
                    break
                seconds.append(time.perf_counter() - start)
                scores.append(kmeans_nmi(Z, y, seed))
            if scores:
                cells.append(
                    f"{np.mean(scores):.4f} ± {np.std(scores):.4f} ({np.mean(seconds):.1f} s)"
                )
            else:
                cells.append("not installed")
        print(
            f"| {name} ({len(runs)} runs) | {len(runs[0][1])} | {' | '.join(cells)} |", flush=True
        )


# ---------------------------------------------------------------------- issue 17


def _quartiles(X: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return X, np.digitize(t, np.quantile(t, [0.25, 0.5, 0.75]))


def _breast_cancer_standardised() -> tuple[np.ndarray, np.ndarray]:
    X, y = load_breast_cancer(return_X_y=True)
    return StandardScaler().fit_transform(X), y


# Fixed data sets (the seed varies only the methods); MNIST draws a subset per seed.
QUALITY_DATA: dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]] = {
    "digits": lambda: load_digits(return_X_y=True),
    "iris": lambda: load_iris(return_X_y=True),
    "breast-cancer": _breast_cancer_standardised,
    "moons": lambda: make_moons(1000, noise=0.06, random_state=7),
    "circles": lambda: make_circles(1000, factor=0.5, noise=0.04, random_state=7),
    "swiss-roll": lambda: _quartiles(*make_swiss_roll(2000, noise=0.2, random_state=7)),
    "wine": lambda: load_wine(return_X_y=True),
}


def _stretched_blobs() -> tuple[np.ndarray, np.ndarray]:
    X, y = make_blobs(1000, centers=4, cluster_std=[1.0, 2.0, 0.5, 1.5], random_state=7)
    return X @ np.array([[0.6, -0.6], [-0.4, 0.8]]), y


def _four_classes_of_twenty_inputs() -> tuple[np.ndarray, np.ndarray]:
    return make_classification(
        1000, n_features=20, n_informative=5, n_redundant=5, n_classes=4,
        n_clusters_per_class=1, random_state=7,
    )  # fmt: skip


def _wine_standardised() -> tuple[np.ndarray, np.ndarray]:
    X, y = load_wine(return_X_y=True)
    return StandardScaler().fit_transform(X), y


def _classification_rescaled() -> tuple[np.ndarray, np.ndarray]:
    """The classification set with each input in other units (a factor from 0.01 to 100)."""
    X, y = _four_classes_of_twenty_inputs()
    return X * 10 ** np.random.RandomState(5).uniform(-2, 2, X.shape[1]), y


# Data sets kept out of every choice of a default (issue 17): a rule chosen on QUALITY_DATA is
# checked here, on shapes the choice never saw. Fixed sets, as QUALITY_DATA.
VALIDATION_DATA: dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]] = {
    "s-curve": lambda: _quartiles(*make_s_curve(2000, noise=0.1, random_state=7)),
    "swiss-roll-noisy": lambda: _quartiles(*make_swiss_roll(2000, noise=0.6, random_state=11)),
    "moons-noisy": lambda: make_moons(1000, noise=0.12, random_state=11),
    "circles-close": lambda: make_circles(1000, factor=0.7, noise=0.05, random_state=11),
    "gaussian-quantiles": lambda: make_gaussian_quantiles(
        n_samples=1000, n_features=3, n_classes=3, random_state=7
    ),
    "blobs-stretched": _stretched_blobs,
    "classification": _four_classes_of_twenty_inputs,
    "wine-standardised": _wine_standardised,
    # Inputs of very different scales, as users send them.
    "breast-cancer-raw": lambda: load_breast_cancer(return_X_y=True),
    "classification-rescaled": _classification_rescaled,
}
KNOWN_DATA = {**QUALITY_DATA, **VALIDATION_DATA}


def quality_data(name: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    if name == "mnist5k":
        return mnist_subset(seed)
    if name not in KNOWN_DATA:
        raise SystemExit(f"unknown dataset {name!r}; known: mnist5k {' '.join(KNOWN_DATA)}")
    X, y = KNOWN_DATA[name]()
    return np.asarray(X, dtype=np.float64), y


class OldDefaultsMBN(MBN):
    """MBN as its defaults were before issue 17: delta 0.5, and "auto" features meaning at
    least min(d, 8) of the d inputs at the bottom (0.5 at the upper layers)."""

    def _n_bottom_features(self, X, rng) -> int:
        return max(round(0.5 * X.shape[1]), min(X.shape[1], 8))


def pca_output_mbn(c: int, seed: int, **params) -> MBN:
    """MBN with the papers' PCA output, the default before output="auto": what the exploratory
    variants and commands were measured with, and still compare."""
    return MBN(n_classes=c, output="pca", random_state=seed, **params)


# The MBN configurations the issue-17 tables compare, as (c, seed) -> unfitted estimator.
MBN_MODELS: dict[str, Callable] = {
    "MBN, old defaults": lambda c, seed: OldDefaultsMBN(
        n_classes=c, delta=0.5, output="pca", random_state=seed
    ),
    "MBN, new defaults": lambda c, seed: MBN(n_classes=c, random_state=seed),
    # The defaults before output="auto": the paper's PCA output on every data set.
    "MBN, PCA output": pca_output_mbn,
    "MBN, UMAP output": lambda c, seed: MBN(n_classes=c, output="umap", random_state=seed),
    "MBN, cosine": lambda c, seed: MBN(n_classes=c, metric="cosine", random_state=seed),
}


class NetworkEnsemble:
    """m networks that differ only in their seed (and, given ``k1s``, network j's k1); the
    embedding is PCA of their top codes side by side (the average of their co-associations),
    the issue's "ensemble of networks"."""

    def __init__(
        self,
        n_networks: int,
        n_clusterings: int,
        c: int,
        seed: int,
        k1s: tuple[float | str, ...] | None = None,
    ) -> None:
        self.n_networks, self.n_clusterings, self.c, self.seed = n_networks, n_clusterings, c, seed
        self.k1s = k1s or ("auto",) * n_networks

    def fit_transform(self, X) -> np.ndarray:
        blocks = []
        for j, k1 in enumerate(self.k1s):
            net = MBN(
                n_classes=self.c,
                n_clusterings=self.n_clusterings,
                k1=k1,
                output="pca",  # only its codes are used
                random_state=1000 * self.seed + j,
            ).fit(X)
            blocks.append(one_hot(net.encode(X), net.ks_[-1], dtype=np.float64))
        codes = sp.hstack(blocks).toarray()
        return PCA(n_components=self.c, svd_solver="full").fit_transform(codes)


class GraphNeighborsUmapOutput:
    """``MBN(output="umap")`` whose UMAP graph asks for another number of neighbours per row
    than the product's ``umap_output.GRAPH_NEIGHBORS`` (patched for the fit only). It only
    fits: a ``transform`` after the patch would place rows with the product's constant."""

    def __init__(self, graph_neighbors: int, c: int, seed: int) -> None:
        self.graph_neighbors, self.c, self.seed = graph_neighbors, c, seed

    def fit_transform(self, X) -> np.ndarray:
        model = MBN(n_classes=self.c, output="umap", random_state=self.seed)
        with mock.patch.object(umap_output, "GRAPH_NEIGHBORS", self.graph_neighbors):
            return model.fit_transform(X)


class RawUnitsFeatureRuleMBN(MBN):
    """MBN whose ``feature_fraction="auto"`` scores the inputs as given, as before commit
    d098c60, instead of at unit scale."""

    def _n_bottom_features(self, X, rng) -> int:
        with mock.patch.object(auto, "unit_scale", lambda sample: sample):
            return super()._n_bottom_features(X, rng)


# Exploratory variants for ``quality --methods`` (not in its default list).
MBN_VARIANTS: dict[str, Callable] = {
    "MBN, delta 0.7": lambda c, seed: pca_output_mbn(c, seed, delta=0.7),
    "MBN, delta 0.9": lambda c, seed: pca_output_mbn(c, seed, delta=0.9),
    "MBN, V 800": lambda c, seed: pca_output_mbn(c, seed, n_clusterings=800),
    "MBN, V 1600": lambda c, seed: pca_output_mbn(c, seed, n_clusterings=1600),
    "MBN, V 1600, delta 0.7": lambda c, seed: pca_output_mbn(
        c, seed, n_clusterings=1600, delta=0.7
    ),
    "MBN, 4 networks x V 100": lambda c, seed: NetworkEnsemble(4, 100, c, seed),
    "MBN, 4 networks x V 400": lambda c, seed: NetworkEnsemble(4, 400, c, seed),
    "MBN, r 0.5": lambda c, seed: pca_output_mbn(c, seed, shift_fraction=0.5),
    "MBN, r 0.25": lambda c, seed: pca_output_mbn(c, seed, shift_fraction=0.25),
    "MBN, UMAP output, 30-neighbour graph": lambda c, seed: GraphNeighborsUmapOutput(30, c, seed),
    "MBN, standardised input": lambda c, seed: make_pipeline(
        StandardScaler(), pca_output_mbn(c, seed)
    ),
    "MBN, feature rule on raw units": lambda c, seed: RawUnitsFeatureRuleMBN(
        n_classes=c, output="pca", random_state=seed
    ),
    "MBN, UMAP output, feature rule on raw units": lambda c, seed: RawUnitsFeatureRuleMBN(
        n_classes=c, output="umap", random_state=seed
    ),
}


def fit_transform_of(name: str) -> Callable:
    models = {**MBN_MODELS, **MBN_VARIANTS}
    return lambda X, c, seed: models[name](c, seed).fit_transform(X)


def issue17_umap(X, c, seed, n_neighbors: int = 15):
    import umap

    model = umap.UMAP(n_components=c, n_neighbors=n_neighbors, random_state=seed)
    return model.fit_transform(np.asarray(X, np.float32))


def issue17_pca(X, c, seed):
    return PCA(n_components=min(c, X.shape[1]), random_state=seed).fit_transform(X)


QUALITY_METHODS: dict[str, Callable] = {
    **{name: fit_transform_of(name) for name in MBN_MODELS},
    "UMAP": issue17_umap,
    "PCA": issue17_pca,
}
QUALITY_DEFAULT_METHODS = list(QUALITY_METHODS)
QUALITY_METHODS.update({name: fit_transform_of(name) for name in MBN_VARIANTS})
QUALITY_METHODS["UMAP, 30 neighbours"] = lambda X, c, seed: issue17_umap(X, c, seed, 30)


def label_free(X: np.ndarray, Z: np.ndarray, seed: int) -> dict[str, float]:
    rows = np.random.default_rng(seed).permutation(len(X))[:1000]
    return neighbourhood_scores(X[rows], Z[rows], 10, "euclidean")


class SeedScores:
    """One method's NMI and label-free report (trustworthiness, continuity) over seeds."""

    def __init__(self) -> None:
        self.nmi: list[float] = []
        self.trust: list[float] = []
        self.cont: list[float] = []

    def add(self, nmi: float, X: np.ndarray, Z: np.ndarray, seed: int) -> None:
        self.nmi.append(nmi)
        report = label_free(X, Z, seed)
        self.trust.append(report["trustworthiness"])
        self.cont.append(report["continuity"])

    def cell(self, prefix: str = "") -> str:
        if not self.nmi:
            return "not installed"
        report = f"{np.mean(self.trust):.3f} / {np.mean(self.cont):.3f}"
        return f"{mean_sd(self.nmi)} ({prefix}{report})"


def quality(args) -> None:
    methods = {name: QUALITY_METHODS[name] for name in args.methods}
    print(
        f"{len(args.datasets)} data sets, {args.seeds} seeds; cell: NMI mean ± sd "
        "(seconds per embedding; trustworthiness / continuity, k = 10)"
    )
    print()
    print(f"| data | n x d | {' | '.join(methods)} |")
    print(f"|---|---|{'---|' * len(methods)}")
    for name in args.datasets:
        runs = [(seed, *quality_data(name, seed)) for seed in range(args.seeds)]
        cells = []
        for method, embed in methods.items():
            scores, seconds = SeedScores(), []
            for seed, X, y in runs:
                c = len(np.unique(y))
                start = time.perf_counter()
                try:
                    Z = embed(X, c, seed)
                except ImportError:
                    break
                seconds.append(time.perf_counter() - start)
                scores.add(kmeans_nmi(Z, y, seed, n_init=20), X, Z, seed)
                print(f"{name} {method} seed {seed}: NMI {scores.nmi[-1]:.4f}", file=sys.stderr)
            cells.append(scores.cell(f"{np.median(seconds):.1f} s; " if seconds else ""))
        shape = runs[0][1].shape
        print(f"| {name} | {shape[0]:,} x {shape[1]} | {' | '.join(cells)} |", flush=True)


HELDOUT_METHODS: dict[str, Callable] = {
    "MBN, new defaults": MBN_MODELS["MBN, new defaults"],
    "MBN, PCA output": MBN_MODELS["MBN, PCA output"],
    "MBN, UMAP output": MBN_MODELS["MBN, UMAP output"],
    "MBN, cosine": MBN_MODELS["MBN, cosine"],
    "UMAP": lambda c, seed: __import__("umap").UMAP(n_components=c, random_state=seed),
    "PCA": lambda c, seed: PCA(n_components=c, random_state=seed),
}


def split_rows(n_rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A random 80% of the rows to fit, and the other 20% as new rows."""
    order = np.random.default_rng(seed).permutation(n_rows)
    return order[: int(0.8 * n_rows)], order[int(0.8 * n_rows) :]


def heldout(args) -> None:
    print(
        f"{args.seeds} seeds, 80/20 split per seed; cell: held-out NMI mean ± sd "
        "(held-out trustworthiness / continuity, k = 10)"
    )
    print()
    methods = {name: HELDOUT_METHODS[name] for name in args.methods}
    print(f"| data | {' | '.join(methods)} |")
    print(f"|---|{'---|' * len(methods)}")
    for name in args.datasets:
        cells = []
        for method, make in methods.items():
            scores = SeedScores()
            for seed in range(args.seeds):
                X, y = quality_data(name, seed)
                X = np.asarray(X, np.float32)
                c = len(np.unique(y))
                fit_rows, new_rows = split_rows(len(X), seed)
                try:
                    model = make(min(c, X.shape[1]) if method == "PCA" else c, seed)
                except ImportError:
                    break
                kmeans = KMeans(c, n_init=20, random_state=seed)
                kmeans.fit(model.fit_transform(X[fit_rows]))
                Z_new = model.transform(X[new_rows])
                nmi = normalized_mutual_info_score(y[new_rows], kmeans.predict(Z_new))
                scores.add(nmi, X[new_rows], Z_new, seed)
                print(f"{name} {method} seed {seed}: NMI {nmi:.4f}", file=sys.stderr)
            cells.append(scores.cell())
        print(f"| {name} | {' | '.join(cells)} |", flush=True)


def bare_bottom_gemms(n: int, d_chosen: int, k: int, V: int) -> float:
    """Seconds for V float32 products of the bottom layer's shapes, default BLAS threads."""
    rng = np.random.default_rng(0)
    A = rng.random((n, d_chosen + 1), dtype=np.float32)
    B = rng.random((d_chosen + 1, k), dtype=np.float32)
    A @ B
    start = time.perf_counter()
    for _ in range(V):
        A @ B
    return time.perf_counter() - start


def speed(args) -> None:
    X, _ = mnist_subset(0)
    model = MBN(random_state=0)
    ks = model.layer_sizes(len(X))
    d_chosen = model._n_bottom_features(X, np.random.RandomState(0))
    rows = []
    for repeat in range(args.repeats):
        gemm = bare_bottom_gemms(len(X), d_chosen, ks[0], model.n_clusterings)
        ends: dict[int, float] = {}

        def callback(layer, done, total, ends=ends):
            ends[layer] = time.perf_counter()

        start = time.perf_counter()
        MBN(random_state=repeat, callback=callback).fit(X)
        fit = time.perf_counter() - start
        bottom = ends[0] - start
        upper = ends[len(ks) - 1] - ends[0]
        rows.append((gemm, fit, bottom, upper))
        print(
            f"repeat {repeat}: bare GEMMs {gemm:.1f} s, fit {fit:.1f} s "
            f"(bottom {bottom:.1f} s, upper {upper:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
    runs = np.array(rows)
    gemm, fit, bottom, upper = runs.T
    # Ratios within each run (same machine state), then their median: the machine is shared.
    print(f"MNIST 5,000 x 784, defaults (ks={ks}, V=400, a=0.5), {args.repeats} runs")
    print()
    print("| run | bare GEMMs | fit | fit / GEMMs | bottom / GEMMs | upper / bottom |")
    print("|---|---|---|---|---|---|")
    for i, (g, f, b, u) in enumerate(runs):
        print(f"| {i} | {g:.1f} s | {f:.1f} s | {f / g:.2f} | {b / g:.2f} | {u / b:.0%} |")
    print(
        f"| **median** | {np.median(gemm):.1f} s | {np.median(fit):.1f} s | "
        f"**{np.median(fit / gemm):.2f}** (target <= 1.5) | {np.median(bottom / gemm):.2f} | "
        f"**{np.median(upper / bottom):.0%}** (target <= 25%) |"
    )
    print()
    print(f"PCA and projection: {np.median(fit - bottom - upper):.1f} s (median)")


def restarts(args) -> None:
    from scipy.stats import spearmanr
    from sklearn.metrics import silhouette_score

    print(
        f'MBN(n_classes=c, output="pca", random_state=s), s = 0..{args.seeds - 1}; restarts in '
        "groups of "
        f"{args.group}, keeping the best silhouette"
    )
    print()
    print(
        "| data | NMI, mean ± sd | Spearman(silhouette, NMI) | best silhouette per group | mean |"
    )
    print("|---|---|---|---|---|")
    for name in args.datasets:
        X, y = quality_data(name, 0)
        c = len(np.unique(y))
        nmi, silhouette = [], []
        for seed in range(args.seeds):
            Z = pca_output_mbn(c, seed).fit_transform(X)
            labels = KMeans(c, n_init=20, random_state=0).fit_predict(Z)
            nmi.append(normalized_mutual_info_score(y, labels))
            silhouette.append(silhouette_score(Z, labels))
            print(
                f"{name} seed {seed}: NMI {nmi[-1]:.3f} silhouette {silhouette[-1]:.3f}",
                file=sys.stderr,
            )
        groups = range(0, args.seeds - args.group + 1, args.group)
        picks = [nmi[g + int(np.argmax(silhouette[g : g + args.group]))] for g in groups]
        print(
            f"| {name} | {mean_sd(nmi)} | "
            f"{spearmanr(silhouette, nmi)[0]:+.2f} | {', '.join(f'{p:.3f}' for p in picks)} | "
            f"{np.mean(picks):.3f} |",
            flush=True,
        )


def spectral_embedding(K, c: int) -> tuple[np.ndarray, float]:
    """Ng-Jordan-Weiss: the c leading eigenvectors of D^-1/2 K D^-1/2, rows normalised, and
    the eigengap at c. Dense K is solved whole; sparse K (thousands of rows) with ARPACK."""
    inverse_root = 1.0 / np.sqrt(np.asarray(K.sum(1)).ravel())
    if sp.issparse(K):
        normalised = sp.diags(inverse_root) @ K @ sp.diags(inverse_root)
        values, U = eigsh(normalised, k=c + 1, which="LA", v0=np.ones(K.shape[0]))
    else:
        values, U = np.linalg.eigh(K * np.outer(inverse_root, inverse_root))
    order = np.argsort(-values)
    values, U = values[order], U[:, order[:c]]
    return U / np.linalg.norm(U, axis=1, keepdims=True), float(values[c - 1] - values[c])


def coassociations(model: MBN, X: np.ndarray) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """The share of a fitted network's bottom clusterings that put each pair of rows in one
    cell, and its elementwise product with the same share at the top layer."""
    V = model.n_clusterings
    bottom = one_hot(model.encode(X, layer=0), model.ks_[0])
    top = one_hot(model.encode(X), model.ks_[-1])
    K_bottom = ((bottom @ bottom.T) / V).tocsr()
    return K_bottom, K_bottom.multiply((top @ top.T) / V).tocsr()


def affinities(args) -> None:
    seeds = f"s = 0..{args.seeds - 1}"
    print(f'MBN(n_classes=c, output="pca", random_state=s), {seeds}; NMI mean ± sd')
    print()
    print("| data | k-means on the embedding | spectral, bottom | spectral, bottom x top |")
    print("|---|---|---|---|")
    for name in args.datasets:
        scores = []
        for seed in range(args.seeds):
            X, y = quality_data(name, seed)
            c = len(np.unique(y))
            model = pca_output_mbn(c, seed)
            Z = model.fit_transform(X)
            K_bottom, K_product = coassociations(model, X)
            outputs = (Z, spectral_embedding(K_bottom, c)[0], spectral_embedding(K_product, c)[0])
            scores.append([kmeans_nmi(out, y, seed, n_init=20) for out in outputs])
            print(
                f"{name} seed {seed}: " + " ".join(f"{v:.4f}" for v in scores[-1]), file=sys.stderr
            )
        cells = " | ".join(mean_sd(column) for column in zip(*scores, strict=True))
        print(f"| {name} | {cells} |", flush=True)


# Every 20th bottom clustering: 20 of the 400 describe the layer well enough.
CELL_STRIDE = 20


def bottom_cells(args) -> None:
    print(
        "Bottom-layer cells of MBN(metric=m, random_state=s) on the MNIST 5k subsets, "
        f"s = 0..{args.seeds - 1}, every {CELL_STRIDE}th clustering; mean ± sd over seeds"
    )
    print()
    print("| metric | row-length variance left within cells | cell label purity | NMI |")
    print("|---|---|---|---|")
    for metric in METRICS:
        rows = []
        for seed in range(args.seeds):
            X, y = mnist_subset(seed)
            model = MBN(metric=metric, random_state=seed)
            Z = model.fit_transform(X)
            within, purity = cell_statistics(model.encode(X, layer=0)[:, ::CELL_STRIDE], X, y)
            rows.append((within, purity, kmeans_nmi(Z, y, seed, n_init=20)))
        cells = " | ".join(mean_sd(column) for column in zip(*rows, strict=True))
        print(f"| {metric} | {cells} |", flush=True)


def cell_statistics(codes: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """How much of the rows' length (a digit's ink) varies inside a bottom cell, as a share of
    its total variance, and the share of rows whose cell's majority label is their own."""
    length = np.linalg.norm(np.asarray(X, np.float64), axis=1)
    within, purity = [], []
    for column in codes.T.astype(np.int64):
        counts = np.bincount(column)
        mean = np.bincount(column, weights=length) / np.maximum(counts, 1)
        within.append(np.mean((length - mean[column]) ** 2) / length.var())
        table = np.zeros((counts.size, int(y.max()) + 1))
        np.add.at(table, (column, y), 1)
        purity.append(table.max(axis=1).sum() / len(y))
    return float(np.mean(within)), float(np.mean(purity))


def scale_one(n: int, k_max: int, metric: str, seed: int, output: str, new_rows: int) -> dict:
    """Fit on MNIST's first n images; with ``new_rows``, also embed its last ``new_rows``
    images (never fitted when n + new_rows <= 70,000) and score them with the fitted rows'
    k-means centroids."""
    X_all, y_all = load_mnist()
    if new_rows and n + new_rows > len(X_all):
        raise ValueError(f"{n} fitted + {new_rows} new rows > {len(X_all)} images")
    X, y = X_all[:n], y_all[:n]
    layer_ends: list[float] = []

    def on_progress(layer: int, done: int, total: int) -> bool:
        if done == total:
            layer_ends.append(time.perf_counter())
        return False

    model = MBN(k_max=k_max, metric=metric, output=output, random_state=seed, callback=on_progress)
    start = time.perf_counter()
    Z = model.fit_transform(X)
    end = time.perf_counter()
    kmeans = KMeans(10, n_init=50, random_state=seed).fit(Z)
    result = {
        "n": n,
        "ks": model.ks_,
        "fit_s": end - start,
        # The layers' seconds, then the output's (from the top layer's end to the embedding).
        "layer_s": np.diff([start, *layer_ends]).round(1).tolist(),
        "output_s": end - layer_ends[-1],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "model_mb": model.nbytes / 1e6,
        "nmi": float(normalized_mutual_info_score(y, kmeans.labels_)),
    }
    if new_rows:
        start = time.perf_counter()
        Z_new = model.transform(X_all[-new_rows:])
        result["new_ms_per_row"] = 1000 * (time.perf_counter() - start) / new_rows
        labels = kmeans.predict(Z_new)
        result["new_nmi"] = float(normalized_mutual_info_score(y_all[-new_rows:], labels))
    return result


def scale(args) -> None:
    print(
        f"MNIST first n images, defaults with k_max={args.k_max}, V=400, metric={args.metric}, "
        f"output={args.output}, random_state={args.seed}, one process per size"
        + (f"; new rows: MNIST's last {args.new_rows:,}" if args.new_rows else "")
    )
    print()
    print(
        "| n | ks | fit (bottom layer / upper layers / output) | peak RSS | model size "
        "| NMI (k-means, 10 clusters) | new rows: NMI (fitted rows' centroids), ms per row |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in args.sizes:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "scale-one",
                str(n),
                str(args.k_max),
                args.metric,
                str(args.seed),
                args.output,
                str(args.new_rows),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        r = json.loads(out.strip().splitlines()[-1])
        new = f"{r['new_nmi']:.4f}, {r['new_ms_per_row']:.2f} ms" if "new_nmi" in r else ""
        print(
            f"| {r['n']:,} | {'-'.join(map(str, r['ks']))} | {r['fit_s']:.0f} s "
            f"({r['layer_s'][0]:.0f} s / {sum(r['layer_s'][1:]):.0f} s / {r['output_s']:.0f} s) | "
            f"{r['peak_rss_mb']:.0f} MB | {r['model_mb']:.0f} MB | {r['nmi']:.4f} | {new} |",
            flush=True,
        )


# The rule's candidates, and 0.6 to see where between 0.5 and 0.7 the rate falls.
ORPHAN_DELTAS = tuple(sorted({*auto.DELTAS, 0.6}))


def orphans(args) -> None:
    """Second-layer orphan rates per candidate delta (see ``mbn_core.mbn.auto.orphan_rate``)."""
    print(
        f"rows: up to {args.rows} per network, {args.trials} trial clusterings per delta; "
        f"mean ± sd over {args.repeats} estimates"
    )
    print()
    print(f"| data | seed | {' | '.join(f'delta {d}' for d in ORPHAN_DELTAS)} | auto chooses |")
    print(f"|---|---|{'---|' * (len(ORPHAN_DELTAS) + 1)}")
    for name in args.datasets:
        for seed in range(args.seeds):
            X, y = quality_data(name, seed)
            c = len(np.unique(y))
            network = pca_output_mbn(c, seed).fit(X)
            codes, k1 = network.encode(X, layer=0), network.ks_[0]
            rates = [
                [
                    auto.orphan_rate(
                        codes,
                        int(d * k1),
                        network._upper_fraction(),  # as fit passes it to choose_delta
                        np.random.RandomState(r),
                        n_rows=args.rows,
                        n_trials=args.trials,
                    )
                    for r in range(1000 * seed, 1000 * seed + args.repeats)
                ]
                for d in ORPHAN_DELTAS
            ]
            cells = " | ".join(
                f"{100 * np.mean(r):.2f}%" + (f" ± {100 * np.std(r):.2f}" if len(r) > 1 else "")
                for r in rates
            )
            print(f"| {name} | {seed} | {cells} | {network.delta_} |", flush=True)


def features(args) -> None:
    """The inputs ``feature_fraction="auto"`` chooses, at unit scale and on raw units."""
    print(f"seeds 0-{args.seeds - 1}; inputs per bottom clustering, one per seed")
    print()
    print("| data | d | at unit scale (the product) | on raw units (before) |")
    print("|---|---|---|---|")
    for name in args.datasets:
        X, _ = quality_data(name, 0)
        choices = []
        for model in (MBN(), RawUnitsFeatureRuleMBN()):
            seeds = [
                model._n_bottom_features(X, np.random.RandomState(s)) for s in range(args.seeds)
            ]
            choices.append(", ".join(map(str, seeds)))
        print(f"| {name} | {X.shape[1]} | {' | '.join(choices)} |", flush=True)


def outputs(args) -> None:
    """The shrink factor and output the defaults choose, per data set and seed."""
    print(f"seeds 0-{args.seeds - 1}; per seed: delta_ / output_, and = when the embedding is")
    print("bit for bit MBN(output=output_)'s")
    print()
    print("| data | n x d | per seed |")
    print("|---|---|---|")
    for name in args.datasets:
        cells = []
        for seed in range(args.seeds):
            X, y = quality_data(name, seed)
            c = len(np.unique(y))
            model = MBN(n_classes=c, random_state=seed)  # the defaults, output="auto"
            Z = model.fit_transform(X)
            named = MBN(n_classes=c, output=model.output_, random_state=seed).fit_transform(X)
            same = "=" if np.array_equal(Z, named) else "differs"
            cells.append(f"{model.delta_} / {model.output_} {same}")
        print(f"| {name} | {X.shape[0]:,} x {X.shape[1]} | {'; '.join(cells)} |", flush=True)


def progress_data(name: str) -> tuple[np.ndarray, np.ndarray]:
    """``quality_data``, and MNIST's first N images as "mnistN" (e.g. mnist10k)."""
    if name.startswith("mnist") and name.endswith("k") and name != "mnist5k":
        n = 1000 * int(name[len("mnist") : -1])
        X, y = load_mnist()
        return X[:n], y[:n]
    return quality_data(name, 0)


def progress_one(name: str, output: str) -> dict:
    """One fit of ``name`` under the service's progress callback: when each step ended."""
    X, y = progress_data(name)
    params = {"n_classes": len(np.unique(y)), "output": output, **METHOD.defaults}
    # A fresh process compiles numba code, or loads it from numba's cache, on first use: timed
    # apart, on a small fit that takes the same path.
    start = time.perf_counter()
    MBN(random_state=1, **{**params, "k1": 0.5}).fit(X[: min(len(X), 300)])
    compile_s = time.perf_counter() - start
    model = MBN(random_state=0, **params)
    events: list[tuple[float, float, str]] = []
    METHOD.track(
        model, X.shape, lambda share, message: events.append((time.perf_counter(), share, message))
    )
    start = time.perf_counter()
    model.fit(X)
    end = time.perf_counter()

    def last(prefix: str) -> float:
        times = [t for t, _, message in events if message.startswith(prefix)]
        return times[-1] if times else float("nan")

    bottom_end, layers_end = last("layer 1/"), last("layer ")
    search_end = last(f"{model.output_} output, neighbours")
    epochs = [
        t for t, _, message in events if message.startswith(f"{model.output_} output, layout")
    ]
    first_epoch = epochs[0] if epochs else float("nan")
    n, k1 = X.shape[0], model.ks_[0]
    unit_s = (bottom_end - start) / layer_costs(model, X.shape, model.ks_)[0]
    visits = n * model.n_clusterings * n / k1
    # The bar against the clock: reported share minus the share of the fit's time gone.
    gaps = [share - (t - start) / (end - start) for t, share, _ in events]
    return {
        "name": name,
        "shape": list(X.shape),
        "ks": model.ks_,
        "output": model.output_,
        "fit_s": end - start,
        "first_small_fit_s": compile_s,
        "bottom_s": bottom_end - start,
        "upper_s": layers_end - bottom_end,
        "search_s": search_end - layers_end,
        "layout_s": end - search_end,
        # Of the layout: the fuzzy set, the spectral start and numba's compiling before epoch 0.
        "layout_start_s": first_epoch - search_end,
        "unit_ns": 1e9 * unit_s,
        "search_cost": (search_end - layers_end) / visits / unit_s,
        "layout_cost": (end - search_end) / (n * umap_output.layout_epochs(n)) / unit_s,
        "ahead": max(gaps),
        "behind": -min(gaps),
    }


def progress(args) -> None:
    print(
        f"MBN(n_classes=c, output={args.output!r}, random_state=0, k_max="
        f"{METHOD.defaults['k_max']}) under the service's progress callback; one process per set"
    )
    print()
    print(
        "| data | n x d | ks, output | first fit of 300 rows (compiling) | fit | bottom layer / "
        "upper layers / neighbour search / layout | ns per bottom unit | search cost per visit "
        "/ layout cost per row-epoch (units) | bar ahead / behind the clock |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.datasets:
        out = subprocess.run(
            [sys.executable, __file__, "progress-one", name, args.output],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        r = json.loads(out.strip().splitlines()[-1])
        umap_like = r["output"].startswith("umap")
        print(
            f"| {r['name']} | {r['shape'][0]:,} x {r['shape'][1]} | "
            f"{'-'.join(map(str, r['ks']))}, {r['output']} | {r['first_small_fit_s']:.1f} s | "
            f"{r['fit_s']:.1f} s | "
            f"{r['bottom_s']:.1f} / {r['upper_s']:.1f} / "
            + (
                f"{r['search_s']:.1f} / {r['layout_s']:.1f} s ({r['layout_start_s']:.1f} s "
                "before epoch 0) | "
                if umap_like
                else "- / - s | "
            )
            + f"{r['unit_ns']:.3f} | "
            + (f"{r['search_cost']:.2g} / {r['layout_cost']:.2g} | " if umap_like else "- | ")
            + f"{r['ahead']:.2f} / {r['behind']:.2f} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--datasets", nargs="+", default=[*QUALITY_DATA, "mnist5k"])
    q.add_argument(
        "--methods", nargs="+", choices=list(QUALITY_METHODS), default=QUALITY_DEFAULT_METHODS
    )
    q.add_argument("--seeds", type=int, default=5)
    p = sub.add_parser("paper")
    p.add_argument("--datasets", nargs="+", default=["mnist5k", "digits", "wine"])
    p.add_argument("--seeds", type=int, default=5)
    s = sub.add_parser("speed")
    s.add_argument("--repeats", type=int, default=3)
    c = sub.add_parser("scale")
    c.add_argument("--sizes", nargs="+", type=int, default=[5000, 20000, 70000])
    c.add_argument("--k-max", type=int, default=8000)
    c.add_argument("--metric", choices=METRICS, default="euclidean")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--output", choices=OUTPUTS, default="pca")
    c.add_argument("--new-rows", type=int, default=0)
    r = sub.add_parser("restarts")
    r.add_argument("--datasets", nargs="+", default=list(QUALITY_DATA))
    r.add_argument("--seeds", type=int, default=15)
    r.add_argument("--group", type=int, default=5)
    b = sub.add_parser("cells")
    b.add_argument("--seeds", type=int, default=3)
    a = sub.add_parser("affinities")
    a.add_argument("--datasets", nargs="+", default=[*QUALITY_DATA, "mnist5k"])
    a.add_argument("--seeds", type=int, default=3)
    h = sub.add_parser("heldout")
    h.add_argument("--datasets", nargs="+", default=[*QUALITY_DATA, "mnist5k"])
    h.add_argument("--seeds", type=int, default=3)
    h.add_argument("--methods", nargs="+", default=list(HELDOUT_METHODS))
    o = sub.add_parser("orphans")
    o.add_argument("--datasets", nargs="+", default=[*QUALITY_DATA, "mnist5k"])
    o.add_argument("--seeds", type=int, default=3)
    o.add_argument("--rows", type=int, default=auto.ORPHAN_ROWS)
    o.add_argument("--trials", type=int, default=auto.ORPHAN_TRIALS)
    o.add_argument("--repeats", type=int, default=1)
    f = sub.add_parser("features")
    f.add_argument("--datasets", nargs="+", default=[*QUALITY_DATA, *VALIDATION_DATA, "mnist5k"])
    f.add_argument("--seeds", type=int, default=10)
    u = sub.add_parser("outputs")
    u.add_argument("--datasets", nargs="+", default=[*QUALITY_DATA, *VALIDATION_DATA, "mnist5k"])
    u.add_argument("--seeds", type=int, default=5)
    g = sub.add_parser("progress")
    g.add_argument("--datasets", nargs="+", default=["moons", "swiss-roll", "digits", "mnist10k"])
    g.add_argument("--output", choices=OUTPUTS, default="auto")
    g_one = sub.add_parser("progress-one")
    g_one.add_argument("name")
    g_one.add_argument("output", choices=OUTPUTS)
    one = sub.add_parser("scale-one")
    one.add_argument("n", type=int)
    one.add_argument("k_max", type=int)
    one.add_argument("metric", choices=METRICS)
    one.add_argument("seed", type=int)
    one.add_argument("output", choices=OUTPUTS)
    one.add_argument("new_rows", type=int)
    args = parser.parse_args()
    if args.command == "quality":
        quality(args)
    elif args.command == "paper":
        paper(args)
    elif args.command == "speed":
        speed(args)
    elif args.command == "scale":
        scale(args)
    elif args.command == "restarts":
        restarts(args)
    elif args.command == "cells":
        bottom_cells(args)
    elif args.command == "affinities":
        affinities(args)
    elif args.command == "heldout":
        heldout(args)
    elif args.command == "features":
        features(args)
    elif args.command == "outputs":
        outputs(args)
    elif args.command == "orphans":
        orphans(args)
    elif args.command == "progress":
        progress(args)
    elif args.command == "progress-one":
        print(json.dumps(progress_one(args.name, args.output)))
    else:
        with threadpool_limits(limits=None):
            result = scale_one(
                args.n, args.k_max, args.metric, args.seed, args.output, args.new_rows
            )
            print(json.dumps(result))


if __name__ == "__main__":
    main()
