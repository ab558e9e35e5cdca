"""POST /embed through the real app: modes, encodings, clusters, headers, every bad input."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import numpy as np
import pytest
from digits_data import Digits
from fastapi.testclient import TestClient
from servicetest import assert_error, make_settings, running_app

from mbn_core.bundle import load_bundle
from service.main import SWITCH_INTERVAL_SECONDS, configure_interpreter
from service.routes.embed import _ENCODE_ROWS, _json_matrix


@pytest.fixture(scope="module")
def client(
    tmp_path_factory: pytest.TempPathFactory, write_bundle: Callable[..., Path]
) -> Iterator[TestClient]:
    settings = make_settings(
        tmp_path_factory.mktemp("embed"),
        embedded_worker=False,
        max_rows_per_request=50,
        max_body_bytes=64 * 1024,
    )
    with running_app(settings, write_bundle) as client:
        yield client


def b64(x: np.ndarray) -> str:
    return base64.b64encode(x.astype("<f4").tobytes()).decode()


def test_fast_default_model(client: TestClient, digits: Digits) -> None:
    x = digits[0][:7]
    response = client.post("/embed", json={"inputs": x.tolist()})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["model"], body["name"], body["mode"], body["dim"], body["n"]) == (
        "m-digits", "digits", "fast", 10, 7,
    )  # fmt: skip
    bundle = load_bundle(client.app.state.settings.models_path / "m-digits")  # type: ignore[attr-defined]
    np.testing.assert_allclose(body["embeddings"], bundle.embed(x), rtol=1e-6, atol=1e-6)
    assert body["clusters"] == bundle.predict_clusters(x).tolist()
    assert response.headers["x-model-id"] == "m-digits"
    # The model's compute time, milliseconds with three decimals, in both headers.
    compute_ms = response.headers["x-compute-time-ms"]
    assert 0 < float(compute_ms) < 60_000 and len(compute_ms.split(".")[1]) == 3
    assert response.headers["server-timing"] == f"compute;dur={compute_ms}"


def test_exact_mode_matches_the_exact_model_and_is_batch_independent(
    client: TestClient, digits: Digits
) -> None:
    x = digits[0][:5]
    batch = client.post("/embed", json={"inputs": x.tolist(), "mode": "exact"}).json()
    single = client.post("/embed", json={"inputs": x[3:4].tolist(), "mode": "exact"}).json()
    bundle = load_bundle(client.app.state.settings.models_path / "m-digits")  # type: ignore[attr-defined]
    np.testing.assert_allclose(batch["embeddings"], bundle.embed(x, mode="exact"), atol=1e-6)
    assert batch["mode"] == "exact"
    assert single["embeddings"][0] == batch["embeddings"][3]
    assert batch["clusters"] == bundle.predict_clusters(x, mode="exact").tolist()


def test_base64_in_and_out(client: TestClient, digits: Digits) -> None:
    x = digits[0][:9]
    as_json = client.post("/embed", json={"inputs": x.tolist(), "return_clusters": False})
    as_b64 = client.post(
        "/embed", json={"inputs_b64": b64(x), "dim": 64, "encoding_format": "base64"}
    )
    assert as_b64.status_code == 200, as_b64.text
    body = as_b64.json()
    assert "embeddings" not in body and body["n"] == 9
    decoded = np.frombuffer(base64.b64decode(body["embeddings_b64"]), dtype="<f4").reshape(9, 10)
    np.testing.assert_array_equal(decoded, np.array(as_json.json()["embeddings"], np.float32))
    assert "clusters" not in as_json.json()
    # The URL-safe alphabet and escaped characters take the general path, to the same answer.
    raw = x.astype("<f4").tobytes()
    urlsafe = base64.urlsafe_b64encode(raw).decode()
    escaped = json.dumps({"inputs_b64": b64(x), "dim": 64, "encoding_format": "base64"})
    escaped = escaped.replace("/", "\\/")
    assert ("-" in urlsafe or "_" in urlsafe) and "\\/" in escaped
    for response in (
        client.post("/embed", json={"inputs_b64": urlsafe, "dim": 64, "encoding_format": "base64"}),
        client.post("/embed", content=escaped, headers={"content-type": "application/json"}),
    ):
        assert response.status_code == 200, response.text
        assert response.json()["embeddings_b64"] == body["embeddings_b64"]


def test_model_by_id_and_name(client: TestClient, digits: Digits) -> None:
    rows = digits[0][:1].tolist()
    for ref in ("m-digits", "digits"):
        assert client.post("/embed", json={"model": ref, "inputs": rows}).json()["model"] == (
            "m-digits"
        )
    assert_error(client.post("/embed", json={"model": "nope", "inputs": rows}), 404, "not_found")


def test_no_model_is_503_with_retry_after(api: Callable[..., TestClient]) -> None:
    client = api(models=False)
    response = client.post("/embed", json={"inputs": [[1.0] * 64]})
    assert_error(response, 503, "unavailable")
    assert int(response.headers["retry-after"]) > 0


ROW = [0.0] * 64
BAD_BODIES: list[tuple[str, object, int, str]] = [
    ("nan", '{"inputs": [[NaN' + ", 0" * 63 + "]]}", 422, "NaN"),
    ("infinity", '{"inputs": [[Infinity' + ", 0" * 63 + "]]}", 422, "NaN"),
    ("beyond float32", {"inputs": [[1e+39, *ROW[1:]]]}, 422, "float32"),
    ("wrong dimension", {"inputs": [[0.0] * 63]}, 422, "wrong dimension"),
    ("ragged", {"inputs": [ROW, ROW[:-1]]}, 422, "ragged"),
    ("empty batch", {"inputs": []}, 422, "at least 1 item"),
    ("empty row", {"inputs": [[]]}, 422, "at least 1 item"),
    ("string number", {"inputs": [["1", *ROW[1:]]]}, 422, "number"),
    ("boolean", {"inputs": [[True, *ROW[1:]]]}, 422, "number"),
    ("null", {"inputs": [[None, *ROW[1:]]]}, 422, "number"),
    ("nested row", {"inputs": [[[0.0], *ROW[1:]]]}, 422, "number"),
    ("not a list", {"inputs": "abc"}, 422, "array"),
    ("unknown field", {"inputs": [ROW], "extra": 1}, 422, "unknown member 'extra'"),
    ("misspelt field", {"inputs": [ROW], "mdoe": "exact"}, 422, "did you mean 'mode'"),
    ("huge dim", {"inputs_b64": "AAAA", "dim": int("9" * 400)}, 422, "dim: input should be less"),
    ("bad mode", {"inputs": [ROW], "mode": "slow"}, 422, "mode"),
    ("both forms", {"inputs": [ROW], "inputs_b64": "AAAA", "dim": 1}, 422, "exactly one"),
    ("neither form", {"mode": "fast"}, 422, "exactly one"),
    ("base64 without dim", {"inputs_b64": "AAAAAA=="}, 422, "dim"),
    ("dim without base64", {"inputs": [ROW], "dim": 64}, 422, "dim"),
    ("bad base64", {"inputs_b64": "!!!!", "dim": 64}, 422, "base64"),
    ("partial row", {"inputs_b64": base64.b64encode(b"\0" * 20).decode(), "dim": 64}, 422,
     "whole number"),
    ("base64 wrong dim", {"inputs_b64": base64.b64encode(b"\0" * 24).decode(), "dim": 3}, 422,
     "wrong dimension"),
    ("base64 nan", {"inputs_b64": base64.b64encode(np.full(64, np.nan, "<f4").tobytes()).decode(),
                    "dim": 64}, 422, "NaN"),
    ("empty base64", {"inputs_b64": "", "dim": 64}, 422, "empty"),
    ("zero dim", {"inputs_b64": "", "dim": 0}, 422, "dim"),
    ("long model name", {"model": "x" * 201, "inputs": [ROW]}, 422, "model"),
    ("not json", "{inputs: [", 422, "JSON"),
    ("json array", "[1, 2]", 422, "object"),
    ("empty body", "", 422, "empty"),
    ("too many rows", {"inputs": [ROW] * 51}, 413, "at most 50"),
    ("too many base64 rows", {"inputs_b64": b64(np.zeros((51, 64))), "dim": 64}, 413,
     "at most 50"),
    ("body too large", {"inputs": [[0.123456789] * 64] * 200}, 413, "limit"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "status", "message"), [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES]
)
def test_bad_input(
    client: TestClient, digits: Digits, body: object, status: int, message: str
) -> None:
    probe = digits[0][:3].tolist()
    before = client.post("/embed", json={"inputs": probe}).json()
    content = body if isinstance(body, str) else json.dumps(body)
    response = client.post("/embed", content=content, headers={"content-type": "application/json"})
    error = assert_error(response, status)
    assert message.lower() in error["message"].lower(), error
    # Bad input changes nothing.
    assert client.post("/embed", json={"inputs": probe}).json() == before


def _in_exact_mode(body: object) -> object | None:
    """``body`` asking for exact mode, or None for a body that says something of its mode
    already or is no JSON object."""
    if isinstance(body, dict):
        return None if {"mode", "mdoe"} & body.keys() else {**body, "mode": "exact"}
    if isinstance(body, str) and body.startswith('{"inputs"'):
        return '{"mode": "exact", ' + body[1:]
    return None


EXACT_BAD_BODIES = [
    (name, exact, status, message)
    for name, body, status, message in BAD_BODIES
    if (exact := _in_exact_mode(body)) is not None
] + [("unknown model", {"model": "nope", "inputs": [ROW], "mode": "exact"}, 404, "nope")]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [b[1:] for b in EXACT_BAD_BODIES],
    ids=[b[0] for b in EXACT_BAD_BODIES],
)
def test_exact_mode_refuses_bad_input_as_fast_mode_does(
    client: TestClient, body: object, status: int, message: str
) -> None:
    """The exact runtime changes nothing of what /embed refuses, nor of how: the same codes
    and messages as fast mode, and no server path."""
    content = body if isinstance(body, str) else json.dumps(body)
    response = client.post("/embed", content=content, headers={"content-type": "application/json"})
    error = assert_error(response, status)
    assert message.lower() in error["message"].lower(), error
    assert "/tmp" not in response.text and str(Path.home()) not in response.text


def test_wrong_content_type_is_415(client: TestClient) -> None:
    response = client.post(
        "/embed", content=json.dumps({"inputs": [ROW]}), headers={"content-type": "text/plain"}
    )
    assert_error(response, 415, "unsupported_media_type")


def test_json_without_content_type_is_accepted(client: TestClient) -> None:
    response = client.post("/embed", content=json.dumps({"inputs": [ROW]}))
    assert response.status_code == 200, response.text


def test_large_json_answers_are_written_in_slices_with_the_same_bytes() -> None:
    rng = np.random.default_rng(0)
    for n in (0, 1, _ENCODE_ROWS, _ENCODE_ROWS + 1, 3 * _ENCODE_ROWS + 7):
        matrix = rng.standard_normal((n, 10)).astype(np.float32)
        whole = msgspec.json.encode({"embeddings": matrix.tolist()})
        assert msgspec.json.encode({"embeddings": _json_matrix(matrix)}) == whole


def test_serving_asks_for_the_interpreter_lock_after_a_millisecond() -> None:
    before = sys.getswitchinterval()
    try:
        configure_interpreter()
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_SECONDS)
    finally:
        sys.setswitchinterval(before)
