"""Requests an attacker would send, over real HTTP to ``mbn serve``: each one is a clear 4xx,
never a 500, and the connection stays usable (a 500 made uvicorn drop it without saying so).
"""

from __future__ import annotations

import http.client
import io
import json
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from servicetest import FAST_JOBS_ENV, TINY_PARAMS, Server, assert_error, serving

# Slow: a real mbn serve process, attacked over raw HTTP.
pytestmark = pytest.mark.slow

ROW = [0.0] * 64
TRAIN_BYTES = 64 << 20
MIB = 1 << 20


@pytest.fixture(scope="module")
def server(digits_data_dir: Callable[[str], Path]) -> Iterator[Server]:
    data_dir = digits_data_dir("hostile")
    env = {
        **FAST_JOBS_ENV,
        "MBN_DATA_DIR": str(data_dir),
        "MBN_DEMO_MODEL": "false",
        "MBN_EMBEDDED_WORKER": "false",
        "MBN_MAX_TRAIN_BYTES": str(TRAIN_BYTES),
    }
    with serving(env, data_dir / "server.log", ready=False, clean_log=True) as srv:
        yield srv


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


def _post_raw(client: httpx.Client, path: str, body: bytes) -> httpx.Response:
    return client.post(path, content=body, headers={"content-type": "application/json"})


def _twice_on_one_connection(server: Server, body: bytes) -> tuple[int, dict]:
    """POST ``body`` to /embed, then a valid request on the same connection: the first
    answer's status and error, after checking that the connection was kept (an unhandled
    error made uvicorn drop it without a ``Connection: close``)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        headers = {"content-type": "application/json"}
        connection.request("POST", "/embed", body=body, headers=headers)
        first = connection.getresponse()
        status, error = first.status, json.loads(first.read())
        assert not first.will_close, first.getheaders()
        connection.request("POST", "/embed", body=json.dumps({"inputs": [ROW]}), headers=headers)
        second = connection.getresponse()
        assert second.status == 200, second.read()
        second.read()
    finally:
        connection.close()
    return status, error


@pytest.mark.parametrize("depth", [100, 990, 5000, 100_000])
def test_deeply_nested_json_is_a_422(server: Server, depth: int) -> None:
    body = b'{"inputs": ' + b"[" * depth + b"]" * depth + b"}"
    status, error = _twice_on_one_connection(server, body)
    assert status == 422 and error["error"]["type"] == "invalid_input", error


@pytest.mark.parametrize("depth", [990, 100_000])
def test_deeply_nested_train_params_are_a_422(client: httpx.Client, depth: int) -> None:
    body = b'{"name": "x", "data": [[1], [2]], "params": ' + b"[" * depth + b"]" * depth + b"}"
    assert_error(_post_raw(client, "/train", body), 422, "invalid_input")


@pytest.mark.parametrize(
    "body",
    [
        b'{"\xff\xfe": 1, "inputs": [[0]]}',
        b'{"inputs": [[0]], "mo\xc3del": "x"}',
        b'{"model": "\xed\xa0\x80", "inputs": [[0]]}',  # an encoded surrogate
    ],
)
def test_invalid_utf8_is_a_422_and_the_connection_stays(server: Server, body: bytes) -> None:
    status, error = _twice_on_one_connection(server, body)
    assert status == 422 and error["error"]["type"] == "invalid_input", error


@pytest.mark.parametrize(
    "body",
    [
        b'{"inputs": [[0]], "model": "m-digits", "model": "digits"}',
        b'{"inputs": [[0]], "inputs": [[0], [0]]}',
        b'{"inputs_b64": "AAAAAA==", "dim": 1, "dim": 2}',
        b'{"mode": "fast", "inputs": [[0.5]], "mode": "exact"}',
        b'{"inputs": [[0, 1]], "mode": "fast", "mode": "fast"}',
    ],
)
def test_duplicate_keys_are_refused_on_embed(client: httpx.Client, body: bytes) -> None:
    error = assert_error(_post_raw(client, "/embed", body), 422, "invalid_input")
    assert "twice" in error["message"]


def test_duplicate_keys_are_refused_on_train(client: httpx.Client) -> None:
    raw = (
        b'{"name": "dup", "data": [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]], '
        b'"params": {"n_clusterings": 5, "n_clusterings": 6}}'
    )
    error = assert_error(_post_raw(client, "/train", raw), 422, "invalid_input")
    assert "'n_clusterings' twice" in error["message"]


@pytest.mark.parametrize(
    ("path", "headers", "fragment"),
    [
        # Nothing inflates bodies: taken as they are, compressed ones were read as plain.
        ("/embed", {"content-type": "application/json", "content-encoding": "gzip"}, "gzip"),
        (
            "/train",
            {"content-type": "multipart/form-data; boundary=x", "content-encoding": "br"},
            "'br'",
        ),
        # JSON is UTF-8: a body declared as another charset was parsed as UTF-8 anyway.
        ("/embed", {"content-type": "application/json; charset=utf-16"}, "UTF-8"),
        ("/train", {"content-type": "application/json;charset=latin-1"}, "application/json"),
    ],
)
def test_bodies_the_service_cannot_read_as_sent_are_415(
    client: httpx.Client, path: str, headers: dict, fragment: str
) -> None:
    response = client.post(path, content=b'{"inputs": [[0.5]]}', headers=headers)
    error = assert_error(response, 415, "unsupported_media_type")
    assert fragment in error["message"]
    # What still reads as JSON: UTF-8 named either way, and ASCII (a subset).
    for content_type in (
        "application/json; charset=UTF-8",
        'application/json; charset="utf8"',
        "application/json; charset=us-ascii",
    ):
        ok = client.post(
            "/embed", content=b'{"inputs": [[0.5]]}', headers={"content-type": content_type}
        )
        assert ok.status_code != 415, ok.text


def test_content_encoding_is_refused_after_the_body_and_only_with_one(
    client: httpx.Client,
) -> None:
    # Every Content-Encoding line is read ("identity" first hid a second "gzip" line).
    body = b'{"inputs": [[0.5]]}'
    headers = [("content-type", "application/json"), ("content-encoding", "identity"),
               ("content-encoding", "gzip")]  # fmt: skip
    error = assert_error(client.post("/embed", content=body, headers=headers), 415)
    assert "'gzip'" in error["message"]
    # Identity is no coding, and a request without a body has nothing to decode.
    plain = client.post("/embed", content=body, headers={**dict(headers[:2])})
    assert plain.status_code != 415, plain.text
    assert client.get("/health/live", headers={"content-encoding": "gzip"}).status_code == 200
    # A large refused body is read to its end first: the 415 arrives whole, no reset.
    large = b"x" * 3_000_000
    refused = client.post(
        "/embed",
        content=large,
        headers={"content-type": "application/json", "content-encoding": "br"},
    )
    assert refused.status_code == 415


def test_a_huge_unknown_key_is_not_echoed_back(client: httpx.Client) -> None:
    # The 422 names the key, shortened: a 2 MB key came back whole before.
    key = "k" * 2_000_000
    body = b'{"inputs": [[0.5]], "' + key.encode() + b'": 1}'
    response = _post_raw(client, "/embed", body)
    error = assert_error(response, 422, "invalid_input")
    assert "(2000000 characters)" in error["message"]
    assert len(response.content) < 2_000


def _npy_header(shape: tuple[int, ...], dtype: str = "<f8") -> bytes:
    """The bytes of an .npy file's header alone: a file that claims ``shape``."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": dtype, "fortran_order": False, "shape": shape}
    )
    return buffer.getvalue()


