"""Probe: what could lift the default's output on dense data (digits, iris) to UMAP's.

    python benchmarks/experiments/probe_dense_outputs.py variants --datasets iris digits --seeds 30
    python benchmarks/experiments/probe_dense_outputs.py readout \
        --datasets iris digits wine breast-cancer \
        --seeds 10 [--heldout]
    python benchmarks/experiments/probe_dense_outputs.py fast-path --seeds 10

On dense data ``output="auto"`` is the papers' PCA of the top codes, and over 30 seeds it
trails UMAP on digits (0.899 against 0.905) and iris (0.787 against 0.809). Each subcommand
asks one question, scored as ``bench_mbn.py quality`` scores (k-means with c clusters, lowest
inertia of 20 runs, NMI against the labels, mean ± sd over seeds):

- ``variants``: is it the PCA output's noise or its target? Each seed's default network
  (``MBN(n_classes=c, output="pca", random_state=seed)``) and variants of what its top
  becomes: PCA of the layer below the top or of every upper layer's codes side by side,
  kernel PCA of the top co-association plus the bottom one, the output whitened, the top
  layer's soft shared-code counts (a softmax over each clustering's centers, from a top
  layer drawn here as ``fit`` draws one) instead of its argmax, one layer more (k_L >= c),
  delta 0.7, k1 of 0.35 n and 0.7 n, three of the four iris inputs per clustering, and
  ensembles of three networks (``bench_mbn.NetworkEnsemble``: PCA of their top codes side
  by side, seeds 1000 s + j; the same k1, or k1 of 0.35 n, 0.5 n and 0.7 n).
- ``readout``: the UMAP output read out linearly. Ridge regression of the UMAP output's
  layout (``MBN(output="umap")``'s embedding of its training rows) on the same network's
  one-hot top codes, alpha = lambda * n (so the penalty keeps its weight against the n
  squared errors): a (V, k_L, c) table like the PCA output's, aimed at the layout's
  clusters instead of the codes' variance. ``--heldout`` fits on a random 80%
  (``bench_mbn.split_rows``), k-means on the fitted rows, new rows to the nearest centroid.
- ``fast-path``: what a service user gets from each output. scikit-learn's digits split
  1,200 / 597 by a seeded permutation (``bench_fidelity.py``'s split), the distilled MLP with
  ``CompressiveMBN``'s defaults (no fidelity report), the teacher ``MBN(k_max=2000, ...)``
  as ``mbn train`` builds it. On the 597 test rows: k-means NMI of the exact and of the
  fast embedding, the fast rows assigned to the exact embedding's k-means centroids (does
  the student put rows in the right cluster?), and R^2 of fast against exact. Plain UMAP
  (fitted on the 1,200 rows, its own ``transform`` of the others) in the same run.

Exploratory, not a product feature.

Decision record: docs/decisions/0020-dense-rows-keep-the-pca-output.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared harness

from bench_fidelity import load_set
from harness import NetworkEnsemble, kmeans_nmi, mean_sd, quality_data, split_rows
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA, KernelPCA
from sklearn.linear_model import Ridge
from sklearn.metrics import normalized_mutual_info_score, r2_score

from mbn_core import MBN, CompressiveMBN
from mbn_core.mbn.coassociation import one_hot

# ---------------------------------------------------------------------- variants


def layer_onehot(net: MBN, X, layer: int) -> sp.csr_matrix:
    return one_hot(net.encode(X, layer), net.ks_[layer], dtype=np.float64)


def pca_of(codes: sp.csr_matrix, c: int) -> np.ndarray:
    """PCA of one-hot codes: dense when small, else ARPACK on the sparse matrix (every upper
    layer of digits side by side is 1,797 x 347,600)."""
    if codes.shape[0] * codes.shape[1] <= 20_000_000:
        return PCA(c, svd_solver="full").fit_transform(codes.toarray())
    return PCA(c, svd_solver="arpack", random_state=0).fit_transform(codes)


def coassociation(codes: sp.csr_matrix, n_clusterings: int) -> np.ndarray:
    return (codes @ codes.T).toarray() / n_clusterings


def soft_top_pca(net: MBN, X, c: int, seed: int) -> np.ndarray:
    """PCA of a top layer's soft codes: for each of V clusterings (k_L random rows as centers,
    each one-hot dimension of the layer below kept with probability 0.5, as ``fit`` draws),
    a softmax over the centers of the shared-code counts that ``fit`` takes the argmax of."""
    below = layer_onehot(net, X, -2).tocsc()
    n_rows, k = below.shape[0], net.ks_[-1]
    rng = np.random.RandomState(1000 + seed)
    soft = np.empty((n_rows, net.n_clusterings, k))
    for v in range(net.n_clusterings):
        kept = below[:, rng.random_sample(below.shape[1]) < 0.5]
        counts = (kept @ kept[rng.choice(n_rows, k, replace=False)].T).toarray()
        weights = np.exp(counts - counts.max(axis=1, keepdims=True))
        soft[:, v] = weights / weights.sum(axis=1, keepdims=True)
    return PCA(c, svd_solver="full").fit_transform(soft.reshape(n_rows, -1))


def deeper_ks(net: MBN, c: int) -> list[int]:
    """The default network's layers (delta 0.5) continued while k >= c instead of 1.5 c."""
    ks = list(net.ks_)
    while (k := int(0.5 * ks[-1])) >= c:
        ks.append(k)
    return ks


