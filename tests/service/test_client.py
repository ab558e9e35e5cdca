"""mbn_core.client against a real ``mbn serve``: embed (base64 both ways), train and wait,
models, promote, monitor, the server's messages as errors, and retries after Retry-After."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from digits_data import Digits
from servicetest import FAST_JOBS_ENV, REPO, TINY_PARAMS, Server, serving

from mbn_core.bundle import load_bundle
from mbn_core.client import ApiError, Client

# Slow: a real mbn serve process and a training job.
pytestmark = pytest.mark.slow

KEY = "client-test-key-0123456789"


@pytest.fixture(scope="module")
def server(digits_data_dir: Callable[[str], Path]) -> Iterator[Server]:
    data = digits_data_dir("client")
    env = {
        **FAST_JOBS_ENV,
        "MBN_DATA_DIR": str(data),
        "MBN_DEMO_MODEL": "false",
        "MBN_API_KEYS": KEY,
        "MBN_SHADOW_FRACTION": "1.0",
    }
    with serving(env, data / "server.log", clean_log=True) as srv:
        yield srv


@pytest.fixture(scope="module")
def queue_server(digits_data_dir: Callable[[str], Path]) -> Iterator[Server]:
    """No worker, and room for one queued job: a second is refused with 429 and
    Retry-After: 1 until the first is cancelled."""
    data = digits_data_dir("client-queue")
    env = {
        **FAST_JOBS_ENV,
        "MBN_DATA_DIR": str(data),
        "MBN_DEMO_MODEL": "false",
        "MBN_EMBEDDED_WORKER": "false",
        "MBN_API_KEYS": KEY,
        "MBN_RETRY_AFTER_SECONDS": "1",
        "MBN_MAX_QUEUED_JOBS": "1",
    }
    with serving(env, data / "server.log") as srv:
        yield srv


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    with Client(server.url, api_key=KEY, retries=2) as client:
        yield client


def test_the_client_imports_nothing_of_the_server() -> None:
    code = (
        "import sys, mbn_core.client; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('service', 'fastapi', 'uvicorn', 'starlette', 'sqlalchemy', 'pydantic')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO, check=True)  # fmt: skip
    assert result.stdout.strip() == "[]"


def test_embed_gives_arrays_equal_to_the_library(
    client: Client, server: Server, digits: Digits
) -> None:
    x = digits[0][:300]
    bundle = load_bundle(Path(server.env["MBN_DATA_DIR"]) / "models" / "m-digits")
    assert client.ready()
    client.batch_rows = 128  # three requests, joined
    result = client.embed(x, model="digits", return_novelty=True)
    assert result.embeddings.dtype == np.float32 and result.embeddings.shape == (300, 10)
    np.testing.assert_array_equal(result.embeddings, bundle.embed(x))
    np.testing.assert_array_equal(result.clusters, bundle.predict_clusters(x))
    assert (result.model, result.name, result.mode) == ("m-digits", "digits", "fast")
    # The test bundle has no novelty model: said, and no flags.
    assert result.novelty is None and result.out_of_range is None
    assert "no novelty model" in (result.novelty_unavailable or "")
    exact = client.embed(x[:5], mode="exact")
    np.testing.assert_array_equal(exact.embeddings, bundle.embed(x[:5], mode="exact"))
    one = client.embed(x[0])  # one row
    assert one.embeddings.shape == (1, 10)


def test_errors_carry_the_servers_message(client: Client, server: Server) -> None:
    with pytest.raises(ApiError) as caught:
        client.embed(np.zeros((2, 63)))
    assert caught.value.status == 422 and caught.value.type == "invalid_input"
    assert "wrong dimension" in caught.value.message
    with pytest.raises(ApiError, match="404 not_found"):
        client.embed(np.zeros((1, 64)), model="no-such-model")
    with Client(server.url, api_key="wrong-key-0123456789") as wrong, pytest.raises(ApiError) as e:
        wrong.models()
    assert e.value.status == 401


def test_train_wait_promote_and_monitor(client: Client, digits: Digits, tmp_path: Path) -> None:
    seen: list[tuple[str, float]] = []
    job = client.train(digits[0][:400], TINY_PARAMS, name="client-made", labels=digits[1][:400])
    assert job.status in ("queued", "running")
    job.wait(progress=lambda j: seen.append((j.status, j.progress)), timeout=300, poll=0.3)
    assert job.status == "succeeded" and job.model_id is not None
    assert seen[-1] == ("succeeded", 1.0) and len(seen) >= 2
    ids = {model["id"] for model in client.models()}
    assert job.model_id in ids
    promoted = client.promote(job.model_id)
    assert promoted["default"] is True
    assert client.embed(digits[0][:3]).model == job.model_id  # the default now
    report = client.monitor(job.model_id)
    assert report["model"] == job.model_id
    # A file, with its columns chosen.
    csv = tmp_path / "rows.csv"
    header = "id," + ",".join(f"p{i}" for i in range(64))
    lines = [header] + [f"{i}," + ",".join(f"{v:g}" for v in row)
                        for i, row in enumerate(digits[0][:200])]  # fmt: skip
    csv.write_text("\n".join(lines) + "\n")
    from_file = client.train(csv, TINY_PARAMS, name="from-file", drop=["id"])
    assert from_file.info["n_features"] == 64
    from_file.wait(timeout=300, poll=0.3)


def test_a_429_is_retried_after_retry_after(queue_server: Server, digits: Digits) -> None:
    tries: list[int] = []
    hooks = {"response": [lambda response: tries.append(response.status_code)]}
    rows = digits[0][:50]
    with Client(queue_server.url, api_key=KEY, retries=0) as impatient:
        first = impatient.train(rows, TINY_PARAMS, name="first")  # the queue is full now
        with pytest.raises(ApiError) as caught:
            impatient.train(rows, TINY_PARAMS, name="refused")
        assert caught.value.status == 429 and caught.value.retry_after == 1.0
        assert "queued" in caught.value.message
        canceller = threading.Timer(2.5, first.cancel)
        with Client(queue_server.url, api_key=KEY, retries=10,
                    client_options={"event_hooks": hooks}) as patient:  # fmt: skip
            canceller.start()
            started = time.monotonic()
            try:
                second = patient.train(rows, TINY_PARAMS, name="second")
            finally:
                canceller.join()
            waited = time.monotonic() - started
            assert second.status == "queued" and first.refresh().status == "cancelled"
            second.cancel()
    # Refused (Retry-After: 1 s apart) until the first job left the queue, then accepted.
    assert tries[-2:] == [202, 200] and set(tries[:-2]) == {429} and len(tries) >= 4, tries
    assert waited >= 2.0
