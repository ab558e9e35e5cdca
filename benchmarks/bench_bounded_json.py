"""Large JSON bodies against a real ``mbn serve``: the API's memory and its liveness.

For each case, on a fresh server (one uvicorn process, a small digits model, no training
worker so that ``/train`` jobs only queue):

- a prober asks ``GET /health/live`` every 20 ms from a process of its own (a kubelet's view)
  and keeps the longest answer;
- a sampler reads the server's resident memory (``VmRSS``) every 10 ms;
- the case's bodies are sent (several at once where the case says so) and answered.

Reported per case: the bodies' size, the answers, the time to answer, the longest liveness
answer while they were in flight, and the peak resident memory above the server's own before
them, as a multiple of the largest body and of all the bodies in flight. Cases:

- ``embed-unknown``: ``/embed`` with valid rows and an unknown member holding 1.5 million small
  arrays (24 MB); ``train-unknown``: the same on ``/train``;
- ``embed-unknown-x2``: two of them at once;
- ``train-json``: a legitimate 33 MB ``/train`` JSON body (200,000 rows of 64 small integers);
  ``train-json-x3``: three at once;
- ``embed-batch``: a legitimate 8,192-row ``/embed`` batch of 64 numbers a row (4 decimals).

    python benchmarks/bench_bounded_json.py                  # this checkout
    python benchmarks/bench_bounded_json.py --source DIR     # another checkout's code (same venv)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path

import httpx
import numpy as np
from bench_server import start_serve, wait_until_ready

REPO = Path(__file__).resolve().parents[1]
PROBE_SECONDS = 0.02
SAMPLE_SECONDS = 0.01


def write_model(model_dir: Path) -> None:
    from sklearn.datasets import load_digits

    from mbn_core import MBN, CompressiveMBN
    from mbn_core.bundle import save_bundle

    x, y = load_digits(return_X_y=True)
    mbn = MBN(n_clusterings=10, random_state=0, n_jobs=1)
    model = CompressiveMBN(mbn, hidden_layer_sizes=(16,), max_epochs=3, n_clusters=10,
                           random_state=0, n_jobs=1).fit(x.astype(np.float32), y)  # fmt: skip
    model_dir.mkdir(parents=True, exist_ok=True)
    save_bundle(model, model_dir / "m-digits", name="digits")


def bodies(case: str) -> tuple[str, list[bytes]]:
    """The path and the bodies of a case."""
    row = json.dumps([0] * 64).encode()
    junk = b"[" + b",".join([b"[0.25,0.5,0.75]"] * 1_500_000) + b"]"  # 24 MB
    if case.startswith("embed-unknown"):
        body = b'{"inputs": [' + row + b'], "junk": ' + junk + b"}"
        return "/embed", [body] * (2 if case.endswith("x2") else 1)
    if case == "train-unknown":
        return "/train", [b'{"data": [' + row + b"," + row + b'], "junk": ' + junk + b"}"]
    if case.startswith("train-json"):
        rng = np.random.default_rng(0)
        data = rng.integers(0, 17, (200_000, 64))  # 33 MB: MBN_MAX_BODY_BYTES is 32 MiB
        body = json.dumps({"name": "big", "data": data.tolist()}, separators=(",", ":"))
        return "/train", [body.encode()] * (3 if case.endswith("x3") else 1)
    if case == "embed-batch":
        rng = np.random.default_rng(0)
        data = np.round(rng.random((8192, 64)) * 16, 4).tolist()
        return "/embed", [json.dumps({"inputs": data}).encode()]
    raise ValueError(case)


CASES = ("embed-unknown", "train-unknown", "embed-unknown-x2", "train-json", "train-json-x3",
         "embed-batch")  # fmt: skip


def probe(url: str, stop: multiprocessing.Event, out: Connection) -> None:
    """Ask /health/live every PROBE_SECONDS; send back the longest answer (seconds)."""
    longest = 0.0
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            started = time.perf_counter()
            client.get(f"{url}/health/live")
            longest = max(longest, time.perf_counter() - started)
            time.sleep(PROBE_SECONDS)
    out.send(longest)


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def run_case(case: str, source: Path, data_dir: Path) -> dict:
    path, payloads = bodies(case)
    log = data_dir / f"{case}.log"
    proc, url = start_serve(
        source,
        {
            "MBN_DATA_DIR": str(data_dir / case),
            "MBN_MODEL_DIR": str(data_dir / "models"),
            "MBN_DEMO_MODEL": "false",
            "MBN_EMBEDDED_WORKER": "false",
            "MBN_MAX_QUEUED_JOBS": "100",
        },
        log,
    )
    try:
        wait_until_ready(proc, url, log, case)
        # Warm: the model's first batch and the parsers' first use allocate what every later
        # request reuses; the baseline is after them.
        row = [[0.5] * 64] * 1024
        with httpx.Client(timeout=60) as client:
            for _ in range(3):
                client.post(f"{url}/embed", json={"inputs": row})
                client.post(f"{url}/train", json={"data": row[:4], "name": "warm"})
        time.sleep(1.0)  # settle
        baseline = rss(proc.pid)
        peak = [baseline]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                peak[0] = max(peak[0], rss(proc.pid))
                time.sleep(SAMPLE_SECONDS)

        sampler = threading.Thread(target=sample)
        sampler.start()
        stop = multiprocessing.Event()
        receive, send = multiprocessing.Pipe(duplex=False)
        prober = multiprocessing.Process(target=probe, args=(url, stop, send))
        prober.start()
        time.sleep(0.5)

        def post(body: bytes) -> tuple[int, float]:
            started = time.perf_counter()
            with httpx.Client(timeout=300) as client:
                answer = client.post(
                    f"{url}{path}", content=body, headers={"content-type": "application/json"}
                )
            return answer.status_code, time.perf_counter() - started

        with ThreadPoolExecutor(len(payloads)) as pool:
            answers = list(pool.map(post, payloads))
        time.sleep(0.5)
        stop.set()
        longest = receive.recv()
        prober.join()
        sampling.set()
        sampler.join()
        largest = max(len(body) for body in payloads)
        return {
            "case": case,
            "bodies": len(payloads),
            "body_mb": largest / 1e6,
            "statuses": sorted(status for status, _ in answers),
            "seconds": max(seconds for _, seconds in answers),
            "live_max_s": longest,
            "rss_base_mb": baseline / 1e6,
            "rss_peak_mb": peak[0] / 1e6,
            "peak_over_body": (peak[0] - baseline) / largest,
            "peak_over_bodies": (peak[0] - baseline) / sum(len(body) for body in payloads),
        }
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=REPO, help="the checkout whose code runs")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        write_model(data_dir / "models")
        print(f"code: {args.source}")
        print(f"{'case':<18} {'n':>2} {'body MB':>8} {'answers':<16} {'s':>6} "
              f"{'live max s':>10} {'RSS base MB':>11} {'RSS peak MB':>11} {'peak/body':>9} "
              f"{'peak/bodies':>11}")  # fmt: skip
        for case in args.cases:
            r = run_case(case, args.source, data_dir)
            statuses = ",".join(map(str, r["statuses"]))
            print(f"{r['case']:<18} {r['bodies']:>2} {r['body_mb']:>8.1f} {statuses:<16} "
                  f"{r['seconds']:>6.2f} {r['live_max_s']:>10.3f} {r['rss_base_mb']:>11.0f} "
                  f"{r['rss_peak_mb']:>11.0f} {r['peak_over_body']:>9.2f} "
                  f"{r['peak_over_bodies']:>11.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
