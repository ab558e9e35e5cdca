"""GET /models, GET /models/{model}, DELETE /models/{model_id}."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient
from servicetest import assert_error, wait_for


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
        }
    ]
    manifest = client.get("/models/m-digits").json()
    assert manifest["id"] == "m-digits" and manifest["format"] == "mbn-bundle"
    quality = manifest["quality"]  # the label-free report, PCA's beside the model's
    assert quality["n_neighbors"] == 10
    assert {"trustworthiness", "continuity"} <= set(quality["exact"]) & set(quality["pca"])
    assert client.get("/models/digits").json() == manifest  # by name too

    # A bundle written by someone else (another replica's worker) shows up.
    write_bundle(models_path, "m-later", "later", created="2999-01-01T00:00:00Z")
    listing = wait_for(
        lambda: (listing := client.get("/models").json())["default"] == "m-later" and listing,
        timeout=10,
        what="the new bundle to be picked up (rescans are rate-limited)",
    )
    assert [m["id"] for m in listing["models"]] == ["m-later", "m-digits"]
    assert listing["default"] == "m-later"

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
    for ref in ("nope", "..", "%2e%2e", "..%2F..%2Fetc", "digits"):
        assert_error(client.delete(f"/models/{ref}"), 404)  # "digits" is a name, not an id
    assert (models_path / "m-digits").exists()
    for ref in ("nope", "%2e%2e", "..%2Fdata"):
        assert_error(client.get(f"/models/{ref}"), 404)
