"""GET /models, GET /models/{model}, DELETE /models/{model_id}."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from servicetest import assert_error, wait_for

from mbn_core.bundle import EXACT_FILE


def test_list_get_delete(api: Callable[..., TestClient], write_bundle: Callable[..., Path]) -> None:
    client = api()
    models_path = client.app.state.settings.models_path  # type: ignore[attr-defined]
    listing = client.get("/models").json()
    assert listing["default"] == "m-digits"
    assert listing["models"] == [
        {
            "id": "m-digits",
            "name": "digits",
            "created": listing["models"][0]["created"],
            "input_dim": 64,
            "output_dim": 10,
            "n_clusters": 10,
            "default": True,
            "current": True,
            "state": "ready",
            "problem": None,
        }
    ]
    assert listing["default_source"] == "auto"
    manifest = client.get("/models/m-digits").json()
    assert manifest["id"] == "m-digits" and manifest["format"] == "mbn-bundle"
    quality = manifest["quality"]  # the label-free report, PCA's beside the model's
    assert quality["n_neighbors"] == 10
    assert {"trustworthiness", "continuity"} <= set(quality["exact"]) & set(quality["pca"])
    assert client.get("/models/digits").json() == manifest  # by name too

    # A bundle written by someone else (another replica's worker) shows up.
    write_bundle(models_path, "m-later", "later", created="2999-01-01T00:00:00Z")
    listing = wait_for(
        lambda: (
            (listing := client.get("/models").json())["models"][0]["id"] == "m-later" and listing
        ),
        timeout=10,
        what="the new bundle to be picked up (rescans are rate-limited)",
    )
    assert [m["id"] for m in listing["models"]] == ["m-later", "m-digits"]
    assert listing["default"] == "m-digits"  # a newer model moves nothing

    response = client.delete("/models/m-later")
    assert response.status_code == 204 and response.content == b""
    assert not (models_path / "m-later").exists()
    assert_error(client.get("/models/m-later"), 404, "not_found")
    assert_error(client.delete("/models/m-later"), 404, "not_found")
    assert client.get("/models").json()["default"] == "m-digits"
    assert client.post("/embed", json={"inputs": [[0.0] * 64]}).json()["model"] == "m-digits"


def test_unknown_and_hostile_model_refs(api: Callable[..., TestClient], tmp_path: Path) -> None:
    client = api()
    models_path = client.app.state.settings.models_path  # type: ignore[attr-defined]
    for ref in ("nope", "%2e%2e", "..%2F..%2Fetc", "digits"):
        assert_error(client.delete(f"/models/{ref}"), 404)  # "digits" is a name, not an id
    # The client resolves "/models/.." to "/", the console's redirect, which deletes nothing.
    assert_error(client.delete("/models/.."), 405)
    assert (models_path / "m-digits").exists()
    for ref in ("nope", "%2e%2e", "..%2Fdata"):
        assert_error(client.get(f"/models/{ref}"), 404)


def test_promote_and_forced_delete_over_http(
    api: Callable[..., TestClient], write_bundle: Callable[..., Path]
) -> None:
    client = api()
    models_path = client.app.state.settings.models_path  # type: ignore[attr-defined]
    write_bundle(models_path, "m-v2", "digits", created="2999-01-01T00:00:00Z")
    row = {"inputs": [[0.0] * 64]}
    assert client.get("/models/m-v2").status_code == 200  # an id is found at once
    assert client.post("/embed", json={**row, "model": "digits"}).json()["model"] == "m-digits"
    assert client.post("/embed", json=row).json()["model"] == "m-digits"

    promoted = client.post("/models/m-v2/promote", params={"default": "false"})
    assert promoted.status_code == 200 and promoted.json()["current"] is True
    assert client.post("/embed", json={**row, "model": "digits"}).json()["model"] == "m-v2"
    assert client.post("/embed", json=row).json()["model"] == "m-digits"
    assert client.post("/models/m-v2/promote").json()["default"] is True
    assert client.post("/embed", json=row).json()["model"] == "m-v2"
    assert client.get("/models").json()["default_source"] == "promoted"

    error = assert_error(client.delete("/models/m-v2"), 409, "conflict")
    assert "default model" in error["message"]
    assert_error(client.post("/models/nope/promote"), 404, "not_found")
    assert client.delete("/models/m-v2", params={"force": "true"}).status_code == 204
    listing = client.get("/models").json()
    assert listing["default"] == "m-digits" and listing["default_source"] == "auto"


@pytest.mark.slow  # starts the exact runtime (a process): seconds; the full suite runs it
def test_a_tampered_exact_model_is_a_clear_409_and_shows_in_models(
    api: Callable[..., TestClient], caplog: pytest.LogCaptureFixture
) -> None:
    client = api()
    models_path = client.app.state.settings.models_path  # type: ignore[attr-defined]
    exact = models_path / "m-digits" / EXACT_FILE
    good = exact.read_bytes()
    row = {"inputs": [[0.0] * 64]}
    assert client.post("/embed", json=row).status_code == 200  # loaded (fast path only)
    exact.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])

    with caplog.at_level(logging.ERROR, logger="service.registry"):
        error = assert_error(client.post("/embed", json={**row, "mode": "exact"}), 409, "conflict")
    assert "failed verification" in error["message"]
    assert f"{EXACT_FILE}: SHA-256 does not match the manifest" in error["message"]
    assert str(models_path) not in error["message"] and "/" not in error["message"]
    assert "failed verification" in caplog.text  # logged, with the server's path
    # Out of service in every mode until repaired, and listed with the reason.
    assert_error(client.post("/embed", json=row), 503, "unavailable")
    assert_error(client.post("/embed", json={**row, "model": "digits"}), 409, "conflict")
    # Readiness is re-checked beside the traffic every half second: wait for it to see the damage.
    wait_for(lambda: client.get("/health/ready").status_code == 503, 30, "not ready")
    assert_error(client.get("/health/ready"), 503)
    [model] = client.get("/models").json()["models"]
    assert (model["id"], model["state"]) == ("m-digits", "damaged")
    assert EXACT_FILE in model["problem"]

    # Repaired in place: served again after the next scan, the directory untouched.
    with exact.open("r+b") as handle:
        handle.write(good)
    wait_for(
        lambda: client.post("/embed", json={**row, "mode": "exact"}).status_code == 200,
        timeout=10,
        what="the repaired model to be served again",
    )
    assert client.get("/models").json()["models"][0]["state"] == "ready"


def test_delete_by_name_says_to_use_the_id(api: Callable[..., TestClient]) -> None:
    """DELETE /models/digits answered "no model 'digits'" while GET /models/digits and
    /embed accept the name."""
    client = api()
    assert client.get("/models/digits").status_code == 200
    message = assert_error(client.delete("/models/digits"), 404, "not_found")["message"]
    assert "is a name" in message and "'m-digits'" in message and "model id" in message
    assert client.get("/models/digits").status_code == 200  # nothing was deleted
