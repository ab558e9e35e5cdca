"""MBN on one GPU: fit time, NMI, layer shares, bit-identity with the CPU, transform speed.

One command, sized for a few minutes of GPU time:

    MBN_MNIST=/path/to/mnist70k.npz python benchmarks/bench_gpu.py

prints, for all 70,000 MNIST digits as raw uint8 pixels at V = 400, k1 = 8,000:

1. the GPU fit's time and its NMI (k-means on the embedding against the labels);
2. the bottom and upper layers' shares of that time (and the rest: "auto" measurements,
   the PCA output), and the fit's seconds by phase (``mbn_core.mbn.phases``: auto, draws,
   bottom, upper, output: the host steps beside the card's);
3. bit-identity against the CPU: a sample of training rows encoded at every layer on the GPU
   and on the CPU, the fit's embedding of them against the CPU's ``transform``, and a whole
   small model (``--subset-rows``) fitted on both devices;
4. exact ``transform`` throughput on the GPU (``--transform-rows`` rows);
5. the CPU baseline, in the same run on this machine's cores: the same model's bottom layer
   for ``--cpu-clusterings`` of its clusterings, extrapolated to all of them (the whole CPU
   fit takes far longer than the GPU time allows).

``--device cpu`` runs the GPU backend's own code with numpy on the CPU (the CI check, on
small data: ``--data digits --rows 600 --clusterings 8 --k1 80``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from sklearn.cluster import KMeans
from sklearn.datasets import load_digits
from sklearn.metrics import normalized_mutual_info_score
from threadpoolctl import threadpool_limits

from mbn_core import MBN
from mbn_core.mbn import persistence
from mbn_core.mbn.backends import cuda, use_backend
from mbn_core.mbn.backends.cuda import bottom as cuda_bottom
from mbn_core.mbn.backends.cuda import tf32
from mbn_core.mbn.backends.local import LocalBackend
from mbn_core.mbn.bottom import bottom_input, input_row_norms
from mbn_core.mbn.dtypes import smallest_uint
from mbn_core.mbn.phases import timed_phases


class LayerClock:
    """An MBN callback noting when each layer's last clustering finished."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.done: dict[int, float] = {}

    def __call__(self, layer: int, done: int, total: int) -> bool:
        if done == total:
            self.done[layer] = time.perf_counter()
        return False


def load(name: str, rows: int) -> tuple[np.ndarray, np.ndarray]:
    if name == "digits":
        X, y = load_digits(return_X_y=True)
        X = np.rint(X * 15).astype(np.uint8)  # 0..240, whole numbers like pixels
    else:
        from bench_data import load_mnist

        X, y = load_mnist()
    return X[:rows], y[:rows]


def device_fit(
    X, params: dict, device: str
) -> tuple[MBN, np.ndarray, LayerClock, float, dict[str, float]]:
    """The fitted model, its embedding, its layers' clock, the fit's seconds and its seconds
    by phase (``mbn_core.mbn.phases``: auto, draws, bottom, upper, output)."""
    clock = LayerClock()
    if device == "cuda":
        model = MBN(**params, device="cuda", callback=clock)
        with timed_phases() as times:
            start = time.perf_counter()
            embedding = model.fit_transform(X)
            seconds = time.perf_counter() - start
        # The checks below encode on the CPU unless they name the device.
        model.set_params(device="cpu", callback=None)
        return model, embedding, clock, seconds, dict(times.seconds)
    with use_backend(cuda.numpy_backend), timed_phases() as times:
        model = MBN(**params, callback=clock)
        start = time.perf_counter()
        embedding = model.fit_transform(X)
        seconds = time.perf_counter() - start
    model.set_params(callback=None)
    return model, embedding, clock, seconds, dict(times.seconds)


