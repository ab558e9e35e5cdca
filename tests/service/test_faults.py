"""Fault injection against a real ``mbn serve``: what the service does when its disk or its
job store fails under it, when it is killed, and when it is stopped mid-request.

The store faults use a small tmpfs each test mounts for itself (a read-only remount, a file
filling it, the store file deleted), so they need root; they skip, saying so, only when the
tests do not run as root. docs/FAULTS.md lists each fault, the service's answer and the test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from digits_data import Digits
from servicetest import (
    FAST_JOBS_ENV,
    LONG_PARAMS,
    Server,
    assert_error,
    wait_for,
    wait_for_progress,
)

from service.jobs import JobStore

# Slow: a real mbn serve per fault, killed, starved of disk or of its store.
pytestmark = pytest.mark.slow

ROWS = [[float(i), float(i % 7)] for i in range(40)]
SMALL_JOB = {"data": ROWS, "params": {"n_clusterings": 5, "n_components": 2}}
MIB = 1 << 20


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB tmpfs of this test's own."""
    if os.geteuid() != 0:
        pytest.skip("mounting the fault-injection tmpfs needs root; run the suite as root")
    mount = tmp_path / "mnt"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def serve(tmp_path: Path, write_bundle: Callable[..., Path]) -> Iterator[Callable[..., Server]]:
    """Start ``mbn serve`` on a data dir (with the tiny digits model); stopped at the end,
    and its log must hold no traceback (an unhandled error is a 500)."""
    servers: list[Server] = []

    def start(data_dir: Path, **env: str) -> Server:
        if not (data_dir / "models" / "m-digits").exists():
            write_bundle(data_dir / "models", "m-digits", "digits")
        values = {
            **FAST_JOBS_ENV,
            "MBN_DATA_DIR": str(data_dir),
            "MBN_DEMO_MODEL": "false",
            "MBN_EMBEDDED_WORKER": "false",
            "MBN_MIN_FREE_BYTES": str(4 * MIB),
            **env,
        }
        # The log stays off the faulty file system (an open log would block its remount).
        server = Server(values, tmp_path / f"server{len(servers)}.log").start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        with contextlib.suppress(Exception):
            server.stop(signal.SIGKILL, timeout=10)
    for server in servers:
        log = server.log_path.read_text(errors="replace")
        assert "Traceback" not in log, log[-4000:]


def _status(client: httpx.Client, path: str) -> int:
    return client.get(path).status_code


def _remount(mount: Path, mode: str) -> None:
    # EBUSY while a file there is open for writing (a job-store operation in progress).
    wait_for(
        lambda: (
            subprocess.run(
                ["mount", "-o", f"remount,{mode}", str(mount)], capture_output=True
            ).returncode
            == 0
        ),
        10,
        f"remounting {mode}",
        interval=0.05,
    )


def test_read_only_store(tmpfs: Path, serve: Callable[..., Server]) -> None:
    server = serve(tmpfs / "data")
    with server.client() as client:
        wait_for(lambda: _status(client, "/health/ready") == 200, 20, "ready")
        _remount(tmpfs, "ro")
        try:
            wait_for(lambda: _status(client, "/health/ready") == 503, 10, "not ready")
            error = assert_error(client.get("/health/ready"), 503)
            assert "read-only" in error["message"]
            error = assert_error(client.post("/train", json=SMALL_JOB), 503, "unavailable")
            assert "/" not in error["message"].replace("/health", "")
            assert client.get("/jobs").status_code in (200, 503)
            assert client.post("/embed", json={"inputs": [[0.0] * 64]}).status_code == 200
        finally:
            _remount(tmpfs, "rw")
        wait_for(lambda: _status(client, "/health/ready") == 200, 10, "ready again")
        assert client.post("/train", json=SMALL_JOB).status_code == 202


def test_store_file_deleted_while_running(tmpfs: Path, serve: Callable[..., Server]) -> None:
    data_dir = tmpfs / "data"
    server = serve(data_dir)
    db = data_dir / "jobs.sqlite3"
    with server.client() as client:
        wait_for(lambda: _status(client, "/health/ready") == 200, 20, "ready")
        before = client.post("/train", json=SMALL_JOB)
        assert before.status_code == 202
        backup = tmpfs / "backup.sqlite3"
        with sqlite3.connect(db) as source, sqlite3.connect(backup) as target:
            source.backup(target)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)

        wait_for(lambda: _status(client, "/health/ready") == 503, 10, "not ready")
        assert "deleted" in assert_error(client.get("/health/ready"), 503)["message"]
        # Consistently refused (it alternated 200/503), and never a 202 into the lost file.
        assert [client.get("/jobs").status_code for _ in range(5)] == [503] * 5
        for _ in range(3):
            assert_error(client.post("/train", json=SMALL_JOB), 503, "unavailable")
        assert not db.exists()  # refusing did not create an empty store behind our back
        assert "was DELETED while running" in server.log_path.read_text()

        backup.rename(db)  # the operator restores it
        wait_for(lambda: _status(client, "/health/ready") == 200, 10, "ready again")
        assert [j["id"] for j in client.get("/jobs").json()["jobs"]] == [before.json()["id"]]
        assert client.post("/train", json=SMALL_JOB).status_code == 202


