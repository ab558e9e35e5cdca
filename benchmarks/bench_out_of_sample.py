"""New rows for the layout methods: each method's layout, its distilled student and, where it
has one, its own ``transform``, on rows none of them saw. Prints a markdown table.

    python benchmarks/bench_out_of_sample.py                      # MNIST, digits, breast_cancer
    python benchmarks/bench_out_of_sample.py --sets digits --methods tsne,umap
    python benchmarks/bench_out_of_sample.py --sets breast_cancer --seeds 0,1,2,3,4,5,6,7,8,9
    python benchmarks/bench_out_of_sample.py --sets mnist --option hidden_layer_sizes=[512,512]

Each (set, method) is trained with ``train_bundle`` (the method's defaults, the seed, the
labels only for the report), as ``mbn train --method NAME`` would, then measured on the set's
unseen rows. With several ``--seeds`` (each a split of a small set into fitted and unseen
rows, and the training's seed), a last table gives the medians over them: on a small set a
single split's k-means NMI moves by more than the differences it is asked to show.

- ``mnist``: the first 10,000 images of ``bench_data.load_mnist()`` fitted, 5,000 of the last
  10,000 (the test split) unseen;
- ``digits``, ``breast_cancer``: scikit-learn's bundled copies, split as in
  ``bench_fidelity.py`` (digits 1,200 / 597; breast_cancer 2/3 / 1/3, standardised).

Columns:

- **layout (fitted rows)**: the method's own k-means NMI against the labels and
  trustworthiness (k = 10), on all the rows it laid out, scored exactly as the unseen rows
  are. The layout is the method fitted again with the model's parameters and seed on the
  same (scaled) rows; the bundle's reference rows (a sample of its own layout) say whether
  the second fit reproduced the model's layout ("refit: same" or "differs", the largest
  difference). MBN's "layout" is its exact map of the fitted rows;
- **report (cross-fitted)**: the bundle's report of the student on rows its fold never saw:
  NMI (with the layout's own NMI on those rows, the report's k-means, in brackets), R^2 and
  10-NN overlap against the layout;
- **student (unseen)**: the fast path (the ONNX network) on the unseen rows: NMI and
  trustworthiness;
- **transform (unseen)**: the method's exact map on the same rows (t-SNE: openTSNE's
  ``transform``; UMAP: umap-learn's; PaCMAP: its ``transform`` with the training rows as
  basis), "-" for methods without one;
- **time per row**: the fast path in a batch of the unseen rows and one row at a time
  (median of 200 calls), the exact map in one batch of them; and the training time.

k-means has as many clusters as classes, the lowest inertia of 20 restarts; trustworthiness is
scored on (a seeded sample of) 1,000 unseen rows. ``mbn`` may be listed among the methods for
MBN's figures on the same rows.

``--reference parametric_umap`` adds umap-learn's ParametricUMAP, the published network
that learns a UMAP layout and its map together (a Keras encoder, here on TensorFlow's CPU
build: ``pip install tensorflow-cpu``; without it the row says it was skipped and why). It is
fitted outside the pipeline: its own layout and encoder, no report.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_fidelity import kmeans_nmi, load_set
from bench_report import add_training_option, command_line
from sklearn.manifold import trustworthiness

from mbn_core.bundle import Bundle, ExactModel, load_bundle
from mbn_core.data.scaling import INPUT_SCALING, choose_scaling
from mbn_core.exceptions import NoExactMap
from mbn_core.pipeline.alignment import load_reference
from mbn_core.pipeline.distillation import fresh_copy
from mbn_core.pipeline.training import TrainingParams, train_bundle

METHODS = "tsne,umap,densmap,pacmap,trimap"
SETS = "mnist,digits,breast_cancer"
# The published network beside the methods (``--reference``).
REFERENCE = "parametric_umap"
N_FIT_MNIST = 10_000
N_NEW_MNIST = 5_000
TRUST_ROWS = 1_000
SINGLE_ROW_CALLS = 200


def load(name: str, seed: int, data: str | None):
    """(X_fit, y_fit, X_new, y_new) of a set."""
    if name == "mnist":
        X_fit, y_fit, X_test, y_test = load_set(f"mnist-{N_FIT_MNIST}", seed, data)
        return X_fit, y_fit, X_test[:N_NEW_MNIST], y_test[:N_NEW_MNIST]
    return load_set(name, seed, data)


def trust(X: np.ndarray, Z: np.ndarray, seed: int) -> float:
    rows = np.arange(len(X))
    if len(rows) > TRUST_ROWS:
        rows = np.sort(np.random.RandomState(seed).choice(len(X), TRUST_ROWS, replace=False))
    X_rows = np.asarray(X, dtype=np.float64)[rows]
    return float(trustworthiness(X_rows, np.asarray(Z, dtype=np.float64)[rows], n_neighbors=10))


def measure(set_name: str, method: str, seed: int, args: argparse.Namespace) -> dict:
    X_fit, y_fit, X_new, y_new = load(set_name, seed, args.data)
    X_fit, X_new = X_fit.astype(np.float32), X_new.astype(np.float32)
    params = TrainingParams.from_dict(
        {"method": method, "random_state": seed, "n_jobs": args.threads, **args.option}
    )
    row: dict = {"set": set_name, "method": method, "seed": seed}
    row.update(n_fit=len(X_fit), n_new=len(X_new))
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        path = train_bundle(X_fit, Path(scratch) / "model", name=method, params=params, y=y_fit)
        row["train_seconds"] = time.perf_counter() - started
        bundle = load_bundle(path)
        report = bundle.manifest["fidelity"]
        try:
            exact_model = bundle.load_exact()  # read once: the layout and the transform's
        except NoExactMap:
            exact_model = None
        started = time.perf_counter()
        layout = fitted_layout(params, bundle, X_fit, exact_model)
        row["layout_seconds"] = time.perf_counter() - started
        row["refit_difference"] = refit_difference(params, bundle, X_fit, layout)
        row.update(
            layout_nmi=kmeans_nmi(layout, y_fit, seed),
            layout_trust=trust(X_fit, layout, seed),
            report_layout_nmi=report["nmi_labels_exact"],
            report_nmi=report["nmi_labels_fast"],
            report_r2=report["r2"],
            report_knn=report["knn_overlap"],
            report_rows=report["n_holdout"],
            report_kind=report.get("holdout"),
        )
        batch = min(_timed(lambda: bundle.embed(X_new))[0] for _ in range(3))
        row["fast_us_per_row"] = 1e6 * batch / len(X_new)
        singles = []
        for i in range(SINGLE_ROW_CALLS):
            one = X_new[i % len(X_new)][None, :]
            singles.append(_timed(lambda one=one: bundle.embed(one))[0])
        row["fast_us_single_row"] = 1e6 * float(np.median(singles))
        fast = np.asarray(bundle.embed(X_new), dtype=np.float64)
        row["student_nmi"] = kmeans_nmi(fast, y_new, seed)
        row["student_trust"] = trust(X_new, fast, seed)
        if exact_model is None:
            row.update(exact_ms_per_row=None, transform_nmi=None, transform_trust=None)
        else:  # timed without reading the arrays, which is not placing rows
            seconds, exact = _timed(lambda: bundle.embed(X_new, mode="exact", exact=exact_model))
            exact = np.asarray(exact, dtype=np.float64)
            row["exact_ms_per_row"] = 1e3 * seconds / len(X_new)
            row["transform_nmi"] = kmeans_nmi(exact, y_new, seed)
            row["transform_trust"] = trust(X_new, exact, seed)
    return row


def fitted_layout(
    params: TrainingParams, bundle: Bundle, X_fit: np.ndarray, exact_model: ExactModel | None
) -> np.ndarray:
    """The method's embedding of the rows it was fitted on (float64): a layout method
    fitted again as the pipeline fits it (the same parameters and seed, on the rows scaled
    as the model scales them), MBN's exact map of them (``exact_model``, the bundle's)."""
    if not params.spec.layout:
        assert exact_model is not None, "a method that is not a layout has an exact map"
        exact = bundle.embed(X_fit, mode="exact", exact=exact_model)
        return np.asarray(exact, dtype=np.float64)
    scaled = choose_scaling(X_fit, params[INPUT_SCALING.name]).transform(X_fit)
    return np.asarray(fresh_copy(params.estimator()).fit_transform(scaled), dtype=np.float64)


def refit_difference(
    params: TrainingParams, bundle: Bundle, X_fit: np.ndarray, layout: np.ndarray
) -> float | None:
    """The largest difference between ``layout`` and the model's own layout on the bundle's
    reference rows (a sample of its fitted rows; 0 when the refit reproduced it), None for
    MBN or a bundle without reference rows."""
    reference = load_reference(bundle)
    if not params.spec.layout or reference is None:
        return None
    index = {row.tobytes(): i for i, row in enumerate(np.asarray(X_fit, dtype=np.float32))}
    rows = [index[row.tobytes()] for row in reference.rows.astype(np.float32)]
    return float(np.max(np.abs(layout[rows].astype(np.float32) - reference.embedding)))


def parametric_umap(set_name: str, seed: int, args: argparse.Namespace) -> dict:
    """umap-learn's ParametricUMAP on the same rows: its layout, and its encoder on the
    unseen rows (a row saying why, when TensorFlow is not installed)."""
    row: dict = {"set": set_name, "method": "ParametricUMAP (reference)", "seed": seed}
    try:
        from umap.parametric_umap import ParametricUMAP
    except ImportError as error:
        return {**row, "skipped": f"needs TensorFlow ({error})"}
    X_fit, y_fit, X_new, y_new = load(set_name, seed, args.data)
    X_fit, X_new = X_fit.astype(np.float32), X_new.astype(np.float32)
    row.update(n_fit=len(X_fit), n_new=len(X_new))
    started = time.perf_counter()
    model = ParametricUMAP(random_state=seed, verbose=False)
    layout = model.fit_transform(X_fit)
    row["train_seconds"] = time.perf_counter() - started
    row["layout_nmi"] = kmeans_nmi(layout, y_fit, seed)
    row["layout_trust"] = trust(X_fit, layout, seed)
    model.transform(X_new[:10])  # the first call builds the encoder's graph
    seconds, placed = _timed(lambda: model.transform(X_new))
    row["fast_us_per_row"] = 1e6 * seconds / len(X_new)
    singles = [_timed(lambda i=i: model.transform(X_new[i : i + 1]))[0] for i in range(20)]
    row["fast_us_single_row"] = 1e6 * float(np.median(singles))
    row["student_nmi"] = kmeans_nmi(placed, y_new, seed)
    row["student_trust"] = trust(X_new, placed, seed)
    row.update(
        report_nmi=None, report_layout_nmi=None, report_r2=None, report_knn=None,
        report_rows="-",
        exact_ms_per_row=None, transform_nmi=None, transform_trust=None,
    )  # fmt: skip
    return row


def _timed(function):
    started = time.perf_counter()
    result = function()
    return time.perf_counter() - started, result


def _cell(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def table_row(row: dict, with_seed: bool = False) -> str:
    seed = f", seed {row['seed']}" if with_seed else ""
    if "skipped" in row:
        return f"| {row['set']}{seed} | {row['method']} | skipped: {row['skipped']} ||||||||"
    speedup = None
    if row["exact_ms_per_row"] is not None:
        speedup = 1e3 * row["exact_ms_per_row"] / row["fast_us_per_row"]
    return (
        f"| {row['set']} ({row['n_fit']} / {row['n_new']}{seed}) | {row['method']} "
        f"| {_cell(row['layout_nmi'])} / {_cell(row['layout_trust'])} "
        f"| {_cell(row['report_nmi'])} ({_cell(row['report_layout_nmi'])}) / "
        f"{_cell(row['report_r2'])} / "
        f"{_cell(row['report_knn'])} ({row['report_rows']}) "
        f"| {_cell(row['student_nmi'])} / {_cell(row['student_trust'])} "
        f"| {_cell(row['transform_nmi'])} / {_cell(row['transform_trust'])} "
        f"| {row['fast_us_per_row']:.1f} / {row['fast_us_single_row']:.0f} "
        f"| {_cell(row['exact_ms_per_row'], '.2f')} | {_cell(speedup, '.0f')} "
        f"| {row['train_seconds']:.0f} | {_refit(row.get('refit_difference'))} |"
    )


def seed_medians(rows: list[dict]) -> list[str]:
    """Markdown rows, one per (set, method) measured with several seeds: the medians of the
    layout's NMI on its fitted rows, the student's and the transform's on the unseen rows,
    and of the gaps (layout minus the other) with their lowest and highest."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        if "skipped" not in row:
            groups.setdefault((row["set"], row["method"]), []).append(row)
    lines = []
    for (set_name, method), runs in groups.items():
        layout = np.array([run["layout_nmi"] for run in runs])
        student = np.array([run["student_nmi"] for run in runs])
        cells = [set_name, method, str(len(runs)), f"{np.median(layout):.3f}"]
        cells += [f"{np.median(student):.3f}", _spread(layout - student)]
        if all(run["transform_nmi"] is not None for run in runs):
            transform = np.array([run["transform_nmi"] for run in runs])
            cells += [f"{np.median(transform):.3f}", _spread(layout - transform)]
        else:
            cells += ["-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _spread(values: np.ndarray) -> str:
    return f"{np.median(values):+.3f} ({values.min():+.3f} to {values.max():+.3f})"


def _refit(difference: float | None) -> str:
    if difference is None:
        return "-"
    return "same" if difference == 0 else f"differs ({difference:.2g})"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", default=SETS)
    parser.add_argument("--methods", default=METHODS)
    parser.add_argument(
        "--seeds",
        default="0",
        help="comma-separated seeds of the split (the small sets) and of the training; more "
        "than one adds a table of medians over them",
    )
    parser.add_argument("--threads", type=int, default=2, help="n_jobs of each training")
    parser.add_argument("--data", help="MNIST .npz (default: bench_data.load_mnist's search)")
    parser.add_argument("--json", help="also append each row as a JSON line to this file")
    parser.add_argument(
        "--reference",
        choices=[REFERENCE, "none"],
        default=REFERENCE,
        help="a published network to compare with (default: ParametricUMAP, when installed)",
    )
    add_training_option(parser, "hidden_layer_sizes=[512,512]")
    args = parser.parse_args(argv)
    print(f"New rows for the layout methods (`{command_line('bench_out_of_sample.py', argv)}`)\n")
    print(
        "| set (fitted / unseen) | method | layout NMI / trust (fitted rows) "
        "| report NMI (layout's) / R^2 / 10-NN (rows) | student NMI / trust (unseen) "
        "| transform NMI / trust (unseen) | fast µs/row: batch / one row "
        "| exact ms/row | exact / fast | train s | refit |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    seeds = [int(seed) for seed in args.seeds.split(",")]
    rows = []
    for set_name in args.sets.split(","):
        for seed in seeds:
            methods = args.methods.split(",")
            if args.reference == REFERENCE:
                methods.append(REFERENCE)
            for method in methods:
                # Each row out as soon as it is measured: a long run that fails keeps the rest.
                if method == REFERENCE:
                    row = parametric_umap(set_name, seed, args)
                else:
                    row = measure(set_name, method, seed, args)
                if args.json:
                    with open(args.json, "a") as handle:
                        handle.write(json.dumps(row) + "\n")
                print(table_row(row, with_seed=len(seeds) > 1), flush=True)
                rows.append(row)
    if len(seeds) > 1:
        print(
            "\n| set | method | seeds | layout NMI (fitted) | student NMI (unseen) "
            "| layout - student: median (lowest to highest) | transform NMI (unseen) "
            "| layout - transform |"
        )
        print("|---|---|---|---|---|---|---|---|")
        print("\n".join(seed_medians(rows)))


if __name__ == "__main__":
    main()
