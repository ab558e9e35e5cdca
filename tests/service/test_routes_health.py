"""Health, readiness and Prometheus metrics."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from servicetest import assert_error, wait_for


def test_live_and_ready(api: Callable[..., TestClient]) -> None:
    client = api()
    assert client.get("/health/live").json() == {"status": "ok", "checks": {}}
    ready = client.get("/health/ready")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {
        "store": True,
        "disk": True,
        "models_scanned": True,
        "model_available": True,
        # Ready means warm: the default model's fast path has run (the first request paid
        # for it, seconds, after ready said 200).
        "default_fast_warm": True,
        "default_exact_loaded": False,
        "exact_runtime": True,
        "embed_capacity": True,
    }
    # An app started without `mbn serve` starts its runtime when exact mode is first used.
    assert ready.json()["exact_runtime"].startswith("not started")
    assert client.post("/embed", json={"inputs": [[0.0] * 64], "mode": "exact"}).status_code == 200
    assert client.get("/health/ready").json()["exact_runtime"].startswith("running (process")


@pytest.mark.slow
def test_a_real_server_is_warm_when_ready(
    tmp_path: Path, write_bundle: Callable[..., Path], processes: list
) -> None:
    """After /health/ready said 200 the first fast request took 3.9 s and the first exact
    one 12.5 s. Ready now means the default's fast path has run, and readiness says when the
    exact runtime has loaded the default's exact model (from then on, the first exact
    request does not pay for its read)."""
    from servicetest import FAST_JOBS_ENV, Server

    data_dir = tmp_path / "data"
    write_bundle(data_dir / "models", "m-digits", "digits")
    env = {**FAST_JOBS_ENV, "MBN_DATA_DIR": str(data_dir), "MBN_DEMO_MODEL": "false",
           "MBN_EMBEDDED_WORKER": "false"}  # fmt: skip
    server = Server(env, tmp_path / "server.log")
    processes.append(server)
    server.start(wait=180)
    with server.client() as client:
        wait_for(lambda: client.get("/health/ready").status_code == 200, 120, "readiness")
        assert client.get("/health/ready").json()["checks"]["default_fast_warm"] is True
        wait_for(
            lambda: client.get("/health/ready").json()["checks"]["default_exact_loaded"],
            300,
            "the default's exact model loaded",
        )
        # The runtime reports its figures as they change: the model loaded before the
        # warm-up's row was answered and counted, so both are waited for.
        runtime = wait_for(
            lambda: (
                (r := client.get("/exact/runtime").json())["models_loaded"] == 1
                and r["requests"] >= 1
                and r
            ),
            30,
            "the runtime's figures",
        )
        assert runtime["requests"] == 1  # the warm-up's one row, at background priority
        exact = client.post("/embed", json={"inputs": [[0.0] * 64], "mode": "exact"})
        assert exact.status_code == 200
    assert "model m-digits: fast path warm" in (tmp_path / "server.log").read_text()


def test_head_probes_get_the_status_without_a_body(api: Callable[..., TestClient]) -> None:
    """HEAD /health/live answered 405: load balancers and uptime checkers probe with it."""
    for client, ready in ((api(), 200), (api(models=False, demo_model=True), 503)):
        live = client.head("/health/live")
        assert (live.status_code, live.content) == (200, b"")
        assert client.head("/health/ready").status_code == ready


def test_not_ready_while_the_demo_model_trains(api: Callable[..., TestClient]) -> None:
    # No worker: the demo job stays queued, so the service must stay out of rotation.
    client = api(models=False, demo_model=True)
    error = assert_error(client.get("/health/ready"), 503, "unavailable")
    assert "demo model" in error["message"]
    jobs = client.get("/jobs").json()["jobs"]
    assert [(j["name"], j["status"], j["n_rows"]) for j in jobs] == [
        ("demo-digits", "queued", 1797)
    ]


def test_not_ready_without_a_usable_model_until_one_appears(
    api: Callable[..., TestClient], write_bundle: Callable[..., Path]
) -> None:
    # /embed answers 503 here, so readiness must too (it answered 200 before).
    client = api(models=False)
    error = assert_error(client.get("/health/ready"), 503, "unavailable")
    assert "no usable model" in error["message"]
    assert_error(client.post("/embed", json={"inputs": [[0.0] * 64]}), 503)
    write_bundle(client.app.state.settings.models_path, "m-late", "late")  # type: ignore[attr-defined]
    wait_for(lambda: client.get("/health/ready").status_code == 200, 10, "readiness")


def test_not_ready_when_the_store_is_down(api: Callable[..., TestClient]) -> None:
    client = api()
    store = client.app.state.store  # type: ignore[attr-defined]
    store.engine.dispose()
    # Make the store unreachable for real: a directory where the database file was.
    db_file = str(store.sqlite_path)
    os.rename(db_file, db_file + ".moved")
    os.mkdir(db_file)
    try:
        wait_for(lambda: client.get("/health/ready").status_code == 503, 10, "not ready")
        error = assert_error(client.get("/health/ready"), 503)
        assert "job store" in error["message"]
        assert_error(client.get("/jobs"), 503, "unavailable")
        # Embedding does not need the store.
        assert client.post("/embed", json={"inputs": [[0.0] * 64]}).status_code == 200
    finally:
        os.rmdir(db_file)
        os.rename(db_file + ".moved", db_file)
    wait_for(lambda: client.get("/health/ready").status_code == 200, 10, "ready again")


def test_metrics(api: Callable[..., TestClient]) -> None:
    client = api()
    row = [[0.0] * 64]
    client.post("/embed", json={"inputs": row})
    client.post("/embed", json={"inputs": row, "mode": "exact"})
    client.post("/embed", json={"inputs": [[0.0]]})
    client.post("/train", json={"data": [[float(i), 2.0] for i in range(30)]})
    client.get("/jobs/" + "0" * 32)
    text = client.get("/metrics").text
    assert (
        'mbn_http_requests_total{method="POST",mode="fast",route="/embed",status="200"} 1.0' in text
    )
    assert 'mbn_http_requests_total{method="POST",mode="exact",route="/embed",status="200"}' in text
    assert 'mbn_http_requests_total{method="POST",mode="fast",route="/embed",status="422"}' in text
    assert 'route="/jobs/{job_id}",status="404"' in text  # templates, not raw paths
    assert 'mbn_http_request_duration_seconds_bucket{le="0.005",method="POST",mode="fast"' in text
    assert 'mbn_jobs{status="queued"} 1.0' in text
    assert 'mbn_jobs{status="running"} 0.0' in text
    assert "mbn_models_loaded 1.0" in text
    # The exact runtime's figures, as it last sent them (about once a second).
    assert "mbn_exact_runtime_up 1.0" in text and 'mbn_exact_device{device="cpu"} 1.0' in text
    text = wait_for(
        lambda: "mbn_exact_requests_total 1.0" in (t := client.get("/metrics").text) and t,
        30,
        "the runtime's figures",
    )
    assert "mbn_exact_models_loaded 1.0" in text and "mbn_exact_queue_requests 0.0" in text
    assert 'mbn_exact_batch_rows_bucket{le="1.0"} 1.0' in text
    assert "mbn_exact_runtime_restarts_total 0.0" in text


def test_the_exact_runtime_report(api: Callable[..., TestClient]) -> None:
    client = api(api_keys="a-key-of-sixteen-chars")
    assert_error(client.get("/exact/runtime"), 401)
    headers = {"Authorization": "Bearer a-key-of-sixteen-chars"}
    before = client.get("/exact/runtime", headers=headers).json()
    assert before["state"] == "not started" and before["requests"] == 0
    assert before["batch_rows"] is None
    exact = {"inputs": [[0.0] * 64] * 3, "mode": "exact"}
    assert client.post("/embed", json=exact, headers=headers).status_code == 200
    report = wait_for(
        lambda: (r := client.get("/exact/runtime", headers=headers).json())["requests"] == 1 and r,
        30,
        "the runtime's figures",
    )
    assert report["state"] == "running" and report["pid"] > 0 and report["generation"] == 1
    assert report["device"] == "cpu" and report["restarts"] == 0
    assert (report["rows"], report["batches"], report["mean_batch_rows"]) == (3, 1, 3.0)
    histogram = report["batch_rows"]
    assert len(histogram["counts"]) == len(histogram["bounds"]) + 1  # the last: above all
    assert histogram["counts"][histogram["bounds"].index(4.0)] == 1  # 3 rows: the bucket <= 4
    assert report["mean_compute_ms"] > 0 and report["models_loaded"] == 1