def test_full_disk(tmpfs: Path, serve: Callable[..., Server]) -> None:
    server = serve(tmpfs / "data")
    filler = tmpfs / "filler"
    with server.client() as client:
        wait_for(lambda: _status(client, "/health/ready") == 200, 20, "ready")
        with filler.open("wb") as handle, contextlib.suppress(OSError):
            while True:  # until ENOSPC
                handle.write(bytes(MIB))
                handle.flush()
        wait_for(lambda: _status(client, "/health/ready") == 503, 10, "not ready")
        assert "disk is full" in assert_error(client.get("/health/ready"), 503)["message"]
        content = "\n".join(f"{a},{b}" for a, b in ROWS * 50).encode()
        for response in (
            client.post("/train", files={"file": ("d.csv", content)}),
            client.post("/train", json=SMALL_JOB),
        ):
            error = assert_error(response, 507, "insufficient_storage")
            assert "space" in error["message"] or "full" in error["message"]
        assert client.post("/embed", json={"inputs": [[0.0] * 64]}).status_code == 200

        filler.unlink()
        wait_for(lambda: _status(client, "/health/ready") == 200, 10, "ready again")
        assert client.post("/train", json=SMALL_JOB).status_code == 202
    assert not list((tmpfs / "data" / "jobs").glob("*/.upload-*"))  # no partial uploads


def test_full_disk_forced_delete_and_promote_change_nothing(
    tmpfs: Path, serve: Callable[..., Server], write_bundle: Callable[..., Path]
) -> None:
    """Both wrote the choices file after acting and answered 500: the default's bundle was
    renamed away while the file still named it, and readiness stayed 503 for good. A read
    (GET /jobs) answered 507."""
    data = tmpfs / "data"
    write_bundle(data / "models", "m-two", "two", created="2030-01-01T00:00:00+00:00")
    server = serve(data)
    filler = tmpfs / "filler"
    aliases = data / "models" / ".aliases.json"
    with server.client() as client:
        wait_for(lambda: _status(client, "/health/ready") == 200, 20, "ready")
        assert client.post("/models/m-two/promote").status_code == 200
        chosen = aliases.read_bytes()
        with contextlib.suppress(OSError), filler.open("wb") as handle:
            while True:  # until ENOSPC
                handle.write(bytes(MIB))
                handle.flush()
        assert_error(client.post("/models/m-digits/promote"), 507, "insufficient_storage")
        assert_error(client.delete("/models/m-two?force=true"), 507, "insufficient_storage")
        assert aliases.read_bytes() == chosen
        assert client.get("/models/m-two").status_code == 200
        assert client.post("/embed", json={"inputs": [[0.0] * 64]}).headers["x-model-id"] == (
            "m-two"
        )
        assert client.get("/jobs").status_code == 200

        filler.unlink()
        wait_for(lambda: _status(client, "/health/ready") == 200, 10, "ready again")
        assert client.delete("/models/m-two?force=true").status_code == 204
        assert client.post("/embed", json={"inputs": [[0.0] * 64]}).status_code == 200
        assert _status(client, "/health/ready") == 200


def test_uploads_spool_to_the_data_directory_not_tmpdir(
    tmp_path: Path, tmpfs: Path, serve: Callable[..., Server]
) -> None:
    """Multipart files rolled over to the system temporary directory past 1 MB: a full
    TMPDIR answered 422, a disk readiness never looked at. They now spool under the data
    directory (whose full disk is a 507, test_full_disk)."""
    server = serve(tmp_path / "data", TMPDIR=str(tmpfs))
    content = "\n".join(f"{i},{i % 7},{i % 3}.5" for i in range(200_000)).encode()
    assert len(content) > 2 * MIB
    with server.client() as client:
        # The first spool to disk fixes Python's temporary directory (TMPDIR, while it has
        # room); then TMPDIR fills up.
        assert client.post("/train", files={"file": ("d.csv", content)}).status_code == 202
        filler = tmpfs / "filler"
        with contextlib.suppress(OSError), filler.open("wb") as handle:
            while True:  # until ENOSPC
                handle.write(bytes(MIB))
                handle.flush()
        answer = client.post("/train", files={"file": ("d.csv", content)})
        assert answer.status_code == 202, answer.text
        # Started with the data directory's scan still going on (a loaded machine): it
        # finishes although TMPDIR is full.
        wait_for(lambda: _status(client, "/health/ready") == 200, 30, "ready")


