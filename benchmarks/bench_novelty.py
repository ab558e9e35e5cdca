"""Novelty calibration on MNIST: held-out digits against generated shifts.

The novelty model (``mbn_core.pipeline.novelty``) is fitted on training digits, as
``train_bundle`` fits it, and scores held-out digits (which should be flagged at about the
calibrated rate, 1%) and shifted copies of them: Gaussian noise, a white square occluding
part of the digit, inverted images, images rotated by 90 degrees, and uniform noise. Each
part of the score is also thresholded alone (at its own 99th percentile on the same
calibration rows), which is how the combined score was chosen. The last rows time the score
per row, in a batch of one and of 256.

Run: ``MBN_MNIST=path/to/mnist70k.npz python benchmarks/bench_novelty.py [--train 10000]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from bench_data import load_mnist
from bench_report import print_measures

from mbn_core.pipeline.novelty import QUANTILE, Novelty


def shifted_sets(X: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Shifted copies of the uint8 images ``X`` (as float32)."""
    images = X.reshape(-1, 28, 28).astype(np.float32)
    occluded = images.copy()
    for image in occluded:
        row, col = rng.integers(4, 14, 2)
        image[row : row + 10, col : col + 10] = 255.0
    flat = images.reshape(len(X), -1)
    return {
        "noise (Gaussian, sd 64)": np.clip(flat + rng.normal(0, 64, flat.shape), 0, 255),
        "occlusion (10x10 white square)": occluded.reshape(len(X), -1),
        "inverted (255 - x)": 255.0 - flat,
        "rotated 90 degrees": np.rot90(images, 1, axes=(1, 2)).reshape(len(X), -1),
        "uniform noise images": rng.uniform(0, 255, flat.shape),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=10_000, help="training digits")
    parser.add_argument("--test", type=int, default=2_000, help="held-out digits")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    x, _ = load_mnist()
    train = x[: args.train].astype(np.float32)
    held_out = x[60_000 : 60_000 + args.test].astype(np.float32)
    started = time.perf_counter()
    model, summary = Novelty.fit(train, random_state=args.seed)
    fit_seconds = time.perf_counter() - started

    # The parts alone, each thresholded at its own quantile on the same calibration rows.
    rng = np.random.RandomState(args.seed)
    calibration = train[rng.permutation(len(train))[summary["n_reference_rows"] :]][:5000]
    part_thresholds = np.quantile(model._parts(calibration), QUANTILE, axis=0)

    def rates(rows: np.ndarray) -> str:
        parts = model._parts(rows)
        recon, neighbours = np.mean(parts > part_thresholds, axis=0)
        combined = np.mean(model.is_novel(rows))
        out = np.mean(model.out_of_range(rows))
        return (
            f"{combined:.3f} (reconstruction {recon:.3f}, neighbours {neighbours:.3f}; "
            f"out of range {out:.3f})"
        )

    rows = [
        (
            "training digits (fit)",
            f"{args.train} ({summary['n_reference_rows']} reference, "
            f"{summary['n_calibration_rows']} calibration), {fit_seconds:.2f} s",
        ),
        ("calibration novel share", f"{summary['calibration_novel_share']:.3f}"),
        (f"held-out digits ({args.test})", rates(held_out)),
    ]
    shifts = shifted_sets(held_out.astype(np.uint8), np.random.default_rng(args.seed))
    for name, shifted in shifts.items():
        rows.append((name, rates(shifted.astype(np.float32))))
    for batch in (1, 256):
        sample = held_out[:batch]
        repeats = max(3, 2000 // batch)
        times = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(repeats):
                model.score(sample)
            times.append((time.perf_counter() - started) / repeats / batch)
        rows.append(
            (
                f"score time per row, batch of {batch} (median of 5)",
                f"{np.median(times) * 1e6:.1f} us",
            )
        )
    print_measures("Novelty on MNIST: share of rows flagged", "bench_novelty.py", rows, argv)


if __name__ == "__main__":
    main()
