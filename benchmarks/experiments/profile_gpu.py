"""Where a GPU fit's time goes: cProfile of ``MBN(device="cuda")`` on all 70,000 MNIST digits.

    MBN_MNIST=path/to/mnist70k.npz python benchmarks/experiments/profile_gpu.py [V]

Fits V clusterings per layer (default 50) at k1 = 8,000 after a small warm-up fit, and prints
the 35 functions of most own time and the 45 of most cumulative time. On a fresh machine the
first fit also pays NVRTC compiling CuPy's reduction kernels and ours (cached on disk after):
run it twice to see the steady state. Figures: docs/BENCHMARKS.md, "MBN on one GPU".
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_data import load_mnist

from mbn_core import MBN


def main() -> None:
    X, _ = load_mnist()
    n_clusterings = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    MBN(n_clusterings=2, k1=1000, random_state=0, n_jobs=-1, device="cuda").fit(X[:5000])
    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.enable()
    MBN(n_clusterings=n_clusterings, k1=8000, random_state=0, n_jobs=-1, device="cuda").fit(X)
    profile.disable()
    print(f"fit V={n_clusterings}: {time.perf_counter() - started:.2f} s")
    for order, count in (("tottime", 35), ("cumulative", 45)):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(order).print_stats(count)
        print(out.getvalue())


if __name__ == "__main__":
    main()
