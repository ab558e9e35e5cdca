"""Exact mode over HTTP against real ``mbn serve`` processes: one runtime per replica for
every API process, answers bit for bit, and clients that leave."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from digits_data import Digits
from servicetest import FAST_JOBS_ENV, Server, wait_for

from mbn_core.bundle import load_bundle

# Slow: real servers, and models large enough to be caught computing.
pytestmark = pytest.mark.slow


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(*extra_args: str, **env: str) -> Server:
        values = {
            **FAST_JOBS_ENV,
            "MBN_DATA_DIR": str(tmp_path / "data"),
            "MBN_DEMO_MODEL": "false",
            "MBN_EMBEDDED_WORKER": "false",
            **env,
        }
        server = Server(values, tmp_path / f"server{len(servers)}.log")
        server.args += list(extra_args)
        servers.append(server.start(wait=180))
        with server.client() as client:
            wait_for(lambda: client.get("/health/ready").status_code == 200, 120, "ready")
        return server

    yield start
    for server in servers:
        server.stop()
        log = server.log_path.read_text(errors="replace")
        assert "Traceback" not in log, log[-4000:]


def _figure(client: httpx.Client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return 0.0


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def _command(pid: int) -> str:
    return (Path(f"/proc/{pid}") / "cmdline").read_bytes().replace(b"\0", b" ").decode()


def _maps(pid: int) -> str:
    return (Path(f"/proc/{pid}") / "maps").read_text()


def _decoded(answer: dict) -> np.ndarray:
    raw = base64.b64decode(answer["embeddings_b64"])
    return np.frombuffer(raw, dtype="<f4").reshape(answer["n"], answer["dim"])


def test_one_runtime_maps_the_model_for_every_api_process(
    tmp_path: Path, write_bundle: Callable[..., Path], serve: Callable[..., Server], digits: Digits
) -> None:
    """``mbn serve --workers 2``: one exact runtime, shared by both API processes, maps the
    model's exact file (no API process reads it), and both report its figures."""
    path = write_bundle(tmp_path / "data" / "models", "m-digits", "digits")
    server = serve("--workers", "2")
    assert server.proc is not None
    children = _children(server.proc.pid)
    runtimes = [pid for pid in children if "service.exact.process" in _command(pid)]
    assert len(runtimes) == 1 and len(children) >= 3, [_command(p) for p in children]
    rows = digits[0][:4].tolist()
    for _ in range(12):  # a connection each: the kernel spreads them over both processes
        with server.client() as client:
            assert client.post("/embed", json={"inputs": rows, "mode": "exact"}).status_code == 200
    exact_file = str((path / "exact.npz").resolve())
    assert exact_file in _maps(runtimes[0])  # mapped, not read into the process's memory
    for pid in children:
        if pid not in runtimes and Path(f"/proc/{pid}").exists():
            assert exact_file not in _maps(pid)

    def every_process_counts_twelve() -> bool:
        # (Each API process's warm-up of the default model adds a request of its own.)
        totals = set()
        for _ in range(6):
            with server.client() as client:
                totals.add(_figure(client, "mbn_exact_requests_total"))
        return len(totals) == 1 and 12 <= totals.pop() <= 14

    wait_for(every_process_counts_twelve, 60, "both processes to report the runtime's totals")


