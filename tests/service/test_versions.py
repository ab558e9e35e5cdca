"""Aligned versions through the real app: align_to checked at submission, compare."""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import numpy as np
import pytest
import scipy.sparse as sp
from digits_data import Digits
from fastapi.testclient import TestClient
from servicetest import assert_error, wait_for_job
from small_models import FOLLOWING_PARAMS


def _train(client: TestClient, x: np.ndarray, seed: int, **extra) -> object:
    return client.post(
        "/train",
        json={"name": "digits", "data": x.tolist(),
              "params": {**FOLLOWING_PARAMS, "random_state": seed}, **extra},
    )  # fmt: skip


def test_align_to_is_checked_at_submission(api: Callable[..., TestClient], digits: Digits) -> None:
    client = api()  # m-digits: 64 -> 10, saved without reference rows
    x = digits[0][:200]
    assert_error(_train(client, x, 0, align_to="nope"), 404, "not_found")
    narrow = x[:, :5]
    error = assert_error(_train(client, narrow, 0, align_to="digits"), 422)
    assert "64 features" in error["message"]
    wide = client.post(
        "/train",
        json={"name": "d", "data": x.tolist(), "align_to": "m-digits",
              "params": {**FOLLOWING_PARAMS, "n_components": 3}},
    )  # fmt: skip
    assert "10 dimensions" in assert_error(wide, 422)["message"]
    # Sparse input keeps no reference rows: refused at submission, not by the job.
    buffer = io.BytesIO()
    sp.save_npz(buffer, sp.random(50, 64, density=0.3, random_state=0, format="csr"))
    sparse = client.post(
        "/train",
        files={"file": ("s.npz", buffer.getvalue())},
        data={"align_to": "m-digits", "params": json.dumps({"input_scaling": "none"})},
    )
    assert "sparse input is not supported" in assert_error(sparse, 422)["message"]
    # A damaged model: its files changed on disk (the scan verifies them again).
    registry = client.app.state.registry
    path = registry.get("m-digits").path
    with (path / "compressor.onnx").open("ab") as handle:
        handle.write(b"tampered")
    registry.rescan()
    assert_error(_train(client, x, 0, align_to="m-digits"), 409)
    assert client.get("/jobs").json()["jobs"] == []  # nothing was queued


@pytest.mark.slow
def test_aligned_version_end_to_end(api: Callable[..., TestClient], digits: Digits) -> None:
    client = api(models=False, embedded_worker=True)
    x, held_out = digits[0][:1500], digits[0][1500:]
    first = wait_for_job(client, _train(client, x, 0).json()["id"], {"succeeded", "failed"}, 300)
    assert first["status"] == "succeeded", first
    response = _train(client, x, 1, align_to="digits")
    assert (
        response.status_code == 202 and response.json()["params"]["align_to"] == first["model_id"]
    )
    second = wait_for_job(client, response.json()["id"], {"succeeded", "failed"}, 300)
    assert second["status"] == "succeeded", second
    plain = wait_for_job(client, _train(client, x, 1).json()["id"], {"succeeded", "failed"}, 300)
    a, b, c = first["model_id"], second["model_id"], plain["model_id"]

    manifest = client.get(f"/models/{b}").json()
    assert manifest["alignment"]["reference_model"] == a
    aligned = client.get(f"/models/{b}/compare/{a}").json()
    unaligned = client.get(f"/models/{c}/compare/{a}").json()
    assert aligned["b"]["id"] == a and aligned["a"]["aligned_to"] == a
    assert aligned["exact"] is not None  # the aligned version keeps a's reference rows
    assert aligned["fast"]["cosine_median"] > unaligned["fast"]["cosine_median"] + 0.3
    assert aligned["fast"]["knn_overlap"] == pytest.approx(
        unaligned["fast"]["knn_overlap"], abs=0.05
    )

    def embed(model: str, mode: str) -> np.ndarray:
        body = client.post("/embed", json={"model": model, "inputs": held_out.tolist(),
                                           "mode": mode}).json()  # fmt: skip
        return np.array(body["embeddings"])

    for mode in ("fast", "exact"):
        old, new = embed(a, mode), embed(b, mode)
        cosine = (
            np.sum(old * new, axis=1) / np.linalg.norm(old, axis=1) / np.linalg.norm(new, axis=1)
        )
        assert np.median(cosine) > 0.8, mode
    assert client.get(f"/models/{a}/compare/nope").status_code == 404
