"""Exact MBN on one row and in batches. Prints a markdown table.

    python benchmarks/bench_exact.py --fit benchmarks/out/mnist60k_k4000   # once: fit, save
    python benchmarks/bench_exact.py --model benchmarks/out/mnist60k_k4000 [--calls 50]

``--fit PREFIX`` fits the MBN of the exact-mode MNIST-60k model (V = 400, k1 = 4000, the first
60,000 images of ``bench_data.load_mnist()``, seed 0; ``--n-train`` and ``--k1`` change
that) and saves its arrays and parameters as ``PREFIX.npz`` / ``PREFIX.json`` (uncompressed
``np.savez``, as a bundle's ``mbn.npz``).

``--model PREFIX`` loads them (``--model DIR``: a bundle's exact model, read as the
service reads it) and measures, on one thread, with test rows (the last 10,000
images) the model never saw:

- one row through the whole exact MBN (``transform``), p50 and p90 over ``--calls`` rows;
- the same rows through the bottom layer alone (``encode(row, layer=0)``): the arithmetic a
  single row cannot avoid; the ratio of the two p50s is the target (<= 1.5);
- batch throughput: ``transform`` of ``--batch`` rows at once;
- that every single-row embedding equals its row of the batch, bit for bit;
- resident memory of the loaded model against ``PREFIX.npz``: a fresh child process loads
  it after the kernels, twice over (the first run fills numba's on-disk cache with this
  model's dtypes, a one-off cost of the process, not of the model); the second counts.

Run it with ``PYTHONPATH`` pointing at another checkout to measure that code ("before").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from bench_data import load_mnist
from bench_report import print_measures
from threadpoolctl import threadpool_limits

from mbn_core import MBN, model_from_arrays, model_to_arrays
from mbn_core.bundle import load_bundle

_RSS_PROBE = """
import json, sys
import numpy as np
from mbn_core import MBN, model_from_arrays
from mbn_core.mbn.persistence import model_to_arrays
# Load the compiled kernels (and numba's runtime) first: they are the process's, not the model's.
rng = np.random.default_rng(0)
tiny = MBN(n_clusterings=40, ks=[300, 150, 20], n_components=2, random_state=0)
tiny.fit(rng.integers(0, 255, size=(400, 784)).astype(np.uint8))
tiny = model_from_arrays(model_to_arrays(tiny), tiny.get_params())
tiny.transform(np.zeros((1, 784), np.float32))
tiny.transform(np.zeros((40, 784), np.float32))
def rss():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
before = rss()
if sys.argv[3] == "bundle":  # as the service reads it: the file's bytes, hash checked
    from mbn_core.bundle import load_bundle
    model = load_bundle(sys.argv[1]).load_exact().estimator
else:
    with np.load(sys.argv[1] + ".npz", allow_pickle=False) as npz:
        arrays = {key: npz[key] for key in npz.files}
    params = json.load(open(sys.argv[1] + ".json"))
    model = model_from_arrays(arrays, params)
    del arrays
