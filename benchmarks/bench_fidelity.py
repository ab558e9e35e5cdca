"""Fidelity of the fast path on new data. Prints a markdown table.

    python benchmarks/bench_fidelity.py --sets digits,wine,breast_cancer
    python benchmarks/bench_fidelity.py --sets mnist-5k,mnist-10k
    python benchmarks/bench_fidelity.py --sets mnist-60k
    python benchmarks/bench_fidelity.py --sets digits --option input_noise=0.3
    python benchmarks/bench_fidelity.py --sets bag-of-words
    python benchmarks/bench_fidelity.py --sets moons,circles,swiss-roll --option n_classes=2

Each set is trained with ``train_bundle`` and ``mbn train``'s defaults (``TrainingParams()``,
random_state ``--seed``) plus the labels (used only for the report), then embedded on a test
set the training never saw:

- ``mnist-N``: the first N images of ``bench_data.load_mnist()``, tested on the last 10,000;
- ``digits``: scikit-learn's digits, a seeded permutation split 1,200 / 597;
- ``breast_cancer`` (569 x 30, 2 classes), ``wine`` (178 x 13, 3 classes): scikit-learn's
  bundled copies, a stratified seeded split 2/3 / 1/3, standardised on the training part;
- any other of ``harness.py``'s data sets by its name there (``moons``,
  ``swiss-roll``, ``s-curve``, ...): its rows as given, a stratified seeded split 2/3 / 1/3;
- ``bag-of-words``: sparse input, ``bench_data.topic_corpus``'s 2,000 training and 1,000
  test documents over 30,000 words (10 topics; the split, not the topics, depends on the seed).

On the test set: k-means (as many clusters as classes, lowest inertia of 20 restarts) NMI
against the labels on the exact and on the fast embedding, their gap (fast - exact), R^2
(variance weighted) of fast against exact, the 10-NN overlap between them, and beside them
the gap, R^2 and overlap that the bundle's own fidelity report (manifest) states, with the
rows it was measured on ("5 folds": cross-fitted, see ``CompressiveMBN.report_folds``) and
the difference of the two gaps (the target: within 0.01). Also the MBN and
compressor training times, the report's own time (the fold fits when cross-fitted) and, for
MNIST, the batch speed-up of fast over exact. ``--report-folds`` overrides the default
(``auto``; ``none`` is the single held-out set).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_data import load_mnist, topic_corpus
from bench_report import add_training_option, command_line
from harness import KNOWN_DATA
from sklearn.cluster import KMeans
from sklearn.datasets import load_breast_cancer, load_digits, load_wine
from sklearn.metrics import normalized_mutual_info_score, r2_score
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from mbn_core.bundle import load_bundle
from mbn_core.pipeline.fidelity import knn_overlap
from mbn_core.pipeline.training import TrainingParams, train_bundle

N_TEST_MNIST = 10_000


def load_set(name: str, seed: int, data: str | None):
    """(X_train, y_train, X_test, y_test) of a named set."""
    if name.startswith("mnist-"):
        n_train = int(name.removeprefix("mnist-").replace("k", "000"))
        X, y = load_mnist(data)
        return X[:n_train], y[:n_train], X[-N_TEST_MNIST:], y[-N_TEST_MNIST:]
    if name == "digits":
        X, y = load_digits(return_X_y=True)
        order = np.random.RandomState(seed).permutation(len(X))
        train, test = order[:1200], order[1200:]
        return X[train], y[train], X[test], y[test]
    if name == "bag-of-words":
        X, y = topic_corpus(3000)
        order = np.random.RandomState(seed).permutation(X.shape[0])
        train, test = order[:2000], order[2000:]
        return X[train], y[train], X[test], y[test]
    loaders = {"breast_cancer": load_breast_cancer, "wine": load_wine}
    if name not in loaders and name in KNOWN_DATA:
        X, y = KNOWN_DATA[name]()
        X_train, X_test, y_train, y_test = train_test_split(
            X, y, test_size=1 / 3, stratify=y, random_state=seed
        )
        return X_train, y_train, X_test, y_test
    if name not in loaders:
        raise SystemExit(
            f"unknown set {name!r}: mnist-N, digits, breast_cancer, wine, bag-of-words or one "
            f"of bench_mbn.py's: {', '.join(KNOWN_DATA)}"
        )
    X, y = loaders[name](return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=1 / 3, stratify=y, random_state=seed
    )
    # Their features come in units thousands of times apart (wine's proline against its
    # hue); MBN's Euclidean centers need comparable scales, as any distance-based method.
    scaler = StandardScaler().fit(X_train)
    return scaler.transform(X_train), y_train, scaler.transform(X_test), y_test


def kmeans_nmi(Z: np.ndarray, y: np.ndarray, seed: int) -> float:
    with threadpool_limits(limits=1):
        labels = KMeans(len(np.unique(y)), n_init=20, random_state=seed).fit_predict(Z)
    return float(normalized_mutual_info_score(y, labels))


def measure(name: str, args: argparse.Namespace) -> dict:
    X_train, y_train, X_test, y_test = load_set(name, args.seed, args.data)
    values: dict = {"random_state": args.seed, "targets": args.targets}
    if args.report_folds is not None:
        folds = args.report_folds
        named = {"none": None, "auto": "auto"}
        values["report_folds"] = named[folds] if folds in named else int(folds)
    if args.hidden:
        values["hidden_layer_sizes"] = [int(h) for h in args.hidden.split(",")]
    params = TrainingParams.from_dict({**values, **args.option})
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        if args.bundle:  # trained already (by `mbn train` on this set's training rows)
            path = args.bundle
        else:
            path = train_bundle(
                X_train, Path(scratch) / "model", name=name, params=params, y=y_train
            )
        train_seconds = time.perf_counter() - started
        bundle = load_bundle(path)
        manifest = bundle.manifest
        fast_seconds = min(_timed(lambda: bundle.embed(X_test))[0] for _ in range(3))
        fast = np.asarray(bundle.embed(X_test), dtype=np.float64)
        exact_model = bundle.load_exact()  # loading the arrays is not prediction
        exact_seconds, exact = _timed(lambda: bundle.embed(X_test, mode="exact", exact=exact_model))
    exact = np.asarray(exact, dtype=np.float64)
    nmi_exact = kmeans_nmi(exact, y_test, args.seed)
    nmi_fast = kmeans_nmi(fast, y_test, args.seed)
    report = manifest["fidelity"]
    seconds = manifest["training"]["seconds"]
    return {
        "set": name,
        "n_train": X_train.shape[0],
        "n_test": X_test.shape[0],
        "ks": manifest["training"].get("ks"),  # an MBN fact; other methods have none
        "nmi_exact": nmi_exact,
        "nmi_fast": nmi_fast,
        "gap": nmi_fast - nmi_exact,
        "r2": float(r2_score(exact, fast, multioutput="variance_weighted")),
        "knn_overlap": knn_overlap(exact, fast),
        "report_gap": report["nmi_labels_fast"] - report["nmi_labels_exact"],
        "report_r2": report["r2"],
        "report_knn_overlap": report["knn_overlap"],
        "report_n": report["n_holdout"],
        "report_folds": report.get("folds"),
        "mbn_seconds": seconds["teacher"],
        "compressor_seconds": seconds["compressor"],
        "evaluation_seconds": seconds["evaluation"],
        "train_seconds": train_seconds,
        "exact_seconds": exact_seconds,
        "fast_seconds": fast_seconds,
    }


def _timed(function):
    started = time.perf_counter()
    result = function()
    return time.perf_counter() - started, result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", default="digits,wine,breast_cancer")
    parser.add_argument("--targets", default="in-sample", help="the compressor's targets")
    parser.add_argument("--report-folds", help="N, auto or none (default: TrainingParams')")
    parser.add_argument("--hidden", help="compressor hidden layers (default: TrainingParams')")
    add_training_option(parser, "input_noise=0.3")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--bundle",
        type=Path,
        help="measure this bundle instead of training (one set, its "
        "training rows; e.g. `mbn train` of mnist-60k)",
    )
    parser.add_argument("--seeds", help="several seeds, e.g. 0,1,2,3,4: a row each, and means")
    parser.add_argument("--data", help="MNIST .npz (default: bench_data.load_mnist's search)")
    parser.add_argument("--json", help="also append each row as a JSON line to this file")
    args = parser.parse_args(argv)
    print(f"Fidelity on new data (`{command_line('bench_fidelity.py', argv)}`)\n")
    print(
        "| set | train / test | exact NMI | fast NMI | gap | R^2 | 10-NN overlap "
        "| report: gap / R^2 / overlap (rows) | report gap - test gap "
        "| MBN / compressor / report s | exact / fast |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    seeds = [int(seed) for seed in args.seeds.split(",")] if args.seeds else [args.seed]
    for name in args.sets.split(","):
        rows = []
        for seed in seeds:
            args.seed = seed
            row = measure(name, args)
            rows.append(row)
            if args.json:
                with open(args.json, "a") as handle:
                    handle.write(json.dumps(row) + "\n")
            print(_table_row(row, f"{row['set']} (seed {seed})" if len(seeds) > 1 else ""))
        if len(rows) > 1:
            print(_mean_row(rows), flush=True)


def _table_row(row: dict, label: str = "") -> str:
    folds = f", {row['report_folds']} folds" if row["report_folds"] else ""
    return (
        f"| {label or row['set']} | {row['n_train']} / {row['n_test']} | {row['nmi_exact']:.4f} "
        f"| {row['nmi_fast']:.4f} | {row['gap']:+.4f} | {row['r2']:.4f} "
        f"| {row['knn_overlap']:.3f} | {row['report_gap']:+.4f} / {row['report_r2']:.4f} / "
        f"{row['report_knn_overlap']:.3f} ({row['report_n']}{folds}) "
        f"| {row['report_gap'] - row['gap']:+.4f} "
        f"| {row['mbn_seconds']:.1f} / {row['compressor_seconds']:.1f} "
        f"/ {row['evaluation_seconds']:.1f} "
        f"| {row['exact_seconds'] / row['fast_seconds']:.0f}x |"
    )


def _mean_row(rows: list[dict]) -> str:
    """Means over the seeds (splits and fits): a test set this small has a noisy gap of its
    own (its spread over the seeds is given), so the report is compared with its mean."""

    def mean(key: str) -> float:
        return float(np.mean([row[key] for row in rows]))

    test_gaps = np.array([row["gap"] for row in rows])
    return (
        f"| **{rows[0]['set']}, mean of {len(rows)} seeds** | | {mean('nmi_exact'):.4f} "
        f"| {mean('nmi_fast'):.4f} | **{mean('gap'):+.4f}** (sd {test_gaps.std(ddof=1):.4f}) "
        f"| {mean('r2'):.4f} | {mean('knn_overlap'):.3f} "
        f"| **{mean('report_gap'):+.4f}** / {mean('report_r2'):.4f} / "
        f"{mean('report_knn_overlap'):.3f} | **{mean('report_gap') - mean('gap'):+.4f}** "
        f"| {mean('mbn_seconds'):.1f} / {mean('compressor_seconds'):.1f} "
        f"/ {mean('evaluation_seconds'):.1f} | |"
    )


if __name__ == "__main__":
    main()
