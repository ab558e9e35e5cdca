"""The live monitor through the real app: shadow rows, novelty, GET /models/{id}/monitor."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from servicetest import assert_error, make_settings, running_app, wait_for
from sklearn.metrics import r2_score

from mbn_core import CompressiveMBN
from mbn_core.bundle import NOVELTY_FILE, load_bundle, save_bundle
from mbn_core.pipeline.novelty import Novelty

Digits = tuple[np.ndarray, np.ndarray]


@pytest.fixture(scope="module")
def novelty_bundle(digits: Digits, tiny_model: CompressiveMBN) -> Callable[[Path], Path]:
    """Writes ``tiny_model`` with a novelty model fitted on the digits, as ``m-novel``."""
    x, _ = digits
    model, summary = Novelty.fit(x[:1500], random_state=0)

    def write(model_dir: Path) -> Path:
        model_dir.mkdir(parents=True, exist_ok=True)
        return save_bundle(
            tiny_model,
            model_dir / "m-novel",
            name="novel",
            extra_files={NOVELTY_FILE: model.to_bytes()},
            manifest_sections={"novelty": summary},
        )

    return write


def _app(tmp_path: Path, write_bundle, novelty_bundle, **overrides) -> Iterator[TestClient]:
    settings = make_settings(tmp_path, embedded_worker=False, **overrides)
    novelty_bundle(settings.models_path)
    with running_app(settings, write_bundle) as client:
        yield client


@pytest.fixture
def shadowing(tmp_path, write_bundle, novelty_bundle) -> Iterator[TestClient]:
    """Every fast row sampled and shadowed (MBN_SHADOW_FRACTION=1), as soon as the
    monitor's thread is free (MBN_SHADOW_MAX_DELAY=0)."""
    yield from _app(
        tmp_path, write_bundle, novelty_bundle, shadow_fraction=1.0, shadow_max_delay=0.0
    )


@pytest.fixture
def batching(tmp_path, write_bundle, novelty_bundle) -> Iterator[TestClient]:
    """Every fast row sampled; rows wait for a full batch (MBN_SHADOW_MAX_DELAY an hour)."""
    yield from _app(
        tmp_path, write_bundle, novelty_bundle, shadow_fraction=1.0, shadow_max_delay=3600.0
    )


def test_a_model_without_traffic_answers_zeros_and_says_so(shadowing: TestClient) -> None:
    response = shadowing.get("/models/m-novel/monitor")
    assert response.status_code == 200
    body = response.json()
    assert body["rows_seen"] == body["shadow_rows"] == 0
    assert body["has_traffic"] is False and "no fast-mode traffic" in body["note"]
    assert body["live"]["r2"] == body["live"]["cosine_median"] == 0.0
    assert body["novelty_share"] == body["out_of_range_share"] == 0.0
    assert (
        body["training"]
        == load_bundle(shadowing.app.state.registry.get("m-novel").path).manifest["fidelity"]
    )
    assert shadowing.get("/models/nope/monitor").status_code == 404


def test_return_novelty(shadowing: TestClient, digits: Digits) -> None:
    x = digits[0][1500:1520]
    shifted = 16.0 - x
    body = shadowing.post(
        "/embed", json={"model": "novel", "inputs": np.vstack([x, shifted]).tolist(),
                        "return_novelty": True},
    ).json()  # fmt: skip
    model = Novelty.fit(digits[0][:1500], random_state=0)[0]
    np.testing.assert_allclose(body["novelty"], model.score(np.vstack([x, shifted])))
    assert sum(body["novel"][:20]) <= 2 and all(body["novel"][20:])
    # A bundle saved without one reports it as unavailable.
    old = shadowing.post(
        "/embed", json={"model": "digits", "inputs": x.tolist(), "return_novelty": True}
    ).json()
    assert (
        old["novelty"] is None
        and old["novel"] is None
        and "no novelty model" in old["novelty_unavailable"]
    )
    plain = shadowing.post("/embed", json={"model": "novel", "inputs": x.tolist()}).json()
    assert "novelty" not in plain