def test_twelve_clients_at_once_get_what_transform_alone_gives(
    tmp_path: Path, write_bundle: Callable[..., Path], serve: Callable[..., Server], digits: Digits
) -> None:
    path = write_bundle(tmp_path / "data" / "models", "m-digits", "digits")
    server = serve()
    bundle = load_bundle(path)
    x = digits[0]
    sizes = [1, 3, 1, 7, 20, 1, 2, 64, 300, 1, 5, 33]
    starts = np.cumsum([0, *sizes[:-1]])
    requests = [x[start : start + size] for start, size in zip(starts, sizes, strict=True)]
    with server.client() as client:  # the model is read before the clients start together
        assert client.post("/embed", json={"inputs": [x[0].tolist()], "mode": "exact"}).is_success
    answers: list[dict] = [{} for _ in sizes]
    barrier = threading.Barrier(len(sizes))

    def send(index: int) -> None:
        body = {"inputs": requests[index].tolist(), "mode": "exact", "encoding_format": "base64"}
        with server.client() as client:
            barrier.wait()
            answers[index] = client.post("/embed", json=body).json()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(sizes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    for rows, answer in zip(requests, answers, strict=True):
        embedding, clusters = bundle.embed_with_clusters(rows, mode="exact")
        np.testing.assert_array_equal(_decoded(answer), embedding)
        assert answer["clusters"] == clusters.tolist()
        alone = server.client().post(
            "/embed", json={"inputs": rows.tolist(), "mode": "exact", "encoding_format": "base64"}
        )
        np.testing.assert_array_equal(_decoded(alone.json()), embedding)


def test_a_client_that_leaves_frees_the_runtime(
    tmp_path: Path,
    write_bundle: Callable[..., Path],
    slow_bundle: Callable[[Path], Path],
    serve: Callable[..., Server],
    digits: Digits,
) -> None:
    """A client sends a large exact request and closes its connection while it computes:
    its rows leave the queue, and a one-row request sent next is answered."""
    slow_bundle(tmp_path / "data" / "models")
    # Seconds of work on any machine: still computing when the figures say it runs.
    server = serve(
        MBN_DEFAULT_MODEL="m-slow",
        MBN_MAX_ROWS_PER_REQUEST="40000",
        MBN_MAX_INFLIGHT_ROWS="40000",
    )
    body = json.dumps(
        {"inputs": np.resize(digits[0], (40_000, 64)).tolist(), "mode": "exact"}
    ).encode()
    head = (
        f"POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with server.client() as client:
        row = {"inputs": [digits[0][0].tolist()], "mode": "exact"}
        assert client.post("/embed", json=row).status_code == 200  # the model is read
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(head + body)
            # Rows waiting that only the large request has: a figure taken while the
            # one-row request above computed may still arrive after its answer.
            wait_for(
                lambda: _figure(client, "mbn_exact_queue_rows") > 1000,
                120,
                "the large request to be computing",
                interval=0.05,
            )
        # The connection is closed: its rows are dropped from the runtime's queue.
        wait_for(lambda: _figure(client, "mbn_exact_cancelled_total") == 1, 60, "the cancel")
        assert client.post("/embed", json=row).status_code == 200
        # The runtime's figures arrive once a second: the large one was never answered.
        wait_for(lambda: _figure(client, "mbn_exact_rows_total") == 2, 30, "the figures")
        assert _figure(client, "mbn_exact_queue_rows") == 0
        text = client.get("/metrics").text
        assert 'route="/embed",status="499"' in text  # not a server error


def test_a_step_whose_client_left_stops_mid_computation(
    tmp_path: Path,
    slow_bundle: Callable[[Path], Path],
    serve: Callable[..., Server],
    digits: Digits,
) -> None:
    """A client whose rows are all in the step being computed (one long step) closes its
    connection: the step stops as its layer's next clusterings finish, instead of running
    to its end, and a one-row request sent next is answered."""
    slow_bundle(tmp_path / "data" / "models")
    # One lane: with two, the idle lanes would share the rows (two steps of 4,096).
    server = serve(MBN_DEFAULT_MODEL="m-slow", MBN_EXACT_BATCH_ROWS="8192", MBN_EXACT_THREADS="1")
    body = json.dumps({"inputs": np.resize(digits[0], (8192, 64)).tolist(), "mode": "exact"})
    head = (
        f"POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with server.client() as client:
        row = {"inputs": [digits[0][0].tolist()], "mode": "exact"}
        assert client.post("/embed", json=row).status_code == 200  # the model is read
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(head + body.encode())
            wait_for(
                lambda: _figure(client, "mbn_exact_running_rows") == 8192,
                120,
                "the large request to be computing",
                interval=0.05,
            )
        wait_for(lambda: _figure(client, "mbn_exact_abandoned_total") == 1, 60, "the stop")
        assert client.post("/embed", json=row).status_code == 200
        wait_for(lambda: _figure(client, "mbn_exact_rows_total") == 2, 30, "the figures")
        assert _figure(client, "mbn_exact_cancelled_total") == 1
        assert _figure(client, "mbn_exact_running_rows") == 0
