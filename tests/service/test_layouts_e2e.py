"""The layout methods over real HTTP: a job trains one, both modes answer where the method has
an exact map, exact mode is a 422 pointing to the fast path where it has none, the live
monitor says "no exact map", and bad jobs are refused at submission."""

from __future__ import annotations

import numpy as np
import pytest
from servicetest import FAST_JOBS_ENV, assert_error, serving, wait_for, wait_for_job

# Slow: an mbn serve process training layout methods.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    data_dir = tmp_path_factory.mktemp("layouts")
    env = {
        **FAST_JOBS_ENV,
        "MBN_DATA_DIR": str(data_dir),
        "MBN_DEMO_MODEL": "false",
        "MBN_SHADOW_FRACTION": "1",
        "MBN_SHADOW_MAX_DELAY": "0.1",
    }
    # Up to 5 minutes: a busy machine imports the service and the layout libraries slowly.
    with serving(env, data_dir / "server.log", ready=False, wait=300.0) as srv:
        yield srv


def train(client, method: str, x, y, params: dict) -> dict:
    response = client.post(
        "/train",
        json={
            "name": method,
            "method": method,
            "data": x.tolist(),
            "labels": y.tolist(),
            "params": {"max_epochs": 5, **params},
        },
    )
    assert response.status_code == 202, response.text
    job = wait_for_job(client, response.json()["id"], {"succeeded", "failed"}, 300)
    assert job["status"] == "succeeded", job
    return client.get(f"/models/{job['model_id']}").json()


@pytest.mark.parametrize(
    ("method", "params"),
    [("pacmap", {"num_iters": 220}), ("trimap", {"n_iters": 60})],
)
def test_a_layout_trains_and_serves(server, digits, method, params):
    x, y = digits
    new = x[1200:1210]
    with server.client() as client:
        manifest = train(client, method, x[:400], y[:400], params)
        assert manifest["method"] == method and manifest["fast_path"] == "distilled"
        fidelity = manifest["fidelity"]
        assert fidelity["holdout"] == "cross-fitted students" and fidelity["folds"] == 5
        assert fidelity["n_holdout"] == 400 and fidelity["r2"] > 0.5
        fast = client.post("/embed", json={"model": method, "inputs": new.tolist()})
        assert fast.status_code == 200, fast.text
        assert np.asarray(fast.json()["embeddings"]).shape == (10, 2)
        exact = client.post(
            "/embed", json={"model": method, "inputs": new.tolist(), "mode": "exact"}
        )
        if method == "pacmap":
            assert exact.status_code == 200, exact.text
            assert np.asarray(exact.json()["embeddings"]).shape == (10, 2)
            return
        message = assert_error(exact, 422, "invalid_input")["message"]
        assert "has no exact mode" in message and "fast path" in message

        # The monitor: novelty measured, no live fidelity, and it says why.
        def sampled() -> dict | None:
            monitor = client.get(f"/models/{manifest['id']}/monitor").json()
            return monitor if monitor["window_sampled_rows"] else None

        monitor = wait_for(sampled, 60, "the monitor to sample the rows embedded", interval=0.5)
        assert monitor["live"]["state"] == "no exact map", monitor
        assert monitor["skipped_exact_busy"] == 0 and monitor["window_sampled_rows"] > 0
        assert monitor["note"].startswith("no exact map")
        # Prometheus: the novelty share, and no live fidelity gauge (a zero would read as a
        # fast path that lost its way).
        metrics = client.get("/metrics").text
        model = f'model="{manifest["id"]}"'
        assert any(
            line.startswith("mbn_input_novelty_share{") and model in line
            for line in metrics.splitlines()
        ), metrics
        assert not any(
            line.startswith("mbn_live_fidelity") and model in line for line in metrics.splitlines()
        )


def test_bad_layout_jobs_are_refused_at_submission(server, digits):
    x, _ = digits
    with server.client() as client:
        few = client.post("/train", json={"method": "tsne", "data": x[:50].tolist()})
        message = assert_error(few, 422)["message"]
        assert "perplexity=30 needs at least 91 rows, got 50" in message, message
        bad = client.post(
            "/train",
            json={"method": "umap", "data": x[:50].tolist(), "params": {"min_dist": 5.0}},
        )
        assert "min_dist=5 must be at most spread=1" in assert_error(bad, 422)["message"]


def test_a_layout_that_fails_in_the_worker_names_the_method(server, digits):
    x, _ = digits
    with server.client() as client:
        # Parameters within PaCMAP's ranges for which its sampling finds no neighbour.
        response = client.post(
            "/train",
            json={
                "method": "pacmap",
                "data": x[:120].tolist(),
                "params": {"n_neighbors": 10, "MN_ratio": 99, "FP_ratio": 99},
            },
        )
        assert response.status_code == 202, response.text
        job = wait_for_job(client, response.json()["id"], {"succeeded", "failed"}, 300)
        assert job["status"] == "failed", job
        error = job["error"]
        assert error.startswith("PaCMAP failed in fit: ") and "neighbors" in error, error
        assert "Traceback" not in error and "/" not in error, error