def test_npy_claiming_a_huge_shape_is_refused_from_its_header(client: httpx.Client) -> None:
    content = _npy_header((10**9, 64)) + b"\0" * 1024  # 1,152 bytes claiming 477 GiB
    assert len(content) == 1152
    response = client.post(
        "/train", files={"file": ("big.npy", content)}, data={"params": json.dumps(TINY_PARAMS)}
    )
    error = assert_error(response, 422, "invalid_input")
    assert "claims shape (1000000000, 64)" in error["message"] and "/" not in error["message"]


def _bomb(rows: int, cols: int) -> bytes:
    """An .npz whose x inflates to rows x cols float64 zeros (about 1000:1)."""
    buffer = io.BytesIO()
    with (
        zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive,
        archive.open("x.npy", "w", force_zip64=True) as member,
    ):
        member.write(_npy_header((rows, cols)))
        zeros = bytes(MIB)
        remaining = rows * cols * 8
        while remaining:
            member.write(zeros[: min(MIB, remaining)])
            remaining -= min(MIB, remaining)
    return buffer.getvalue()


def _rss(server: Server) -> tuple[int, int]:
    """(current, peak) resident set of the server process, bytes (Linux /proc)."""
    assert server.proc is not None
    status = Path(f"/proc/{server.proc.pid}/status").read_text()
    values = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return (int(values["VmRSS"].split()[0]) * 1024, int(values["VmHWM"].split()[0]) * 1024)


def test_uploads_stream_and_bombs_are_refused_in_bounded_memory(server: Server) -> None:
    # Refused from the zip directory's declared size: 160 MB of float64 in a ~160 kB file.
    bomb = _bomb(200_000, 100)
    assert len(bomb) < 2 * MIB
    # A plain upload near the limits, streamed to disk (its shape is over MBN_MAX_TRAIN_BYTES).
    large = _npy_header((60_000, 784)) + bytes(60_000 * 784 * 8)
    idle, peak_before = _rss(server)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        response = client.post("/train", files={"file": ("bomb.npz", bomb)})
        error = assert_error(response, 413, "payload_too_large")
        assert "MBN_MAX_TRAIN_BYTES" in error["message"]
        response = client.post("/train", files={"file": ("large.npy", large)})
        assert_error(response, 413, "payload_too_large")
    _, peak_after = _rss(server)
    # The peak resident set grew by far less than the upload (376 MB) or the bomb (160 MB).
    assert peak_after - max(idle, peak_before) < 300 * MIB, (idle, peak_before, peak_after)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/models/{ref}"),
        ("DELETE", "/models/{ref}"),
        ("POST", "/models/{ref}/promote"),
        ("GET", "/models/{ref}/map"),
        ("GET", "/jobs/{ref}"),
        ("POST", "/jobs/{ref}/cancel"),
    ],
)
def test_a_long_id_is_not_echoed_whole(
    api: Callable[..., TestClient], method: str, path: str
) -> None:
    """GET /models/<60,000 characters> answered with the whole id."""
    client = api()
    ref = "m" * 20_000
    answer = client.request(method, path.format(ref=ref))
    assert 400 <= answer.status_code < 500, answer.text
    assert len(answer.text) < 500, answer.text[:300]


