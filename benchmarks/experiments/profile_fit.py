"""Where an MBN fit's time goes: its phases, and each upper layer's time and path.

    MBN_MNIST=path/to/mnist70k.npz python benchmarks/experiments/profile_fit.py \\
        [--data mnist5k | mnist | digits] [--rows N] [--k-max K] [--threads T] [--repeats R]

Prints, per fit, the seconds of each phase (``mbn_core.mbn.phases``: auto, draws, bottom,
upper, output), the upper layers' share of the bottom layer's time, and for every upper layer
its wall time (from the progress callback: the end of its last clustering, waits for its
draws and the "auto" delta before the first included) and whether it was computed by
candidate scan or by the posting-list walk. This is the profile behind
docs/decisions/0032-training-speed.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_data import load_mnist
from bench_int8 import mnist_5k
from sklearn.datasets import load_digits

from mbn_core import MBN
from mbn_core.mbn.backends.local import LocalBackend
from mbn_core.mbn.phases import timed_phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=("mnist5k", "mnist", "digits"), default="mnist5k")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--k-max", type=int, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    if args.data == "mnist5k":
        X, _ = mnist_5k()
    elif args.data == "mnist":
        X, _ = load_mnist()
    else:
        X = load_digits().data
    X = X if args.rows is None else X[: args.rows]
    scanned: set[int] = set()
    scan = LocalBackend.scan_upper_codes

    def spy(self, index, codes, clusterings):
        scanned.add(index)
        return scan(self, index, codes, clusterings)

    LocalBackend.scan_upper_codes = spy  # type: ignore[method-assign]
    params = {"k_max": args.k_max, "n_jobs": args.threads}
    MBN(n_clusterings=4, random_state=0, **params).fit(X[:300])  # compile first
    for repeat in range(args.repeats):
        ends: dict[int, float] = {}
        scanned.clear()

        def progress(layer: int, done: int, total: int, ends=ends) -> None:
            ends[layer] = time.perf_counter()

        with timed_phases() as times:
            start = time.perf_counter()
            model = MBN(random_state=repeat, callback=progress, **params).fit(X)
            seconds = time.perf_counter() - start
        phases = times.seconds
        print(f"fit {seconds:.2f} s, {X.shape[0]} x {X.shape[1]}, ks {model.ks_}, "
              f"{args.threads} threads")  # fmt: skip
        print("  " + ", ".join(f"{name} {value:.2f} s" for name, value in phases.items())
              + f"; upper / bottom {phases['upper'] / phases['bottom']:.0%}")  # fmt: skip
        previous = ends[0]
        for layer in range(1, len(model.ks_)):
            path = "scan" if layer in scanned else "walk"
            print(f"  layer {layer} (k {model.ks_[layer]}, {path}): "
                  f"{ends[layer] - previous:.2f} s")  # fmt: skip
            previous = ends[layer]


if __name__ == "__main__":
    main()
