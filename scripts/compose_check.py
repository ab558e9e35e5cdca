"""The checks of scripts/compose-check, run inside the compose stack's network namespace.

First the shape of the deployment, through nginx: readiness, fast and exact embeddings, the same
bundle answered by either replica, a training job run by a worker container on the Dask
workers and then served by both replicas, the console. Then faults, each under a steady stream
of fast ``/embed`` requests sent through nginx (bounded in count and time): an API replica
killed with SIGKILL, a rolling restart of both replicas, a worker container killed in the
middle of a job, PostgreSQL restarted, the shared volume filled. An answer counts as failed
unless it is 2xx, or 429 with Retry-After.

Only the standard library: it runs with the host's Python, beside podman. Prints a Markdown
table of the scenarios, writes the figures as JSON (``--out``) and exits 1 when a check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NGINX = "http://127.0.0.1:80"
# compose.loopback.yml's addresses of the two replicas (nginx.conf's api-1:8000, api-2:8000).
REPLICAS = {"api-1": "http://127.0.0.11:8000", "api-2": "http://127.0.0.12:8000"}
PROJECT = "mbn"
DEMO_ROW = [float(i % 17) for i in range(64)]  # the demo model: 64 digit pixels
TINY_PARAMS = {"n_clusterings": 20, "hidden_layer_sizes": [16], "max_epochs": 3}
# A job that runs long enough to be interrupted (tens of seconds here).
LONG_PARAMS = {"n_clusterings": 100, "hidden_layer_sizes": [16], "max_epochs": 8}


def container(service: str, number: int = 1) -> str:
    """podman-compose's name of a service's container."""
    return f"{PROJECT}_{service}_{number}"


def log(message: str) -> None:
    sys.stdout.write(f"[compose-check {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stdout.flush()


# ---- HTTP -----------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int  # 0: no answer (the error says why)
    headers: dict[str, str]
    body: bytes
    seconds: float
    error: str | None = None

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    base: str,
    method: str,
    path: str,
    body: bytes | None = None,
    content_type: str = "application/json",
    timeout: float = 60.0,
) -> Answer:
    url = urllib.parse.urlsplit(base)
    start = time.monotonic()
    connection = http.client.HTTPConnection(url.hostname or "", url.port or 80, timeout=timeout)
    try:
        headers = {"Content-Type": content_type} if body is not None else {}
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        data = response.read()
        return Answer(
            response.status,
            {key.lower(): value for key, value in response.getheaders()},
            data,
            time.monotonic() - start,
        )
    except (OSError, http.client.HTTPException) as exc:
        return Answer(0, {}, b"", time.monotonic() - start, f"{type(exc).__name__}: {exc}")
    finally:
        connection.close()


def post_json(base: str, path: str, payload: Any, timeout: float = 60.0) -> Answer:
    return request(base, "POST", path, json.dumps(payload).encode(), timeout=timeout)


def embed(
    base: str, rows: list[list[float]], mode: str = "fast", model: str | None = None
) -> Answer:
    payload: dict[str, Any] = {"inputs": rows, "mode": mode}
    if model:
        payload["model"] = model
    return post_json(base, "/embed", payload, timeout=300)


def ok(answer: Answer) -> bool:
    """What the load generator counts as served: 2xx, or 429 that says when to come back."""
    return 200 <= answer.status < 300 or (answer.status == 429 and "retry-after" in answer.headers)


def wait_until(what: str, condition: Any, timeout: float, interval: float = 0.5) -> float:
    """Seconds until condition() held; raises TimeoutError after timeout."""
    start = time.monotonic()
    while True:
        if condition():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


def ready(base: str) -> bool:
    return request(base, "GET", "/health/ready", timeout=5).status == 200


def both_ready() -> bool:
    return all(ready(url) for url in REPLICAS.values())


# ---- podman ---------------------------------------------------------------------------------


def podman(*args: str, check: bool = True) -> str:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)}: {result.stderr.strip()[-500:]}")
    return result.stdout.strip()


def running(name: str) -> bool:
    return podman("inspect", "--format", "{{.State.Running}}", name, check=False) == "true"


def main_process(name: str) -> int | None:
    """The container's main process (the child of its init, compose's `init: true`), or None
    when it runs none."""
    init = int(podman("inspect", "--format", "{{.State.Pid}}", name, check=False) or 0)
    try:
        children = Path(f"/proc/{init}/task/{init}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if init and children else None


# ---- data -----------------------------------------------------------------------------------


def blobs(n: int, dim: int, seed: int) -> tuple[list[list[float]], list[int]]:
    """Rows around 5 centres, and their labels."""
    rng = random.Random(seed)
    centres = [[rng.uniform(-4, 4) for _ in range(dim)] for _ in range(5)]
    rows = [[round(c + rng.gauss(0, 1), 4) for c in centres[i % 5]] for i in range(n)]
    return rows, [i % 5 for i in range(n)]


def train(name: str, params: dict[str, Any], n: int = 400, seed: int = 0) -> Answer:
    rows, labels = blobs(n, 16, seed)
    body = {"name": name, "data": rows, "labels": labels, "params": params}
    return post_json(NGINX, "/train", body)


def job(job_id: str) -> dict[str, Any]:
    answer = request(NGINX, "GET", f"/jobs/{job_id}", timeout=10)
    return answer.json() if answer.status == 200 else {"status": f"http {answer.status}"}


def wait_for_job(job_id: str, timeout: float) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def finished() -> bool:
        found.update(job(job_id))
        return found.get("status") in ("succeeded", "failed", "cancelled")

    wait_until(f"job {job_id}", finished, timeout, interval=1.0)
    return found


def models_of(job_id: str, base: str = NGINX) -> list[str]:
    answer = request(base, "GET", "/models", timeout=10)
    if answer.status != 200:
        return []
    return [m["id"] for m in answer.json()["models"] if m["id"].startswith(job_id)]


def multipart(fields: dict[str, str], filename: str, content: bytes) -> tuple[bytes, str]:
    boundary = "compose-check-boundary"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n{value}\r\n'.encode()
        for key, value in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        f"Content-Type: text/csv\r\n\r\n".encode()
        + content
        + b"\r\n"
    )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


# ---- the load generator ---------------------------------------------------------------------


@dataclass
class Sent:
    start: float
    status: int
    seconds: float
    ok: bool
    error: str | None


class Load:
    """Fast /embed requests through nginx from a few threads at a fixed total rate, until
    stopped, max_requests were sent or max_seconds passed."""

    def __init__(
        self, rate: float, threads: int = 4, max_requests: int = 30_000, max_seconds: float = 600
    ) -> None:
        self.interval = threads / rate
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        self.max_requests, self.max_seconds = max_requests, max_seconds
        self.sent: list[Sent] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def __enter__(self) -> Load:
        self.began = time.monotonic()
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=400)

    def _run(self) -> None:
        rows = [DEMO_ROW, [v / 2 for v in DEMO_ROW]]
        next_at = time.monotonic() + random.random() * self.interval
        while not self.stopping.is_set() and time.monotonic() - self.began < self.max_seconds:
            with self.lock:
                if len(self.sent) >= self.max_requests:
                    return
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += self.interval
            start = time.monotonic()
            answer = embed(NGINX, rows)
            if answer.status == 200 and len(answer.json()["embeddings"]) != 2:
                answer.status, answer.error = 0, "wrong number of embeddings"
            sent = Sent(start, answer.status, answer.seconds, ok(answer), answer.error)
            with self.lock:
                self.sent.append(sent)

    def during(self, since: float, until: float) -> list[Sent]:
        with self.lock:
            return [s for s in self.sent if since <= s.start <= until]


def p99_ms(sent: list[Sent]) -> float:
    if not sent:
        return math.nan
    ordered = sorted(s.seconds for s in sent)
    return 1000 * ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


# ---- checks ---------------------------------------------------------------------------------


@dataclass
class Scenario:
    name: str
    sent: int = 0
    failed: int = 0
    p99_ms: float = math.nan
    recovery_s: float = math.nan
    jobs_lost: int = 0
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


class Checks:
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.scenarios: list[Scenario] = []

    def expect(self, condition: bool, message: str) -> bool:
        log(("ok: " if condition else "FAILED: ") + message)
        if not condition:
            self.problems.append(message)
        return condition


def check_shape(checks: Checks) -> None:
    expect = checks.expect
    expect(ready(NGINX), "/health/ready is 200 through nginx")
    answers = {mode: embed(NGINX, [DEMO_ROW, DEMO_ROW], mode) for mode in ("fast", "exact")}
    for mode, answer in answers.items():
        good = answer.status == 200 and len(answer.json()["embeddings"]) == 2
        expect(good, f"/embed {mode} through nginx: {answer.status} in {answer.seconds:.2f} s")

    # Either replica, asked directly, answers with the same bundle and the same numbers.
    for mode in ("fast", "exact"):
        by_replica = {name: embed(url, [DEMO_ROW], mode) for name, url in REPLICAS.items()}
        statuses = {name: a.status for name, a in by_replica.items()}
        if expect(set(statuses.values()) == {200}, f"/embed {mode} on each replica: {statuses}"):
            ids = {a.headers.get("x-model-id") for a in by_replica.values()}
            rows = [a.json()["embeddings"][0] for a in by_replica.values()]
            gap = max(abs(x - y) for x, y in zip(*rows, strict=True))
            expect(len(ids) == 1, f"both replicas serve the same default bundle ({ids})")
            expect(gap <= 1e-5, f"both replicas embed alike in {mode} mode (max gap {gap:.1e})")

    ui = request(NGINX, "GET", "/ui", timeout=10)
    if ui.status in (301, 302, 307, 308):  # /ui redirects to the console's page
        ui = request(NGINX, "GET", ui.headers.get("location", "/ui"), timeout=10)
    expect(
        ui.status == 200 and "text/html" in ui.headers.get("content-type", ""),
        f"/ui through nginx: {ui.status} {ui.headers.get('content-type')}",
    )

    # A job through nginx, run by a worker container with its layers on the Dask workers.
    before = dask_transitions()
    submitted = train("compose-check", TINY_PARAMS)
    if not expect(submitted.status == 202, f"POST /train through nginx: {submitted.status}"):
        return
    job_id = submitted.json()["id"]
    done = wait_for_job(job_id, 900)
    if not expect(done["status"] == "succeeded", f"job {job_id}: {done['status']}"):
        log(f"job: {done}")
        return
    model = done["model_id"]
    after = dask_transitions()
    grew = {w: after.get(w, 0) - before.get(w, 0) for w in after}
    expect(
        len(grew) >= 2 and all(n > 0 for n in grew.values()),
        f"the job's tasks ran on the compose Dask workers (task transitions per worker: {grew})",
    )
    rows, _ = blobs(3, 16, 1)
    for name, url in REPLICAS.items():
        served: dict[str, Answer] = {}

        def serves(url: str = url, served: dict[str, Answer] = served) -> bool:
            served["a"] = embed(url, rows, "fast", model)
            return served["a"].status == 200

        with contextlib.suppress(TimeoutError):
            wait_until(f"{name} serves {model}", serves, 60)
        answer = served["a"]
        expect(
            answer.status == 200 and answer.headers.get("x-model-id") == model,
            f"{name} serves the new model {model}: {answer.status}",
        )


def dask_transitions() -> dict[str, int]:
    """Task state transitions so far on each Dask worker, asked through the scheduler."""
    code = (
        "import json\n"
        "from distributed import Client\n"
        "with Client('tcp://127.0.0.1:8786', timeout=30) as c:\n"
        "    print(json.dumps(c.run(lambda dask_worker: dask_worker.state.transition_counter)))\n"
    )
    out = podman("exec", container("dask-scheduler"), "python", "-c", code)
    return {k: int(v) for k, v in json.loads(out.splitlines()[-1]).items()}


def summarize(load: Load, scenario: Scenario, since: float, until: float) -> None:
    scenario.sent = len(load.sent)
    bad = [s for s in load.sent if not s.ok]
    scenario.failed = len(bad)
    scenario.failures = [f"{s.status} {s.error or ''}".strip() for s in bad[:10]]
    scenario.p99_ms = p99_ms(load.during(since, until))


def kill_replica(checks: Checks, rate: float) -> Scenario:
    scenario = Scenario("kill -9 of API replica api-1, brought back")
    name = container("api-1")
    with Load(rate) as load:
        time.sleep(5)
        killed = main_process(name)
        assert killed is not None, f"{name} runs no server"
        fault = time.monotonic()
        os.kill(killed, signal.SIGKILL)
        try:
            # The restart policy (unless-stopped) brings it back: a new server process.
            wait_until(
                f"{name} restarted by its restart policy",
                lambda: main_process(name) not in (None, killed),
                20,
            )
            scenario.notes.append(
                f"restarted by its restart policy after {time.monotonic() - fault:.1f} s"
            )
        except TimeoutError:
            podman("start", name)
            scenario.notes.append("not restarted by its restart policy: podman start")
        wait_until("api-1 ready", lambda: ready(REPLICAS["api-1"]), 300)
        recovered = time.monotonic()
        time.sleep(5)
    summarize(load, scenario, fault, recovered)
    scenario.recovery_s = recovered - fault
    checks.expect(scenario.failed == 0, f"{scenario.name}: {scenario.failed} failed /embed")
    return scenario


def rolling_restart(checks: Checks, rate: float) -> Scenario:
    scenario = Scenario("rolling restart of api-1 then api-2")
    with Load(rate) as load:
        time.sleep(5)
        fault = time.monotonic()
        for replica in REPLICAS:
            began = time.monotonic()
            podman("restart", "--time", "30", container(replica))
            wait_until(f"{replica} ready", lambda r=replica: ready(REPLICAS[r]), 300)
            back = time.monotonic() - began
            # nginx has no active health checks: it leaves a replica that failed out for
            # fail_timeout. The next one restarts once nginx sends this one traffic again.
            served = embeds_served(REPLICAS[replica])
            wait_until(
                f"nginx sends {replica} traffic",
                lambda r=replica, n=served: embeds_served(REPLICAS[r]) >= n + 5,
                60,
            )
            scenario.notes.append(
                f"{replica} ready {back:.1f} s after the restart began, "
                f"back in nginx's pool after {time.monotonic() - began:.1f} s"
            )
        recovered = time.monotonic()
        time.sleep(5)
    summarize(load, scenario, fault, recovered)
    scenario.recovery_s = recovered - fault
    checks.expect(scenario.failed == 0, f"{scenario.name}: {scenario.failed} failed /embed")
    return scenario


def embeds_served(base: str) -> int:
    """Fast /embed requests a replica answered 200 since it started (its /metrics)."""
    text = request(base, "GET", "/metrics", timeout=5).body.decode()
    prefix = 'mbn_http_requests_total{method="POST",mode="fast",route="/embed",status="200"}'
    return sum(
        int(float(line.split()[-1])) for line in text.splitlines() if line.startswith(prefix)
    )


def attempts(job_id: str, workers: list[str]) -> dict[int, tuple[str, str]]:
    """Who started each attempt of a job: attempt -> (container, worker id), from the
    workers' logs ("job ID: attempt N started by WORKER")."""
    found: dict[int, tuple[str, str]] = {}
    pattern = re.compile(rf"job {job_id}: attempt (\d+) started by (\S+)")
    for name in workers:
        result = subprocess.run(
            ["podman", "logs", name], capture_output=True, text=True, timeout=60, check=False
        )
        for match in pattern.finditer(result.stdout + result.stderr):
            found[int(match.group(1))] = (name, match.group(2))
    return found


