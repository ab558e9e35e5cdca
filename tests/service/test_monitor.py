"""The live monitor through the real app: shadow rows, novelty, GET /models/{id}/monitor."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from digits_data import Digits
from fastapi.testclient import TestClient
from servicetest import assert_error, make_settings, running_app, wait_for
from sklearn.metrics import r2_score

from mbn_core import CompressiveMBN
from mbn_core.bundle import NOVELTY_FILE, load_bundle, save_bundle
from mbn_core.pipeline.novelty import Novelty


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
    # m-digits named the default: unset, the default is the oldest model, and m-novel (written
    # first) is older only when the two writes straddle a second of ``created``, as they did on
    # a loaded machine; deleting the default answers 409.
    overrides.setdefault("default_model", "m-digits")
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


def test_a_model_without_traffic_reports_no_values_and_says_so(shadowing: TestClient) -> None:
    response = shadowing.get("/models/m-novel/monitor")
    assert response.status_code == 200
    body = response.json()
    assert body["rows_seen"] == body["shadow_rows"] == 0
    assert body["has_traffic"] is False and "no fast-mode traffic" in body["note"]
    assert body["state"] == "no_traffic"
    # No rows, no value: null, never a zero that reads as a failing model.
    live = body["live"]
    assert live["n_holdout"] == 0
    assert all(live[key] is None for key in ("r2", "cosine", "cosine_median", "nmi_fast_exact"))
    assert body["novelty_share"] is None and body["out_of_range_share"] is None
    assert body["last_update"] is None and "zero" not in body["note"]
    assert (
        body["training"]
        == load_bundle(shadowing.app.state.registry.get("m-novel").path).manifest["fidelity"]
    )
    assert shadowing.get("/models/nope/monitor").status_code == 404
    # Nor a Prometheus sample: an idle model raises no alert on min(mbn_live_fidelity_r2).
    metrics = shadowing.get("/metrics").text
    assert 'model="m-novel"' not in metrics


@pytest.mark.slow  # the exact runtime computes the shadow rows: seconds; the full suite runs it
def test_a_window_of_sampled_rows_but_no_shadow_rows_reports_no_fidelity(
    batching: TestClient, digits: Digits
) -> None:
    """Rows scored for novelty but not embedded exactly yet: shares, and no fidelity."""
    monitor = batching.app.state.monitor
    response = batching.post("/embed", json={"model": "novel", "inputs": digits[0][:3].tolist()})
    assert response.status_code == 200
    body = batching.get("/models/m-novel/monitor").json()
    assert body["state"] == "no_shadow_rows" and body["live"]["r2"] is None
    assert "live fidelity is zero" not in body["note"] and "no live fidelity yet" in body["note"]
    assert monitor.wait_idle(300)
    body = batching.get("/models/m-novel/monitor").json()
    assert body["state"] == "live" and body["shadow_rows"] == 3
    # One ISO 8601 timestamp, as every other one the service gives.
    stamp = datetime.fromisoformat(body["last_update"].replace("Z", "+00:00"))
    assert stamp.tzinfo is not None and abs(stamp.timestamp() - time.time()) < 600
    metrics = batching.get("/metrics").text
    assert 'mbn_live_fidelity_cosine{model="m-novel"' in metrics
    assert 'mbn_input_novelty_share{model="m-novel"' in metrics


def _live_figures(body: dict) -> tuple:
    live = body["live"]
    return live["r2"], live["nmi_fast_exact"], live["cosine_median"], live["n_holdout"]


@pytest.mark.slow  # the exact runtime computes the shadow rows: seconds; the full suite runs it
def test_rows_outside_the_training_range_stay_out_of_the_live_figures(
    shadowing: TestClient, digits: Digits
) -> None:
    """At fraction 1.0 one row of 1e30 (a valid float32) took R^2 to -1.4e54 and
    nmi_fast_exact from 0.97 to 0.0016: such rows are counted, flagged out of range and
    left out of the fidelity window (they are not shadowed at all)."""
    monitor = shadowing.app.state.monitor
    x = digits[0][1500:1560]
    response = shadowing.post("/embed", json={"model": "novel", "inputs": x.tolist()})
    assert response.status_code == 200
    assert monitor.wait_idle(300)
    before = shadowing.get("/models/m-novel/monitor").json()
    # The tiny test model's fast path is rough (R^2 about -0.15 here): a sane figure.
    assert before["shadow_rows"] == 60 and -1 < before["live"]["r2"] < 1
    extreme = np.full((1, 64), 1e30, dtype=np.float32)
    response = shadowing.post("/embed", json={"model": "novel", "inputs": extreme.tolist()})
    assert response.status_code == 200
    assert monitor.wait_idle(300)
    after = shadowing.get("/models/m-novel/monitor").json()
    assert _live_figures(after) == _live_figures(before)
    assert after["shadow_rows"] == 60 and after["skipped_out_of_range"] == 1
    assert after["rows_sampled"] == 61
    assert after["out_of_range_share"] == pytest.approx(1 / 61)
    assert "outside the training range" in after["note"]
    metrics = shadowing.get("/metrics").text
    line = f'mbn_live_fidelity_r2{{model="m-novel",replica="{after["replica"]}"}}'
    assert float(metrics.split(line)[1].split()[0]) == pytest.approx(before["live"]["r2"])


@pytest.mark.slow  # the exact runtime computes the shadow rows: seconds; the full suite runs it
def test_a_large_request_of_extreme_rows_at_the_default_fraction(
    tmp_path, write_bundle, novelty_bundle, digits: Digits
) -> None:
    """One 8,192-row request of 1e30 at the default fraction took live R^2 from -0.01 to
    -8.9e29."""
    for client in _app(tmp_path, write_bundle, novelty_bundle, shadow_max_delay=0.0):
        monitor = client.app.state.monitor
        assert monitor.fraction == 0.01  # the default
        normal = np.tile(digits[0], (5, 1))[:8192]
        assert (
            client.post("/embed", json={"model": "novel", "inputs": normal.tolist()}).status_code
            == 200
        )
        assert monitor.wait_idle(300)
        before = client.get("/models/m-novel/monitor").json()
        assert before["shadow_rows"] > 20, before
        extreme = np.full((8192, 64), 1e30, dtype=np.float32)
        payload = {"model": "novel", "inputs": extreme.tolist()}
        assert client.post("/embed", json=payload).status_code == 200
        assert monitor.wait_idle(300)
        after = client.get("/models/m-novel/monitor").json()
        assert _live_figures(after) == _live_figures(before)
        assert after["skipped_out_of_range"] > 20 and after["shadow_rows"] == before["shadow_rows"]
        assert after["out_of_range_share"] > 0.2


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
    assert body["out_of_range"] == model.out_of_range(np.vstack([x, shifted])).tolist()
    # Rows beyond the training range are flagged row by row: a user's digits multiplied by 3
    # were "novel" only 14% of the time (the score sees their direction, not their scale).
    tripled = shadowing.post(
        "/embed", json={"model": "novel", "inputs": (3 * x).tolist(), "return_novelty": True}
    ).json()
    assert all(tripled["out_of_range"]) and sum(tripled["novel"]) < 10
    # A bundle saved without one reports it as unavailable.
    old = shadowing.post(
        "/embed", json={"model": "digits", "inputs": x.tolist(), "return_novelty": True}
    ).json()
    assert (
        old["novelty"] is None
        and old["novel"] is None
        and old["out_of_range"] is None
        and "no novelty model" in old["novelty_unavailable"]
    )
    plain = shadowing.post("/embed", json={"model": "novel", "inputs": x.tolist()}).json()
    assert "novelty" not in plain


@pytest.mark.slow  # the exact runtime computes the shadow rows: seconds; the full suite runs it
def test_a_degenerate_novelty_calibration_is_said(
    tmp_path, write_bundle, novelty_bundle, tiny_model: CompressiveMBN, digits: Digits
) -> None:
    """Scaling "none" and one column 1e13 times the others: every calibration row scored 0,
    the threshold was 0.0, rows of 1e30 scored 0.0 ("not novel"), and the monitor said
    novelty_available true. The calibration is found degenerate and said so; the range
    check, which does not depend on it, still flags such rows."""
    rng = np.random.default_rng(0)
    x = rng.random((1500, 64), dtype=np.float32)
    x[:, 0] = rng.integers(0, 4, len(x)) * 1e13  # a code column, in units 1e13 times larger
    model, summary = Novelty.fit(x, random_state=0)
    # The calibration the user met: every difference of squared norms rounds to zero.
    assert model.threshold == 0.0 and not model.scales.any()
    assert model.score(np.full((1, 64), 1e30, dtype=np.float32)).tolist() == [0.0]
    assert summary["degenerate"] is True and "degenerate" in summary["degenerate_reason"]
    assert model.degenerate is not None
    healthy = Novelty.fit(digits[0][:1500], random_state=0)
    assert healthy[0].degenerate is None and healthy[1]["degenerate"] is False
    settings = make_settings(
        tmp_path, embedded_worker=False, shadow_fraction=1.0, shadow_max_delay=0.0
    )
    settings.models_path.mkdir(parents=True, exist_ok=True)
    save_bundle(
        tiny_model,
        settings.models_path / "m-flat",
        name="flat",
        extra_files={NOVELTY_FILE: model.to_bytes()},
        manifest_sections={"novelty": summary},
    )
    with running_app(settings, write_bundle) as client:
        rows = np.vstack([x[:10], np.full((1, 64), 1e30, dtype=np.float32)])
        body = client.post(
            "/embed", json={"model": "flat", "inputs": rows.tolist(), "return_novelty": True}
        ).json()
        assert body["novelty"] is None and body["novel"] is None
        assert "degenerate" in body["novelty_unavailable"]
        assert body["out_of_range"] == [False] * 10 + [True]
        assert client.app.state.monitor.wait_idle(300)
        monitor = client.get("/models/m-flat/monitor").json()
        assert monitor["novelty_available"] is False
        assert "degenerate" in monitor["novelty_unavailable"]
        assert monitor["novelty_share"] is None
        assert monitor["out_of_range_share"] == pytest.approx(1 / 11)
        metrics = client.get("/metrics").text
        assert 'mbn_input_novelty_share{model="m-flat"' not in metrics
        assert 'mbn_input_out_of_range_share{model="m-flat"' in metrics


@pytest.mark.slow  # the exact runtime computes the shadow rows: seconds; the full suite runs it
def test_a_deleted_model_leaves_no_monitor_state(shadowing: TestClient, digits: Digits) -> None:
    """Its window, its novelty model and its series in /metrics go with it."""
    monitor = shadowing.app.state.monitor
    response = shadowing.post(
        "/embed", json={"model": "novel", "inputs": digits[0][:12].tolist(), "return_novelty": True}
    )
    assert response.status_code == 200
    assert monitor.wait_idle(300)
    assert 'mbn_live_fidelity_r2{model="m-novel"' in shadowing.get("/metrics").text
    assert "m-novel" in monitor._windows and "m-novel" in monitor._novelty
    assert shadowing.delete("/models/m-novel").status_code == 204
    assert "m-novel" not in monitor._windows
    assert "m-novel" not in monitor._novelty and "m-novel" not in monitor._centers
    assert 'model="m-novel"' not in shadowing.get("/metrics").text
    # The other models' state stays.
    response = shadowing.post("/embed", json={"model": "digits", "inputs": digits[0][:2].tolist()})
    assert response.status_code == 200
    assert monitor.wait_idle(300)
    assert set(monitor._windows) == {"m-digits"}


@pytest.mark.slow  # the exact runtime computes the shadow rows: seconds; the full suite runs it
def test_a_model_another_replica_deleted_leaves_no_monitor_state(
    shadowing: TestClient, digits: Digits
) -> None:
    """Deleted beside this replica (its directory gone): the next rescan drops it here."""
    import shutil

    monitor = shadowing.app.state.monitor
    registry = shadowing.app.state.registry
    response = shadowing.post("/embed", json={"model": "novel", "inputs": digits[0][:4].tolist()})
    assert response.status_code == 200
    assert monitor.wait_idle(300)
    shutil.rmtree(registry.get("m-novel").path)
    registry.rescan()
    assert "m-novel" not in monitor._windows
    assert 'model="m-novel"' not in shadowing.get("/metrics").text


@pytest.mark.slow  # the exact runtime computes the shadow rows: seconds; the full suite runs it
def test_monitor_equals_a_brute_force_recomputation(shadowing: TestClient, digits: Digits) -> None:
    monitor = shadowing.app.state.monitor
    x = np.vstack([digits[0][1500:1560], 16.0 - digits[0][1560:1570]])
    novelty = Novelty.fit(digits[0][:1500], random_state=0)[0]
    # The inverted rows set pixels no training row set: out of range, never shadowed.
    in_range = ~novelty.out_of_range(x)
    assert 0 < in_range.sum() < len(x)
    for start in range(0, len(x), 7):
        response = shadowing.post(
            "/embed", json={"model": "novel", "inputs": x[start : start + 7].tolist()}
        )
        assert response.status_code == 200
        # One batch at a time: none is replaced while the previous one is processed. (The
        # first waits for the exact model's read: minutes on a loaded machine.)
        assert monitor.wait_idle(300)
    body = shadowing.get("/models/m-novel/monitor").json()
    assert body["rows_seen"] == body["rows_sampled"] == len(x)
    assert body["shadow_rows"] == in_range.sum()
    assert body["skipped_out_of_range"] == len(x) - in_range.sum()
    assert body["skipped_exact_busy"] == body["dropped_behind"] == 0

    bundle = load_bundle(shadowing.app.state.registry.get("m-novel").path)
    shadowed = x[in_range]
    exact = bundle.embed(shadowed, mode="exact").astype(np.float64)
    fast = bundle.embed(shadowed, mode="fast").astype(np.float64)
    cosine = np.sum(exact * fast, axis=1) / (
        np.linalg.norm(exact, axis=1) * np.linalg.norm(fast, axis=1)
    )
    live = body["live"]
    assert live["n_holdout"] == len(shadowed)
    assert live["r2"] == pytest.approx(r2_score(exact, fast, multioutput="variance_weighted"))
    assert live["cosine_median"] == pytest.approx(np.median(cosine))
    agree = bundle.predict_clusters(shadowed, "exact") == bundle.predict_clusters(shadowed, "fast")
    assert live["cluster_agreement"] == pytest.approx(np.mean(agree))
    assert body["novelty_share"] == pytest.approx(np.mean(novelty.is_novel(x)))
    assert body["out_of_range_share"] == pytest.approx(np.mean(novelty.out_of_range(x)))
    assert body["novelty_share"] >= 10 / 70  # the inverted rows

    metrics = shadowing.get("/metrics").text
    replica = body["replica"]
    line = f'mbn_live_fidelity_r2{{model="m-novel",replica="{replica}"}}'
    assert line in metrics
    value = float(metrics.split(line)[1].split()[0])
    assert value == pytest.approx(live["r2"])


@pytest.mark.slow  # the exact runtime computes the shadow rows: seconds; the full suite runs it
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


@pytest.mark.slow  # the exact runtime computes the shadow rows: seconds; the full suite runs it
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


@pytest.mark.slow  # the exact runtime computes the shadow rows: seconds; the full suite runs it
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


@pytest.fixture
def two_reads(tmp_path, write_bundle, novelty_bundle) -> Iterator[TestClient]:
    """At most two expensive reads in flight (MBN_MAX_INFLIGHT_READS=2)."""
    yield from _app(tmp_path, write_bundle, novelty_bundle, max_inflight_reads=2)


def test_expensive_reads_are_admitted_and_refused_past_their_bound(
    two_reads: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """30 clients flooding compare and /monitor never got a 429 (each ran on the default
    pool of 40 threads) while /embed's p99 went from 19.5 ms to 408 ms."""
    client = two_reads
    monitor, reads = client.app.state.monitor, client.app.state.read_budget
    release, entered = threading.Event(), threading.Semaphore(0)
    report = monitor.report

    def slow_report(bundle):
        entered.release()
        release.wait(60)
        return report(bundle)

    monkeypatch.setattr(monitor, "report", slow_report)
    answers: list = []

    def get_monitor() -> None:
        answers.append(client.get("/models/m-novel/monitor"))

    threads = [threading.Thread(target=get_monitor) for _ in range(2)]
    try:
        for thread in threads:
            thread.start()
        assert entered.acquire(timeout=60)  # one runs, the other waits for the thread
        wait_for(lambda: reads.in_flight == 2 or None, 60, "two reads admitted")
        for path in ("/models/m-novel/monitor", "/models/m-novel/compare/m-digits"):
            refused = client.get(path)
            assert "MBN_MAX_INFLIGHT_READS" in assert_error(refused, 429)["message"]
            assert refused.headers["retry-after"]
        # Other routes and /embed are not held up by the reads.
        assert client.get("/health/live").status_code == 200
        assert client.post("/embed", json={"inputs": [[0.0] * 64]}).status_code == 200
    finally:
        release.set()
        for thread in threads:
            thread.join(60)
    assert [answer.status_code for answer in answers] == [200, 200]
    assert reads.in_flight == 0
    assert client.get("/models/m-novel/compare/m-digits").status_code in (200, 409)
    metrics = client.get("/metrics").text
    assert 'mbn_rejected_total{reason="read_monitor"} 1.0' in metrics
    assert 'mbn_rejected_total{reason="read_compare"} 1.0' in metrics
