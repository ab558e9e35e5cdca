"""MBN on a Dask cluster: fit time against a local fit, bytes per layer, per-task
overhead, a cost model for larger clusters, and bulk embedding of a file larger than memory.

    python benchmarks/bench_distributed.py fit [--n 20000] [--k-max 2000] [--repeats 2]
    python benchmarks/bench_distributed.py overhead [--tasks 2000]
    python benchmarks/bench_distributed.py faults [--n 20000] [--k-max 500]
    python benchmarks/bench_distributed.py model --measured fit.json
    python benchmarks/bench_distributed.py embed --rows 10000000 [--dir /tmp/mbn-bulk]

``fit`` compares ``MBN.fit`` with ``n_jobs=2`` (threads) to the same fit inside ``use_dask`` on a
LocalCluster of 2 single-threaded worker processes, alternating the two, and prints the time per
layer and the bytes each layer moved; ``--json`` saves the measurements ``model`` extrapolates
from. ``embed`` writes an n x 784 uint8 .npy chunk by chunk (MNIST rows with noise), trains a
small bundle, runs ``mbn embed`` on it in a child process and reports its peak RSS and rows/s,
then deletes the files. ``faults`` fits locally in child processes with and without Dask's
``MALLOC_TRIM_THRESHOLD_`` and reports their minor page faults and CPU seconds. MNIST comes
from ``bench_data.load_mnist()`` (``MBN_MNIST``).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from bench_data import load_mnist

from mbn_core import MBN
from mbn_core.mbn.upper import Postings


def layer_timer():
    """A callback recording when each layer's last clustering finished."""
    marks: dict[int, float] = {}

    def callback(layer: int, done: int, total: int) -> None:
        if done == total:
            marks[layer] = time.perf_counter()

    return marks, callback


def timed_fit(X, params, client=None):
    from mbn_core.mbn.backends import use_backend
    from mbn_core.mbn.backends.dask import DaskBackend

    marks, callback = layer_timer()
    model = MBN(**params, callback=callback)
    built: list[DaskBackend] = []

    def on_cluster(**options) -> DaskBackend:  # use_dask's backend, kept for its transfers
        built.append(DaskBackend(client, **options))
        return built[-1]

    started = time.perf_counter()
    if client is None:
        model.fit(X)
        transfers = []
    else:
        with use_backend(on_cluster, purposes=DaskBackend.purposes):
            model.fit(X)
        transfers = built[-1].transfers
    total = time.perf_counter() - started
    edges = [started] + [marks[i] for i in range(len(model.ks_))]
    layers = [b - a for a, b in itertools.pairwise(edges)]
    return model, total, layers, transfers


def bottom_codes(X, params) -> np.ndarray:
    """The bottom layer's codes of the training data, from a fit that stops right after it."""
    from mbn_core.mbn.backends import use_backend
    from mbn_core.mbn.backends.local import LocalBackend

    class Recording(LocalBackend):
        def bottom_codes(self, layer, X):
            self.codes = super().bottom_codes(layer, X)
            raise StopIteration  # the codes are all this needs

    backends: list[Recording] = []

    def factory(*, n_jobs=None, callback=None):
        backends.append(Recording(n_jobs=n_jobs, callback=callback))
        return backends[-1]

    with use_backend(factory), contextlib.suppress(StopIteration):
        MBN(**params, n_jobs=2).fit(X)
    return backends[0].codes


