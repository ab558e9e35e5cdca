"""MBN against the method users compare it with, on the same machine in the same run.

    MBN_MNIST=path/to/mnist70k.npz python benchmarks/bench_peers.py --repeats 3 [--json out.json]
    python benchmarks/bench_peers.py --device cuda ...      # MBN on the GPU (and cuML's UMAP
                                                            # when it is installed)
    python benchmarks/bench_peers.py --data digits --rows 600 --repeats 1   # small, as CI runs it

Each repeat fits, one after another (the order reversed every other repeat, so that neither
side always runs first on a machine whose speed drifts):

- ``umap``: umap-learn with its defaults and ``n_components=10`` (cuML's UMAP on
  ``--device cuda`` where it imports);
- ``mbn``: MBN with the defaults ``mbn train`` gives it (``k_max`` 2,000; V = 400,
  ``random_state`` the repeat);
- ``mbn-k8000``: MBN at the paper's k1 = 8,000 (``k_max`` 8,000; on small data half the rows).

Each fit is warmed up once first, untimed, on enough rows to take the paths the timed fits
take: otherwise numba's compilation of UMAP's nearest-neighbour descent, which umap-learn
uses from 4,096 rows, lands in the first timed fit. For each fit: seconds, and NMI of
k-means (as many clusters as classes, best of ``--n-init``) on the embedding of the fitted
rows; for MBN also its time by phase (``mbn_core.mbn.phases``: auto, draws, bottom, upper,
output). The table gives each figure's median over the repeats,
and each MBN fit's time as the median of its per-repeat ratios to that repeat's UMAP fit:
on a shared machine both sides of a ratio see the same spell.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from bench_data import load_mnist
from harness import kmeans_nmi
from sklearn.datasets import load_digits

from mbn_core import MBN
from mbn_core.mbn.method import METHOD as MBN_METHOD
from mbn_core.mbn.phases import PHASES, timed_phases

BEST_K1 = 8000
# Rows of UMAP's warm-up: past umap-learn's 4,096-row switch to nearest-neighbour descent.
UMAP_WARM_ROWS = 5000


def umap_fit(device: str) -> tuple[str, Callable[[np.ndarray, int], np.ndarray]]:
    """(what it is, fit(X, seed) -> embedding) for UMAP with its defaults, 10 components."""
    if device == "cuda":
        try:
            from cuml.manifold import UMAP as CumlUMAP  # type: ignore[import-not-found]

            return "cuML UMAP", lambda X, seed: np.asarray(
                CumlUMAP(n_components=10).fit_transform(X.astype(np.float32))
            )
        except ImportError:
            print("cuML is not installed: UMAP runs as umap-learn on the CPU", file=sys.stderr)
    import umap

    # No random_state: umap-learn's defaults, which run its layout on every core.
    return "umap-learn", lambda X, seed: umap.UMAP(n_components=10).fit_transform(X)


def mbn_params(n_rows: int, best: bool) -> dict:
    """MBN's parameters: ``mbn train``'s defaults, or k1 = 8,000 (half the rows at most)."""
    params = dict(MBN_METHOD.defaults)
    if best:
        params["k_max"] = min(BEST_K1, max(2, n_rows // 2))
    return params


def run(args) -> dict:
    X, y = load_data(args.data, args.rows)
    name, fit_umap = umap_fit(args.device)
    fits: dict[str, Callable[[np.ndarray, int], tuple[np.ndarray, dict]]] = {
        "umap": lambda X, seed: (fit_umap(X, seed), {}),
        "mbn": lambda X, seed: mbn_fit(X, seed, mbn_params(len(X), False), args.device),
    }
    if not args.no_best:
        fits["mbn-k8000"] = lambda X, seed: mbn_fit(X, seed, mbn_params(len(X), True), args.device)
    # Warm-up, untimed: numba compiles UMAP's and MBN's loops once per process. UMAP takes
    # its nearest-neighbour descent (pynndescent, compiled at its first call) only from
    # 4,096 rows, below which it computes exact neighbours, so it warms up on more rows.
    for key, fit in fits.items():
        fit(X[: min(len(X), UMAP_WARM_ROWS if key == "umap" else 300)], 0)
    results: dict[str, list[dict]] = {key: [] for key in fits}
    for repeat in range(args.repeats):
        order = list(fits) if repeat % 2 == 0 else list(fits)[::-1]
        for key in order:
            start = time.perf_counter()
            embedding, phases = fits[key](X, repeat)
            seconds = time.perf_counter() - start
            nmi = kmeans_nmi(embedding, y, repeat, n_init=args.n_init)
            results[key].append({"seconds": seconds, "nmi": nmi, "phases": phases})
            print(f"repeat {repeat} {key}: {seconds:.1f} s, NMI {nmi:.4f}", file=sys.stderr,
                  flush=True)  # fmt: skip
    return {
        "data": f"{args.data}, {len(X)} rows x {X.shape[1]}",
        "device": args.device,
        "umap": name,
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "params": {key: mbn_params(len(X), key == "mbn-k8000") for key in fits if key != "umap"},
        "runs": results,
        "summary": summarise(results),
    }


def mbn_fit(X: np.ndarray, seed: int, params: dict, device: str) -> tuple[np.ndarray, dict]:
    with timed_phases() as times:
        embedding = MBN(**params, random_state=seed, device=device).fit_transform(X)
    return embedding, dict(times.seconds)


def summarise(results: dict[str, list[dict]]) -> dict:
    umap_seconds = [run["seconds"] for run in results["umap"]]
    summary = {}
    for key, runs in results.items():
        seconds = [run["seconds"] for run in runs]
        row = {
            "seconds": statistics.median(seconds),
            "nmi": statistics.median(run["nmi"] for run in runs),
            "ratio_to_umap": statistics.median(
                s / u for s, u in zip(seconds, umap_seconds, strict=True)
            ),
        }
        if key != "umap":
            row["phases"] = {
                phase: statistics.median(run["phases"][phase] for run in runs) for phase in PHASES
            }
        summary[key] = row
    return summary


def load_data(name: str, rows: int | None) -> tuple[np.ndarray, np.ndarray]:
    if name == "digits":
        X, y = load_digits(return_X_y=True)
    else:
        X, y = load_mnist()
    return (X, y) if rows is None else (X[:rows], y[:rows])


def table(figures: dict) -> str:
    lines = [
        f"{figures['data']}, device {figures['device']} (UMAP: {figures['umap']}), "
        f"{len(figures['runs']['umap'])} repeats, medians",
        "",
        "| fit | time | time / UMAP's (same run) | NMI | bottom / upper / output / auto / "
        "draws (s) |",
        "|---|---|---|---|---|",
    ]
    for key, row in figures["summary"].items():
        phases = row.get("phases")
        split = (
            " / ".join(f"{phases[p]:.1f}" for p in ("bottom", "upper", "output", "auto", "draws"))
            if phases
            else ""
        )
        lines.append(
            f"| {key} | {row['seconds']:.1f} s | {row['ratio_to_umap']:.2f}x | "
            f"{row['nmi']:.4f} | {split} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=("mnist", "digits"), default="mnist")
    parser.add_argument("--rows", type=int, default=None, help="the first N rows (default all)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--n-init", type=int, default=20, help="k-means restarts")
    parser.add_argument("--no-best", action="store_true", help="skip MBN at k1 = 8,000")
    parser.add_argument("--json", help="write every run's figures here")
    args = parser.parse_args()
    figures = run(args)
    print(table(figures))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=1)


if __name__ == "__main__":
    main()