def kill_worker(checks: Checks, rate: float) -> Scenario:
    scenario = Scenario("worker container killed mid-job")
    workers = [container("worker", n) for n in (1, 2)]
    with Load(rate) as load:
        submitted = train("compose-check-long", LONG_PARAMS, n=1000, seed=2)
        job_id = submitted.json()["id"]
        wait_until(
            "the job makes progress",
            lambda: job(job_id).get("progress", 0) > 0 and 1 in attempts(job_id, workers),
            600,
        )
        victim, first = attempts(job_id, workers)[1]
        fault = time.monotonic()
        podman("kill", "--signal", "KILL", victim)
        scenario.notes.append(f"killed {victim} at progress {job(job_id)['progress']:.2f}")
        wait_until(
            "the job runs again",
            lambda: job(job_id).get("attempts", 1) >= 2 and job(job_id)["status"] == "running",
            300,
        )
        recovered = time.monotonic()
        if not running(victim):
            podman("start", victim)
            scenario.notes.append(f"{victim} not restarted by its restart policy: podman start")
        done = wait_for_job(job_id, 900)
        runner, second = attempts(job_id, workers).get(2, ("?", "?"))
        scenario.notes.append(f"attempt 2 ran on {runner} (worker {second})")
    summarize(load, scenario, fault, recovered)
    scenario.recovery_s = recovered - fault
    # Each replica sees a new bundle at its next rescan (MBN_RESCAN_SECONDS).
    with contextlib.suppress(TimeoutError):
        wait_until(
            "both replicas list the model",
            lambda: all(models_of(job_id, url) for url in REPLICAS.values()),
            60,
        )
    published = sorted({m for url in REPLICAS.values() for m in models_of(job_id, url)})
    scenario.jobs_lost = 0 if done["status"] == "succeeded" else 1
    checks.expect(done["status"] == "succeeded", f"the interrupted job {job_id}: {done['status']}")
    checks.expect(second not in ("?", first), f"another worker ran it again ({second})")
    checks.expect(
        published == [done.get("model_id")], f"exactly one model published for it: {published}"
    )
    checks.expect(scenario.failed == 0, f"{scenario.name}: {scenario.failed} failed /embed")
    return scenario


