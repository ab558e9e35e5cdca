"""The fast path's student on new data: calibrate the bar, then compare students.

    python benchmarks/experiments/bench_student.py cache --sets digits,mnist-5k,mnist-10k
    python benchmarks/experiments/bench_student.py calibrate --sets digits,mnist-5k
    python benchmarks/experiments/bench_student.py students --sets digits,mnist-5k
        --variants base,alpha1e-3
    python benchmarks/experiments/bench_student.py cache --sets mnist-5k
        --option 'metric="cosine"' --tag cosine

``cache`` fits, per set, the exact MBN as ``mbn train`` does (``TrainingParams()``'s
estimator, seed 0) on the training rows but a held-out tenth (the selection rows, new to
the MBN), and stores in ``benchmarks/out/student_<set>.npz`` its in-sample embedding of the
rows it was fitted on, its embedding of the selection rows and of the test rows
(``bench_fidelity.load_set``'s split), plus, for the calibration, the test rows' embeddings
by an MBN that differs only in ``random_state`` (1), by one with ``n_clusterings`` = 100,
and of the test rows plus Gaussian noise of 1% of the data's spread. Times are stored too.

``calibrate`` prints how stable the exact embedding's own 10-NN structure is: the overlap
(``knn_overlap``) of the seed-0 test embedding with each of those, the share of test rows
whose exact embedding is duplicated, and the share of rows with a tie at the 10th neighbour.

``students`` trains MLP variants (a name of ``VARIANTS`` or ``key=value`` pairs joined by
``+``, e.g. ``input_noise=0.6+max_epochs=100``; ``augment=F`` adds F x the training rows as
random points between a row and one of its 5 nearest rows, labelled by the exact MBN, whose
labelling seconds are counted in the student's; ``unit_rows=1`` scales each input row to unit
length first; ``seed=N`` seeds the MLP; ``none`` is None, e.g. ``input_components=none``),
with ``CompressiveMBN``'s own input map, target scaling and epoch loop, on the cached
targets and prints, per variant, R^2 and 10-NN overlap on the selection rows (what a variant
is chosen by) and on the test rows, the k-means NMI gap on the test rows, the training
seconds and the weights (projection included).
``calibrate`` also prints the overlap that isotropic Gaussian errors of a given R^2 leave.

``scaling`` asks whether the student is short of data or the teacher sets the limit: it
labels MNIST rows that are neither the set's training rows nor its test rows (``--extra``
counts, from row 20,000 on) with the cached set's exact MBN (refitted as ``cache`` fits it,
labels stored in ``benchmarks/out/student_<set>_extra.npz``), and trains the default student
on the fitted rows plus each count of them, at the default epochs (more rows: more steps).

``kernel`` fits kernel ridge regression students instead of the MLP (a Gaussian kernel on
the compressor's input map, Nystrom landmarks drawn from the fitted rows, the ridge chosen on
the selection rows; ``--landmarks``, ``--widths`` as multiples of the landmarks' median squared
distance, ``--components``), and prints each beside the default MLP (seed 0) and the average of
the two. A closed-form fit needs no epochs, which is what the MLP is short of.

Decision record: docs/decisions/0010-compressor-defaults.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.linalg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared harness

from bench_data import load_mnist
from bench_fidelity import kmeans_nmi, load_set
from bench_report import add_training_option, command_line
from sklearn.metrics import r2_score
from sklearn.neighbors import NearestNeighbors

from mbn_core import CompressiveMBN
from mbn_core.distill.input_map import InputMap
from mbn_core.distill.student import predict as mlp_predict
from mbn_core.distill.student import target_scaling
from mbn_core.pipeline.fidelity import knn_overlap
from mbn_core.pipeline.split import split_rows
from mbn_core.pipeline.training import TrainingParams

OUT = Path(__file__).parent / "out"
NOISE = 0.01


def _embed(model, X) -> np.ndarray:
    return np.asarray(model.transform(X), dtype=np.float64)


def cache(name: str, args: argparse.Namespace) -> None:
    X_train, _, X_test, _ = load_set(name, 0, args.data)
    X_train = np.asarray(X_train, dtype=np.float32)
    X_test = np.asarray(X_test, dtype=np.float32)
    split = split_rows(len(X_train), 0.1, 0.0, np.random.RandomState(0))
    holdout, fitted = split.holdout, split.fitted
    arrays: dict[str, Any] = {"holdout": holdout, "fitted": fitted}
    seconds = {}
    others = [] if args.no_calibration else [("_seed1", {"random_state": 1}), ("_v100", {"V": 100})]
    for label, extra in [("", {}), *others]:
        values: dict[str, Any] = {**args.option, "random_state": extra.get("random_state", 0)}
        mbn = TrainingParams.from_dict(values).estimator()
        if "V" in extra:
            mbn.set_params(n_clusterings=extra["V"])
        started = time.perf_counter()
        embedding = mbn.fit_transform(X_train[fitted])
        seconds[f"fit{label}"] = time.perf_counter() - started
        started = time.perf_counter()
        arrays[f"test{label}"] = _embed(mbn, X_test)
        seconds[f"test{label}"] = time.perf_counter() - started
        if not label:
            arrays["fit"] = np.asarray(embedding, dtype=np.float64)
            arrays["selection"] = _embed(mbn, X_train[holdout])
            if not args.no_calibration:
                noise = np.random.RandomState(1).normal(0, NOISE * X_train.std(), X_test.shape)
                arrays["test_noise"] = _embed(mbn, X_test + noise.astype(np.float32))
            arrays["ks"] = np.asarray(mbn.ks_)
        print(f"{name}{label}: {seconds}", flush=True)
    arrays["seconds_keys"] = np.asarray(list(seconds))
    arrays["seconds"] = np.asarray(list(seconds.values()))
    OUT.mkdir(exist_ok=True)
    np.savez(_cache_path(name, args), **arrays)


def _cache_path(name: str, args: argparse.Namespace) -> Path:
    return OUT / f"student_{name}{'_' + args.tag if args.tag else ''}.npz"


def _load(name: str, args: argparse.Namespace) -> dict[str, np.ndarray]:
    with np.load(_cache_path(name, args)) as stored:
        return {key: stored[key] for key in stored.files}


def calibrate(name: str, args: argparse.Namespace) -> None:
    data = _load(name, args)
    test = data["test"]
    times = dict(zip(data["seconds_keys"], data["seconds"], strict=True))
    times = {str(key): round(float(value), 1) for key, value in times.items()}
    ks = [int(k) for k in data["ks"]]
    print(f"### {name}: {len(test)} test rows, ks {ks}, seconds {times}\n")
    print("| compared with the seed-0 exact test embedding | 10-NN overlap | R^2 |")
    print("|---|---|---|")
    for key, what in (
        ("test_seed1", "exact, MBN random_state 1"),
        ("test_v100", "exact, MBN V = 100"),
        ("test_noise", f"exact, input + N(0, ({NOISE} sd)^2)"),
    ):
        other = data[key]
        r2 = r2_score(test, other, multioutput="variance_weighted")
        r2_text = f"{r2:.4f}" if key == "test_noise" else "(other axes)"
        print(f"| {what} | {knn_overlap(test, other):.3f} | {r2_text} |")
    # What R^2 the overlap asks for: isotropic Gaussian errors on the exact embedding, scaled
    # to a given R^2 (a student's errors are not isotropic; this is the simplest reference).
    rng = np.random.RandomState(0)
    spread = np.sqrt(np.mean((test - test.mean(axis=0)) ** 2))
    unit = rng.normal(size=test.shape)
    for r2 in (0.9, 0.95, 0.99, 0.995, 0.999):
        noisy = test + unit * spread * np.sqrt(1 - r2)
        achieved = r2_score(test, noisy, multioutput="variance_weighted")
        print(
            f"| exact + isotropic Gaussian errors (R^2 {r2}) | {knn_overlap(test, noisy):.3f} "
            f"| {achieved:.4f} |"
        )
    _, first = np.unique(test, axis=0, return_index=True)
    duplicated = 1 - len(first) / len(test)
    distances, _ = NearestNeighbors(n_neighbors=12).fit(test).kneighbors(test)
    # distances[:, 0] is the row itself; column 10 is the 10th neighbour, 11 the 11th.
    ties = np.mean(np.isclose(distances[:, 10], distances[:, 11], rtol=1e-9, atol=0))
    print(
        f"\nrows whose exact embedding equals another row's: {duplicated:.4f}; "
        f"rows with a tie between the 10th and 11th neighbour: {ties:.4f}; "
        f"median distance to the 10th neighbour / embedding rms: "
        f"{np.median(distances[:, 10]) / spread:.4f}\n"
    )


VARIANTS: dict[str, dict[str, Any]] = {
    "base": {},
    "alpha1e-4": {"alpha": 1e-4},
    "alpha1e-3": {"alpha": 1e-3},
    "alpha1e-2": {"alpha": 1e-2},
    "patience10": {"n_iter_no_change": 10, "max_epochs": 100},
    "lr3e-4": {"learning_rate": 3e-4, "max_epochs": 100, "n_iter_no_change": 10},
    "batch64": {"batch_size": 64},
    "deep256x3": {"hidden_layer_sizes": (256, 256, 256)},
    "512x512": {"hidden_layer_sizes": (512, 512)},
    "256x128x128": {"hidden_layer_sizes": (256, 128, 128)},
}


def _variant(spec: str) -> dict[str, Any]:
    """A named variant, or key=value pairs joined by '+' (e.g. alpha=1e-3+batch_size=64)."""
    if spec in VARIANTS:
        return VARIANTS[spec]
    params: dict[str, Any] = {}
    for pair in spec.split("+"):
        key, value = pair.split("=")
        if value == "none":
            params[key] = None
        elif key == "hidden_layer_sizes":
            params[key] = tuple(int(v) for v in value.split("x"))
        else:
            params[key] = float(value) if "." in value or "e" in value else int(value)
    return params


def _unchanged(X: np.ndarray) -> np.ndarray:
    return X


def _unit_rows(X: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero): a cosine teacher cannot tell a row
    from its multiples, so the student need not learn to."""
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.where(norms > 0, norms, 1)


