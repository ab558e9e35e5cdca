"""Compressive MBN on MNIST: speed-up and fidelity of the fast path. Prints markdown.

    python benchmarks/bench_compress.py         # the full figure: roughly 25-35 min on 2 cores
    python benchmarks/bench_compress.py --tiny  # a smoke test of the harness (under a minute)

Trains a bundle with ``train_bundle`` on the first ``--n-train`` MNIST images (default 60,000)
and measures on the last ``--n-test`` (default 10,000):

- prediction time of the test images, exact MBN vs the ONNX fast path, and their ratio
  (paper: 4857 s vs 1.1 s; target: fast >= 1000x faster);
- test NMI of k-means (10 clusters, best of ``--kmeans-init`` restarts) on the fast and on the
  exact embeddings, against the labels (target: within 0.01), and between the two clusterings;
- single-vector fast latency in process (p50, p99) and batch throughput (vectors/s);
- bundle size on disk and resident memory of a loaded exact model (measured in a child
  process, so this process's data and caches do not count).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_data import load_mnist
from bench_report import add_training_option, print_measures
from sklearn.cluster import KMeans
from sklearn.metrics import normalized_mutual_info_score

from mbn_core.bundle import load_bundle
from mbn_core.pipeline.training import TrainingParams, train_bundle

TINY = {
    "n_train": 2000, "n_test": 500, "k1": 200, "n_clusterings": 20, "max_epochs": 3,
    "hidden": "64,64", "latency_calls": 200, "kmeans_init": 3,
}  # fmt: skip

_RSS_PROBE = """
import json, sys
def rss():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
from mbn_core.bundle import load_bundle
bundle = load_bundle(sys.argv[1])
before = rss()
model = bundle.load_exact().estimator
after = rss()
print(json.dumps({"rss_before": before, "rss_after": after, "nbytes": model.nbytes}))
"""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="MNIST .npz (default: bench_data.load_mnist's search)")
    parser.add_argument("--n-train", type=int, default=60000)
    parser.add_argument("--n-test", type=int, default=10000)
    parser.add_argument("--k1", type=int, default=4000, help="bottom-layer centers (k_max)")
    parser.add_argument("--ks", help="explicit centers per layer, e.g. 4000,2000,1000")
    parser.add_argument("--n-clusterings", type=int, default=400)
    parser.add_argument("--hidden", help="compressor hidden layers (default: TrainingParams')")
    parser.add_argument(
        "--max-epochs", type=int, help="compressor epochs (default: TrainingParams')"
    )
    parser.add_argument("--threads", type=int, default=None, help="training threads")
    parser.add_argument(
        "--onnx-threads", type=int, default=1, help="threads of both prediction paths"
    )
    parser.add_argument("--latency-calls", type=int, default=2000)
    parser.add_argument("--kmeans-init", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    add_training_option(parser, "input_components=null")
    parser.add_argument("--out", help="keep the bundle in this directory (default: temporary)")
    parser.add_argument(
        "--bundle",
        help="measure this existing bundle (trained by this script with --out) instead of "
        "training one; its training times come from its manifest",
    )
    parser.add_argument("--tiny", action="store_true", help="a small configuration: smoke test")
    args = parser.parse_args(argv)
    if args.tiny:
        for key, value in TINY.items():
            setattr(args, key, value)
    return args


def training_params(args: argparse.Namespace) -> TrainingParams:
    values: dict = {
        "n_clusterings": args.n_clusterings,
        "k_max": args.k1,
        "k1": args.k1,
        "n_classes": 10,
        "n_components": 10,
        "random_state": args.seed,
        "n_jobs": args.threads,
    }
    if args.ks:
        values["ks"] = [int(k) for k in args.ks.split(",")]
    if args.hidden:
        values["hidden_layer_sizes"] = [int(h) for h in args.hidden.split(",")]
    if args.max_epochs:
        values["max_epochs"] = args.max_epochs
    return TrainingParams.from_dict({**values, **args.option})


def kmeans_labels(Z: np.ndarray, n_init: int, seed: int) -> np.ndarray:
    return KMeans(10, n_init=n_init, random_state=seed).fit_predict(Z)


def timed(function, repeats: int = 1) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - started)
    return best, result


def exact_model_memory(path: Path) -> dict:
    output = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, str(path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(output)


def run(args: argparse.Namespace) -> list[tuple[str, str]]:
    X, y = load_mnist(args.data)
    X_train, y_train = X[: args.n_train], y[: args.n_train]
    X_test, y_test = X[-args.n_test :], y[-args.n_test :]
    params = training_params(args)

    with tempfile.TemporaryDirectory(dir=args.out and Path(args.out).parent) as scratch:
        target = Path(args.out) if args.out else Path(scratch) / "mnist"
        last = [-1]

        def progress(phase: str, fraction: float) -> None:
            percent = int(fraction * 100)
            if percent != last[0]:
                last[0] = percent
                print(f"\rtraining: {phase:<10} {percent:3d}%", end="", file=sys.stderr)

        if args.bundle:
            path = Path(args.bundle)
            train_seconds = None
        else:
            started = time.perf_counter()
            path = train_bundle(
                X_train, target, name="mnist-bench", params=params, y=y_train,
                progress=progress, overwrite=True,
            )  # fmt: skip
            train_seconds = time.perf_counter() - started
            print(file=sys.stderr)
        bundle = load_bundle(path, threads=args.onnx_threads)
        manifest = bundle.manifest
        if manifest["training"]["n_samples"] != args.n_train:
            raise SystemExit(f"{path} was not trained on the first {args.n_train} images")

        fast_seconds, fast = timed(lambda: bundle.embed(X_test), repeats=3)
        loaded = bundle.load_exact()  # loading the arrays is not prediction
        exact_seconds, exact = timed(lambda: bundle.embed(X_test, mode="exact", exact=loaded))
        fast_labels = kmeans_labels(np.asarray(fast), args.kmeans_init, args.seed)
        exact_labels = kmeans_labels(np.asarray(exact), args.kmeans_init, args.seed)
        nmi_fast = normalized_mutual_info_score(y_test, fast_labels)
        nmi_exact = normalized_mutual_info_score(y_test, exact_labels)

        latencies = []
        for i in range(args.latency_calls):
            row = X_test[i % len(X_test)][None, :]
            started = time.perf_counter()
            bundle.embed(row)
            latencies.append(time.perf_counter() - started)
        batch = X_test[:256]
        batch_seconds, _ = timed(lambda: bundle.embed(batch), repeats=5)

        size = sum(f.stat().st_size for f in path.iterdir())
        memory = exact_model_memory(path)

    training = manifest["training"]
    seconds, trained_with = training["seconds"], training["params"]
    total = train_seconds if train_seconds is not None else training["total_seconds"]
    p50, p99 = np.percentile(np.asarray(latencies) * 1e3, [50, 99])
    return [
        ("training points / test points", f"{args.n_train} / {args.n_test}"),
        ("MBN layers (k per layer), V", f"{'-'.join(map(str, training['ks']))}, "
                                        f"{trained_with['n_clusterings']}"),
        ("compressor", f"{trained_with['hidden_layer_sizes']}, {training['n_epochs']} epochs"),
        ("training time: MBN / compressor / total",
         f"{seconds['teacher']:.0f} s / {seconds['compressor']:.0f} s / {total:.0f} s"),
        ("exact prediction of the test set", f"{exact_seconds:.2f} s"),
        ("fast prediction of the test set", f"{fast_seconds:.4f} s"),
        ("speed-up (exact / fast)", f"{exact_seconds / fast_seconds:.0f}x"),
        ("test NMI, k-means on exact embedding", f"{nmi_exact:.4f}"),
        ("test NMI, k-means on fast embedding", f"{nmi_fast:.4f}"),
        ("test NMI difference (fast - exact)", f"{nmi_fast - nmi_exact:+.4f}"),
        ("NMI between fast and exact clusterings",
         f"{normalized_mutual_info_score(exact_labels, fast_labels):.4f}"),
        ("held-out fidelity (manifest)",
         f"R^2 {manifest['fidelity']['r2']:.4f}, cosine {manifest['fidelity']['cosine']:.4f}"),
        ("single-vector fast latency p50 / p99",
         f"{p50:.3f} ms / {p99:.3f} ms ({args.latency_calls} calls)"),
        ("fast throughput, batches of 256", f"{256 / batch_seconds:,.0f} vectors/s"),
        (f"fast throughput, one batch of {args.n_test}",
         f"{args.n_test / fast_seconds:,.0f} vectors/s"),
        ("bundle size on disk", f"{size / 2**20:.1f} MiB"),
        ("resident memory of the loaded exact model",
         f"{(memory['rss_after'] - memory['rss_before']) / 2**20:.0f} MiB "
         f"(arrays: {memory['nbytes'] / 2**20:.0f} MiB)"),
        ("threads of both prediction paths", str(args.onnx_threads)),
    ]  # fmt: skip


def main(argv=None) -> None:
    args = parse_args(argv)
    rows = run(args)
    print_measures("Compressive MBN on MNIST", "bench_compress.py", rows, argv)


if __name__ == "__main__":
    main()
