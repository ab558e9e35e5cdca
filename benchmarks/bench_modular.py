"""Modular kernel PCA against the paper's baselines. Prints JSON lines and tables.

    python benchmarks/bench_modular.py tables [--n-train 12000] [--n-test 50000]
    python benchmarks/bench_modular.py optimiser [--budget 600]
    python benchmarks/bench_modular.py variants [--n-train 3000] [--n-test 5000]
    python benchmarks/bench_modular.py speed
    python benchmarks/bench_modular.py testtime [--n-test 2000]

tables: Tables 2 and 3 on MNIST (rows 0..n_train-1 train, the next n_test rows queries; the
last 2,000 training rows validate λ). Retrieval precision at κ = 10 against input-space
neighbours, and the 15 x 5-NN ensemble accuracy, for MBM, Partition, Bootstrap, Random and
Monolithic (300 KPCA), all on the same Nyström landmarks.
optimiser: Table 1 on MNIST 12k (M = H = 10, λ = 0.9, R = 1000): loss against time for MBM and
for full-batch Adam on the same compressed problem from the same start (one per --seeds), one
run per learning rate in a grid, each with the same budget. Time is CPU time (both run on one
BLAS thread), with the loss evaluations of the curve left out.
variants: the order of the methods on generated stand-ins for mnist-rot, mnist-back-rand,
rectangles and convex (modular_variants.py). With --n-validation N, λ is chosen per variant and
task from --grid as in tables, on the last N training rows.
speed: ModularKPCA fit time on MNIST 12k, and the ONNX fast path per row and per 256 rows.
testtime: Table 3's "Speed", test time of Monolithic (300 KPCA) over that of MBM with its modules
run in parallel. Two cores cannot run 15 modules at once, so it is simulated (spec A1.9): every
module's stages are timed alone on one thread, and MBM's time is the slowest module plus the
merge (re-ranking the candidates, or the vote).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial

import numpy as np
from bench_data import load_mnist
from modular_variants import VARIANTS
from threadpoolctl import threadpool_limits

from mbn_core.modular import _mbm
from mbn_core.modular.baselines import BASELINES
from mbn_core.modular.evaluation import (
    ensemble_predict,
    input_neighbours,
    majority_vote,
    modular_neighbours,
    rerank,
    retrieval_precision,
)
from mbn_core.modular.kernel_map import LandmarkMap, fit_kernel_features
from mbn_core.modular.kpca import module_map

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


def choose_diversity(X, y, args) -> dict[str, float]:
    """λ per task from ``args.grid``, or its first value when ``args.n_validation`` is 0.

    The last n_validation training rows are the queries and the others the database, so the
    query rows of the comparison never take part in the choice. Ties go to the larger λ.
    """
    n_val = args.n_validation
    if not n_val:
        return {"retrieval": args.grid[0], "classification": args.grid[0]}
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
    chosen = {}
    for task, values in scores.items():
        best = max(values.values())
        chosen[task] = max(lam for lam, v in values.items() if v == best)
    emit({"chosen": chosen, "grid": args.grid})
    return chosen


def cmd_tables(args) -> None:
    X, y, X_q, y_q = mnist(args.n_train, args.n_test)
    chosen = choose_diversity(X, y, args)
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
    for seed in args.seeds:
        start = _mbm.initial_factors(
            features.eigenvalues, args.modules, args.dim, np.random.RandomState(seed)
        )
        _race(features.eigenvalues, start, args, seed)


def _race(q, start, args, seed) -> None:
    """MBM and Adam at every rate from one start, each for ``args.budget`` CPU seconds."""
    lam = args.diversity
    # MBM: the loss after every epoch. Both methods' clocks leave out the loss evaluations
    # made only for the curve.
    clock = _Clock()

    def on_update(epoch, module, factors):
        if module == args.modules - 1:
            clock.record(partial(_mbm.modular_loss, factors, q, lam))
        return clock.elapsed() > args.budget

    _mbm.optimise(q, start.copy(), lam, 1e-6, 100_000, 0.0, on_update)
    runs = {"mbm": clock.curve}
    # The same single BLAS thread as MBM uses inside optimise(): same work per core, and a
    # second thread spinning on a shared 2-core machine slowed Adam's steps by 10-100x.
    with threadpool_limits(limits=1, user_api="blas"):
        for rate in args.rates:
            runs[f"adam@{rate}"] = adam(q, start.copy(), lam, rate, args.budget)
    best = min(min(v for _, v in c) for c in runs.values())
    best_adam = min(min(v for _, v in c) for k, c in runs.items() if k != "mbm")
    for name, curve in runs.items():
        losses = np.array([v for _, v in curve])
        times = np.array([t for t, _ in curve])
        record = {
            "seed": seed,
            "method": name,
            "min_loss": float(losses.min()),
            "final_loss": float(losses[-1]),
        }
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


class _Clock:
    """Optimisation time with the monitoring left out: (seconds, loss) points.

    The time is the process's CPU time (the work runs on one BLAS thread): on a shared
    machine under ``nice`` the wall clock also counts the seconds the process waits for a
    core, and those varied 10x between runs.
    """

    def __init__(self) -> None:
        self.curve: list[tuple[float, float]] = []
        self._start = time.process_time()
        self._paused = 0.0

    def elapsed(self) -> float:
        return time.process_time() - self._start - self._paused

    def record(self, loss_fn) -> float:
        now = self.elapsed()
        t = time.process_time()
        loss = float(loss_fn())
        self._paused += time.process_time() - t
        self.curve.append((now, loss))
        return loss


def adam(q, factors, diversity, rate, seconds, beta1=0.9, beta2=0.999, eps=1e-8):
    """Full-batch Adam on the compressed loss; (seconds, loss) every 10 steps.

    The moment updates are in place, so a step costs one gradient and a few passes over
    the M H ρ parameters.
    """
    m = np.zeros_like(factors)
    v = np.zeros_like(factors)
    update = np.empty_like(factors)
    clock = _Clock()
    step = 0
    while clock.elapsed() < seconds:
        step += 1
        g = _mbm.modular_gradient(factors, q, diversity)
        m *= beta1
        m += (1 - beta1) * g
        g *= g
        v *= beta2
        v += (1 - beta2) * g
        # factors -= rate * m_hat / (sqrt(v_hat) + eps)
        np.sqrt(v, out=update)
        update *= 1 / np.sqrt(1 - beta2**step)
        update += eps
        np.divide(m, update, out=update)
        update *= rate / (1 - beta1**step)
        factors -= update
        if step % 10 == 0:
            loss = clock.record(partial(_mbm.modular_loss, factors, q, diversity))
            if not np.isfinite(loss):
                break
    return clock.curve or [(seconds, float("inf"))]


def cmd_variants(args) -> None:
    for name in args.names:
        X, y = VARIANTS[name](args.n_train + args.n_test, np.random.default_rng(SEED))
        X_q, y_q = X[args.n_train :], y[args.n_train :]
        X, y = X[: args.n_train], y[: args.n_train]
        chosen = choose_diversity(X, y, args)
        results = compare(X, y, X_q, y_q, args, chosen)
        emit({"variant": name, "chosen": chosen, "results": results})
        for task, lam in chosen.items():
            # MBM at the λ chosen for this task; the other λ's MBM is not a contender.
            methods = {"mbm": results[f"mbm@{lam}"]}
            methods |= {k: v for k, v in results.items() if not k.startswith("mbm@")}
            order = sorted(methods, key=lambda k: -methods[k][task])
            ranked = " > ".join(f"{k} {methods[k][task]:.1f}" for k in order)
            print(f"{name} {task} (MBM λ {lam}): {ranked}")


def cmd_speed(args) -> None:
    from mbn_core import ModularKPCA
    from mbn_core.distill.onnx import OnnxEmbedder
    from mbn_core.modular.export import to_onnx

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


def cmd_testtime(args) -> None:
    from sklearn.neighbors import KNeighborsClassifier, NearestNeighbors

    from mbn_core.distill.onnx import OnnxEmbedder
    from mbn_core.modular.export import landmark_map_to_onnx

    X, y, X_q, _ = mnist(args.n_train, args.n_test)
    X32 = X_q.astype(np.float32)
    features = fit_kernel_features(X, args.n_landmarks, "auto", np.random.RandomState(SEED))
    # Test time depends on the shapes only; λ and the epochs just make the map a real one.
    mbm_map, _ = fit_mbm(features, args.modules, args.dim, args.grid[0], args.max_epochs, args.tol)
    mono_map = BASELINES["monolithic"](features, args.modules, args.dim, None, X)
    maps = {"monolithic": mono_map}
    maps |= {f"module {m}": _one_module(mbm_map, m) for m in range(args.modules)}
    # The database side is training time: embedded once per joint map, not timed.
    joint_db = mbm_map.transform_modules(X)
    databases = {"monolithic": mono_map.transform(X)}
    databases |= {f"module {m}": np.ascontiguousarray(joint_db[:, m]) for m in range(args.modules)}
    seconds: dict[str, dict[str, float]] = {name: {} for name in maps}
    candidates, votes = [], []
    best = _best_of(args.timing_repeats)
    # One thread per worker (BLAS and scikit-learn's OpenMP): each module, and Monolithic, is
    # timed as one worker would run it.
    with threadpool_limits(limits=1):
        for name, landmark_map in maps.items():
            t = seconds[name]
            db = databases[name]
            t["exact"], queries = best(lambda m=landmark_map: _in_blocks(m.transform, X_q))
            onnx_map = OnnxEmbedder(landmark_map_to_onnx(landmark_map).SerializeToString())
            t["onnx"], _ = best(lambda e=onnx_map: _in_blocks(e.embed, X32))
            # The search structure is built at training time; only the queries are timed.
            # A k-d tree pays off in a module's few dimensions, brute force in 300.
            for algorithm in args.algorithms:
                index = NearestNeighbors(n_neighbors=KAPPA, algorithm=algorithm).fit(db)
                t[f"retrieval {algorithm}"], found = best(
                    lambda i=index, q=queries: i.kneighbors(q, return_distance=False)
                )
                classifier = KNeighborsClassifier(n_neighbors=5, algorithm=algorithm).fit(db, y)
                t[f"classification {algorithm}"], predicted = best(
                    lambda c=classifier, q=queries: c.predict(q)
                )
            if name != "monolithic":
                candidates.append(found)
                votes.append(predicted)
            emit({"stage_seconds": name, **t})
        joint_q = mbm_map.transform_modules(X_q)
        found = np.concatenate(candidates, axis=1)
        merge = {
            "retrieval": best(lambda: rerank(joint_db, joint_q, found, KAPPA))[0],
            "classification": best(lambda: majority_vote(np.stack(votes, axis=1), 10))[0],
        }
    emit({"merge_seconds": merge})
    mono = seconds.pop("monolithic")
    print(f"\nMNIST {args.n_train} database, {args.n_test} queries, one thread per worker")
    print("| task | stages | Monolithic (s) | MBM, slowest module + merge (s) | speed |")
    print("|---|---|---|---|---|")
    for task in ("retrieval", "classification"):
        for embedding in (None, "exact", "onnx"):
            # Each side searches with its faster algorithm.
            def total(t, embedding=embedding, task=task):
                search = min(t[f"{task} {a}"] for a in args.algorithms)
                return search + (t[embedding] if embedding else 0.0)

            mono_s = total(mono)
            mbm_s = max(total(t) for t in seconds.values()) + merge[task]
            label = "search" if embedding is None else f"{embedding} map + search"
            emit({"task": task, "stages": label, "monolithic_s": mono_s, "mbm_s": mbm_s})
            print(f"| {task} | {label} | {mono_s:.3f} | {mbm_s:.3f} | {mono_s / mbm_s:.1f}x |")


def _one_module(landmark_map: LandmarkMap, m: int) -> LandmarkMap:
    """Module m of a modular map as a map of its own (φ_m, without the joint scale)."""
    rows = slice(m * landmark_map.module_dim, (m + 1) * landmark_map.module_dim)
    return LandmarkMap(
        landmark_map.landmarks,
        landmark_map.gamma,
        np.ascontiguousarray(landmark_map.weights[rows]),
        np.ascontiguousarray(landmark_map.offset[rows]),
        1,
        landmark_map.module_dim,
        1.0,
    )


def _in_blocks(fn, X, rows=256):
    # LandmarkMap.transform runs blocks of 256 rows on one thread each: one call per block
    # keeps every stage on one thread.
    return np.vstack([fn(X[i : i + rows]) for i in range(0, len(X), rows)])


def _best_of(repeats):
    """A timer: (the least CPU time of ``repeats`` runs of fn, its result).

    CPU time, not wall clock: under ``nice`` on a shared machine the wall clock counts the
    waits for a core. Every stage runs on one thread, so its CPU time is its work.
    """

    def timed(fn):
        times = []
        for _ in range(repeats):
            t = time.process_time()
            result = fn()
            times.append(time.process_time() - t)
        return min(times), result

    return timed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("tables", "optimiser", "variants", "speed", "testtime"):
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
        p.add_argument("--timing-repeats", type=int, default=3)
    sub.choices["optimiser"].add_argument("--diversity", type=float, default=0.9)
    sub.choices["optimiser"].add_argument("--budget", type=float, default=600.0)
    sub.choices["optimiser"].add_argument("--seeds", type=int, nargs="+", default=[SEED])
    sub.choices["optimiser"].add_argument(
        "--rates", type=float, nargs="+", default=[1e-3, 1e-2, 1e-1]
    )
    sub.choices["variants"].add_argument("--names", nargs="+", default=list(VARIANTS))
    sub.choices["testtime"].add_argument(
        "--algorithms", nargs="+", default=["brute", "kd_tree"], choices=["brute", "kd_tree"]
    )
    args = parser.parse_args()
    {
        "tables": cmd_tables,
        "optimiser": cmd_optimiser,
        "variants": cmd_variants,
        "speed": cmd_speed,
        "testtime": cmd_testtime,
    }[args.command](args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