def own_params(**params) -> Callable:
    return lambda net, X, c, seed: MBN(
        n_classes=c, output="pca", random_state=seed, **params
    ).fit_transform(X)


# name -> (default network, X, c, seed) -> embedding
VARIANTS: dict[str, Callable] = {
    "PCA output (default)": lambda net, X, c, seed: net.transform(X),
    "PCA of the layer below the top": lambda net, X, c, seed: pca_of(layer_onehot(net, X, -2), c),
    "PCA of every upper layer": lambda net, X, c, seed: pca_of(
        sp.hstack([layer_onehot(net, X, layer) for layer in range(1, len(net.ks_))]).tocsr(), c
    ),
    "kernel PCA, top + bottom co-association": lambda net, X, c, seed: KernelPCA(
        c, kernel="precomputed"
    ).fit_transform(
        coassociation(layer_onehot(net, X, -1), net.n_clusterings)
        + coassociation(layer_onehot(net, X, 0), net.n_clusterings)
    ),
    "whitened": lambda net, X, c, seed: (lambda Z: Z / Z.std(axis=0))(net.transform(X)),
    "soft top codes": lambda net, X, c, seed: soft_top_pca(net, X, c, seed),
    "one layer more (k_L >= c)": lambda net, X, c, seed: MBN(
        n_classes=c, ks=deeper_ks(net, c), output="pca", random_state=seed
    ).fit_transform(X),
    "delta 0.7": own_params(delta=0.7),
    "k1 0.35 n": own_params(k1=0.35),
    "k1 0.7 n": own_params(k1=0.7),
    "three quarters of the inputs": own_params(feature_fraction=0.75),
    "3 networks": lambda net, X, c, seed: NetworkEnsemble(3, 400, c, seed).fit_transform(X),
    "3 networks, k1 0.35 / 0.5 / 0.7 n": lambda net, X, c, seed: NetworkEnsemble(
        3, 400, c, seed, k1s=(0.35, 0.5, 0.7)
    ).fit_transform(X),
}


