"""Models with an input scaling, through the real app: rows the scaling takes beyond float32
are a 422 in both modes, alike, and a comparison leaves out the rows one model cannot embed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from digits_data import Digits
from fastapi.testclient import TestClient
from servicetest import assert_error

from mbn_core import CompressiveMBN
from mbn_core.bundle import REFERENCE_FILE, save_bundle
from mbn_core.bundle.trained import TrainedModel
from mbn_core.data.scaling import InputScaling, scale_graph_input
from mbn_core.pipeline.alignment import ReferenceRows


def scaled(model: CompressiveMBN, x: np.ndarray, factor0: float = 1.0) -> TrainedModel:
    """``model`` behind a standard scaling fitted on ``x``, its first feature's factor
    multiplied by ``factor0`` (a feature measured in tiny units)."""
    scaling = InputScaling.fit(x, "standard")
    assert scaling.factor is not None
    scaling.factor[0] *= np.float32(factor0)
    trained = model.as_trained_model()
    trained.input_scaling = scaling
    trained.fast_path = scale_graph_input(trained.fast_path, scaling)
    return trained


@pytest.fixture
def client(
    api: Callable[..., TestClient], tiny_model: CompressiveMBN, digits: Digits, tmp_path: Path
) -> TestClient:
    client = api()
    models = Path(client.app.state.settings.models_path)
    x = digits[0]
    save_bundle(scaled(tiny_model, x), models / "m-scaled", name="scaled")
    # m-wide: reference rows, three of them with a value far outside the digits' range.
    rows = x[:40].copy()
    rows[[3, 17, 29], 0] = 1e10
    reference = ReferenceRows(rows, np.zeros((40, 10), np.float32)).to_bytes()
    save_bundle(tiny_model, models / "m-wide", name="wide", extra_files={REFERENCE_FILE: reference})
    # m-tiny-units: its first feature's factor 1e30: the rows above overflow it.
    save_bundle(scaled(tiny_model, x, 1e30), models / "m-tiny-units", name="tiny-units")
    client.app.state.registry.rescan()
    return client


def test_rows_scaled_beyond_float32_are_a_422_in_both_modes(client: TestClient) -> None:
    hostile = [[3e38] * 64]
    messages = []
    for mode in ("fast", "exact"):
        response = client.post("/embed", json={"model": "scaled", "mode": mode, "inputs": hostile})
        messages.append(assert_error(response, 422, "invalid_input")["message"])
    assert messages[0] == messages[1] and "once scaled" in messages[0], messages
    fine = client.post("/embed", json={"model": "scaled", "mode": "exact", "inputs": [[1.0] * 64]})
    assert fine.status_code == 200, fine.text


def test_compare_leaves_out_the_rows_one_model_cannot_embed(client: TestClient) -> None:
    response = client.get("/models/m-wide/compare/m-tiny-units")
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["reference_rows_of"] == "m-wide"
    assert report["fast"]["n_rows"] == 37
    left_out = report["rows_not_compared"]
    assert left_out["count"] == 3 and left_out["rows"] == [3, 17, 29]
    same = client.get("/models/m-wide/compare/m-scaled").json()
    assert same["rows_not_compared"] is None and same["fast"]["n_rows"] == 40


def test_a_model_others_are_aligned_to_is_deleted_only_when_forced(
    client: TestClient, tiny_model: CompressiveMBN
) -> None:
    """Was a silent 204, after which comparing the aligned model with it gave 404."""
    models = Path(client.app.state.settings.models_path)
    alignment = {
        "reference_model": "m-wide",
        "reference_name": "wide",
        "reference_rows": 40,
        "residual": 0.0,
        "matrix": np.eye(10).tolist(),
        "shift": [0.0] * 10,
        "scale": 1.0,
    }
    save_bundle(tiny_model, models / "m-aligned", name="aligned",
                manifest_sections={"alignment": alignment})  # fmt: skip
    client.app.state.registry.rescan()
    error = assert_error(client.delete("/models/m-wide"), 409, "conflict")
    assert "'m-aligned' are aligned to model 'm-wide'" in error["message"]
    assert client.get("/models/m-aligned/compare/m-wide").status_code == 200
    assert client.delete("/models/m-wide", params={"force": "true"}).status_code == 204
    assert client.delete("/models/m-aligned").status_code == 204