def restart_postgres(checks: Checks, rate: float) -> Scenario:
    scenario = Scenario("PostgreSQL stopped for 15 s, started again")
    name = container("postgres")
    accepted: list[str] = []
    with Load(rate) as load:
        first = train("compose-check-before-pg", LONG_PARAMS, n=1000, seed=3)
        accepted.append(first.json()["id"])
        wait_until("the job runs", lambda: job(accepted[0]).get("status") == "running", 300)
        fault = time.monotonic()
        podman("stop", "--time", "10", name)
        down = time.monotonic()
        readiness: list[int] = []
        submits: list[int] = []
        while time.monotonic() - down < 15:
            readiness.append(request(NGINX, "GET", "/health/ready", timeout=5).status)
            answer = train("compose-check-during-pg", TINY_PARAMS, n=200, seed=4)
            submits.append(answer.status)
            if answer.status == 202:
                accepted.append(answer.json()["id"])
            time.sleep(1)
        podman("start", name)
        wait_until("both replicas ready", both_ready, 300)
        recovered = time.monotonic()
        after = train("compose-check-after-pg", TINY_PARAMS, n=200, seed=5)
        checks.expect(after.status == 202, f"POST /train after PostgreSQL is back: {after.status}")
        if after.status == 202:
            accepted.append(after.json()["id"])
        finished = {job_id: wait_for_job(job_id, 900) for job_id in accepted}
        outcomes = {job_id: found["status"] for job_id, found in finished.items()}
        scenario.notes.append(
            f"the job running during the outage took {finished[accepted[0]].get('attempts')} "
            "attempt(s)"
        )
    summarize(load, scenario, fault, recovered)
    scenario.recovery_s = recovered - fault
    not_ready = sorted(set(readiness[3:]))
    scenario.notes.append(f"/health/ready while down: {readiness}")
    scenario.notes.append(f"POST /train while down: {submits}")
    scenario.jobs_lost = sum(status != "succeeded" for status in outcomes.values())
    checks.expect(not_ready == [503], f"/health/ready 503 while PostgreSQL is down: {readiness}")
    checks.expect(
        set(submits) <= {202, 503}, f"POST /train while down is 503 (or accepted): {submits}"
    )
    checks.expect(scenario.jobs_lost == 0, f"every accepted job succeeded: {outcomes}")
    checks.expect(scenario.failed == 0, f"{scenario.name}: {scenario.failed} failed /embed")
    return scenario