def variants(args) -> None:
    names = args.variants or list(VARIANTS)
    print(f"{args.seeds} seeds; cell: NMI mean ± sd")
    print()
    print(f"| variant | {' | '.join(args.datasets)} |")
    print(f"|---|{'---|' * len(args.datasets)}")
    scores: dict[tuple[str, str], list[float]] = {}
    for name in args.datasets:
        X, y = quality_data(name, 0)
        c = len(np.unique(y))
        for seed in range(args.seeds):
            net = MBN(n_classes=c, output="pca", random_state=seed).fit(X)
            for variant in names:
                nmi = kmeans_nmi(VARIANTS[variant](net, X, c, seed), y, seed, n_init=20)
                scores.setdefault((variant, name), []).append(nmi)
                print(f"{name} seed {seed} {variant}: {nmi:.4f}", file=sys.stderr, flush=True)
    for variant in names:
        cells = [mean_sd(scores[variant, name]) for name in args.datasets]
        print(f"| {variant} | {' | '.join(cells)} |")


# ---------------------------------------------------------------------- readout


class LayoutReadout(TransformerMixin, BaseEstimator):
    """The UMAP output's layout as a ridge regression on the same network's one-hot top
    codes (alpha = ``lam`` * rows): a lookup table over the top codes, as the PCA output."""

    def __init__(self, n_classes: int = 10, lam: float = 1.0, k_max=None, random_state=None):
        self.n_classes = n_classes
        self.lam = lam
        self.k_max = k_max
        self.random_state = random_state

    def fit(self, X, y=None):
        self.net_ = MBN(
            n_classes=self.n_classes,
            k_max=self.k_max,
            output="umap",
            random_state=self.random_state,
        ).fit(X)
        self.layout_ = self.net_.transform(X)
        self.ridge_ = Ridge(alpha=self.lam * X.shape[0]).fit(self.codes(X), self.layout_)
        self.n_components_ = self.layout_.shape[1]
        return self

    def codes(self, X) -> sp.csr_matrix:
        return one_hot(self.net_.encode(X), self.net_.ks_[-1], dtype=np.float64)

    def transform(self, X) -> np.ndarray:
        return self.ridge_.predict(self.codes(X))


def readout(args) -> None:
    lams = args.lams
    columns = ["PCA output", "UMAP output", *(f"read-out, lambda {lam:g}" for lam in lams)]
    rows = "new rows (80/20)" if args.heldout else "fitted rows"
    print(f"{args.seeds} seeds, {rows}; cell: NMI mean ± sd")
    print()
    print(f"| data | {' | '.join(columns)} |")
    print(f"|---|{'---|' * len(columns)}")
    for name in args.datasets:
        X, y = quality_data(name, 0)
        X = np.asarray(X, np.float32)
        c = len(np.unique(y))
        scores: dict[str, list[float]] = {column: [] for column in columns}
        for seed in range(args.seeds):
            fit, new = split_rows(len(X), seed) if args.heldout else (np.arange(len(X)),) * 2
            model = LayoutReadout(n_classes=c, lam=lams[0], random_state=seed).fit(X[fit])
            # Each embedding as (fitted rows, new rows), every row encoded once.
            codes_fit = model.codes(X[fit])
            codes_new = model.codes(X[new]) if args.heldout else codes_fit
            pca = PCA(c, svd_solver="full").fit(codes_fit.toarray())
            embeddings = {
                "PCA output": (
                    pca.transform(codes_fit.toarray()),
                    pca.transform(codes_new.toarray()),
                ),
                "UMAP output": (
                    model.layout_,
                    model.net_.transform(X[new]) if args.heldout else model.layout_,
                ),
            }
            for lam in lams:
                ridge = Ridge(alpha=lam * len(fit)).fit(codes_fit, model.layout_)
                embeddings[f"read-out, lambda {lam:g}"] = (
                    ridge.predict(codes_fit),
                    ridge.predict(codes_new),
                )
            for column, (Z_fit, Z_new) in embeddings.items():
                kmeans = KMeans(c, n_init=20, random_state=seed).fit(Z_fit)
                labels = kmeans.predict(Z_new) if args.heldout else kmeans.labels_
                scores[column].append(normalized_mutual_info_score(y[new], labels))
            print(
                f"{name} seed {seed}: "
                + ", ".join(f"{column} {values[-1]:.4f}" for column, values in scores.items()),
                file=sys.stderr,
                flush=True,
            )
        print(f"| {name} | {' | '.join(mean_sd(scores[column]) for column in columns)} |")