def _interpolations(X: np.ndarray, factor: float) -> np.ndarray:
    """``factor`` x len(X) new inputs, each a random point on the segment from a random row
    to one of its 5 nearest rows (input space)."""
    rng = np.random.RandomState(2)
    n_new = round(factor * len(X))
    near = NearestNeighbors(n_neighbors=6).fit(X).kneighbors(X, return_distance=False)[:, 1:]
    rows = rng.randint(len(X), size=n_new)
    partners = near[rows, rng.randint(near.shape[1], size=n_new)]
    weights = rng.uniform(0, 1, size=(n_new, 1)).astype(np.float32)
    return X[rows] + weights * (X[partners] - X[rows])


def students(name: str, args: argparse.Namespace) -> None:
    data = _load(name, args)
    X_train, _, X_test, y_test = load_set(name, 0, args.data)
    X_train = np.asarray(X_train, dtype=np.float32)
    X_fit = X_train[data["fitted"]]
    X_sel = X_train[data["holdout"]]
    target = data["fit"]
    # The compressor's own split of the fitted rows into validation and training.
    split = split_rows(len(X_fit), None, 0.1, np.random.RandomState(0))
    validation, train = split.validation, split.train
    print(f"### {name}\n")
    print(
        "| variant | weights | epochs | s | selection R^2 | selection 10-NN | test R^2 "
        "| test 10-NN | test NMI exact / fast / gap |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    nmi_exact = kmeans_nmi(data["test"], y_test, 0)
    teacher = None
    for spec in args.variants.split(","):
        params = _variant(spec)
        augment = params.pop("augment", 0)
        prepare = _unit_rows if params.pop("unit_rows", 0) else _unchanged
        seed = params.pop("seed", 0)  # the MLP's (the MBN's is the cache's)
        model = CompressiveMBN(random_state=seed, **params)
        X_student, Y_student, label_seconds = X_fit[train], target[train], 0.0
        if augment:
            if teacher is None:
                teacher = TrainingParams.from_dict({"random_state": 0}).estimator()
                teacher.fit(X_fit)
            X_extra = _interpolations(X_fit[train], augment)
            started = time.perf_counter()
            Y_extra = _embed(teacher, X_extra)
            label_seconds = time.perf_counter() - started
            X_student = np.concatenate([X_student, X_extra])
            Y_student = np.concatenate([Y_student, Y_extra])
        started = time.perf_counter()
        input_map = InputMap.fit(prepare(X_fit[train]), model.input_components)
        mean, scale = target_scaling(target[train])
        mlp, epochs, _ = model._fit_mlp(
            input_map.transform(prepare(X_student)),
            ((Y_student - mean) / scale).astype(np.float32),
            input_map.transform(prepare(X_fit[validation])),
            ((target[validation] - mean) / scale).astype(np.float32),
            np.random.RandomState(seed),
            None,
        )
        seconds = time.perf_counter() - started + label_seconds

        def fast(X, mlp=mlp, input_map=input_map, mean=mean, scale=scale, prepare=prepare):
            out = mlp_predict(mlp, input_map.transform(prepare(X)), target.shape[1]) * scale + mean
            return np.asarray(out, dtype=np.float64)

        sel, tst = fast(X_sel), fast(X_test)
        projection = 0 if input_map.projection is None else input_map.projection.size
        weights = sum(w.size for w in mlp.coefs_) + projection
        nmi_fast = kmeans_nmi(tst, y_test, 0)
        print(
            f"| {spec} | {weights} | {epochs} | {seconds:.1f} "
            f"| {r2_score(data['selection'], sel, multioutput='variance_weighted'):.4f} "
            f"| {knn_overlap(data['selection'], sel):.3f} "
            f"| {r2_score(data['test'], tst, multioutput='variance_weighted'):.4f} "
            f"| {knn_overlap(data['test'], tst):.3f} "
            f"| {nmi_exact:.4f} / {nmi_fast:.4f} / {nmi_fast - nmi_exact:+.4f} |",
            flush=True,
        )
    print()


EXTRA_FIRST_ROW = 20_000  # past every MNIST training set the fidelity table uses up to 10k


def _extra_labels(name: str, X_fit: np.ndarray, X_pool: np.ndarray, args) -> np.ndarray:
    """The cached set's exact MBN's embedding of ``X_pool``, computed once and stored."""
    path = OUT / f"student_{name}_extra.npz"
    if path.exists():
        with np.load(path) as stored:
            if len(stored["labels"]) >= len(X_pool):
                return stored["labels"][: len(X_pool)]
    teacher = TrainingParams.from_dict({**args.option, "random_state": 0}).estimator()
    started = time.perf_counter()
    teacher.fit(X_fit)
    fitted = time.perf_counter() - started
    started = time.perf_counter()
    labels = _embed(teacher, X_pool)
    print(
        f"teacher fit {fitted:.1f} s; {len(X_pool):,} rows labelled in "
        f"{time.perf_counter() - started:.1f} s\n",
        flush=True,
    )
    np.savez(path, labels=labels)
    return labels


def scaling(name: str, args: argparse.Namespace) -> None:
    if not name.startswith("mnist-"):
        raise SystemExit("scaling needs an MNIST set: its extra rows come from MNIST's pool")
    data = _load(name, args)
    X_train, _, X_test, y_test = load_set(name, 0, args.data)
    X_all, _ = load_mnist(args.data)
    X_train = np.asarray(X_train, dtype=np.float32)
    X_fit = X_train[data["fitted"]]
    counts = sorted(args.extra)
    X_pool = np.asarray(X_all[EXTRA_FIRST_ROW : EXTRA_FIRST_ROW + counts[-1]], dtype=np.float32)
    Y_pool = _extra_labels(name, X_fit, X_pool, args)
    target = data["fit"]
    split = split_rows(len(X_fit), None, 0.1, np.random.RandomState(0))
    validation, train = split.validation, split.train
    nmi_exact = kmeans_nmi(data["test"], y_test, 0)
    print(f"### {name}: the default student on teacher-labelled extra rows\n")
    print(
        "| extra rows | training rows | epochs | s | test R^2 | test 10-NN "
        "| test NMI exact / fast / gap |"
    )
    print("|---|---|---|---|---|---|---|")
    for count in counts:
        for seed in args.mlp_seeds:
            model = CompressiveMBN(random_state=seed)
            X_student = np.concatenate([X_fit[train], X_pool[:count]])
            Y_student = np.concatenate([target[train], Y_pool[:count]])
            started = time.perf_counter()
            input_map = InputMap.fit(X_fit[train], model.input_components)
            mean, scale = target_scaling(target[train])
            mlp, epochs, _ = model._fit_mlp(
                input_map.transform(X_student),
                ((Y_student - mean) / scale).astype(np.float32),
                input_map.transform(X_fit[validation]),
                ((target[validation] - mean) / scale).astype(np.float32),
                np.random.RandomState(seed),
                None,
            )
            seconds = time.perf_counter() - started
            scaled = mlp_predict(mlp, input_map.transform(X_test), target.shape[1])
            predicted = scaled * scale + mean
            predicted = np.asarray(predicted, dtype=np.float64)
            nmi_fast = kmeans_nmi(predicted, y_test, 0)
            print(
                f"| {count:,} (MLP seed {seed}) | {len(X_student):,} | {epochs} | {seconds:.1f} "
                f"| {r2_score(data['test'], predicted, multioutput='variance_weighted'):.4f} "
                f"| {knn_overlap(data['test'], predicted):.3f} "
                f"| {nmi_exact:.4f} / {nmi_fast:.4f} / {nmi_fast - nmi_exact:+.4f} |",
                flush=True,
            )
    print()


def _squared_distances(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    return np.maximum((A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2 * A @ B.T, 0)


def _kernel_student(X_fit, target, X_sel, Y_sel, components, landmarks, width):
    """A Gaussian-kernel ridge regression on ``landmarks`` Nystrom centres; returns the
    predictor, its ridge and its fitting seconds (the ridge search included)."""
    started = time.perf_counter()
    input_map = InputMap.fit(X_fit, components)
    F = np.asarray(input_map.transform(X_fit), dtype=np.float64)
    chosen = np.random.RandomState(0).choice(len(F), min(landmarks, len(F)), replace=False)
    centres = F[chosen]
    between = _squared_distances(centres, centres)
    gamma = 1 / (width * np.median(between[np.triu_indices(len(centres), 1)]))
    K_nm = np.exp(-gamma * _squared_distances(F, centres))
    K_mm = np.exp(-gamma * between)
    mean = target.mean(axis=0)
    gram, right = K_nm.T @ K_nm, K_nm.T @ (target - mean)
    jitter = 1e-8 * np.trace(gram) / len(centres) * np.eye(len(centres))

    def predictor(weights):
        def predict(X):
            Z = np.asarray(input_map.transform(X), dtype=np.float64)
            return np.exp(-gamma * _squared_distances(Z, centres)) @ weights + mean

        return predict

    best = None
    for ridge in (1e-10, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4):
        weights = scipy.linalg.solve(gram + ridge * len(F) * K_mm + jitter, right, assume_a="pos")
        predict = predictor(weights)
        score = r2_score(Y_sel, predict(X_sel), multioutput="variance_weighted")
        if best is None or score > best[0]:
            best = (score, ridge, predict)
    return best[2], best[1], time.perf_counter() - started


def kernel(name: str, args: argparse.Namespace) -> None:
    data = _load(name, args)
    X_train, _, X_test, y_test = load_set(name, 0, args.data)
    X_train = np.asarray(X_train, dtype=np.float32)
    X_fit, X_sel, target = X_train[data["fitted"]], X_train[data["holdout"]], data["fit"]
    split = split_rows(len(X_fit), None, 0.1, np.random.RandomState(0))
    validation, train = split.validation, split.train
    model = CompressiveMBN(random_state=0)
    started = time.perf_counter()
    input_map = InputMap.fit(X_fit[train], model.input_components)
    mean, scale = target_scaling(target[train])
    mlp, _, _ = model._fit_mlp(
        input_map.transform(X_fit[train]),
        ((target[train] - mean) / scale).astype(np.float32),
        input_map.transform(X_fit[validation]),
        ((target[validation] - mean) / scale).astype(np.float32),
        np.random.RandomState(0),
        None,
    )
    mlp_seconds = time.perf_counter() - started
    mlp_test = mlp_predict(mlp, input_map.transform(X_test), target.shape[1]) * scale + mean
    nmi_exact = kmeans_nmi(data["test"], y_test, 0)

    def row(what, seconds, predicted):
        r2 = r2_score(data["test"], predicted, multioutput="variance_weighted")
        gap = kmeans_nmi(predicted, y_test, 0) - nmi_exact
        overlap = knn_overlap(data["test"], predicted)
        print(f"| {what} | {seconds} | {r2:.4f} | {overlap:.3f} | {gap:+.4f} |", flush=True)

    print(f"### {name}\n")
    print("| student | s | test R^2 | test 10-NN | test NMI gap |")
    print("|---|---|---|---|---|")
    row("MLP, the default (seed 0)", f"{mlp_seconds:.1f}", np.asarray(mlp_test, np.float64))
    for components in args.components:
        for landmarks in args.landmarks:
            for width in args.widths:
                predict, ridge, seconds = _kernel_student(
                    X_fit, target, X_sel, data["selection"], components, landmarks, width
                )
                kernel_test = predict(X_test)
                what = f"kernel: {components} inputs, {landmarks} landmarks, width {width}"
                row(f"{what}, ridge {ridge:g}", f"{seconds:.1f}", kernel_test)
                row(f"average of the two ({what})", "", (kernel_test + mlp_test) / 2)
    print()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["cache", "calibrate", "students", "kernel", "scaling"])
    parser.add_argument("--sets", default="digits")
    parser.add_argument("--variants", default="base")
    parser.add_argument(
        "--no-calibration", action="store_true", help="cache: the seed-0 MBN's embeddings only"
    )
    add_training_option(parser, "'metric=\"cosine\"' (cache: the MBN's)")
    parser.add_argument("--tag", default="", help="suffix of the cache file, e.g. cosine")
    parser.add_argument("--components", type=int, nargs="+", default=[32], help="kernel")
    parser.add_argument("--landmarks", type=int, nargs="+", default=[2000], help="kernel")
    parser.add_argument("--widths", type=float, nargs="+", default=[0.5], help="kernel")
    parser.add_argument(
        "--extra", type=int, nargs="+", default=[0, 4000, 12000, 28000], help="scaling"
    )
    parser.add_argument("--mlp-seeds", type=int, nargs="+", default=[0], help="scaling")
    parser.add_argument("--data", help="MNIST .npz (default: bench_data.load_mnist's search)")
    args = parser.parse_args(argv)
    print(f"`{command_line('bench_student.py', argv)}`\n")
    commands = {
        "cache": cache,
        "calibrate": calibrate,
        "students": students,
        "kernel": kernel,
        "scaling": scaling,
    }
    run = commands[args.command]
    for name in args.sets.split(","):
        run(name, args)


if __name__ == "__main__":
    main()
