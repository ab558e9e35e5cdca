"""Backpressure over HTTP: body limits and /embed's admission (``service.limits``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from servicetest import assert_error, wait_for

from service.config import Settings


def test_inflight_rows_not_below_the_batch_limit() -> None:
    with pytest.raises(ValueError, match="MBN_MAX_INFLIGHT_ROWS"):
        Settings(max_inflight_rows=10, max_rows_per_request=100)


def test_declared_body_size_is_checked_before_reading(api: Callable[..., TestClient]) -> None:
    client = api(max_body_bytes=2048)
    response = client.post(
        "/embed", content=b"x" * 4096, headers={"content-type": "application/json"}
    )
    assert_error(response, 413, "payload_too_large")


def test_streamed_body_size_is_checked_while_reading(api: Callable[..., TestClient]) -> None:
    client = api(max_body_bytes=2048)

    def chunks():  # no Content-Length: chunked transfer
        for _ in range(8):
            yield b"[" * 512

    response = client.post("/embed", content=chunks(), headers={"content-type": "application/json"})
    assert_error(response, 413, "payload_too_large")


def test_training_uploads_get_their_own_limit(api: Callable[..., TestClient]) -> None:
    client = api(max_body_bytes=2048, max_upload_bytes=8192)
    rows = [[float(i), 1.0] for i in range(200)]  # about 2.4 kB of JSON, 1.8 kB as CSV
    csv = "\n".join(f"{a},{b}" for a, b in rows).encode()
    assert client.post("/train", files={"file": ("d.csv", csv)}).status_code == 202
    assert_error(client.post("/train", files={"file": ("d.csv", csv * 6)}), 413)
    # JSON rows become Python objects first: they are held to the body limit.
    assert_error(client.post("/train", json={"data": rows}), 413)
    assert_error(client.post("/embed", json={"inputs": rows}), 413)


def test_readiness_is_503_while_every_embed_slot_stays_taken(
    api: Callable[..., TestClient],
) -> None:
    """Readiness said 200 while every /embed was refused: a replica that refuses all new
    work is not ready for more of it."""
    client = api(max_inflight_requests=2, saturated_after_seconds=0.2)
    wait_for(lambda: client.get("/health/ready").status_code == 200, 30, "ready")
    budget = client.app.state.row_budget  # type: ignore[attr-defined]
    with budget.request(), budget.request():  # both slots held, as by two long requests
        assert_error(client.post("/embed", json={"inputs": [[0.0] * 64]}), 429)
        answer = wait_for(
            lambda: (r := client.get("/health/ready")).status_code == 503 and r, 30, "503"
        )
        message = assert_error(answer, 503)["message"]
        assert "MBN_MAX_INFLIGHT_REQUESTS=2" in message
    wait_for(lambda: client.get("/health/ready").status_code == 200, 30, "ready again")


def test_a_body_is_read_before_it_takes_a_slot(api: Callable[..., TestClient]) -> None:
    """The in-flight slot is taken once the body is in: a request whose body is still
    arriving holds no slot, so one slot serves the next complete request."""
    client = api(max_inflight_requests=1)
    budget = client.app.state.row_budget  # type: ignore[attr-defined]
    taken: list[int] = []
    original = budget.request

    def watching_request():  # type: ignore[no-untyped-def]
        taken.append(budget.buffered_bytes)  # bytes still held at the moment of admission
        return original()

    budget.request = watching_request
    body = b'{"inputs": [' + b",".join([b"[" + b"0.5," * 63 + b"0.5]"] * 50) + b"]}"

    def chunks():  # type: ignore[no-untyped-def]
        for start in range(0, len(body), 1000):
            yield body[start : start + 1000]

    answer = client.post("/embed", content=chunks(), headers={"content-type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert taken == [len(body)]  # admitted with the whole body read, not before
    assert budget.buffered_bytes == 0


def test_bodies_being_read_are_bounded_in_bytes(api: Callable[..., TestClient]) -> None:
    client = api(max_body_bytes=4096, max_buffered_body_bytes=4096)
    budget = client.app.state.row_budget  # type: ignore[attr-defined]
    with budget.buffering() as earlier:
        asyncio.run(earlier.add(b" " * 4000))  # an earlier body's bytes, still arriving
        answer = client.post("/embed", json={"inputs": [[0.0] * 64]})
    assert_error(answer, 429, "overloaded")
    assert budget.buffered_bytes == 0
    assert client.post("/embed", json={"inputs": [[0.0] * 64]}).status_code == 200