def layer_codes(model: MBN, X, device: str) -> list[np.ndarray]:
    """Every layer's codes of X, layer after layer: on the device ("cuda", or "cpu" for the
    device code run with numpy) or with the CPU's own kernels ("host")."""
    X = np.asarray(X, dtype=np.float64)
    if device == "host":
        backend: LocalBackend | cuda.CudaBackend = LocalBackend()
    else:
        backend = cuda.CudaBackend(xp=None if device == "cuda" else np)
    with threadpool_limits(limits=1, user_api="blas"), backend:
        codes = [backend.bottom_codes(model.bottom_layer_, X)]
        for index, layer in enumerate(model.upper_layers_, start=1):
            codes.append(backend.upper_codes(index, codes[-1], layer))
    return codes


def device_transform(model: MBN, X, device: str) -> np.ndarray:
    if device == "cuda":
        model.set_params(device="cuda")
        try:
            return model.transform(X)
        finally:
            model.set_params(device="cpu")
    with use_backend(cuda.numpy_backend):
        return model.transform(X)


def cpu_bottom_seconds(model: MBN, X, n_clusterings: int, threads: int) -> float:
    """Seconds for ``n_clusterings`` of the model's bottom clusterings on the CPU's threads
    (the CPU's fastest path for this data: integer scores for pixels)."""
    layer = model.bottom_layer_
    X_work = bottom_input(np.asarray(X, dtype=np.float32), layer)
    norms = input_row_norms(X)
    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(threads) as pool:
        start = time.perf_counter()
        list(pool.map(lambda v: layer.clustering_codes(X_work, v, norms), range(n_clusterings)))
        return time.perf_counter() - start


class TF32Record(tf32.TF32Gemms):
    """The backend's TF32 switch, noting whether the last bottom layer's GEMMs ran in TF32
    (installed by ``main`` in place of the backend's own)."""

    last_used = False

    def __enter__(self) -> tf32.TF32Gemms:
        entered = super().__enter__()
        TF32Record.last_used = self.used
        return entered