loaded = rss()
model.transform(np.asarray(json.loads(sys.argv[2]), dtype=np.float32)[None, :])
after = rss()
print(json.dumps({"loaded": loaded - before, "after_request": after - before}))
"""


def fit(prefix: Path, args: argparse.Namespace) -> None:
    X, _ = load_mnist(args.data)
    started = time.perf_counter()
    model = MBN(n_clusterings=400, k1=args.k1, n_components=10, random_state=0)
    model.fit(X[: args.n_train])
    print(f"fitted in {time.perf_counter() - started:.0f} s, layers {model.ks_}")
    np.savez(f"{prefix}.npz", **model_to_arrays(model))
    params = {k: v for k, v in model.get_params().items() if k != "callback"}
    Path(f"{prefix}.json").write_text(json.dumps(params))


def npz_path(prefix: Path) -> Path:
    """The model's arrays: a bundle's ``exact.npz``, or ``PREFIX.npz``."""
    return prefix / "exact.npz" if prefix.is_dir() else Path(f"{prefix}.npz")


def load(prefix: Path) -> MBN:
    if prefix.is_dir():
        exact = load_bundle(prefix, threads=1).load_exact()
        return exact.estimator
    with np.load(f"{prefix}.npz", allow_pickle=False) as npz:
        arrays = {key: npz[key] for key in npz.files}
    params = json.loads(Path(f"{prefix}.json").read_text())
    params["n_jobs"] = 1
    return model_from_arrays(arrays, params)


def percentiles(seconds: list[float]) -> tuple[float, float]:
    p50, p90 = np.percentile(np.asarray(seconds) * 1e3, [50, 90])
    return float(p50), float(p90)


def memory(args: argparse.Namespace, row: np.ndarray) -> list[tuple[str, str]]:
    """Resident memory of the loaded model (a fresh child process) against its ``.npz``."""
    for _ in range(2):
        resident = json.loads(
            subprocess.run(
                [
                    sys.executable,
                    "-c",
                    _RSS_PROBE,
                    str(args.model),
                    json.dumps(row.tolist()),
                    "bundle" if args.model.is_dir() else "prefix",
                ],
                check=True,
                capture_output=True,
                text=True,
                env=os.environ,
            ).stdout
        )
    npz_bytes = npz_path(args.model).stat().st_size
    mib = 2**20
    return [
        ("model arrays on disk (.npz)", f"{npz_bytes / mib:.0f} MiB"),
        ("resident memory: loaded / after a request",
         f"{resident['loaded'] / mib:.0f} MiB / {resident['after_request'] / mib:.0f} MiB "
         f"({resident['after_request'] / npz_bytes:.2f}x the .npz)"),
    ]  # fmt: skip


def measure(args: argparse.Namespace) -> list[tuple[str, str]]:
    X, _ = load_mnist(args.data)
    X_test = X[-10_000:].astype(np.float32)
    if args.memory_only:
        return memory(args, X_test[0])
    model = load(args.model)
    rows = [X_test[i : i + 1] for i in range(args.calls)]
    with threadpool_limits(limits=1):
        model.transform(rows[0])  # compile and build what the first request builds
        model.encode(rows[0], layer=0)
        whole, bottom, singles = [], [], []
        # Interleaved, so that both see the same load of a shared machine, in turns (which
        # runs second finds the centers in cache).
        for i, row in enumerate(rows):
            for step in ("whole", "bottom") if i % 2 else ("bottom", "whole"):
                started = time.perf_counter()
                if step == "whole":
                    singles.append(model.transform(row))
                    whole.append(time.perf_counter() - started)
                else:
                    model.encode(row, layer=0)
                    bottom.append(time.perf_counter() - started)
        started = time.perf_counter()
        batch = model.transform(X_test[: args.batch])
        batch_seconds = time.perf_counter() - started
    same = np.array_equal(np.vstack(singles), batch[: args.calls])
    whole_p50, whole_p90 = percentiles(whole)
    bottom_p50, bottom_p90 = percentiles(bottom)
    return [
        ("model", f"{args.model.name}: layers {model.ks_}, V = {model.n_clusterings}"),
        ("one row, whole exact MBN: p50 / p90", f"{whole_p50:.1f} ms / {whole_p90:.1f} ms"),
        ("one row, bottom layer alone: p50 / p90", f"{bottom_p50:.1f} ms / {bottom_p90:.1f} ms"),
        ("whole / bottom (p50, same run)", f"{whole_p50 / bottom_p50:.2f}"),
        (f"batch of {args.batch}",
         f"{batch_seconds:.1f} s, {args.batch / batch_seconds:.0f} rows/s"),
        ("single rows equal their batch rows bit for bit", str(same)),
        *memory(args, X_test[0]),
    ]  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fit", type=Path, help="fit the MNIST-60k model and save it here")
    parser.add_argument(
        "--model", type=Path, help="the saved model: PREFIX of .npz/.json, or a bundle directory"
    )
    parser.add_argument("--n-train", type=int, default=60000, help="rows --fit trains on")
    parser.add_argument("--k1", type=int, default=4000, help="bottom centers of --fit")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument(
        "--memory-only", action="store_true", help="measure only the loaded model's memory"
    )
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--data", help="MNIST .npz (default: bench_data.load_mnist's search)")
    args = parser.parse_args(argv)
    if args.fit:
        fit(args.fit, args)
        return
    if not args.model:
        parser.error("--fit or --model is needed")
    rows = measure(args)
    print_measures("Exact MBN, one thread", "bench_exact.py", rows, argv)


if __name__ == "__main__":
    main()