def fill_volume(checks: Checks, rate: float, volume: str) -> Scenario:
    scenario = Scenario("shared volume filled")
    mount = Path(podman("volume", "inspect", "--format", "{{.Mountpoint}}", volume))
    filler = mount / "compose-check-filler"
    rows, _ = blobs(200, 16, 6)
    csv = "\n".join(",".join(str(v) for v in row) for row in rows).encode()
    body, content_type = multipart({"name": "compose-check-upload"}, "rows.csv", csv)
    with Load(rate) as load:
        time.sleep(5)
        fault = time.monotonic()
        free = os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize
        with open(filler, "wb") as handle:  # to the last byte: writes fail with ENOSPC
            os.posix_fallocate(handle.fileno(), 0, max(1, free - (1 << 20)))
            handle.seek(0, os.SEEK_END)
            for _ in range(64):
                try:
                    handle.write(bytes(1 << 16))
                    handle.flush()
                except OSError:
                    break
        scenario.notes.append(f"filled {free >> 20} MiB")
        wait_until("not ready", lambda: not ready(NGINX), 60)
        upload = request(NGINX, "POST", "/train", body, content_type=content_type)
        inline = train("compose-check-full", TINY_PARAMS, n=200, seed=7)
        scenario.notes.append(f"upload {upload.status}, JSON train {inline.status}")
        time.sleep(10)
        filler.unlink()
        wait_until("both replicas ready", both_ready, 120)
        recovered = time.monotonic()
        time.sleep(5)
    summarize(load, scenario, fault, recovered)
    scenario.recovery_s = recovered - fault
    checks.expect(upload.status == 507, f"POST /train upload on a full volume: {upload.status}")
    checks.expect(inline.status == 507, f"POST /train JSON on a full volume: {inline.status}")
    checks.expect(scenario.failed == 0, f"{scenario.name}: {scenario.failed} failed /embed")
    return scenario