def kmeans_nmi(Z: np.ndarray, y: np.ndarray, n_init: int) -> float:
    labels = KMeans(len(np.unique(y)), n_init=n_init, random_state=0).fit_predict(Z)
    return float(normalized_mutual_info_score(y, labels))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--data", choices=["mnist", "digits"], default="mnist")
    parser.add_argument("--rows", type=int, default=70_000)
    parser.add_argument("--clusterings", type=int, default=400)
    parser.add_argument("--k1", type=int, default=8000)
    parser.add_argument("--sample", type=int, default=1000, help="rows checked against the CPU")
    parser.add_argument("--transform-rows", type=int, default=10_000)
    parser.add_argument("--cpu-clusterings", type=int, default=16)
    parser.add_argument("--subset-rows", type=int, default=4000)
    parser.add_argument("--n-init", type=int, default=20, help="k-means restarts for the NMI")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    cuda_bottom.TF32Gemms = TF32Record  # type: ignore[misc]
    threads = len(os.sched_getaffinity(0))
    figures: dict[str, object] = {"device": args.device, "cpu_threads": threads}
    if args.device == "cuda":
        figures["gpu"] = cuda.device_name()
    X, y = load(args.data, args.rows)
    params = {"n_clusterings": args.clusterings, "k1": args.k1, "random_state": 0, "n_jobs": -1}
    print(f"data {args.data}: {X.shape[0]} x {X.shape[1]} {X.dtype}; {figures}", flush=True)

    # Compile the kernels (numba's, CuPy's) and load the GEMMs' kernels for these shapes
    # before anything is timed: a fit of a few clusterings on the same data and k1.
    warm = time.perf_counter()
    small = {"n_clusterings": 4, "k1": args.k1, "delta": 0.5, "random_state": 0, "n_jobs": -1}
    warm_model = device_fit(X, small, args.device)[0]
    device_transform(warm_model, X[: args.transform_rows], args.device)
    figures["warm_up_s"] = round(time.perf_counter() - warm, 2)

    model, embedding, clock, fit_s, phases = device_fit(X, params, args.device)
    last = max(clock.done)
    bottom_s = clock.done[0] - clock.start
    upper_s = clock.done[last] - clock.done[0]
    figures.update(
        fit_s=round(fit_s, 2),
        ks=model.ks_,
        bottom_s=round(bottom_s, 2),
        upper_s=round(upper_s, 2),
        rest_s=round(fit_s - bottom_s - upper_s, 2),
    )
    figures["phases_s"] = {name: round(value, 2) for name, value in phases.items()}
    print(f"fit {fit_s:.2f} s: bottom {bottom_s:.2f} s, upper {upper_s:.2f} s, ks {model.ks_}",
          flush=True)  # fmt: skip
    print("  by phase: " + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()), flush=True)
    if args.device == "cuda":
        budget = cuda.device_budget(cuda.require_cupy())
        figures.update(
            tf32=TF32Record.last_used,
            kernels=cuda.kernels_in_use(),
            max_rows_at_this_V=cuda.upper_rows_capacity(args.clusterings, budget),
        )
        print({key: figures[key] for key in ("tf32", "kernels", "max_rows_at_this_V")})
    figures["nmi"] = round(kmeans_nmi(embedding, y, args.n_init), 4)
    print(f"NMI {figures['nmi']}", flush=True)

    # Bit-identity: a sample of training rows, every layer, device against CPU.
    sample = np.random.default_rng(1).choice(len(X), min(args.sample, len(X)), replace=False)
    start = time.perf_counter()
    on_device = layer_codes(model, X[sample], args.device)
    on_cpu = layer_codes(model, X[sample], "host")
    layers_equal = [bool(np.array_equal(a, b)) for a, b in zip(on_device, on_cpu, strict=True)]
    embedding_equal = bool(np.array_equal(embedding[sample], model.transform(X[sample])))
    figures.update(codes_identical=layers_equal, embedding_identical=embedding_equal)
    print(f"sample of {len(sample)} rows: codes identical per layer {layers_equal}, "
          f"embedding identical {embedding_equal} ({time.perf_counter() - start:.1f} s)",
          flush=True)  # fmt: skip

    # A whole small model on both devices.
    rows = min(args.subset_rows, len(X))
    sub = {"n_clusterings": 50, "k1": max(2, rows // 4), "random_state": 0, "n_jobs": -1}
    sub_model, sub_embedding, _, _, _ = device_fit(X[:rows], sub, args.device)
    cpu_model = MBN(**sub).fit(X[:rows])
    same = bool(np.array_equal(sub_embedding, cpu_model.transform(X[:rows])))
    mine, theirs = persistence.model_to_arrays(sub_model), persistence.model_to_arrays(cpu_model)
    same &= mine.keys() == theirs.keys()
    same &= all(np.array_equal(mine[name], theirs[name]) for name in theirs)
    figures["subset_model_identical"] = same
    print(f"{rows}-row model (V=50, k1={sub['k1']}) fitted on both: identical {same}", flush=True)

    # Exact transform throughput.
    new = X[-min(args.transform_rows, len(X)) :]
    times = []
    for _ in range(3):
        start = time.perf_counter()
        out = device_transform(model, new, args.device)
        times.append(time.perf_counter() - start)
    figures["transform_rows"] = len(new)
    figures["transform_s"] = round(statistics.median(times), 3)
    figures["transform_identical_first_100"] = bool(
        np.array_equal(out[:100], model.transform(new[:100]))
    )
    print(f"transform of {len(new)} rows: {figures['transform_s']} s (median of 3)", flush=True)

    # The CPU baseline on this machine's cores.
    n_cpu = min(args.cpu_clusterings, args.clusterings)
    cpu_s = cpu_bottom_seconds(model, X, n_cpu, threads)
    figures["cpu_bottom_s_extrapolated"] = round(cpu_s * args.clusterings / n_cpu, 1)
    print(f"CPU bottom layer on {threads} threads: {cpu_s:.1f} s for {n_cpu} clusterings, "
          f"{figures['cpu_bottom_s_extrapolated']} s for all {args.clusterings} "
          f"(the GPU's: {bottom_s:.2f} s)", flush=True)  # fmt: skip
    code_bytes = np.dtype(smallest_uint(args.k1 - 1)).itemsize
    figures["codes_bytes_per_row"] = code_bytes * args.clusterings
    print(json.dumps(figures))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(figures, handle, indent=1)


if __name__ == "__main__":
    main()