def test_monitor_equals_a_brute_force_recomputation(shadowing: TestClient, digits: Digits) -> None:
    monitor = shadowing.app.state.monitor
    x = np.vstack([digits[0][1500:1560], 16.0 - digits[0][1560:1570]])
    for start in range(0, len(x), 7):
        response = shadowing.post(
            "/embed", json={"model": "novel", "inputs": x[start : start + 7].tolist()}
        )
        assert response.status_code == 200
        # One batch at a time: none is replaced while the previous one is processed. (The
        # first waits for the exact model's read: minutes on a loaded machine.)
        assert monitor.wait_idle(300)
    body = shadowing.get("/models/m-novel/monitor").json()
    assert body["rows_seen"] == body["shadow_rows"] == len(x)
    assert body["skipped_exact_busy"] == body["dropped_behind"] == 0

    bundle = load_bundle(shadowing.app.state.registry.get("m-novel").path)
    exact = bundle.embed(x, mode="exact").astype(np.float64)
    fast = bundle.embed(x, mode="fast").astype(np.float64)
    cosine = np.sum(exact * fast, axis=1) / (
        np.linalg.norm(exact, axis=1) * np.linalg.norm(fast, axis=1)
    )
    live = body["live"]
    assert live["n_holdout"] == len(x)
    assert live["r2"] == pytest.approx(r2_score(exact, fast, multioutput="variance_weighted"))
    assert live["cosine_median"] == pytest.approx(np.median(cosine))
    agree = bundle.predict_clusters(x, "exact") == bundle.predict_clusters(x, "fast")
    assert live["cluster_agreement"] == pytest.approx(np.mean(agree))
    novelty = Novelty.fit(digits[0][:1500], random_state=0)[0]
    assert body["novelty_share"] == pytest.approx(np.mean(novelty.is_novel(x)))
    assert body["out_of_range_share"] == pytest.approx(np.mean(novelty.out_of_range(x)))
    assert body["novelty_share"] >= 10 / 70  # the inverted rows

    metrics = shadowing.get("/metrics").text
    replica = body["replica"]
    line = f'mbn_live_fidelity_r2{{model="m-novel",replica="{replica}"}}'
    assert line in metrics
    value = float(metrics.split(line)[1].split()[0])
    assert value == pytest.approx(live["r2"])


def test_shadow_rows_never_delay_fast_requests(
    shadowing: TestClient, digits: Digits, monkeypatch: pytest.MonkeyPatch
) -> None:
    monitor = shadowing.app.state.monitor
    monkeypatch.setattr(monitor, "batch_rows", 10)  # at most 20 rows wait
    # The shadow thread is held busy: fast requests must still be answered, each one.
    release, held = threading.Event(), threading.Event()
    process = monitor._process_model

    def held_busy(samples: list) -> None:
        held.set()
        release.wait()
        process(samples)

    monkeypatch.setattr(monitor, "_process_model", held_busy)
    x = digits[0][:25]
    try:
        assert (
            shadowing.post("/embed", json={"model": "novel", "inputs": x[:5].tolist()}).status_code
            == 200
        )
        assert held.wait(60)  # the first 5 rows are being processed
        for _ in range(5):
            response = shadowing.post("/embed", json={"model": "novel", "inputs": x[:5].tolist()})
            assert response.status_code == 200
        window = monitor._windows["m-novel"]
        assert window.rows_seen == 30 and window.shadow_rows == 0
        # Bounded: 25 rows queued behind the busy thread, the oldest 5 dropped.
        assert window.pending == 20 and window.dropped == 5
        # One request of more rows than may wait keeps its last ones.
        response = shadowing.post("/embed", json={"model": "novel", "inputs": x.tolist()})
        assert response.status_code == 200
        assert window.pending == 20 and window.dropped == 30
    finally:
        release.set()
    assert monitor.wait_idle(300)
    body = shadowing.get("/models/m-novel/monitor").json()
    assert body["rows_seen"] == 55 and body["pending_rows"] == 0
    assert body["shadow_rows"] == 25 and body["dropped_behind"] == 30


def test_sampled_rows_wait_for_a_batch(batching: TestClient, digits: Digits) -> None:
    monitor = batching.app.state.monitor
    monitor.batch_rows = 8
    x = digits[0][1500:1513]

    def post(rows: np.ndarray) -> dict:
        response = batching.post("/embed", json={"model": "novel", "inputs": rows.tolist()})
        assert response.status_code == 200
        return batching.get("/models/m-novel/monitor").json()

    body = post(x[:5])
    assert body["pending_rows"] == 5 and body["shadow_rows"] == 0
    assert "5 sampled rows wait" in body["note"]
    post(x[5:10])  # 10 rows wait: a full batch, processed without the delay

    def processed() -> dict | None:
        body = batching.get("/models/m-novel/monitor").json()
        return body if body["shadow_rows"] == 10 else None

    body = wait_for(processed, 300, "the full batch processed")  # reads the exact model
    assert body["pending_rows"] == 0 and body["window_sampled_rows"] == 10
    body = post(x[10:])
    assert body["pending_rows"] == 3 and body["shadow_rows"] == 10
    assert monitor.wait_idle(300)  # processes what waits, without the delay
    body = batching.get("/models/m-novel/monitor").json()
    assert body["shadow_rows"] == 13 and body["pending_rows"] == 0
    exact = load_bundle(batching.app.state.registry.get("m-novel").path).embed(x, "exact")
    np.testing.assert_allclose(np.array(monitor._windows["m-novel"].exact), exact, rtol=1e-5)


