"""Modular kernel PCA (issue 14) against the paper's baselines. Prints JSON lines and tables.

    python benchmarks/bench_modular.py tables [--n-train 12000] [--n-test 50000]
    python benchmarks/bench_modular.py optimiser [--budget 600]
    python benchmarks/bench_modular.py variants [--n-train 3000] [--n-test 5000]
    python benchmarks/bench_modular.py speed

tables: Tables 2 and 3 on MNIST (rows 0..n_train-1 train, the next n_test rows queries; the
last 2,000 training rows validate λ). Retrieval precision at κ = 10 against input-space
neighbours, and the 15 x 5-NN ensemble accuracy, for MBM, Partition, Bootstrap, Random and
Monolithic (300 KPCA), all on the same Nyström landmarks.
optimiser: Table 1 on MNIST 12k (M = H = 10, λ = 0.9, R = 1000): loss against time for MBM and
for full-batch Adam on the same compressed problem from the same start, one run per learning
rate in a grid, each with the same time budget.
variants: the order of the methods on generated stand-ins for mnist-rot, mnist-back-rand,
rectangles and convex (modular_variants.py).
speed: ModularKPCA fit time on MNIST 12k, and the ONNX fast path per row and per 256 rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from bench_data import load_mnist
from modular_variants import VARIANTS

from mbn_core import _mbm
from mbn_core.kernel_map import fit_kernel_features
from mbn_core.modular_baselines import BASELINES
from mbn_core.modular_eval import (
    ensemble_predict,
    input_neighbours,
    modular_neighbours,
    retrieval_precision,
)
from mbn_core.modular_kpca import module_map

KAPPA = 10
SEED = 0


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def mnist(n_train: int, n_test: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    x, y = load_mnist()
    x = x.astype(np.float64) / 255.0
    test = slice(n_train, n_train + n_test)
    return x[:n_train], y[:n_train], x[test], y[test]


def fit_mbm(features, n_modules, module_dim, diversity, max_epochs, tol):
    rng = np.random.RandomState(SEED)
    factors = _mbm.initial_factors(features.eigenvalues, n_modules, module_dim, rng)
    factors, losses, _ = _mbm.optimise(
        features.eigenvalues, factors, diversity, 1e-6, max_epochs, tol
    )
    return module_map(features, factors), len(losses) - 1


def evaluate(landmark_map, X_db, y_db, X_q, y_q, truth) -> dict:
    db, queries = landmark_map.transform_modules(X_db), landmark_map.transform_modules(X_q)
    retrieved = modular_neighbours(db, queries, KAPPA)
    predicted = ensemble_predict(db, y_db, queries, n_neighbors=5)
    return {
        "retrieval": 100 * retrieval_precision(retrieved, truth),
        "classification": 100 * float(np.mean(predicted == y_q)),
    }


def compare(X, y, X_q, y_q, args, diversities: dict[str, float]) -> dict:
    """Every method on one train/query split; MBM once per distinct λ."""
    started = time.perf_counter()
    truth = input_neighbours(X, X_q, KAPPA)
    features = fit_kernel_features(X, args.n_landmarks, "auto", np.random.RandomState(SEED))
    emit({"step": "features", "seconds": time.perf_counter() - started, "rank": features.rank})
    results = {}
    for lam in sorted(set(diversities.values())):
        t = time.perf_counter()
        landmark_map, epochs = fit_mbm(
            features, args.modules, args.dim, lam, args.max_epochs, args.tol
        )
        fit_s = time.perf_counter() - t
        results[f"mbm@{lam}"] = {**evaluate(landmark_map, X, y, X_q, y_q, truth), "epochs": epochs}
        emit({"method": f"mbm@{lam}", "optimise_seconds": fit_s, **results[f"mbm@{lam}"]})
    for name, builder in BASELINES.items():
        landmark_map = builder(features, args.modules, args.dim, np.random.RandomState(SEED), X)
        results[name] = evaluate(landmark_map, X, y, X_q, y_q, truth)
        emit({"method": name, **results[name]})
    return results


def cmd_tables(args) -> None:
    X, y, X_q, y_q = mnist(args.n_train, args.n_test)
    n_val = args.n_validation
    grid = {"retrieval": args.grid, "classification": args.grid}
    if n_val:
        # λ chosen on the last training rows as queries against the others, per task.
        chosen = {}
        scores: dict[str, dict[float, float]] = {"retrieval": {}, "classification": {}}
        X_fit, y_fit, X_val, y_val = X[:-n_val], y[:-n_val], X[-n_val:], y[-n_val:]
        truth = input_neighbours(X_fit, X_val, KAPPA)
        features = fit_kernel_features(X_fit, args.n_landmarks, "auto", np.random.RandomState(SEED))
        for lam in args.grid:
            landmark_map, epochs = fit_mbm(
                features, args.modules, args.dim, lam, args.max_epochs, args.tol
            )
            result = evaluate(landmark_map, X_fit, y_fit, X_val, y_val, truth)
            emit({"validation": lam, "epochs": epochs, **result})
            for task in scores:
                scores[task][lam] = result[task]
        for task, values in scores.items():
            best = max(values.values())
            chosen[task] = max(lam for lam, v in values.items() if v == best)
        emit({"chosen": chosen, "grid": grid})
    else:
        chosen = {"retrieval": args.grid[0], "classification": args.grid[0]}
    results = compare(X, y, X_q, y_q, args, chosen)
    mbm = [results[f"mbm@{chosen[t]}"][t] for t in ("retrieval", "classification")]
    rows = [("MBM (λ per task)", *mbm)]
    for name in ("partition", "bootstrap", "random", "monolithic"):
        rows.append((name, results[name]["retrieval"], results[name]["classification"]))
    print(f"\nMNIST {args.n_train}/{args.n_test}, λ chosen: {chosen}")
    print("| method | retrieval (κ=10) | 15 x 5-NN accuracy |\n|---|---|---|")
    for name, retr, acc in rows:
        print(f"| {name} | {retr:.1f} | {acc:.1f} |")


def cmd_optimiser(args) -> None:
    X, _, _, _ = mnist(args.n_train, 0)
    features = fit_kernel_features(X, args.n_landmarks, "auto", np.random.RandomState(SEED))
    q = features.eigenvalues
    start = _mbm.initial_factors(q, args.modules, args.dim, np.random.RandomState(SEED))
    lam = args.diversity

    # MBM: the loss after every epoch, timed from the start of the optimisation.
    curve: list[tuple[float, float]] = []
    t0 = time.perf_counter()

    def on_update(epoch, module, factors):
        if module == args.modules - 1:
            curve.append((time.perf_counter() - t0, _mbm.modular_loss(factors, q, lam)))

    _mbm.optimise(q, start.copy(), lam, 1e-6, 100_000, 0.0, _budget(on_update, args.budget))
    runs = {"mbm": curve}
    for rate in args.rates:
        runs[f"adam@{rate}"] = adam(q, start.copy(), lam, rate, args.budget)
    best = min(min(v for _, v in c) for c in runs.values())
    best_adam = min(min(v for _, v in c) for k, c in runs.items() if k != "mbm")
    for name, curve in runs.items():
        losses = np.array([v for _, v in curve])
        times = np.array([t for t, _ in curve])
        record = {"method": name, "min_loss": float(losses.min()), "final_loss": float(losses[-1])}
        for label, target in (
            ("adam_min_0.1pct", best_adam * 1.001),
            ("best_1pct", best * 1.01),
            ("best_0.1pct", best * 1.001),
        ):
            inside = losses <= target
            # First entry into the band, and the time after which it never leaves it.
            record[f"reach_{label}_s"] = float(times[inside.argmax()]) if inside.any() else None
            stays = np.flatnonzero(~inside)
            settle = 0 if stays.size == 0 else stays[-1] + 1
            record[f"stay_{label}_s"] = float(times[settle]) if settle < len(times) else None
        record["points"] = len(curve)
        emit(record)


def _budget(hook, seconds):
    t0 = time.perf_counter()

    def wrapped(epoch, module, factors):
        hook(epoch, module, factors)
        return time.perf_counter() - t0 > seconds

    return wrapped


def adam(q, factors, diversity, rate, seconds, beta1=0.9, beta2=0.999, eps=1e-8):
    """Full-batch Adam on the compressed loss; (seconds, loss) every 10 steps."""
    m = np.zeros_like(factors)
    v = np.zeros_like(factors)
    curve = []
    t0 = time.perf_counter()
    step = 0
    while time.perf_counter() - t0 < seconds:
        step += 1
        g = _mbm.modular_gradient(factors, q, diversity)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        factors -= rate * (m / (1 - beta1**step)) / (np.sqrt(v / (1 - beta2**step)) + eps)
        if step % 10 == 0:
            loss = _mbm.modular_loss(factors, q, diversity)
            if not np.isfinite(loss):
                break
            curve.append((time.perf_counter() - t0, loss))
    return curve or [(seconds, float("inf"))]


def cmd_variants(args) -> None:
    for name in args.names:
        X, y = VARIANTS[name](args.n_train + args.n_test, np.random.default_rng(SEED))
        results = compare(
            X[: args.n_train],
            y[: args.n_train],
            X[args.n_train :],
            y[args.n_train :],
            args,
            {"retrieval": args.grid[0]},
        )
        emit({"variant": name, "results": results})
        for task in ("retrieval", "classification"):
            order = sorted(results, key=lambda k: -results[k][task])
            print(f"{name} {task}: " + " > ".join(f"{k} {results[k][task]:.1f}" for k in order))


def cmd_speed(args) -> None:
    from mbn_core import ModularKPCA
    from mbn_core.modular_onnx import to_onnx
    from mbn_core.onnx import OnnxEmbedder

    X, _, X_q, _ = mnist(args.n_train, 1000)
    t = time.perf_counter()
    model = ModularKPCA(
        diversity=args.grid[0], max_epochs=args.max_epochs, tol=args.tol, random_state=SEED
    ).fit(X)
    emit({"fit_seconds": time.perf_counter() - t, "epochs": model.n_iter_, "rank": model.rank_})
    embedder = OnnxEmbedder(to_onnx(model).SerializeToString())
    X32 = X_q.astype(np.float32)
    for rows in (1, 256):
        times = []
        for i in range(args.repeats):
            batch = X32[(i * rows) % 700 : (i * rows) % 700 + rows]
            t = time.perf_counter()
            embedder.embed(batch)
            times.append(time.perf_counter() - t)
        emit({"onnx_rows": rows, "median_ms": 1e3 * float(np.median(times))})
    t = time.perf_counter()
    model.transform(X_q[:256])
    emit({"exact_256_ms": 1e3 * (time.perf_counter() - t)})


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("tables", "optimiser", "variants", "speed"):
        p = sub.add_parser(name)
        p.add_argument("--n-train", type=int, default=12000)
        p.add_argument("--n-test", type=int, default=50000)
        p.add_argument("--n-landmarks", type=int, default=1000)
        p.add_argument("--modules", type=int, default=10 if name == "optimiser" else 15)
        p.add_argument("--dim", type=int, default=10 if name == "optimiser" else 20)
        p.add_argument("--max-epochs", type=int, default=200)
        p.add_argument("--tol", type=float, default=1e-4)
        p.add_argument("--grid", type=float, nargs="+", default=[0.99])
        p.add_argument("--n-validation", type=int, default=0)
        p.add_argument("--repeats", type=int, default=200)
    sub.choices["optimiser"].add_argument("--diversity", type=float, default=0.9)
    sub.choices["optimiser"].add_argument("--budget", type=float, default=600.0)
    sub.choices["optimiser"].add_argument(
        "--rates", type=float, nargs="+", default=[1e-3, 1e-2, 1e-1]
    )
    sub.choices["variants"].add_argument("--names", nargs="+", default=list(VARIANTS))
    args = parser.parse_args()
    {
        "tables": cmd_tables,
        "optimiser": cmd_optimiser,
        "variants": cmd_variants,
        "speed": cmd_speed,
    }[args.command](args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
