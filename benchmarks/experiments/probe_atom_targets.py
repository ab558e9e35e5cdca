"""How many atoms the atom head teaches each row, and at what temperature: measured on rows
no part of the model saw, over several student seeds.

    python benchmarks/experiments/probe_atom_targets.py --methods tsne,umap --targets 1,3
    python benchmarks/experiments/probe_atom_targets.py --methods umap --targets 3 \\
        --temperature 0.25 --seeds 0,1,2

Each method lays out MNIST's first 10,000 images (``bench_out_of_sample.py``'s fitted rows,
the method's defaults, seed 0; ``--layouts DIR`` reads or writes ``DIR/NAME.npy`` so that a
rerun skips the fit). The distiller trains the model's own student on them as the pipeline
does (the same split of the rows into training and validation, from a generator seeded by
the student seed), with ``student.ATOM_TARGETS`` (and ``ATOM_TEMPERATURE``) set as asked:
1 is the hard labels each row's nearest atom gave. The student then embeds
``bench_out_of_sample.py``'s 5,000 unseen rows, and k-means (its scoring: as many clusters as
digits, the lowest inertia of 20 restarts, seed 0) is scored against the digits (NMI).
k-means NMI moves by about 0.01 between student seeds, so the median over ``--seeds`` is
what a change must win on. Serves decision 0036.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.utils import check_random_state

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_fidelity import kmeans_nmi
from bench_out_of_sample import load

import mbn_core.distill.student as student_module
from mbn_core.pipeline.distillation import fresh_copy
from mbn_core.pipeline.distilled import DistilledEmbedding
from mbn_core.pipeline.split import split_rows
from mbn_core.pipeline.training import TrainingParams


def layout_of(method: str, X: np.ndarray, cache: Path | None, threads: int) -> np.ndarray:
    path = None if cache is None else cache / f"{method}.npy"
    if path is not None and path.exists():
        return np.load(path)
    params = TrainingParams.from_dict({"method": method, "random_state": 0, "n_jobs": threads})
    layout = np.asarray(fresh_copy(params.estimator()).fit_transform(X), dtype=np.float64)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, layout)
    return layout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="tsne,umap")
    parser.add_argument("--targets", default="1,3", help="ATOM_TARGETS values, comma-separated")
    parser.add_argument("--temperature", type=float, default=student_module.ATOM_TEMPERATURE)
    parser.add_argument("--n-atoms", type=int, default=None, help="default: the distiller's")
    parser.add_argument("--seeds", default="0,1,2,3,4,5,6", help="student seeds")
    parser.add_argument("--threads", type=int, default=1, help="the student's BLAS threads")
    parser.add_argument("--layouts", type=Path, help="folder of cached layouts (NAME.npy)")
    parser.add_argument("--data", help="MNIST .npz (default: bench_data.load_mnist's search)")
    args = parser.parse_args()
    X_fit, _, X_new, y_new = load("mnist", 0, args.data)
    X_fit, X_new = X_fit.astype(np.float32), X_new.astype(np.float32)
    student_module.ATOM_TEMPERATURE = args.temperature
    for method in args.methods.split(","):
        layout = layout_of(method, X_fit, args.layouts, args.threads)
        params = TrainingParams.from_dict({"method": method, "n_jobs": args.threads})
        options = params.compressor_kwargs()
        if args.n_atoms is not None:
            options["n_atoms"] = args.n_atoms
        model = DistilledEmbedding(params.estimator(), **options)
        distiller = model._distiller()
        for targets in (int(k) for k in args.targets.split(",")):
            student_module.ATOM_TARGETS = targets
            row: dict = {"method": method, "targets": targets, "temperature": args.temperature,
                         "n_atoms": model.n_atoms}  # fmt: skip
            runs = []
            for seed in (int(s) for s in args.seeds.split(",")):
                rng = check_random_state(seed)
                split = split_rows(len(X_fit), None, model.validation_fraction, rng)
                started = time.perf_counter()
                student = distiller.distil(X_fit, layout, split.validation, split.train, rng, None)
                seconds = time.perf_counter() - started
                placed = np.asarray(student.embed(X_new), dtype=np.float64)
                runs.append({"seed": seed, "nmi": round(kmeans_nmi(placed, y_new, 0), 4),
                             "seconds": round(seconds, 1)})  # fmt: skip
            nmis = [run["nmi"] for run in runs]
            row.update(median=round(float(np.median(nmis)), 4), runs=runs)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
