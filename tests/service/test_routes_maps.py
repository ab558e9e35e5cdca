"""GET /models/{id}/map and POST /models/{id}/map/locate, on the real app."""

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from servicetest import MAP_POINTS, assert_error

from mbn_core.bundle import save_bundle
from mbn_core.bundle.embedding_map import MAP_FILE

# Slow: every test serves a model with its map (a layout of the model's embedding).
pytestmark = pytest.mark.slow


@pytest.fixture
def mapped_api(api, tiny_model, digits_map) -> Callable[..., object]:
    """An app with ``m-digits`` (no map) and ``m-mapped`` (a map of 300 training rows)."""

    def start(**settings):
        client = api(**settings)
        models = Path(client.app.state.settings.models_path)
        save_bundle(
            tiny_model,
            models / "m-mapped",
            name="mapped",
            extra_files={MAP_FILE: digits_map.to_bytes()},
            manifest_sections={"map": digits_map.summary()},
        )
        return client

    return start


def test_map_of_a_model(mapped_api, digits_map, digits):
    _, y = digits
    client = mapped_api()
    response = client.get("/models/m-mapped/map")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "m-mapped" and body["name"] == "mapped"
    assert body["method"] == "tsne" and body["color_by"] == "label"
    assert body["n_points"] == MAP_POINTS and body["n_samples"] == len(y)
    for key in ("x", "y", "row", "cluster", "label"):
        assert len(body[key]) == MAP_POINTS, key
    np.testing.assert_allclose(body["x"], digits_map.xy[:, 0], atol=1e-3)
    np.testing.assert_allclose(body["y"], digits_map.xy[:, 1], atol=1e-3)
    assert body["row"] == digits_map.row.tolist()
    assert body["label"] == [str(v) for v in y[digits_map.row]]
    assert body["cluster"] == digits_map.cluster.tolist()
    # By name too (its newest version), like GET /models/{id}.
    assert client.get("/models/mapped/map").json()["model"] == "m-mapped"


def test_locate_places_embeddings_from_embed(mapped_api, digits_map, digits):
    x, _ = digits
    client = mapped_api()
    rows = x[digits_map.row[:3]].tolist()
    embedded = client.post("/embed", json={"model": "m-mapped", "inputs": rows, "mode": "exact"})
    assert embedded.status_code == 200, embedded.text
    response = client.post(
        "/models/m-mapped/map/locate", json={"embeddings": embedded.json()["embeddings"]}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "m-mapped" and len(body["x"]) == len(body["y"]) == 3
    # Training rows of the map land on their own map points.
    np.testing.assert_allclose(body["x"], digits_map.xy[:3, 0], atol=0.05)
    np.testing.assert_allclose(body["y"], digits_map.xy[:3, 1], atol=0.05)


def test_a_model_without_a_map_is_404(mapped_api):
    client = mapped_api()
    error = assert_error(client.get("/models/m-digits/map"), 404, "not_found")
    assert "no stored map" in error["message"]
    locate = client.post("/models/m-digits/map/locate", json={"embeddings": [[0.0] * 10]})
    assert_error(locate, 404, "not_found")
    assert_error(client.get("/models/m-nothing/map"), 404, "not_found")


def test_a_damaged_map_is_404_without_paths(mapped_api, tmp_path):
    client = mapped_api()
    assert client.get("/models/m-mapped").status_code == 200  # loaded, its map not yet read
    map_file = Path(client.app.state.settings.models_path) / "m-mapped" / MAP_FILE
    data = bytearray(map_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    map_file.write_bytes(bytes(data))
    # Refused either by the map read (404) or, once a rescan saw the file change, as a
    # damaged bundle (409); never with a server path.
    response = client.get("/models/m-mapped/map")
    assert response.status_code in (404, 409), response.text
    error = response.json()["error"]
    assert str(tmp_path) not in error["message"] and "/" not in error["message"]


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"embeddings": [[0.0] * 9]}, 422, "10 numbers"),
        ({"embeddings": []}, 422, "embeddings"),
        ({"embeddings": [[]]}, 422, "embeddings"),
        ({"embeddings": [["1"] * 10]}, 422, "embeddings"),
        ({"embeddings": [[0.0] * 10], "extra": 1}, 422, "extra"),
        ({}, 422, "embeddings"),
        # Finite JSON numbers that float32 embeddings cannot hold (a 500 before).
        ({"embeddings": [[1e39] + [0.0] * 9]}, 422, "float32 range"),
        ({"embeddings": [[-1e300] + [0.0] * 9]}, 422, "float32 range"),
    ],
)
def test_locate_refuses_bad_bodies(mapped_api, body, status, fragment):
    client = mapped_api()
    error = assert_error(client.post("/models/m-mapped/map/locate", json=body), status)
    assert fragment in error["message"]


def test_locate_refuses_too_many_rows(mapped_api):
    client = mapped_api(max_rows_per_request=4)
    response = client.post("/models/m-mapped/map/locate", json={"embeddings": [[0.0] * 10] * 5})
    assert_error(response, 413, "payload_too_large")


def test_map_needs_the_key_when_keys_are_set(mapped_api):
    client = mapped_api(api_keys=["secret-key-0123456789"])
    assert_error(client.get("/models/m-mapped/map"), 401, "unauthorized")
    assert_error(client.post("/models/m-mapped/map/locate", json={"embeddings": [[0.0] * 10]}), 401)
    ok = client.get(
        "/models/m-mapped/map", headers={"Authorization": "Bearer secret-key-0123456789"}
    )
    assert ok.status_code == 200


def test_openapi_documents_the_map(mapped_api):
    schema = mapped_api().get("/openapi.json").json()
    get = schema["paths"]["/models/{model_id}/map"]["get"]
    assert get["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ModelMap"
    )
    assert {"401", "404"} <= set(get["responses"])
    post = schema["paths"]["/models/{model_id}/map/locate"]["post"]
    # Published inline (json_body), like /embed's: the body is read by the service's parser.
    assert post["requestBody"]["content"]["application/json"]["schema"]["title"] == "LocateRequest"
    assert "ModelMap" in schema["components"]["schemas"]