# ---------------------------------------------------------------------- the newer members

HOSTILE_ROWS = [[1e30] * 64, [-3e38] * 64, [3.4e38] * 64, [1e-45] * 64]
ROWS_40 = [[float(i), float(i * i % 7), float(i % 3)] for i in range(40)]
LIST_VALUES = [
    [], [0], [-1], [2**63], [1.5], ["1"], [True], [[1]], [None], [1] * 10_000,
    [200_000, 200_000], {"a": 1}, "256,256", 256,
]  # fmt: skip


def _hostile_bodies() -> Iterator[tuple[str, object]]:
    for mode in ("fast", "exact"):
        for novelty in (True, False, "yes", 1, None):
            yield "/embed", {"inputs": HOSTILE_ROWS, "mode": mode, "return_novelty": novelty}
    yield "/embed", {"inputs": [ROW], "return_novelty": True, "retrun_novelty": True}
    yield "/embed", {"inputs_b64": "AAAA", "dim": int("9" * 400)}
    for scaling in ("standard", "none", "auto", "minmax", "", None, 1, ["standard"]):
        yield "/train", {"data": ROWS_40, "params": {"input_scaling": scaling}}
    for name in ("hidden_layer_sizes", "ks"):
        for value in LIST_VALUES:
            yield "/train", {"data": ROWS_40, "params": {name: value}}
    for align_to in ("m-digits", "digits", "nope", "", "x" * 5000, "../m-digits", "\u0000", 5):
        yield "/train", {"data": ROWS_40, "align_to": align_to}
    yield "/train", {"data": [[1e-41, 1.0], [2e-41, 2.0], [0.0, 3.0], [1e-41, 4.0]] * 3,
                     "params": {"input_scaling": "standard"}}  # fmt: skip
    yield "/train", {"data": ROWS_40[:4], "params": {"report_folds": 5, "n_components": 2}}
    yield "/train", {"data": ROWS_40, "labels": [2**70] * 40}
    yield "/train", {"data": ROWS_40, "labels": "x" * 100_000}
    yield "/train", {"data": ROWS_40, "junk": [[0]] * 100_000}


@pytest.mark.parametrize(("path", "body"), list(_hostile_bodies()))
def test_the_newer_members_and_parameters_are_never_a_500(
    client: httpx.Client, path: str, body: object
) -> None:
    response = client.post(path, json=body)
    assert response.status_code < 500, response.text[:500]
    assert "/tmp" not in response.text and len(response.text) < 5000
    if response.status_code == 202:
        client.post(f"/jobs/{response.json()['id']}/cancel")


@pytest.mark.parametrize(
    "fields",
    [
        {"columns": "c0,c1"}, {"drop": "c0"}, {"columns": "1,2"}, {"columns": "0"},
        {"columns": "c9"}, {"columns": "c0", "drop": "c1"}, {"columns": ","}, {"drop": ""},
        {"columns": "x" * 100_000}, {"columns": ",".join(["c0"] * 5000)},
        {"columns": "\u00e9\u0000"}, {"columns": "99999999999999999999999"},
        {"align_to": "m-digits"}, {"params": '{"input_scaling": "standard"}'},
        {"params": '{"hidden_layer_sizes": [' + ",".join(["1"] * 20) + "]}"},
    ],
)  # fmt: skip
def test_csv_column_choices_are_never_a_500(client: httpx.Client, fields: dict) -> None:
    csv = b"c0,c1,c2\n" + b"".join(b"%d,%d,%d\n" % (i, i * i % 7, i % 5) for i in range(40))
    data = {"params": json.dumps({"n_clusterings": 5, "hidden_layer_sizes": [4]}), **fields}
    response = client.post("/train", files={"file": ("d.csv", csv)}, data=data)
    assert response.status_code < 500, response.text[:500]
    assert "/tmp" not in response.text and len(response.text) < 5000
    if response.status_code == 202:
        client.post(f"/jobs/{response.json()['id']}/cancel")


@pytest.mark.parametrize(
    "path",
    [
        "/models/m-digits/compare/m-digits", "/models/m-digits/compare/nope",
        "/models/nope/compare/m-digits", "/models/%2e%2e/compare/m-digits",
        "/models/m-digits/compare/" + "x" * 20_000, "/models/m-digits/monitor",
        "/models/digits/compare/digits", "/models/m-digits/compare/%00",
    ],
)  # fmt: skip
def test_compare_and_monitor_are_never_a_500(client: httpx.Client, path: str) -> None:
    response = client.get(path)
    assert response.status_code < 500, response.text[:500]
    assert len(response.text) < 5000
