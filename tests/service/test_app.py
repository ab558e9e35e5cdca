"""The app factory and its lifespan: the documented API, embedded worker, clean shutdown."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from digits_data import Digits
from fastapi.testclient import TestClient
from servicetest import LONG_PARAMS, assert_error, make_settings, running_app, wait_for_progress

from service.jobs import JobStore


def test_openapi_documents_the_contract(api: Callable[..., TestClient]) -> None:
    document = api().get("/openapi.json").json()
    assert {
        (method.upper(), path) for path, item in document["paths"].items() for method in item
    } == {
        ("POST", "/embed"),
        ("POST", "/train"),
        ("GET", "/jobs"),
        ("GET", "/jobs/{job_id}"),
        ("POST", "/jobs/{job_id}/cancel"),
        ("GET", "/models"),
        ("GET", "/models/{model_id}"),
        ("DELETE", "/models/{model_id}"),
        ("POST", "/models/{model_id}/promote"),
        ("GET", "/models/{model_id}/map"),
        ("POST", "/models/{model_id}/map/locate"),
        ("GET", "/models/{model_id}/monitor"),
        ("GET", "/models/{model_a}/compare/{model_b}"),
        ("GET", "/health/live"),
        ("GET", "/health/ready"),
        ("GET", "/exact/runtime"),
        ("GET", "/metrics"),
    }
    train = document["paths"]["/train"]["post"]
    assert set(train["requestBody"]["content"]) == {"application/json", "multipart/form-data"}
    assert "202" in train["responses"] and "429" in train["responses"]
    embed = document["paths"]["/embed"]["post"]
    assert embed["requestBody"]["content"]["application/json"]["schema"]["title"] == (
        "EmbedRequest"
    )
    assert "ErrorResponse" in document["components"]["schemas"]
    # A bearer scheme, so /docs can send a key; health stays open.
    assert document["components"]["securitySchemes"]["ApiKey"] == {
        "type": "http",
        "scheme": "bearer",
        "description": document["components"]["securitySchemes"]["ApiKey"]["description"],
    }
    # Without keys configured the key is optional ({}), as the server does not check it.
    assert embed["security"] == [{}, {"ApiKey": []}]
    assert "security" not in document["paths"]["/health/ready"]["get"]


def test_openapi_requires_the_key_where_the_server_checks_it(
    api: Callable[..., TestClient],
) -> None:
    document = api(api_keys="first-key-0123456789").get("/openapi.json").json()
    assert document["paths"]["/embed"]["post"]["security"] == [{"ApiKey": []}]
    assert document["paths"]["/models/{model_id}/map"]["get"]["security"] == [{"ApiKey": []}]
    assert document["paths"]["/metrics"]["get"]["security"] == [{"ApiKey": []}]
    # Unless MBN_METRICS_REQUIRE_KEY is off: then /metrics is open and says so.
    document = (
        api(api_keys="first-key-0123456789", metrics_require_key=False).get("/openapi.json").json()
    )
    assert document["paths"]["/metrics"]["get"]["security"] == [{}, {"ApiKey": []}]
    assert document["paths"]["/embed"]["post"]["security"] == [{"ApiKey": []}]


@pytest.mark.parametrize(
    ("method", "path"), [("POST", "/train/"), ("GET", "/models/"), ("GET", "/jobs/")]
)
def test_trailing_slashes_are_404_not_307(
    api: Callable[..., TestClient], method: str, path: str
) -> None:
    response = api().request(method, path, follow_redirects=False)
    assert_error(response, 404, "not_found")


@pytest.mark.slow
def test_shutdown_gives_the_running_job_back(
    tmp_path: Path, digits: Digits, write_bundle: Callable[..., Path]
) -> None:
    settings = make_settings(tmp_path / "data", embedded_worker=True)
    with running_app(settings, write_bundle) as client:
        job_id = client.post(
            "/train", json={"data": digits[0].tolist(), "params": LONG_PARAMS}
        ).json()["id"]
        wait_for_progress(client, job_id)
    # The lifespan ended (the event): its worker stopped the training and released the job,
    # without counting the attempt, for the next server (or another replica) to run.
    store = JobStore(settings.db_url)
    try:
        job = store.require(job_id)
        assert (job.status, job.attempts, job.worker_id) == ("queued", 0, None)
    finally:
        store.dispose()
    assert (settings.jobs_path / job_id).exists()  # its data stays for the next run
