"""The shared harness of the MBN benchmarks and experiments: data sets, scores, model variants.

``bench_mbn.py`` (the benchmarks behind docs/BENCHMARKS.md) and the probes of
``experiments/`` import it, so every table scores the same way:

- data: ``QUALITY_DATA`` (the quality table's sets), ``VALIDATION_DATA`` (sets kept out of
  every choice of a default: a rule chosen on the quality table is checked on them),
  ``quality_data(name, seed)`` (either, or ``mnist5k``: one 5,000-image subset per seed);
- scores: ``kmeans_nmi`` (k-means with as many clusters as classes, lowest inertia of
  ``n_init`` runs, NMI against the labels), ``label_free`` (trustworthiness and continuity,
  k = 10, on up to 1,000 rows), ``SeedScores`` and ``mean_sd`` (one table cell over seeds);
- models: ``MBN_MODELS`` (the configurations the quality table compares) and
  ``MBN_VARIANTS`` (the variants the decision records measured: fixed delta, more
  clusterings, ensembles, random reconstruction, standardised input, the feature rule on raw
  units), as ``(c, seed) -> unfitted estimator``; ``QUALITY_METHODS`` adds UMAP and PCA as
  ``(X, c, seed) -> embedding``;
- ``split_rows`` (the 80/20 split of ``heldout``), ``spectral_embedding`` and
  ``coassociations`` (the affinities the probes cluster by).
"""

from __future__ import annotations

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

from mbn_core import MBN
from mbn_core.mbn import auto
from mbn_core.mbn.coassociation import one_hot
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


# Data sets kept out of every choice of a default: a rule chosen on QUALITY_DATA is
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
    """MBN as its defaults were before the "auto" rules (decisions 0002, 0003): delta 0.5, and
    "auto" features meaning at least min(d, 8) of the d inputs at the bottom (0.5 at the upper
    layers)."""

    def _n_bottom_features(self, X, rng) -> int:
        return max(round(0.5 * X.shape[1]), min(X.shape[1], 8))


def pca_output_mbn(c: int, seed: int, **params) -> MBN:
    """MBN with the papers' PCA output, the default before output="auto": what the exploratory
    variants and commands were measured with, and still compare."""
    return MBN(n_classes=c, output="pca", random_state=seed, **params)


# The MBN configurations the quality tables compare, as (c, seed) -> unfitted estimator.
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
    an "ensemble of networks" (decision 0005)."""

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


def quality_umap(X, c, seed, n_neighbors: int = 15):
    import umap

    model = umap.UMAP(n_components=c, n_neighbors=n_neighbors, random_state=seed)
    return model.fit_transform(np.asarray(X, np.float32))


def quality_pca(X, c, seed):
    return PCA(n_components=min(c, X.shape[1]), random_state=seed).fit_transform(X)


QUALITY_METHODS: dict[str, Callable] = {
    **{name: fit_transform_of(name) for name in MBN_MODELS},
    "UMAP": quality_umap,
    "PCA": quality_pca,
}
QUALITY_DEFAULT_METHODS = list(QUALITY_METHODS)
QUALITY_METHODS.update({name: fit_transform_of(name) for name in MBN_VARIANTS})
QUALITY_METHODS["UMAP, 30 neighbours"] = lambda X, c, seed: quality_umap(X, c, seed, 30)


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


def split_rows(n_rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A random 80% of the rows to fit, and the other 20% as new rows."""
    order = np.random.default_rng(seed).permutation(n_rows)
    return order[: int(0.8 * n_rows)], order[int(0.8 * n_rows) :]


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
