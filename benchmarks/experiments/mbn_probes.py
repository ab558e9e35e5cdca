"""Probes of MBN's "auto" rules and outputs: the experiments behind decision records
0002-0006 and 0024 (docs/decisions/). Not benchmarks of a current figure; kept runnable to
revisit the decisions.

    python benchmarks/experiments/mbn_probes.py restarts [--datasets ...] [--seeds 15] [--group 5]
    python benchmarks/experiments/mbn_probes.py affinities [--datasets moons ...] [--seeds 3]
    python benchmarks/experiments/mbn_probes.py cells [--seeds 3]
    python benchmarks/experiments/mbn_probes.py orphans [--datasets moons ...] [--seeds 3]
    python benchmarks/experiments/mbn_probes.py features [--datasets wine ...] [--seeds 10]
    python benchmarks/experiments/mbn_probes.py outputs [--datasets moons ...] [--seeds 5]
    python benchmarks/experiments/mbn_probes.py progress [--datasets moons ...] [--output auto]

``restarts`` asks whether a label-free score could choose among networks that differ only in
their seed: per seed the NMI and the silhouette of k-means with c clusters on the embedding,
their rank correlation, and the NMI of the best-silhouette network in each group of seeds
(decision 0005).

``affinities`` clusters the same fitted networks three ways: k-means on the embedding (PCA of
the top layer's codes), and spectral clustering (Ng-Jordan-Weiss) on the bottom layer's
co-association and on its elementwise product with the top layer's (decision 0004).

``cells`` asks why cosine similarity helps MNIST: for the bottom layer of each metric, how much
of the rows' length (a digit's ink) still varies inside a cell, and how pure the cells' labels
are (labels only describe the cells; they choose nothing; decision 0006).

``orphans`` measures what ``delta="auto"`` decides on: the share of (point, clustering) pairs
that a second layer of ``delta * k1`` centers would leave sharing no code with any center, on
the default network's bottom codes, for each candidate delta (``--rows 200 --trials 8
--repeats 10``: the spread of the first rule's estimate; decision 0003).

``features`` prints the inputs per bottom clustering that ``feature_fraction="auto"`` chooses
on each data set and seed, scoring the inputs at unit scale (the product) and as given (the
rule before it, ``RawUnitsFeatureRuleMBN``). No network is fitted (decision 0002).

``outputs`` fits the defaults (``MBN(n_classes=c, random_state=seed)``) on each data set and
seed and prints what ``delta="auto"`` and ``output="auto"`` chose, and whether the embedding
equals the one of the output asked for by name, bit for bit (decision 0004).

``progress`` fits each data set as a service job does (``METHOD.track``'s callback, the
service's ``k_max``) and prints the seconds of the bottom layer, the upper layers, the UMAP
output's neighbour search and its layout; the costs the progress estimate takes from them
(``mbn_core.mbn.method``); and the largest gap between the reported share and the share of the
fit's time gone (decision 0024).

Decision records (docs/decisions/):
- 0002-feature-fraction-auto.md
- 0003-delta-auto.md
- 0004-output-auto.md
- 0005-ensemble-size-and-restarts.md
- 0006-metric-cosine-opt-in.md
- 0024-training-progress.md
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness

import numpy as np
from bench_data import load_mnist
from harness import (
    QUALITY_DATA,
    VALIDATION_DATA,
    RawUnitsFeatureRuleMBN,
    coassociations,
    kmeans_nmi,
    mean_sd,
    mnist_subset,
    pca_output_mbn,
    quality_data,
    spectral_embedding,
)
from sklearn.cluster import KMeans
from sklearn.metrics import normalized_mutual_info_score, silhouette_score

from mbn_core import MBN
from mbn_core.mbn import auto
from mbn_core.mbn.estimator import METRICS, OUTPUTS
from mbn_core.mbn.method import METHOD, layer_costs
from mbn_core.mbn.outputs import umap as umap_output


def restarts(args) -> None:
    from scipy.stats import spearmanr

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
    r = sub.add_parser("restarts")
    r.add_argument("--datasets", nargs="+", default=list(QUALITY_DATA))
    r.add_argument("--seeds", type=int, default=15)
    r.add_argument("--group", type=int, default=5)
    b = sub.add_parser("cells")
    b.add_argument("--seeds", type=int, default=3)
    a = sub.add_parser("affinities")
    a.add_argument("--datasets", nargs="+", default=[*QUALITY_DATA, "mnist5k"])
    a.add_argument("--seeds", type=int, default=3)
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
    args = parser.parse_args()
    if args.command == "restarts":
        restarts(args)
    elif args.command == "cells":
        bottom_cells(args)
    elif args.command == "affinities":
        affinities(args)
    elif args.command == "features":
        features(args)
    elif args.command == "outputs":
        outputs(args)
    elif args.command == "orphans":
        orphans(args)
    elif args.command == "progress":
        progress(args)
    else:
        print(json.dumps(progress_one(args.name, args.output)))


if __name__ == "__main__":
    main()
