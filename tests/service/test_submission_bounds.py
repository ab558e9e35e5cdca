"""Training parameters and params fields that gave a 500 or were queued without bound."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from servicetest import assert_error

CSV = b"".join(b"%d,%d\n" % (i, i * i % 7) for i in range(40))


@pytest.mark.parametrize(
    "params",
    [
        {"n_clusterings": 5_000_000},
        {"hidden_layer_sizes": [10**18]},
        {"max_epochs": 10**18},
        {"n_clusters": 10**30},
    ],
    ids=["clusterings", "layer", "epochs", "clusters"],
)
def test_counts_beyond_the_jobs_limits_are_refused_at_submission(
    api: Callable[..., TestClient], params: dict
) -> None:
    """Were queued (202): 5,000,000 clusterings ran 45 s at progress 0."""
    client = api(max_train_rows=1000)
    for answer in (
        client.post("/train", files={"file": ("d.csv", CSV)}, data={"params": json.dumps(params)}),
        client.post("/train", json={"data": [[0.5, 1.0]] * 20, "params": params}),
    ):
        message = assert_error(answer, 422, "invalid_input")["message"]
        assert "MBN_MAX_TRAIN_ROWS" in message and len(message) < 300
    assert client.get("/jobs").json()["jobs"] == []


def test_an_integer_of_thousands_of_digits_in_params_is_a_422(
    api: Callable[..., TestClient],
) -> None:
    """json.loads raised a plain ValueError (over 4,300 digits): a 500."""
    client = api()
    huge = '{"n_clusterings": 1' + "0" * 5000 + "}"
    answer = client.post("/train", files={"file": ("d.csv", CSV)}, data={"params": huge})
    assert_error(answer, 422, "invalid_input")
    body = b'{"data": [[0.5, 1.0], [1, 2], [3, 4], [5, 6]], "params": ' + huge.encode() + b"}"
    answer = client.post("/train", content=body, headers={"content-type": "application/json"})
    assert_error(answer, 422, "invalid_input")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        # Were queued (202): 3 million layers made every GET /jobs 6.5 MB, and 100,000 ran
        # until cancelled.
        ({"hidden_layer_sizes": [1] * 10_000}, "sequence of 1 to 16 integers"),
        ({"hidden_layer_sizes": [1] * 100_000}, "bytes of JSON; at most 65536"),
        ({"ks": [2] * 10_000}, "sequence of 1 to 256 integers"),
        # Queued, then failed on a 298 GiB allocation.
        ({"hidden_layer_sizes": [200_000, 200_000]}, "GiB"),
        ({"hidden_layer_sizes": [8_000, 8_000]}, "more than the 1.0 GiB"),
        # Queued, then failed in the job: a cross-fitted report needs a row per fold.
        ({"report_folds": 5, "n_components": 2}, "report_folds=5 is more than the 4 rows"),
    ],
    ids=["mlp-layers", "params-bytes", "mbn-layers", "mlp-memory", "memory-limit", "folds"],
)
def test_lists_memory_and_folds_are_checked_at_submission(
    api: Callable[..., TestClient], params: dict, message: str
) -> None:
    client = api(max_train_memory_bytes=1 << 30)
    rows = [[0.5, 1.0], [1, 2], [3, 4], [5, 7]] if "report_folds" in params else None
    csv = b"".join(b"%d,%d\n" % tuple(row) for row in rows) if rows else CSV
    data = rows or [[float(i), float(i * i % 7)] for i in range(40)]
    for answer in (
        client.post("/train", files={"file": ("d.csv", csv)}, data={"params": json.dumps(params)}),
        client.post("/train", json={"data": data, "params": params}),
    ):
        error = assert_error(answer, 422, "invalid_input")["message"]
        assert message in error and len(error) < 500, error
    assert client.get("/jobs").json()["jobs"] == []


def test_an_unknown_parameter_gets_the_nearest_and_the_list_without_the_servers(
    api: Callable[..., TestClient],
) -> None:
    """The list named device and n_jobs, which HTTP then refused as set by the server."""
    client = api()
    answer = client.post("/train", json={"data": [[0.5, 1.0], [1, 2]] * 5,
                                         "params": {"n_clustering": 5}})  # fmt: skip
    message = assert_error(answer, 422, "invalid_input")["message"]
    assert "unknown training parameter 'n_clustering'" in message
    assert "(did you mean 'n_clusterings'?)" in message
    known, _, elsewhere = message.partition("(set elsewhere:")
    assert "device" not in known and "n_jobs" not in known, message
    assert "device by the server (MBN_TRAIN_DEVICE)" in elsewhere
    answer = client.post("/train", json={"data": [[0.5, 1.0], [1, 2]] * 5,
                                         "params": {"device": "cuda"}})  # fmt: skip
    assert "'device' is set by the server" in assert_error(answer, 422)["message"]


def test_a_job_records_the_device_and_threads_the_server_gives_it(
    api: Callable[..., TestClient],
) -> None:
    """A job started under MBN_TRAIN_DEVICE=cuda recorded device "cpu" (the default) in its
    params: GET /jobs said it ran on the CPU."""
    client = api(train_device="cuda", train_threads=2)
    answer = client.post("/train", json={"data": [[0.5, 1.0], [1, 2], [3, 1], [2, 2]] * 10})
    assert answer.status_code == 202, answer.text
    job = client.get(f"/jobs/{answer.json()['id']}").json()
    assert job["params"]["device"] == "cuda" and job["params"]["n_jobs"] == 2


LAYOUTS = ("tsne", "umap", "densmap", "pacmap", "trimap")
# Values at and beyond the edges of the layout methods' and the student head's parameters,
# of every JSON type: each must be accepted or refused with a message, never crash.
_EDGES: list[object] = [
    0, 1, 2, -1, 3, 10**6, 10**40, 0.0, 1e-300, 1e300, -0.5, 0.5, 9999.0, True, False, None,
    "auto", "pca", "atoms", "", "x" * 300, [], [1], {"a": 1},
]  # fmt: skip


@pytest.mark.slow  # every case builds the estimators: minutes on a busy machine
@pytest.mark.parametrize("method", LAYOUTS)
def test_mutated_layout_parameters_are_accepted_or_refused_by_name(method: str) -> None:
    """Submission checks (service.submission.check_params, then check_data on a small and a
    narrow data set) of random edge values for the method's own options and the student's:
    a clear InvalidInput naming the key, or parameters training may take."""
    import random

    from mbn_core.methods import get_method
    from mbn_core.pipeline.options import options
    from service.domain import InvalidInput
    from service.submission import check_data, check_params

    names = [param.name for param in options(get_method(method))]
    assert {"student_head", "n_atoms"} <= set(names)
    rng = random.Random(method)
    accepted = refused = 0
    for _ in range(120):
        params = {name: rng.choice(_EDGES) for name in rng.sample(names, rng.randint(1, 3))}
        for shape in ((400, 8), (30, 1)):
            try:
                check_data(shape, check_params(params, method, bound=100_000), memory_limit=1 << 30)
            except InvalidInput as error:
                refused += 1
                assert error.message and len(error.message) < 600, error.message
                assert "Traceback" not in error.message
            else:
                accepted += 1
    assert accepted and refused  # the edges hold both kinds