# ---------------------------------------------------------------------- fast path


def teacher_of(name: str, seed: int):
    if name.startswith("read-out"):
        return LayoutReadout(lam=float(name.split()[-1]), k_max=2000, random_state=seed)
    return MBN(k_max=2000, output=name, random_state=seed)


def fast_path(args) -> None:
    columns = ["exact", "fast", "fast, exact centroids", "R^2"]
    print(f"digits 1,200 / 597, {args.seeds} seeds; NMI on the test rows, mean ± sd")
    print()
    print(f"| teacher | student | {' | '.join(columns)} |")
    print("|---|---|" + "---|" * len(columns))
    hidden = tuple(args.hidden)
    for teacher in args.teachers:
        scores: dict[str, list[float]] = {column: [] for column in columns}
        for seed in range(args.seeds):
            X_train, _, X_test, y_test = load_set("digits", seed, None)
            model = CompressiveMBN(
                teacher_of(teacher, seed),
                hidden_layer_sizes=hidden,
                max_epochs=args.epochs,
                report_folds=None,
                holdout_fraction=0.01,
                random_state=seed,
            ).fit(X_train)
            exact = model.exact_transform(X_test)
            fast = np.asarray(model.transform(X_test), dtype=np.float64)
            kmeans = KMeans(10, n_init=20, random_state=seed).fit(exact)
            scores["exact"].append(normalized_mutual_info_score(y_test, kmeans.labels_))
            scores["fast"].append(kmeans_nmi(fast, y_test, seed, n_init=20))
            scores["fast, exact centroids"].append(
                normalized_mutual_info_score(y_test, kmeans.predict(fast))
            )
            scores["R^2"].append(r2_score(exact, fast, multioutput="variance_weighted"))
            last = ", ".join(f"{column} {values[-1]:.4f}" for column, values in scores.items())
            print(f"{teacher} seed {seed}: {last}", file=sys.stderr, flush=True)
        cells = " | ".join(mean_sd(scores[column]) for column in columns)
        print(f"| {teacher} | {hidden}, {args.epochs} epochs | {cells} |", flush=True)
    if args.umap:
        import umap

        nmis = []
        for seed in range(args.seeds):
            X_train, _, X_test, y_test = load_set("digits", seed, None)
            model = umap.UMAP(n_components=10, random_state=seed).fit(X_train)
            nmis.append(kmeans_nmi(model.transform(X_test), y_test, seed, n_init=20))
        print(f"| plain UMAP, its transform | | {mean_sd(nmis)} | | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser("variants", help="the PCA output's variants")
    command.add_argument("--datasets", nargs="+", default=["iris", "digits"])
    command.add_argument("--seeds", type=int, default=5)
    command.add_argument("--variants", nargs="+", choices=list(VARIANTS))
    command.set_defaults(run=variants)
    command = commands.add_parser("readout", help="the UMAP output's linear read-out")
    command.add_argument("--datasets", nargs="+", default=["iris", "digits"])
    command.add_argument("--seeds", type=int, default=5)
    command.add_argument("--lams", nargs="+", type=float, default=[0.3, 1.0, 3.0, 10.0])
    command.add_argument("--heldout", action="store_true", help="new rows, not fitted ones")
    command.set_defaults(run=readout)
    command = commands.add_parser("fast-path", help="the distilled student of each output")
    command.add_argument("--seeds", type=int, default=5)
    command.add_argument("--teachers", nargs="+", default=["pca", "umap", "read-out 1"])
    command.add_argument("--hidden", nargs="+", type=int, default=[256, 256])
    command.add_argument("--epochs", type=int, default=40)
    command.add_argument("--umap", action="store_true", help="also plain UMAP's transform")
    command.set_defaults(run=fast_path)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