def test_shadow_rows_the_runtime_cannot_compute_are_counted_as_skipped(
    tmp_path, write_bundle, novelty_bundle, digits: Digits
) -> None:
    """A runtime told to compute on a GPU that is not there refuses every request, the
    monitor's too: the rows are scored for novelty and counted as skipped."""
    from mbn_core.mbn.backends.cuda import gpu_count

    if gpu_count():
        pytest.skip("this machine has a GPU: the runtime would compute on it")
    for client in _app(
        tmp_path,
        write_bundle,
        novelty_bundle,
        shadow_fraction=1.0,
        shadow_max_delay=0.0,
        exact_device="cuda",
    ):
        monitor = client.app.state.monitor
        response = client.post("/embed", json={"model": "novel", "inputs": digits[0][:4].tolist()})
        assert response.status_code == 200
        assert monitor.wait_idle(300)
        body = client.get("/models/m-novel/monitor").json()
        assert body["rows_sampled"] == body["skipped_exact_busy"] == 4
        assert body["shadow_rows"] == 0 and body["window_sampled_rows"] == 4  # novelty still
        refused = client.post(
            "/embed", json={"model": "novel", "inputs": [[0.0] * 64], "mode": "exact"}
        )
        assert "MBN_EXACT_DEVICE=cuda" in assert_error(refused, 503, "unavailable")["message"]
        assert refused.headers["retry-after"] == "1"


def test_monitoring_off(tmp_path, write_bundle, novelty_bundle, digits: Digits) -> None:
    for client in _app(tmp_path, write_bundle, novelty_bundle, shadow_fraction=0.0):
        client.post("/embed", json={"model": "novel", "inputs": digits[0][:4].tolist()})
        body = client.get("/models/novel/monitor").json()
        assert body["rows_seen"] == 0 and "monitoring is off" in body["note"]


@pytest.mark.slow
def test_monitor_of_a_real_server(
    tmp_path: Path, novelty_bundle, digits: Digits, processes: list
) -> None:
    """``mbn serve`` in its own process: every fast row shadowed, the monitor equal to a
    recomputation of the same rows, the gauges in /metrics labelled by replica."""
    from servicetest import FAST_JOBS_ENV, Server

    data_dir = tmp_path / "data"
    path = novelty_bundle(data_dir / "models")
    env = {**FAST_JOBS_ENV, "MBN_DATA_DIR": str(data_dir), "MBN_DEMO_MODEL": "false",
           "MBN_EMBEDDED_WORKER": "false", "MBN_SHADOW_FRACTION": "1", "MBN_SHADOW_MAX_DELAY": "0",
           "MBN_REPLICA_NAME": "replica-a"}  # fmt: skip
    server = Server(env, tmp_path / "server.log")
    processes.append(server)
    server.start(wait=180)  # a shared, loaded machine can take a minute to import
    x = digits[0][1600:1630]
    with server.client() as client:
        wait_for(lambda: client.get("/health/ready").status_code == 200, 60, "readiness")

        def processed(n: int) -> dict | None:
            body = client.get("/models/m-novel/monitor").json()
            return body if body["shadow_rows"] + body["skipped_exact_busy"] == n else None

        for n, row in enumerate(x, start=1):
            assert client.post("/embed", json={"inputs": [row.tolist()]}).status_code == 200
            # The next row only once this one is shadowed: none is replaced while waiting.
            # The first waits for the exact model's read and its kernels' compilation.
            timeout = 600 if n == 1 else 120
            body = wait_for(lambda n=n: processed(n), timeout, f"row {n} processed")
        metrics = client.get("/metrics").text
    assert body["replica"] == "replica-a" and body["rows_seen"] == len(x)
    assert body["shadow_rows"] == len(x) and body["dropped_behind"] == 0
    bundle = load_bundle(path)
    exact, fast = bundle.embed(x, "exact"), bundle.embed(x, "fast")
    weighting = "variance_weighted"
    assert body["live"]["r2"] == pytest.approx(r2_score(exact, fast, multioutput=weighting))
    novelty = Novelty.fit(digits[0][:1500], random_state=0)[0]
    assert body["novelty_share"] == pytest.approx(np.mean(novelty.is_novel(x)))
    line = 'mbn_live_fidelity_r2{model="m-novel",replica="replica-a"}'
    assert float(metrics.split(line)[1].split()[0]) == pytest.approx(body["live"]["r2"])


def test_rows_are_sampled_at_the_fraction() -> None:
    """Each row with probability ``fraction``, whatever the requests' sizes: the geometric
    gaps between sampled rows give the rate of a draw per row."""
    from types import SimpleNamespace

    from service.monitor import LiveMonitor

    monitor = LiveMonitor(
        None, fraction=0.05, window=100, replica="r", max_delay=3600.0, batch_rows=10**9, seed=0,
    )  # fmt: skip
    bundle = SimpleNamespace(id="m")
    rng = np.random.default_rng(1)
    try:
        for _ in range(4000):
            n = int(rng.choice([1, 1, 1, 3, 40]))
            monitor.observe(bundle, np.zeros((n, 2)), np.zeros((n, 1)))
        window = monitor._windows["m"]
        rate = window.rows_sampled / window.rows_seen
        # about 36,000 rows: the binomial's standard deviation of the rate is 0.0012
        assert abs(rate - 0.05) < 0.005, rate
        assert window.pending == window.rows_sampled
    finally:
        monitor.shutdown()
