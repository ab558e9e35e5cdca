"""POST /train, GET /jobs, GET /jobs/{id}, POST /jobs/{id}/cancel through the real app.

The app here has no worker, so jobs stay queued (running them is test_worker's and the end
to end tests' business), except in the promote test, which needs the jobs' models.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp
from digits_data import Digits
from fastapi.testclient import TestClient
from servicetest import TINY_PARAMS, assert_error, make_settings, running_app, wait_for

from mbn_core.data.readers import load_training_data
from service.aliases import AliasFile
from service.jobs import JobFiles

LIMITS = {
    "max_queued_jobs": 3,
    "max_train_rows": 1000,
    "max_upload_bytes": 400_000,
    "max_body_bytes": 65_536,
}


@pytest.fixture(scope="module")
def shared(
    tmp_path_factory: pytest.TempPathFactory, write_bundle: Callable[..., Path]
) -> Iterator[TestClient]:
    """One app for the many bad-input cases (which must leave it unchanged)."""
    settings = make_settings(tmp_path_factory.mktemp("jobs"), embedded_worker=False, **LIMITS)
    with running_app(settings, write_bundle) as client:
        yield client


@pytest.fixture
def client(api: Callable[..., TestClient]) -> TestClient:
    return api(**LIMITS)


def stored_data(client: TestClient, job: dict) -> tuple[np.ndarray, np.ndarray | None]:
    files = JobFiles(client.app.state.settings.jobs_path)  # type: ignore[attr-defined]
    return load_training_data(files.path(job["id"], "data.npz"))


def test_train_json_queues_a_job_with_its_data(client: TestClient, digits: Digits) -> None:
    x, y = digits[0][:150], digits[1][:150]
    response = client.post(
        "/train",
        json={"name": "small", "data": x.tolist(), "labels": y.tolist(), "params": TINY_PARAMS},
    )
    assert response.status_code == 202, response.text
    job = response.json()
    assert response.headers["location"] == f"/jobs/{job['id']}"
    assert (job["status"], job["name"], job["n_rows"], job["n_features"]) == (
        "queued", "small", 150, 64,
    )  # fmt: skip
    assert job["progress"] == 0 and job["model_id"] is None and job["attempts"] == 0
    assert job["promote"] is False  # training promotes nothing unless asked
    assert job["params"]["n_clusterings"] == 20  # the full parameter set is recorded
    stored_x, stored_y = stored_data(client, job)
    np.testing.assert_array_equal(stored_x, x)
    np.testing.assert_array_equal(stored_y, y)
    assert client.get(f"/jobs/{job['id']}").json() == job
    assert [j["id"] for j in client.get("/jobs").json()["jobs"]] == [job["id"]]
    assert client.get("/jobs", params={"status": "running"}).json() == {"jobs": []}


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".csv"])
def test_train_multipart_upload(client: TestClient, digits: Digits, suffix: str) -> None:
    x = digits[0][:200]
    buffer = io.BytesIO()
    if suffix == ".npy":
        np.save(buffer, x)
    elif suffix == ".npz":
        np.savez(buffer, x=x, y=digits[1][:200])
    else:
        buffer.write(("\n".join(",".join(f"{v:g}" for v in row) for row in x)).encode())
    response = client.post(
        "/train",
        files={"file": (f"../../evil/name{suffix}", buffer.getvalue(), "application/octet-stream")},
        data={"params": json.dumps(TINY_PARAMS), "name": "uploaded"},
    )
    assert response.status_code == 202, response.text
    job = response.json()
    assert (job["name"], job["n_rows"], job["n_features"]) == ("uploaded", 200, 64)
    # Stored under the job's id whatever the client called it (a CSV as the float32 .npy
    # of its numbers, checked and parsed once, at submission).
    files = JobFiles(client.app.state.settings.jobs_path)  # type: ignore[attr-defined]
    stored_suffix = ".npy" if suffix == ".csv" else suffix
    stored, _ = load_training_data(files.path(job["id"], f"data{stored_suffix}"))
    np.testing.assert_allclose(stored, x)
    assert sorted(p.name for p in files.path(job["id"], "data.npy").parent.iterdir()) == [
        f"data{stored_suffix}"
    ]


ROWS = [[float(i), float(i % 7), 1.0] for i in range(40)]
BAD_TRAIN_JSON: list[tuple[str, object, int, str]] = [
    ("unknown param", {"data": ROWS, "params": {"n_clustering": 5}}, 422, "n_clustering"),
    ("bad param value", {"data": ROWS, "params": {"n_clusterings": -1}}, 422, "n_clusterings"),
    ("bad param type", {"data": ROWS, "params": {"delta": "half"}}, 422, "delta"),
    ("server param", {"data": ROWS, "params": {"n_jobs": 64}}, 422, "n_jobs"),
    ("params not object", {"data": ROWS, "params": [1]}, 422, "params"),
    ("unknown field", {"data": ROWS, "epochs": 3}, 422, "unknown member 'epochs'"),
    ("misspelt field", {"data": ROWS, "labes": [0] * 40}, 422, "did you mean 'labels'"),
    ("bad name", {"data": ROWS, "name": "../etc"}, 422, "name"),
    ("no data", {"name": "x"}, 422, "data"),
    ("empty data", {"data": []}, 422, "at least 2 items"),
    ("one row", {"data": [[1.0, 2.0]]}, 422, "at least 2 items"),
    ("ragged", {"data": [[1.0, 2.0], [1.0]]}, 422, "ragged"),
    ("nan", '{"data": [[NaN, 1], [1, 2]]}', 422, "NaN"),
    ("strings", {"data": [["a", 1.0], [1.0, 2.0]]}, 422, "number"),
    ("labels length", {"data": ROWS, "labels": [1, 2]}, 422, "labels"),
    ("labels beyond int64", {"data": ROWS, "labels": [2**70] * 40}, 422, "64 bits"),
    ("more centers than rows", {"data": ROWS, "params": {"ks": [100]}}, 422, "40 rows"),
    ("one-layer output, two layers", {"data": ROWS, "params": {"output": "umap-bottom",
                                                              "ks": [10, 5]}}, 422, "alone"),
    ("constant rows", {"data": [[1.0, 2.0, 3.0]] * 40}, 422, "every row is the same"),
    ("huge values", {"data": [[v * 1e20 for v in row] for row in ROWS]}, 422, "as large as"),
    ("too many rows", {"data": [[1.0]] * 1001}, 413, "at most 1000"),
    ("not json", "{", 422, "JSON"),
    ("promote not bool", {"data": ROWS, "promote": "yes"}, 422, "promote"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [b[1:] for b in BAD_TRAIN_JSON],
    ids=[b[0] for b in BAD_TRAIN_JSON],
)
def test_bad_train_json(shared: TestClient, body: object, status: int, message: str) -> None:
    client = shared
    content = body if isinstance(body, str) else json.dumps(body)
    response = client.post("/train", content=content, headers={"content-type": "application/json"})
    error = assert_error(response, status)
    assert message.lower() in error["message"].lower(), error
    assert client.get("/jobs").json() == {"jobs": []}  # nothing queued
    jobs_dir = client.app.state.settings.jobs_path  # type: ignore[attr-defined]
    assert not any(jobs_dir.iterdir())  # nothing left on disk


def shadow_npz() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("x.npy", npy(np.ones((20, 8), np.float32)))
        zf.writestr("x", npy(np.ones((4000, 8), np.float32)))
    return buffer.getvalue()


def npy_header(shape: tuple[int, ...]) -> bytes:
    """An .npy header alone: a file that claims ``shape``."""
    buffer = io.BytesIO()
    header = {"descr": "<f8", "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buffer, header)  # type: ignore[no-untyped-call]
    return buffer.getvalue()


def npy(x: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, x)
    return buffer.getvalue()


BAD_UPLOADS: list[tuple[str, dict, dict, int, str]] = [
    ("no file", {}, {"params": "{}"}, 422, "file"),
    ("wrong suffix", {"file": ("x.pkl", b"123")}, {}, 422, "must end in"),
    ("no suffix", {"file": ("data", b"123")}, {}, 422, "must end in"),
    ("bad params json", {"file": ("x.csv", b"1,2\n3,4\n")}, {"params": "{"}, 422, "JSON"),
    ("params not object", {"file": ("x.csv", b"1,2\n3,4\n")}, {"params": "[]"}, 422, "dictionary"),
    ("unknown param", {"file": ("x.csv", b"1,2\n3,4\n")}, {"params": '{"nope": 1}'}, 422,
     "nope"),
    ("unknown field", {"file": ("x.csv", b"1,2\n3,4\n")}, {"other": "1"}, 422, "unknown form"),
    ("duplicate key in params", {"file": ("x.csv", b"1,2\n3,4\n")},
     {"params": '{"n_clusterings": 5, "n_clusterings": 6}'}, 422, "'n_clusterings' twice"),
    ("params nested too deeply", {"file": ("x.csv", b"1,2\n3,4\n")},
     {"params": "[" * 10_000 + "]" * 10_000}, 422, "nested too deeply"),
    ("params too large", {"file": ("x.csv", b"1,2\n3,4\n")},
     {"params": json.dumps({"hidden_layer_sizes": [1] * 100_000})}, 422, "at most 65536"),
    ("a field twice", {"file": ("x.csv", b"1,2\n3,4\n")}, {"name": ["a", "b"]}, 422,
     "'name' more than once"),
    ("bad name", {"file": ("x.csv", b"1,2\n3,4\n")}, {"name": "a b/c"}, 422, "name"),
    ("promote not bool", {"file": ("x.csv", b"1,2\n3,4\n")}, {"promote": "1"}, 422, "promote"),
    ("garbage npy", {"file": ("x.npy", b"not numpy at all")}, {}, 422, "file"),
    ("pickled npy", {"file": ("x.npy", npy(np.array([{"a": 1}], dtype=object)))}, {}, 422,
     "file"),
    ("text csv", {"file": ("x.csv", b"a,b\nc,d\n")}, {}, 422, "not a number"),
    # A text cell anywhere is refused at submission, as the CLI refuses it (was a 202, then
    # a failed job).
    # A small checked x.npy beside a raw member 'x' that np.load would have read instead.
    ("shadow npz", {"file": ("x.npz", shadow_npz())}, {}, 422, "is not an array"),
    ("text cell csv", {"file": ("x.csv", b"1,2\n3,x\n5,6\n7,8\n9,10\n")}, {}, 422,
     "'x' is not a number: data row 2, column 2"),
    ("2-row csv", {"file": ("x.csv", b"1,2\n3,4\n")}, {}, 422, "at least 4 rows"),
    ("huge npy header", {"file": ("x.npy", npy_header((10**9, 64)) + b"\0" * 1024)}, {}, 422,
     "claims shape (1000000000, 64)"),
    ("truncated npy", {"file": ("x.npy", npy(np.zeros((50, 2)))[:-8])}, {}, 422, "holds"),
    ("npz without x", {"file": ("x.npz", b"PK\x05\x06" + b"\0" * 18)}, {}, 422, "file"),
    ("1-D npy", {"file": ("x.npy", npy(np.arange(5.0)))}, {}, 422, "2-D"),
    ("too many rows", {"file": ("x.npy", npy(np.zeros((1001, 2))))}, {}, 413, "at most 1000"),
    ("over the upload limit", {"file": ("x.npy", b"\0" * 500_000)}, {}, 413, "limit"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("files", "data", "status", "message"),
    [b[1:] for b in BAD_UPLOADS],
    ids=[b[0] for b in BAD_UPLOADS],
)
def test_bad_uploads(
    shared: TestClient, files: dict, data: dict, status: int, message: str
) -> None:
    client = shared
    if not files:  # still send a multipart body
        response = client.post("/train", data=data, files={"other_file": ("a.csv", b"1")})
        message = "unknown form"
    else:
        response = client.post("/train", files=files, data=data)
    error = assert_error(response, status)
    assert message.lower() in error["message"].lower(), error
    assert client.get("/jobs").json() == {"jobs": []}
    jobs_dir = client.app.state.settings.jobs_path  # type: ignore[attr-defined]
    assert not any(p.is_file() for p in jobs_dir.rglob("*"))


def test_sparse_uploads_are_sized_by_their_arrays(api: Callable[..., TestClient]) -> None:
    # 900 documents over 100,000 words: 360 MB as float32 rows, about 100 MB as what
    # training holds (it never makes them dense); sized as dense, they were refused (413).
    limit = 200 * 2**20
    client = api(max_train_bytes=limit, embedded_worker=False)
    rng = np.random.default_rng(0)
    X = sp.csr_matrix(
        (
            rng.random(9000, dtype=np.float32),
            (np.repeat(np.arange(900), 10), rng.integers(0, 100_000, 9000)),
        ),
        shape=(900, 100_000),
    )
    assert limit < 900 * 100_000 * 4
    buffer = io.BytesIO()
    sp.save_npz(buffer, X)
    params = json.dumps({"n_clusterings": 5})
    response = client.post(
        "/train", files={"file": ("bag.npz", buffer.getvalue())}, data={"params": params}
    )
    assert response.status_code == 202, response.text
    # A vocabulary whose per-word arrays alone pass the limit is still refused at once.
    buffer = io.BytesIO()
    sp.save_npz(buffer, sp.csr_matrix((X.data, X.indices % 10, X.indptr), shape=(900, 130_000_000)))
    error = assert_error(
        client.post(
            "/train", files={"file": ("wide.npz", buffer.getvalue())}, data={"params": params}
        ),
        413,
    )
    assert "sparse values" in error["message"] and "MBN_MAX_TRAIN_BYTES" in error["message"]


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ({"input_scaling": "standard"}, "input_scaling='standard'"),
        ({"method": "modular_kpca"}, "does not take sparse input"),
        *(
            ({"method": method}, f"method {method!r} does not take sparse input")
            for method in ("tsne", "umap", "densmap", "pacmap", "trimap")
        ),
    ],
)
def test_sparse_uploads_a_training_cannot_take_are_refused_at_submission(
    shared: TestClient, params: dict, reason: str
) -> None:
    # Refused with the reason before a job exists, not failed as a job later.
    buffer = io.BytesIO()
    sp.save_npz(buffer, sp.random(60, 40, density=0.2, format="csr", random_state=0))
    response = shared.post(
        "/train",
        files={"file": ("bag.npz", buffer.getvalue())},
        data={"params": json.dumps(params)},
    )
    error = assert_error(response, 422)
    assert reason in error["message"] and "sparse rows" in error["message"]


@pytest.mark.parametrize(
    ("params", "n_rows", "n_features", "reason"),
    [
        ({"method": "tsne"}, 50, 8, "perplexity=30 needs at least 91 rows, got 50"),
        ({"method": "pacmap", "n_neighbors": 30}, 20, 8, "n_neighbors=30 needs at least 32 rows"),
        ({"method": "umap", "n_neighbors": 40}, 30, 8, "n_neighbors=40 (and n_components=2)"),
        ({"method": "trimap"}, 60, 1, "n_components=2 principal components, which needs at "
         "least 2 features, got 1"),
        ({"method": "pacmap"}, 60, 1, "needs at least 2 features, got 1"),
        ({"method": "tsne", "initialization": "pca", "n_components": 3}, 120, 2,
         'initialization="pca" starts the layout from n_components=3 principal components'),
    ],
)  # fmt: skip
def test_layout_jobs_too_small_for_their_parameters_are_refused_at_submission(
    shared: TestClient, params: dict, n_rows: int, n_features: int, reason: str
) -> None:
    # Too few rows for the neighbourhood, too few features for the start: a 422 naming the
    # parameter and the minimum before a job exists, not a job failed in the worker.
    x = np.random.RandomState(0).rand(n_rows, n_features).round(3)
    options = {key: value for key, value in params.items() if key != "method"}
    response = shared.post(
        "/train", json={"method": params["method"], "data": x.tolist(), "params": options}
    )
    assert reason in assert_error(response, 422)["message"]


def test_json_training_data_is_bounded_by_the_body_limit(client: TestClient) -> None:
    # JSON rows become Python objects in the API process: the upload limit is for files.
    rows = [[0.5] * 64] * 400  # ~100 kB, over max_body_bytes, under max_upload_bytes
    response = client.post("/train", json={"data": rows})
    error = assert_error(response, 413, "payload_too_large")
    assert "as a file" in error["message"]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"a,b\n1,nan\n3,4\n5,6\n7,8\n9,10\n",
         "nan is not a finite number: data row 1, column 'b' (2)"),
        (b"1,2\n3,4\n5,inf\n7,8\n9,10\n", "inf is not a finite number: data row 3, column 2"),
        (b"1,2\n3,4\n5,6\n7,8\n9,1e39\n", "1e+39 at row 5, column 2 is beyond float32's range"),
        (b"1,2\n1,2\n1,2\n1,2\n1,2\n", "every row is the same"),
        (b"1e30,2\n3,4\n5,6\n7,8\n9,10\n", "as large as 1e+30"),
        (b"1,1e-41\n3,2e-41\n5,0\n7,1e-41\n9,0\n",
         "column 2 varies by a standard deviation of 7.48e-42, too small"),
    ],
)  # fmt: skip
def test_bad_numbers_in_a_file_are_refused_at_submission(
    api: Callable[..., TestClient], content: bytes, reason: str
) -> None:
    # Were queued (202), and the job failed minutes later with a message naming no row or
    # column. Every value of an upload is checked at submission now, in bounded memory.
    client = api()
    params = {"n_clusterings": 5, "n_components": 2, "hidden_layer_sizes": [4]}
    if b"e-41" in content:
        params["input_scaling"] = "standard"
    response = client.post(
        "/train", files={"file": ("x.csv", content)}, data={"params": json.dumps(params)}
    )
    error = assert_error(response, 422, "invalid_input")["message"]
    assert reason in error and "/" not in error, error
    x = np.loadtxt(io.BytesIO(content), delimiter=",", skiprows=1 if b"a,b" in content else 0)
    for suffix in (".npy", ".npz"):
        buffer = io.BytesIO()
        np.save(buffer, x) if suffix == ".npy" else np.savez(buffer, x=np.asfortranarray(x))
        response = client.post(
            "/train",
            files={"file": (f"x{suffix}", buffer.getvalue())},
            data={"params": json.dumps(params)},
        )
        assert_error(response, 422, "invalid_input")
    assert client.get("/jobs").json()["jobs"] == []


def test_other_content_types_are_415(client: TestClient) -> None:
    response = client.post("/train", content=b"1,2\n", headers={"content-type": "text/csv"})
    assert_error(response, 415)


def test_full_queue_is_429_with_retry_after(client: TestClient) -> None:
    for _ in range(3):
        assert client.post("/train", json={"data": ROWS}).status_code == 202
    response = client.post("/train", json={"data": ROWS})
    assert_error(response, 429, "overloaded")
    assert int(response.headers["retry-after"]) >= 1
    assert len(client.get("/jobs").json()["jobs"]) == 3


def test_cancel(client: TestClient) -> None:
    job = client.post("/train", json={"data": ROWS}).json()
    cancelled = client.post(f"/jobs/{job['id']}/cancel")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["finished_at"] is not None
    assert_error(client.post(f"/jobs/{job['id']}/cancel"), 409, "conflict")
    assert client.get(f"/jobs/{job['id']}").json()["status"] == "cancelled"
    jobs_dir = client.app.state.settings.jobs_path  # type: ignore[attr-defined]
    assert not (jobs_dir / job["id"]).exists()  # its data is gone with it


@pytest.mark.parametrize("job_id", ["0" * 32, "not-an-id", "..%2F..%2Fetc"])
def test_unknown_jobs_are_404(client: TestClient, job_id: str) -> None:
    assert_error(client.get(f"/jobs/{job_id}"), 404, "not_found")
    assert_error(client.post(f"/jobs/{job_id}/cancel"), 404, "not_found")


@pytest.mark.parametrize("query", [{"status": "done"}, {"limit": 0}, {"limit": "x"}])
def test_bad_job_queries_are_422(client: TestClient, query: dict) -> None:
    assert_error(client.get("/jobs", params=query), 422, "invalid_input")


@pytest.mark.slow
def test_only_a_job_that_asks_promotes_its_model(
    api: Callable[..., TestClient], digits: Digits
) -> None:
    """Training moves neither the default nor a name by itself; a job with promote=true
    (here a multipart upload) moves both to its model once it succeeds."""
    client = api(embedded_worker=True)
    x = digits[0][:300]

    def finished(response: Any) -> dict:
        assert response.status_code == 202, response.text
        job_id = response.json()["id"]
        done = wait_for(
            lambda: (
                (j := client.get(f"/jobs/{job_id}").json())["status"] in ("succeeded", "failed")
                and j
            ),
            120,
            f"job {job_id}",
        )
        assert done["status"] == "succeeded", done["error"]
        return done

    def answering(model: str | None) -> str:
        body = {"inputs": x[:2].tolist(), **({} if model is None else {"model": model})}
        response = client.post("/embed", json=body)
        assert response.status_code == 200, response.text
        return str(response.json()["model"])

    def entry(listing: dict, model_id: str) -> dict:
        return next(m for m in listing["models"] if m["id"] == model_id)

    quiet = finished(
        client.post("/train", json={"name": "digits", "data": x.tolist(), "params": TINY_PARAMS})
    )
    assert quiet["promote"] is False
    listing = client.get("/models").json()
    assert (listing["default"], listing["default_source"]) == ("m-digits", "auto")
    assert entry(listing, quiet["model_id"])["current"] is False
    assert answering(None) == answering("digits") == "m-digits"

    loud = finished(
        client.post(
            "/train",
            files={"file": ("x.npy", npy(x), "application/octet-stream")},
            data={"name": "digits", "params": json.dumps(TINY_PARAMS), "promote": "true"},
        )
    )
    assert loud["promote"] is True and client.get(f"/jobs/{loud['id']}").json()["promote"]
    listing = client.get("/models").json()
    assert (listing["default"], listing["default_source"]) == (loud["model_id"], "promoted")
    model = entry(listing, loud["model_id"])
    assert model["default"] is True and model["current"] is True
    assert entry(listing, "m-digits")["default"] is False
    assert answering(None) == answering("digits") == loud["model_id"]
    # Recorded in the alias file, where every replica reads it at its next rescan.
    models_path = client.app.state.settings.models_path  # type: ignore[attr-defined]
    recorded = AliasFile(models_path).read()
    assert recorded.default == loud["model_id"] and recorded.names["digits"] == loud["model_id"]


def test_a_csv_upload_chooses_its_columns(api: Callable[..., TestClient]) -> None:
    client = api(max_queued_jobs=20)
    lines = ["id,name,a,b"] + [f"{i},n{i},{i % 7},{(i * i) % 11}" for i in range(40)]
    csv = ("\n".join(lines) + "\n").encode()
    params = json.dumps(TINY_PARAMS)
    files = JobFiles(client.app.state.settings.jobs_path)  # type: ignore[attr-defined]
    for fields in ({"columns": "a, b"}, {"drop": "id,name"}, {"columns": "3,4"}):
        response = client.post(
            "/train", files={"file": ("d.csv", csv)}, data={"params": params, **fields}
        )
        assert response.status_code == 202, response.text
        job = response.json()
        assert (job["n_rows"], job["n_features"]) == (40, 2)
        stored, _ = load_training_data(files.path(job["id"], "data.npy"))
        np.testing.assert_array_equal(stored[:3], [[0, 0], [1, 1], [2, 4]])
    # A pandas index column (no header name) is left out unasked.
    indexed = ("," + "\n".join(lines[0:1] + lines[1:]).split("\n", 1)[0] + "\n").encode()
    indexed += b"".join(b"%d,%s\n" % (i, line.encode()) for i, line in enumerate(lines[1:]))
    response = client.post(
        "/train", files={"file": ("d.csv", indexed)}, data={"params": params, "drop": "id,name"}
    )
    assert response.status_code == 202 and response.json()["n_features"] == 2, response.text
    for fields, message in (
        ({"columns": "a", "drop": "b"}, "columns or drop, not both"),
        ({"columns": "A"}, "did you mean 'a'"),
        ({}, "'n0' is not a number: data row 1, column 'name' (2)"),
    ):
        response = client.post(
            "/train", files={"file": ("d.csv", csv)}, data={"params": params, **fields}
        )
        assert message in assert_error(response, 422)["message"]
    npy = io.BytesIO()
    np.save(npy, np.eye(5))
    response = client.post(
        "/train", files={"file": ("d.npy", npy.getvalue())}, data={"columns": "1"}
    )
    assert "of a .csv file only" in assert_error(response, 422)["message"]
