"""A method registered outside the code base trains and serves over real HTTP, with no change
to the routes, the bundle code or the worker: ``MBN_METHODS`` names the module that registers
it (tests/mbn_core/toy_method.py), as a site would name its own."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from servicetest import FAST_JOBS_ENV, assert_error, serving, wait_for_job

# Slow: an mbn serve process training and serving a registered method.
pytestmark = pytest.mark.slow

TOY_DIR = Path(__file__).resolve().parents[1] / "mbn_core"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    data_dir = tmp_path_factory.mktemp("methods")
    path = os.pathsep.join(filter(None, [str(TOY_DIR), os.environ.get("PYTHONPATH", "")]))
    env = {
        **FAST_JOBS_ENV,
        "MBN_DATA_DIR": str(data_dir),
        "MBN_DEMO_MODEL": "false",
        "MBN_METHODS": "toy_method",
        "PYTHONPATH": path,
    }
    with serving(env, data_dir / "server.log", ready=False) as srv:
        yield srv


@pytest.mark.parametrize("method", ["toy-exported", "toy-distilled", "multilevel"])
def test_a_plugged_in_method_trains_and_embeds(server, digits, method):
    x, y = digits
    train, new = x[:1200], x[1200:1210]
    with server.client() as client:
        response = client.post(
            "/train",
            json={
                "name": method,
                "method": method,
                "data": train.tolist(),
                "labels": y[:1200].tolist(),
                "params": {"n_components": 3, "n_clusters": 4}
                if method == "toy-exported"
                else {"n_components": 3, "max_epochs": 3},
            },
        )
        assert response.status_code == 202, response.text
        job = wait_for_job(client, response.json()["id"], {"succeeded", "failed"}, 120)
        assert job["status"] == "succeeded", job
        manifest = client.get(f"/models/{job['model_id']}").json()
        assert manifest["method"] == method
        fast = client.post("/embed", json={"model": method, "inputs": new.tolist()})
        exact = client.post(
            "/embed", json={"model": method, "inputs": new.tolist(), "mode": "exact"}
        )
        assert fast.status_code == exact.status_code == 200, (fast.text, exact.text)
        fast_rows = np.asarray(fast.json()["embeddings"])
        exact_rows = np.asarray(exact.json()["embeddings"])
        assert fast_rows.shape == exact_rows.shape == (10, 3)
        if method == "toy-exported":  # the same map both ways, up to float32 rounding
            np.testing.assert_allclose(fast_rows, exact_rows, rtol=1e-4, atol=1e-3)
            assert len(fast.json()["clusters"]) == 10
        if method == "multilevel":
            # Finite float32 values so far outside the training range that the distilled MLP
            # overflows: a 422 naming the row, not NaN sent back as null with a 200.
            extreme = np.vstack([new[:1], np.full((1, new.shape[1]), 3.4e38)])
            response = client.post("/embed", json={"model": method, "inputs": extreme.tolist()})
            message = assert_error(response, 422, "invalid_input")["message"]
            assert "1 row(s) (1) embed to NaN or infinity in fast mode" in message, message


def test_params_of_another_method_are_refused(server, digits):
    x, _ = digits
    with server.client() as client:
        response = client.post(
            "/train",
            json={
                "method": "toy-exported",
                "data": x[:50].tolist(),
                "params": {"n_clusterings": 5},
            },
        )
        error = assert_error(response, 422)
        assert "n_clusterings" in error["message"] and "toy-exported" in error["message"]
        response = client.post("/train", json={"method": "nope", "data": x[:50].tolist()})
        assert "unknown method 'nope'" in assert_error(response, 422)["message"]


def test_modular_kpca_trains_and_serves_both_paths(server, digits):
    # A built-in method beside MBN: the same routes, no special case.
    x, y = digits
    train, new = x[:800], x[1200:1210]
    params = {"n_modules": 3, "module_dim": 4, "n_landmarks": 80, "max_epochs": 10}
    with server.client() as client:
        response = client.post(
            "/train",
            json={
                "name": "mkpca",
                "method": "modular_kpca",
                "data": train.tolist(),
                "labels": y[:800].tolist(),
                "params": params,
            },
        )
        assert response.status_code == 202, response.text
        job = wait_for_job(client, response.json()["id"], {"succeeded", "failed"}, 120)
        assert job["status"] == "succeeded", job
        manifest = client.get(f"/models/{job['model_id']}").json()
        assert manifest["method"] == "modular_kpca"
        assert manifest["fast_path"] == "exported"
        assert manifest["hyperparameters"]["modular_kpca"]["n_modules"] == 3
        assert manifest["fidelity"]["r2"] > 0.9999
        assert manifest["quality"]
        fast = client.post("/embed", json={"model": "mkpca", "inputs": new.tolist()})
        exact = client.post(
            "/embed", json={"model": "mkpca", "inputs": new.tolist(), "mode": "exact"}
        )
        assert fast.status_code == exact.status_code == 200, (fast.text, exact.text)
        fast_rows = np.asarray(fast.json()["embeddings"])
        exact_rows = np.asarray(exact.json()["embeddings"])
        assert fast_rows.shape == exact_rows.shape == (10, 12)
        np.testing.assert_allclose(fast_rows, exact_rows, atol=1e-4 * np.abs(exact_rows).max())
        bad = client.post(
            "/train",
            json={"method": "modular_kpca", "data": train[:50].tolist(),
                  "params": {"diversity": 2.0}},
        )  # fmt: skip
        assert "diversity" in assert_error(bad, 422)["message"]
