"""What ``input_scaling="auto"`` chooses on raw data, and what each choice gives. Prints a
markdown table (and writes JSON with ``--json``).

    python benchmarks/bench_input_scaling.py
    MBN_MNIST=path/to/mnist70k.npz python benchmarks/bench_input_scaling.py --sets mnist-5k

Each set is given as it comes, unscaled: scikit-learn's bundled wine, breast cancer and iris
(a stratified seeded split 2/3 / 1/3, one per seed), digits (a seeded split 1,200 / 597) and
MNIST-5k (the first 5,000 images of ``bench_data.load_mnist()`` as uint8 pixels, tested on
the last 10,000). Each is trained with ``mbn train``'s defaults twice, ``input_scaling``
"none" and "standard", and the bundle embeds the raw test rows (it scales them itself). On
the test rows: k-means NMI against the labels (as many clusters as classes, 20 restarts) on
the exact embedding, and R^2 of fast against exact. "auto" is the choice the training rows'
feature range ratio makes (``mbn_core.data.scaling.choose_scaling``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_data import load_mnist
from bench_report import command_line
from sklearn.cluster import KMeans
from sklearn.datasets import load_breast_cancer, load_digits, load_iris, load_wine
from sklearn.metrics import normalized_mutual_info_score, r2_score
from sklearn.model_selection import train_test_split
from threadpoolctl import threadpool_limits

from mbn_core.bundle import load_bundle
from mbn_core.data.scaling import choose_scaling
from mbn_core.pipeline.training import train_bundle

SMALL = {"wine": load_wine, "breast_cancer": load_breast_cancer, "iris": load_iris}
N_TEST_MNIST = 10_000


def load_set(name: str, seed: int):
    """(X_train, y_train, X_test, y_test), unscaled."""
    if name == "mnist-5k":
        X, y = load_mnist()
        return X[:5000], y[:5000], X[-N_TEST_MNIST:], y[-N_TEST_MNIST:]
    if name == "digits":
        X, y = load_digits(return_X_y=True)
        order = np.random.RandomState(seed).permutation(len(X))
        return X[order[:1200]], y[order[:1200]], X[order[1200:]], y[order[1200:]]
    X, y = SMALL[name](return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=1 / 3, stratify=y, random_state=seed
    )
    return X_train, y_train, X_test, y_test


def kmeans_nmi(Z: np.ndarray, y: np.ndarray, seed: int) -> float:
    with threadpool_limits(limits=1):
        labels = KMeans(len(np.unique(y)), n_init=20, random_state=seed).fit_predict(Z)
    return float(normalized_mutual_info_score(y, labels))


def measure(name: str, seed: int, scaling: str) -> dict:
    X_train, y_train, X_test, y_test = load_set(name, seed)
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        path = train_bundle(
            X_train,
            Path(scratch) / "model",
            name=name,
            params={"input_scaling": scaling, "random_state": seed, "map_points": 0},
            y=y_train,
        )
        seconds = time.perf_counter() - started
        bundle = load_bundle(path)
        fast = bundle.embed(X_test).astype(np.float64)
        exact = bundle.embed(X_test, mode="exact").astype(np.float64)
    return {
        "set": name,
        "seed": seed,
        "scaling": scaling,
        "nmi_exact": kmeans_nmi(exact, y_test, seed),
        "nmi_fast": kmeans_nmi(fast, y_test, seed),
        "r2": float(r2_score(exact, fast, multioutput="variance_weighted")),
        "train_seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default="wine,breast_cancer,iris,digits")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="seeds of the small sets' splits")
    parser.add_argument("--json", help="write the measurements here")
    args = parser.parse_args()
    rows = []
    for name in args.sets.split(","):
        seeds = [int(s) for s in args.seeds.split(",")] if name in SMALL else [0]
        chosen = choose_scaling(load_set(name, seeds[0])[0])
        runs = {
            scaling: [measure(name, seed, scaling) for seed in seeds]
            for scaling in ("none", "standard")
        }
        row = {"set": name, "seeds": len(seeds), "auto": chosen.method, "ratio": chosen.range_ratio}
        for scaling, measured in runs.items():
            for key in ("nmi_exact", "nmi_fast", "r2", "train_seconds"):
                row[f"{key}_{scaling}"] = float(np.mean([m[key] for m in measured]))
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n`{command_line('bench_input_scaling.py')}`\n")
    print(
        "| set (seeds) | range ratio | auto picks | NMI none | NMI standard | R^2 none "
        "| R^2 standard | auto's NMI - best |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        nmi = {s: row[f"nmi_exact_{s}"] for s in ("none", "standard")}
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.1f}"
        print(
            f"| {row['set']} ({row['seeds']}) | {ratio} | {row['auto']} | {nmi['none']:.3f} | "
            f"{nmi['standard']:.3f} | {row['r2_none']:.3f} | {row['r2_standard']:.3f} | "
            f"{nmi[row['auto']] - max(nmi.values()):+.3f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
