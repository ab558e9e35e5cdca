"""One error shape for every error, whoever raised it."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from servicetest import assert_error

from service.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    ServiceError,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
    install_error_handlers,
)


@pytest.fixture
def client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)
    errors: dict[str, ServiceError] = {
        "invalid": InvalidInput("bad"),
        "unauthorized": Unauthorized("who"),
        "missing": NotFound("gone"),
        "conflict": Conflict("state"),
        "large": PayloadTooLarge("big"),
        "media": UnsupportedMediaType("type"),
        "busy": Overloaded("busy", retry_after=4),
        "down": Unavailable("down", retry_after=9),
    }

    @app.get("/raise/{name}")
    def raise_error(name: str) -> None:
        if name == "bug":
            raise RuntimeError("secret internals")
        raise errors[name]

    @app.get("/typed/{number}")
    def typed(number: int) -> int:
        return number

    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize(
    ("name", "status", "error_type", "header"),
    [
        ("invalid", 422, "invalid_input", None),
        ("unauthorized", 401, "unauthorized", ("www-authenticate", "Bearer")),
        ("missing", 404, "not_found", None),
        ("conflict", 409, "conflict", None),
        ("large", 413, "payload_too_large", None),
        ("media", 415, "unsupported_media_type", None),
        ("busy", 429, "overloaded", ("retry-after", "4")),
        ("down", 503, "unavailable", ("retry-after", "9")),
    ],
)
def test_service_errors(
    client: TestClient, name: str, status: int, error_type: str, header: tuple | None
) -> None:
    response = client.get(f"/raise/{name}")
    assert_error(response, status, error_type)
    if header is not None:
        assert response.headers[header[0]] == header[1]


def test_framework_errors_have_the_same_shape(client: TestClient) -> None:
    assert_error(client.get("/no/such/path"), 404, "not_found")
    assert_error(client.post("/typed/1"), 405, "method_not_allowed")
    error = assert_error(client.get("/typed/abc"), 422, "invalid_input")
    assert "number" in error["message"]


def test_bugs_are_500_without_details(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    error = assert_error(client.get("/raise/bug"), 500, "internal_error")
    assert "secret" not in error["message"]
    assert "secret internals" in caplog.text  # ... but the log has them


def test_the_service_uses_the_shape(api: Callable[..., TestClient]) -> None:
    client = api()
    assert_error(client.get("/nowhere"), 404, "not_found")
    assert_error(client.put("/embed"), 405, "method_not_allowed")


def test_every_domain_error_has_its_status() -> None:
    # The domain (store, registry, submitter, handlers) raises errors that carry no status;
    # every one of them has its status in service/errors.py's one table (test_service_layers.py
    # checks that nothing else picks one).
    import service.domain as domain
    from service.errors import STATUS

    kinds = [
        value
        for value in vars(domain).values()
        if isinstance(value, type) and issubclass(value, domain.ServiceError)
    ]
    assert set(kinds) - {domain.ServiceError} == set(STATUS)
