"""Optional API keys."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from servicetest import assert_error

from service.auth import ApiKeys
from service.errors import Unauthorized

KEY = "first-key-0123456789"
OTHER = "second-key-0123456789"


def test_api_keys_unit() -> None:
    keys = ApiKeys([SecretStr(KEY), SecretStr(OTHER)])
    assert keys.enabled
    keys.check(f"Bearer {KEY}")
    keys.check(f"bearer {OTHER}")
    for header in (None, "", KEY, f"Basic {KEY}", "Bearer ", f"Bearer {KEY}x", "Bearer x"):
        with pytest.raises(Unauthorized):
            keys.check(header)
    ApiKeys([]).check(None)  # no keys configured: open


def test_routes_need_a_key_except_health(
    api: Callable[..., TestClient], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client = api(api_keys=f"{KEY},{OTHER}")
    row = {"inputs": [[0.0] * 64]}
    protected = [
        ("POST", "/embed", row),
        ("POST", "/train", {"data": [[1.0]] * 30}),
        ("GET", "/jobs", None),
        ("GET", "/jobs/" + "0" * 32, None),
        ("POST", "/jobs/" + "0" * 32 + "/cancel", None),
        ("GET", "/models", None),
        ("GET", "/models/m-digits", None),
        ("DELETE", "/models/m-digits", None),
        ("GET", "/metrics", None),
    ]
    for method, path, body in protected:
        for headers in ({}, {"Authorization": "Bearer wrong-key-0123456789"}):
            response = client.request(method, path, json=body, headers=headers)
            assert_error(response, 401, "unauthorized")
            assert response.headers["www-authenticate"] == "Bearer"
    assert (client.get("/models/m-digits").status_code) == 401  # not deleted
    good = {"Authorization": f"Bearer {OTHER}"}
    assert client.post("/embed", json=row, headers=good).status_code == 200
    assert client.get("/metrics", headers=good).status_code == 200
    assert client.get("/health/live").status_code == 200
    assert client.get("/health/ready").status_code == 200
    assert client.get("/openapi.json").status_code == 200
    assert KEY not in caplog.text and OTHER not in caplog.text


def test_metrics_can_be_left_open(api: Callable[..., TestClient]) -> None:
    client = api(api_keys=KEY, metrics_require_key=False)
    assert client.get("/metrics").status_code == 200
    assert_error(client.get("/models"), 401)