def test_kill_9_leftovers_are_cleaned_on_recovery(
    tmp_path: Path, serve: Callable[..., Server], digits: tuple[np.ndarray, np.ndarray]
) -> None:
    data_dir = tmp_path / "data"
    server = serve(data_dir, MBN_EMBEDDED_WORKER="true")
    x = digits[0][:300].tolist()
    with server.client() as client:
        running = client.post("/train", json={"data": x, "params": LONG_PARAMS}).json()["id"]
        wait_for_progress(client, running)
        requeued = client.post("/train", json={"data": x, "params": LONG_PARAMS}).json()["id"]
    assert (data_dir / "staging" / f"{running}-1").is_dir()
    server.stop(signal.SIGKILL)

    # While no server runs, the running job is cancelled (through another replica): nobody
    # is left to remove its upload folder or its staging directory.
    store = JobStore(f"sqlite:///{data_dir / 'jobs.sqlite3'}")
    store.create_schema()
    store.cancel(running)
    store.dispose()
    (data_dir / "staging" / f"{requeued}-7").mkdir()  # an attempt that is not running
    (data_dir / "models" / ".deleted-m-old-1234").mkdir()  # an interrupted delete

    server = serve(data_dir, MBN_EMBEDDED_WORKER="true")
    with server.client() as client:
        wait_for(
            lambda: (
                not (data_dir / "jobs" / running).exists()
                and not (data_dir / "staging" / f"{running}-1").exists()
                and not (data_dir / "staging" / f"{requeued}-7").exists()
                and not (data_dir / "models" / ".deleted-m-old-1234").exists()
            ),
            30,
            "the leftovers to be removed",
        )
        assert client.get(f"/jobs/{running}").json()["status"] == "cancelled"
        assert (data_dir / "jobs" / requeued).is_dir()  # a live job keeps its data
        client.post(f"/jobs/{requeued}/cancel")


def _exact_figure(client: httpx.Client, name: str) -> float:
    """A gauge or counter of the exact runtime from /metrics (0 before its first figures)."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return 0.0


def _runtime_pid(client: httpx.Client) -> int:
    """The exact runtime's process, as readiness names it once it is running."""
    described = wait_for(
        lambda: (
            (text := client.get("/health/ready").json()["exact_runtime"]).startswith(
                "running (process "
            )
            and text
        ),
        120,
        "the exact runtime to run",
    )
    return int(described.split()[2].rstrip(","))


def test_sigterm_with_an_exact_request_running(
    tmp_path: Path,
    serve: Callable[..., Server],
    slow_bundle: Callable[[Path], Path],
    digits: Digits,
) -> None:
    """The exact runtime computes in its own process: SIGTERM answers the request it holds
    with 503 once the grace period ends, without waiting for the computation, and the server
    and its runtime exit."""
    slow_bundle(tmp_path / "data" / "models")
    server = serve(
        tmp_path / "data",
        MBN_SHUTDOWN_GRACE_SECONDS="1",
        MBN_MAX_INFLIGHT_REQUESTS="1",
        MBN_DEFAULT_MODEL="m-slow",
        MBN_EXACT_BATCH_ROWS="8192",  # one long step, to be caught computing
    )
    rows = np.resize(digits.X, (8192, 64)).tolist()
    answer: dict[str, httpx.Response] = {}
    with server.client() as client:
        wait_for(lambda: _status(client, "/health/ready") == 200, 60, "ready")
        runtime = _runtime_pid(client)

    def exact() -> None:
        with httpx.Client(base_url=server.url, timeout=300) as client:
            answer["exact"] = client.post("/embed", json={"inputs": rows, "mode": "exact"})

    thread = threading.Thread(target=exact)
    thread.start()
    with server.client() as client:
        wait_for(
            lambda: _exact_figure(client, "mbn_exact_running_rows") == 8192,
            300,  # the first request also maps the model
            "the exact request to be computing",
            interval=0.05,
        )
        # The exact request waits on the runtime, not on this process: its one in-flight
        # slot serves a fast request meanwhile, and health answers.
        assert client.post("/embed", json={"inputs": [[0.0] * 64]}).status_code == 200
        assert client.get("/health/ready").status_code == 200
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    thread.join(300)
    error = assert_error(answer["exact"], 503, "unavailable")
    assert "shutting down" in error["message"]
    assert server.proc.wait(300) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal
    wait_for(lambda: not Path(f"/proc/{runtime}").exists(), 60, "the runtime to exit")