def cmd_fit(args) -> None:
    from distributed import Client, LocalCluster

    X = load_mnist()[0][: args.n]
    params = {"n_clusterings": 400, "k_max": args.k_max, "random_state": 0}
    ks = MBN(**params).layer_sizes(len(X))
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        # Warm-up: imports and numba's cached kernels in the driver and in both workers.
        warm = {"n_clusterings": 8, "k_max": 200, "random_state": 0}
        timed_fit(X[:2000], {**warm, "n_jobs": 2})
        timed_fit(X[:2000], warm, client)
        runs: dict[str, list] = {"local": [], "dask": []}
        for _ in range(args.repeats):
            for name in ("local", "dask"):
                _, total, layers, transfers = timed_fit(
                    X, {**params, "n_jobs": 2} if name == "local" else params,
                    client if name == "dask" else None,
                )  # fmt: skip
                runs[name].append((total, layers, transfers))
                print(f"{name}: {total:.1f} s", flush=True)
    codes = bottom_codes(X[: args.n], params)
    # The per-layer shared cost on a worker: the posting lists of layer 1 (single thread).
    started = time.perf_counter()
    postings = Postings.build(codes, codes, ks[0], centers_are_points=True)
    postings_s = time.perf_counter() - started
    postings_bytes = sum(
        a.nbytes for a in (postings.rows, postings.start, postings.length, postings.segments,
                           postings.neighbors) if a is not None
    )  # fmt: skip

    local_total = float(np.median([r[0] for r in runs["local"]]))
    dask_total = float(np.median([r[0] for r in runs["dask"]]))
    ratios = [d[0] / loc[0] for loc, d in zip(runs["local"], runs["dask"], strict=True)]
    print(f"\nMNIST {len(X)} x 784, V=400, layers {'-'.join(map(str, ks))}, "
          f"{args.repeats} runs each, alternating")  # fmt: skip
    print(f"local n_jobs=2: median {local_total:.1f} s; LocalCluster 2x1: median "
          f"{dask_total:.1f} s; ratio of medians {dask_total / local_total:.3f}; "
          f"same-run ratios {', '.join(f'{r:.3f}' for r in ratios)}")  # fmt: skip
    print(
        "\n| layer | k | local s | dask s | input scattered (1 copy) | copies | codes back "
        "| total moved | tasks |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    local_layers = np.median([r[1] for r in runs["local"]], axis=0)
    dask_layers = np.median([r[1] for r in runs["dask"]], axis=0)
    transfers = runs["dask"][-1][2]
    for i, t in enumerate(transfers):
        print(f"| {i} | {ks[i]} | {local_layers[i]:.1f} | {dask_layers[i]:.1f} | "
              f"{mb(t.scattered_bytes)} | {t.n_workers} | {mb(t.gathered_bytes)} | "
              f"{mb(t.total_bytes)} | {t.n_tasks} |")  # fmt: skip
    print(f"\nposting lists of layer 1, one thread: {postings_s:.2f} s, {mb(postings_bytes)}")
    if args.json:
        measured = {
            "n": len(X), "d": X.shape[1], "V": 400, "ks": ks,
            "local_total_s": local_total, "dask_total_s": dask_total,
            "local_layers_s": local_layers.tolist(), "dask_layers_s": dask_layers.tolist(),
            "scattered_bytes": [t.scattered_bytes for t in transfers],
            "gathered_bytes": [t.gathered_bytes for t in transfers],
            "postings_s": postings_s, "postings_bytes": postings_bytes,
        }  # fmt: skip
        Path(args.json).write_text(json.dumps(measured, indent=1))


def mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB" if n < 1e9 else f"{n / 1e9:,.2f} GB"


def noop(i: int) -> int:
    return i


def cmd_overhead(args) -> None:
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        client.gather(client.map(noop, range(100), pure=False))  # warm-up
        times = []
        for _ in range(3):
            started = time.perf_counter()
            client.gather(client.map(noop, range(args.tasks), pure=False))
            times.append(time.perf_counter() - started)
        per_task = float(np.median(times)) / args.tasks
        # A whole MBN layer's fixed cost: scatter, tasks, gather, cache drop, on tiny data.
        from mbn_core.mbn.backends.dask import use_dask

        X = load_mnist()[0][:500]
        layer_times = []
        with use_dask(client, clusterings_per_task=1):
            for _ in range(3):
                model = MBN(n_clusterings=8, ks=[4] * 10, random_state=0)
                started = time.perf_counter()
                model.fit(X)
                layer_times.append((time.perf_counter() - started) / 10)
    print(f"no-op tasks: {args.tasks} in a batch, median of 3 batches: "
          f"{per_task * 1e3:.2f} ms per task on 2 single-threaded workers")  # fmt: skip
    print(f"a tiny MBN layer (8 tasks of 1 clustering on 500 rows): "
          f"{np.median(layer_times) * 1e3:.0f} ms per layer")  # fmt: skip


# A child process's fit, reporting what getrusage counted during it (after a warm-up fit).
_FAULTS_CHILD = """
import json, resource, sys, time
from bench_data import load_mnist
from mbn_core import MBN
X = load_mnist()[0][:{n}]
MBN(n_clusterings=8, k_max=200, random_state=0, n_jobs=2).fit(X[:2000])
before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
MBN(n_clusterings=400, k_max={k_max}, random_state=0, n_jobs=2).fit(X)
after = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({{"wall": time.perf_counter() - started,
                  "faults": after.ru_minflt - before.ru_minflt,
                  "system": after.ru_stime - before.ru_stime,
                  "user": after.ru_utime - before.ru_utime}}))
"""


def cmd_faults(args) -> None:
    """Page faults of a local fit with and without the malloc setting Dask's nanny uses."""
    import distributed  # noqa: F401  (registers the distributed.* settings)
    from dask import config

    trim = config.get("distributed.nanny.pre-spawn-environ").get("MALLOC_TRIM_THRESHOLD_")
    script = _FAULTS_CHILD.format(n=args.n, k_max=args.k_max)
    here = str(Path(__file__).resolve().parent)
    print("| MALLOC_TRIM_THRESHOLD_ | minor page faults | system CPU s | user CPU s | wall s |")
    print("|---|---|---|---|---|")
    for _ in range(args.repeats):
        for value in (None, trim):
            env = {k: v for k, v in os.environ.items() if k != "MALLOC_TRIM_THRESHOLD_"}
            if value is not None:
                env["MALLOC_TRIM_THRESHOLD_"] = str(value)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
            out = subprocess.run([sys.executable, "-c", script], env=env, check=True,
                                 capture_output=True, text=True).stdout  # fmt: skip
            r = json.loads(out.splitlines()[-1])
            print(f"| {value or 'unset'} | {r['faults']:,} | {r['system']:.1f} | "
                  f"{r['user']:.1f} | {r['wall']:.1f} |", flush=True)  # fmt: skip


def cmd_model(args) -> None:
    """Extrapolate the measured per-clustering times and transfer sizes to larger fits.

    Per layer, with n rows and W single-threaded workers (k capped by k_max, so the layer sizes
    and the work per row stay as measured; everything below scales linearly with n):
    - compute: ceil(V / W) clusterings one after the other on each worker, each taking the
      measured per-clustering time x n / n0; plus, for upper layers, the posting lists every
      worker builds once (measured, one thread);
    - network: the layer's input (measured scattered bytes x n / n0) reaches every worker by
      Dask's replication (log2 W + 1 rounds of copies at the NIC's bandwidth); the codes
      (measured gathered bytes x n / n0) come back through the driver's NIC;
    - scheduler: the layer's tasks (min(V, 16 W)) at the measured per-task overhead, serially,
      plus the measured fixed cost of a layer.
    The top PCA on the driver is not modelled (seconds at these sizes: n x 10 components).
    """
    m = json.loads(Path(args.measured).read_text())
    n0, d, V, ks = m["n"], m["d"], m["V"], m["ks"]
    # 2 threads in the local fit; --compute-scale converts to another machine's (quieter) cores.
    per_clustering = [s * 2 / V * args.compute_scale for s in m["local_layers_s"]]
    postings_s = m["postings_s"] * args.compute_scale
    print(f"Measured at n={n0:,}, layers {'-'.join(map(str, ks))}: one clustering takes "
          f"{per_clustering[0]:.3f} s (bottom), {sum(per_clustering[1:]):.3f} s (all upper "
          f"layers together); posting lists {postings_s:.2f} s and "
          f"{mb(m['postings_bytes'])} per upper layer and worker; per task "
          f"{args.task_overhead * 1e3:.0f} ms, per layer "
          f"{args.layer_overhead * 1e3:.0f} ms")  # fmt: skip
    print("\n| rows | workers | wall time | compute / network / scheduler | memory per worker | "
          "network per layer (each worker in; driver in + out) | driver memory |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for n in (1_000_000, 10_000_000):
        scale = n / n0
        scattered = [b * scale for b in m["scattered_bytes"]]
        gathered = [b * scale for b in m["gathered_bytes"]]
        for workers in (8, 32, 128):
            compute = network = scheduler = 0.0
            for i, t in enumerate(per_clustering):
                compute += math.ceil(V / workers) * t * scale
                compute += postings_s * scale if i else 0.0
                rounds = math.log2(workers) + 1
                network += (scattered[i] * rounds + gathered[i]) / args.bandwidth
                scheduler += min(V, 16 * workers) * args.task_overhead + args.layer_overhead
            wall = compute + network + scheduler
            bottom_mem = scattered[0] + n * (d + 1) * 4  # input + its float32 working copy
            upper_mem = max(scattered[1:]) + m["postings_bytes"] * scale
            driver_mem = n * d + 2 * max(gathered)
            worker_mem = max(bottom_mem, upper_mem)
            print(f"| {n:,} | {workers} | {wall / 60:,.1f} min | {compute / 60:,.1f} / "
                  f"{network / 60:,.1f} / {scheduler / 60:,.1f} min | {mb(worker_mem)} "
                  f"| {mb(scattered[0])} (bottom), {mb(max(scattered[1:]))} (upper); "
                  f"{mb(max(gathered) + max(scattered[1:]))} | {mb(driver_mem)} |")  # fmt: skip


def cmd_embed(args) -> None:
    from mbn_core.pipeline.training import train_bundle

    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    data = work / "rows.npy"
    X, y = load_mnist()
    try:
        started = time.perf_counter()
        out = np.lib.format.open_memmap(data, mode="w+", dtype=np.uint8, shape=(args.rows, 784))
        rng = np.random.default_rng(0)
        step = 100_000
        for start in range(0, args.rows, step):
            stop = min(start + step, args.rows)
            rows = X[rng.integers(0, len(X), stop - start)].astype(np.int16)
            rows += rng.integers(-8, 9, rows.shape, dtype=np.int16)
            out[start:stop] = np.clip(rows, 0, 255).astype(np.uint8)
            out.flush()
        del out
        print(f"wrote {data} ({mb(data.stat().st_size)}) in {time.perf_counter() - started:.0f} s")
        bundle = work / "model"
        if not bundle.exists():
            train_bundle(X[:5000], bundle, name="mnist5k", y=y[:5000],
                         params={"n_clusterings": 100, "k_max": 500, "max_epochs": 10})  # fmt: skip
        command = [
            sys.executable, "-m", "mbn_core.cli", "embed", str(bundle), str(data),
            "--out", str(work / "embedding.npy"), "--threads", str(args.threads),
            "--chunk-rows", str(args.chunk_rows),
        ]  # fmt: skip
        print("$ /usr/bin/time -v", " ".join(command[1:]), flush=True)
        result = subprocess.run(
            ["/usr/bin/time", "-v", *command], capture_output=True, text=True, check=True
        )
        print(result.stdout.strip())
        for line in result.stderr.splitlines():
            if "Maximum resident" in line or "Elapsed (wall" in line:
                print(line.strip())
        embedding = np.load(work / "embedding.npy", mmap_mode="r")
        print(f"embedding {embedding.shape} {embedding.dtype}, finite: "
              f"{bool(np.isfinite(embedding[:: max(1, args.rows // 1000)]).all())}")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fit = commands.add_parser("fit")
    fit.add_argument("--n", type=int, default=20_000)
    fit.add_argument("--k-max", type=int, default=2000)
    fit.add_argument("--repeats", type=int, default=2)
    fit.add_argument("--json", help="save the measurements for `model`")
    overhead = commands.add_parser("overhead")
    overhead.add_argument("--tasks", type=int, default=2000)
    faults = commands.add_parser("faults")
    faults.add_argument("--n", type=int, default=20_000)
    faults.add_argument("--k-max", type=int, default=500)
    faults.add_argument("--repeats", type=int, default=1)
    model = commands.add_parser("model")
    model.add_argument("--measured", required=True)
    model.add_argument("--bandwidth", type=float, default=1.25e9, help="bytes/s per NIC")
    model.add_argument("--layer-overhead", type=float, default=0.3, help="s per layer")
    model.add_argument("--task-overhead", type=float, default=0.01, help="s per task")
    model.add_argument(
        "--compute-scale", type=float, default=1.0, help="multiply the measured compute times"
    )
    embed = commands.add_parser("embed")
    embed.add_argument("--rows", type=int, default=10_000_000)
    embed.add_argument("--dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "mbn-bulk"))
    embed.add_argument("--threads", type=int, default=2)
    embed.add_argument("--chunk-rows", type=int, default=32_768)
    args = parser.parse_args()
    commands_run = {"fit": cmd_fit, "overhead": cmd_overhead, "faults": cmd_faults}
    commands_run |= {"model": cmd_model, "embed": cmd_embed}
    commands_run[args.command](args)


if __name__ == "__main__":
    main()
