"""End to end over real HTTP: ``mbn serve`` processes on loopback, real training jobs.

The demo model on an empty model dir, training on digits through the API, embedding fast and
exact, cancelling a running job, a job surviving the crash of its server. (A clean restart
giving the job back at once: test_app.)
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from digits_data import Digits
from servicetest import (
    FAST_JOBS_ENV,
    LONG_PARAMS,
    TINY_PARAMS,
    Process,
    Server,
    serving,
    wait_for,
    wait_for_job,
    wait_for_progress,
)

# Slow: mbn serve processes and real training jobs over HTTP.
pytestmark = pytest.mark.slow

log = logging.getLogger(__name__)
# Runs for seconds, then finishes: long enough to restart servers under it. No cross-fitted
# report (five more fits), which this test does not look at.
MEDIUM_PARAMS = {
    "n_clusterings": 150, "hidden_layer_sizes": [16], "max_epochs": 3, "report_folds": None,
}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server, started on an empty data dir with the demo model enabled."""
    data_dir = tmp_path_factory.mktemp("e2e")
    env = {**FAST_JOBS_ENV, "MBN_DATA_DIR": str(data_dir), "MBN_DEMO_MODEL": "true"}
    started = time.monotonic()
    with serving(env, data_dir / "server.log") as srv:
        log.info("demo model ready %.1f s after start", time.monotonic() - started)
        yield srv


def test_demo_model_answers_at_once(server: Server, digits: Digits) -> None:
    with server.client() as client:
        response = client.post("/embed", json={"inputs": digits[0][:4].tolist()})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["name"] == "demo-digits" and body["dim"] == 10 and len(body["clusters"]) == 4
        (job,) = client.get("/jobs").json()["jobs"]
        assert (job["name"], job["status"], job["model_id"]) == (
            "demo-digits", "succeeded", body["model"],
        )  # fmt: skip


def test_train_poll_embed(server: Server, digits: Digits) -> None:
    x, y = digits
    with server.client() as client:
        response = client.post(
            "/train",
            json={"name": "e2e", "data": x.tolist(), "labels": y.tolist(), "params": TINY_PARAMS},
        )
        assert response.status_code == 202, response.text
        job = client.get(response.headers["location"]).json()
        seen_progress = set()

        def finished() -> dict | None:
            current = client.get(f"/jobs/{job['id']}").json()
            seen_progress.add(current["progress"])
            return current if current["status"] in ("succeeded", "failed") else None

        done = wait_for(finished, 120, "training", interval=0.1)
        assert done["status"] == "succeeded", done["error"]
        assert done["progress"] == 1.0 and all(0 <= p <= 1 for p in seen_progress)
        assert done["started_at"] <= done["finished_at"]
        model_id = done["model_id"]
        assert client.get(f"/models/{model_id}").json()["name"] == "e2e"

        rows = x[:16]
        fast = client.post("/embed", json={"model": "e2e", "inputs": rows.tolist()})
        exact = client.post(
            "/embed", json={"model": model_id, "inputs": rows.tolist(), "mode": "exact"}
        )
        assert fast.status_code == exact.status_code == 200
        assert fast.headers["x-model-id"] == exact.headers["x-model-id"] == model_id
        fast_emb = np.array(fast.json()["embeddings"])
        exact_emb = np.array(exact.json()["embeddings"])
        assert fast_emb.shape == exact_emb.shape == (16, 10)
        assert np.isfinite(fast_emb).all() and np.isfinite(exact_emb).all()
        # Exact embeddings do not depend on the batch.
        alone = client.post(
            "/embed", json={"model": model_id, "inputs": rows[5:6].tolist(), "mode": "exact"}
        )
        assert alone.json()["embeddings"][0] == exact.json()["embeddings"][5]
        assert len(exact.json()["clusters"]) == 16


def test_cancel_a_running_job(server: Server, digits: Digits) -> None:
    with server.client() as client:
        job = client.post("/train", json={"data": digits[0].tolist(), "params": LONG_PARAMS})
        job_id = job.json()["id"]
        wait_for_progress(client, job_id)
        models_before = {m["id"] for m in client.get("/models").json()["models"]}
        response = client.post(f"/jobs/{job_id}/cancel")
        assert response.status_code == 200 and response.json()["status"] == "cancelled"
        assert client.post(f"/jobs/{job_id}/cancel").status_code == 409
        # The worker is free again promptly: a small job right after runs to the end.
        small = client.post(
            "/train", json={"data": digits[0][:300].tolist(), "params": TINY_PARAMS}
        ).json()
        done = wait_for_job(client, small["id"], {"succeeded", "failed"}, 60)
        assert done["status"] == "succeeded"
        final = client.get(f"/jobs/{job_id}").json()
        assert final["status"] == "cancelled" and final["model_id"] is None
        models_after = {m["id"] for m in client.get("/models").json()["models"]}
        assert models_after - models_before == {done["model_id"]}


def test_a_job_survives_the_crash_of_its_server(
    tmp_path: Path, digits: Digits, processes: list[Process]
) -> None:
    env = {**FAST_JOBS_ENV, "MBN_DATA_DIR": str(tmp_path), "MBN_DEMO_MODEL": "false"}

    def start() -> Server:
        srv = Server(env, tmp_path / "server.log")
        processes.append(srv)
        return srv.start()

    first = start()
    with first.client() as client:
        job_id = client.post(
            "/train", json={"data": digits[0].tolist(), "params": MEDIUM_PARAMS}
        ).json()["id"]
        wait_for_progress(client, job_id)
    # Killed mid-job: the job stays "running" with a heartbeat that stops...
    first.stop(signal.SIGKILL)

    second = start()
    with second.client() as client:
        # ... and the next server's worker recovers it: requeued, run again, to the end.
        done = wait_for_job(client, job_id, {"succeeded", "failed"}, 120)
        assert done["status"] == "succeeded", done["error"]
        assert done["attempts"] == 2 and done["model_id"] == f"{job_id}-2"
        models = [m["id"] for m in client.get("/models").json()["models"]]
        assert models == [done["model_id"]]  # one job, one model
        response = client.post("/embed", json={"inputs": digits[0][:2].tolist()})
        assert response.status_code == 200
    # A clean stop (uvicorn re-raises the SIGTERM it handled once it is done).
    assert second.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in second.log_tail()