def test_kill_9_of_the_exact_runtime(
    tmp_path: Path,
    serve: Callable[..., Server],
    slow_bundle: Callable[[Path], Path],
    digits: Digits,
) -> None:
    """kill -9 of the exact runtime: the request it was computing gets 503 with Retry-After,
    exact requests meanwhile too; the fast path loses no request and readiness stays 200,
    reporting the runtime down; its supervisor starts it again and exact mode answers."""
    slow_bundle(tmp_path / "data" / "models")
    server = serve(tmp_path / "data", MBN_EXACT_BATCH_ROWS="8192")
    exact_row = {"model": "m-slow", "inputs": [[0.0] * 64], "mode": "exact"}
    big = {"model": "m-slow", "inputs": np.resize(digits.X, (8192, 64)).tolist(),
           "mode": "exact"}  # fmt: skip
    fast_statuses: list[int] = []
    readiness: list[tuple[int, bool]] = []
    stop = threading.Event()

    def fast_traffic() -> None:
        with server.client() as client:
            while not stop.is_set():
                fast_statuses.append(
                    client.post("/embed", json={"inputs": [[1.0] * 64]}).status_code
                )
                ready = client.get("/health/ready")
                readiness.append((ready.status_code, ready.json()["checks"]["exact_runtime"]))

    with server.client() as client:
        wait_for(lambda: _status(client, "/health/ready") == 200, 60, "ready")
        first = client.post("/embed", json=exact_row)  # maps the model
        assert first.status_code == 200
        pid = _runtime_pid(client)
        lost: dict[str, httpx.Response] = {}
        computing = threading.Thread(
            target=lambda: lost.update(big=server.client().post("/embed", json=big))
        )
        computing.start()
        wait_for(
            lambda: _exact_figure(client, "mbn_exact_running_rows") == 8192,
            120,
            "the large request to be computing",
            interval=0.05,
        )
        traffic = threading.Thread(target=fast_traffic)
        traffic.start()
        try:
            os.kill(pid, signal.SIGKILL)
            computing.join(120)
            error = assert_error(lost["big"], 503, "unavailable")
            assert "restarted while computing this request" in error["message"]
            assert int(lost["big"].headers["retry-after"]) >= 1
            # Exact mode answers again once the supervisor has started a new runtime; until
            # then every exact request gets 503 with Retry-After, at once.
            refused = []

            def answered() -> bool:
                response = client.post("/embed", json=exact_row)
                if response.status_code == 503:
                    assert int(response.headers["retry-after"]) >= 1
                    refused.append(assert_error(response, 503, "unavailable")["message"])
                    return False
                assert response.status_code == 200, response.text
                return True

            wait_for(answered, 120, "exact mode to answer again", interval=0.05)
            wait_for(lambda: any(not up for _, up in readiness), 30, "readiness to see it")
        finally:
            stop.set()
            traffic.join(60)
        assert refused and all("m-slow" in message for message in refused)
        assert client.post("/embed", json=exact_row).json() == first.json()
        assert _runtime_pid(client) != pid
        assert _exact_figure(client, "mbn_exact_runtime_restarts_total") == 1
    assert fast_statuses and set(fast_statuses) == {200}, sorted(set(fast_statuses))
    assert {status for status, _ in readiness} == {200}
    assert "was killed by SIGKILL; restarting it" in server.log_path.read_text()


def test_fault_table_names_existing_tests() -> None:
    """docs/FAULTS.md points at tests that exist (the table is the suite's index)."""
    table = (Path(__file__).resolve().parents[2] / "docs" / "FAULTS.md").read_text()
    here = Path(__file__).parent
    names = {
        line.split("::", 1)[1].split("`", 1)[0]
        for line in table.splitlines()
        if "::" in line and line.startswith("|")
    }
    assert names
    sources = "".join(p.read_text() for p in here.parent.rglob("test_*.py"))
    missing = sorted(n for n in names if f"def {n}(" not in sources)
    assert not missing, missing