def table(scenarios: list[Scenario]) -> str:
    lines = [
        "| scenario | requests sent | failed | p99 latency during fault (ms) "
        "| recovery (s) | jobs lost |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for s in scenarios:
        lines.append(
            f"| {s.name} | {s.sent} | {s.failed} | {s.p99_ms:.0f} | {s.recovery_s:.1f} "
            f"| {s.jobs_lost} |"
        )
    return "\n".join(lines)


SCENARIOS = ["kill-replica", "rolling-restart", "kill-worker", "restart-postgres", "fill-volume"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=20.0, help="/embed requests per second")
    parser.add_argument("--volume", default=f"{PROJECT}_mbn-data", help="the shared volume")
    parser.add_argument("--out", type=Path, help="write the figures here (JSON)")
    parser.add_argument("--skip-shape", action="store_true")
    parser.add_argument("--only", nargs="*", choices=SCENARIOS, default=SCENARIOS)
    args = parser.parse_args()

    checks = Checks()
    if not args.skip_shape:
        log("the deployment's shape")
        check_shape(checks)
    runs = {
        "kill-replica": lambda: kill_replica(checks, args.rate),
        "rolling-restart": lambda: rolling_restart(checks, args.rate),
        "kill-worker": lambda: kill_worker(checks, args.rate),
        "restart-postgres": lambda: restart_postgres(checks, args.rate),
        "fill-volume": lambda: fill_volume(checks, args.rate, args.volume),
    }
    for key in args.only:
        log(f"scenario {key}")
        try:
            scenario = runs[key]()
        except (TimeoutError, RuntimeError, KeyError, ValueError) as exc:
            checks.expect(False, f"scenario {key} did not complete: {exc}")
            continue
        checks.scenarios.append(scenario)
        log(
            f"{scenario.name}: {scenario.sent} sent, {scenario.failed} failed, "
            f"p99 {scenario.p99_ms:.0f} ms, recovery {scenario.recovery_s:.1f} s; "
            f"{'; '.join(scenario.notes)}"
        )
        if scenario.failures:
            log(f"failed answers (first 10): {scenario.failures}")
        # The next scenario starts from a whole deployment.
        wait_until("both replicas ready", both_ready, 300)

    sys.stdout.write(table(checks.scenarios) + "\n")
    if args.out:
        args.out.write_text(
            json.dumps(
                {"scenarios": [vars(s) for s in checks.scenarios], "problems": checks.problems},
                indent=2,
            )
        )
    if checks.problems:
        sys.stderr.write("compose-check: FAILED:\n  " + "\n  ".join(checks.problems) + "\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
