"""Aligned versions on MNIST: two models of the same rows with different seeds.

Trains a model on MNIST training rows (seed 0), then a second one on the same rows with
another seed, aligned to the first (``train_bundle(..., align_to=first)``). On held-out rows
it reports, for the exact and the fast path, the median cosine and the 10-NN overlap
between the versions' vectors, aligned and unaligned (the second model's own space: its
estimator's output, and its fast path with the map undone), plus the alignment's residual.

Run: ``MBN_MNIST=path/to/mnist70k.npz python benchmarks/bench_alignment.py [--train 5000]``
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_data import load_mnist
from bench_report import add_training_option, print_measures

from mbn_core.bundle import load_bundle
from mbn_core.pipeline.alignment import compare_embeddings
from mbn_core.pipeline.training import train_bundle


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=5_000, help="training digits")
    parser.add_argument("--test", type=int, default=1_000, help="held-out digits")
    parser.add_argument("--seeds", type=int, nargs=2, default=(0, 1))
    add_training_option(parser, "n_clusterings=100")
    args = parser.parse_args(argv)
    x, _ = load_mnist()
    train = x[: args.train].astype(np.float32)
    held_out = x[60_000 : 60_000 + args.test].astype(np.float32)
    params = {"map_points": 0, **args.option}
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        first = train_bundle(
            train, Path(tmp) / "first", name="v", params={**params, "random_state": args.seeds[0]}
        )
        second = train_bundle(
            train,
            Path(tmp) / "second",
            name="v",
            params={**params, "random_state": args.seeds[1]},
            align_to=first,
        )
        seconds = time.perf_counter() - started
        old, new = load_bundle(first), load_bundle(second)
        section = new.manifest["alignment"]
        matrix, shift = np.asarray(section["matrix"]), np.asarray(section["shift"])
        rows = [
            ("training rows, held-out rows", f"{args.train}, {args.test}"),
            ("both trainings", f"{seconds:.0f} s"),
            ("reference rows", str(section["reference_rows"])),
            (
                "residual aligned / unaligned",
                f"{section['residual']:.3f} / {section['unaligned_residual']:.3f}",
            ),
        ]
        exact_new = new.load_exact()
        for mode in ("exact", "fast"):
            reference = old.embed(held_out, mode)
            aligned = new.embed(held_out, mode, exact=exact_new if mode == "exact" else None)
            if mode == "exact":
                unaligned = exact_new.estimator.transform(held_out)
            else:
                unaligned = (aligned.astype(np.float64) - shift) @ np.linalg.inv(matrix)
            a = compare_embeddings(reference, aligned)
            u = compare_embeddings(reference, unaligned)
            rows.append((f"{mode}: median cosine aligned / unaligned",
                         f"{a['cosine_median']:.3f} / {u['cosine_median']:.3f}"))  # fmt: skip
            rows.append((f"{mode}: 10-NN overlap aligned / unaligned",
                         f"{a['knn_overlap']:.3f} / {u['knn_overlap']:.3f}"))  # fmt: skip
    print_measures("Aligned versions on MNIST", "bench_alignment.py", rows, argv)


if __name__ == "__main__":
    main()
