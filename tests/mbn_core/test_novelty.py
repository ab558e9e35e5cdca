"""The novelty score: calibrated on training rows, flags shifted rows, stored in bundles."""

from __future__ import annotations

import numpy as np
import pytest

from mbn_core.bundle import NOVELTY_FILE, load_bundle
from mbn_core.pipeline.novelty import QUANTILE, Novelty, load_novelty
from mbn_core.pipeline.training import train_bundle


@pytest.fixture(scope="module")
def split(digits):
    """1,400 digits drawn at random to fit and the other 397, as float32."""
    rng = np.random.default_rng(0)
    order = rng.permutation(len(digits.X))
    X = digits.X.astype(np.float32)
    return X[order[:1400]], X[order[1400:]]


def _shifted(X: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    images = X.reshape(-1, 8, 8)
    occluded = images.copy()
    for image in occluded:
        row, col = rng.integers(0, 4, 2)
        image[row : row + 4, col : col + 4] = 16.0
    return {
        "noise": np.clip(X + rng.normal(0, 4, X.shape), 0, 16),
        "inverted": 16.0 - X,
        "occluded": occluded.reshape(len(X), -1),
        "uniform": rng.uniform(0, 16, X.shape),
    }


def test_held_out_rows_stay_near_the_calibrated_rate(split):
    train, held_out = split
    model, summary = Novelty.fit(train, random_state=0)
    assert summary["quantile"] == QUANTILE
    assert summary["calibration_novel_share"] == pytest.approx(1 - QUANTILE, abs=0.01)
    # 397 rows new to the model: a 1% rate gives 4 flags on average; 5% is far above it.
    assert np.mean(model.is_novel(held_out)) <= 0.05
    assert np.mean(model.out_of_range(held_out)) <= 0.05


def test_shifted_rows_are_flagged(split):
    train, held_out = split
    model, _ = Novelty.fit(train, random_state=0)
    rng = np.random.default_rng(1)
    for name, rows in _shifted(held_out, rng).items():
        share = float(np.mean(model.is_novel(rows)))
        assert share > 0.3, (name, share)
    assert np.mean(model.is_novel(_shifted(held_out, rng)["inverted"])) > 0.9
    far = held_out * 3.0
    assert np.mean(model.out_of_range(far)) > 0.9


def test_scores_are_per_row(split):
    train, held_out = split
    model, _ = Novelty.fit(train, random_state=0)
    batch = model.score(held_out[:50])
    alone = np.array([model.score(row[None])[0] for row in held_out[:50]])
    np.testing.assert_allclose(batch, alone, rtol=1e-9, atol=1e-9)


def test_round_trip_and_malformed_bytes(split):
    train, held_out = split
    model, _ = Novelty.fit(train, random_state=0)
    again = Novelty.from_bytes(model.to_bytes())
    np.testing.assert_array_equal(model.score(held_out), again.score(held_out))
    assert again.threshold == model.threshold
    with pytest.raises(ValueError, match="novelty"):
        Novelty.from_bytes(b"not an npz")
    with pytest.raises(ValueError, match="shape"):
        model.score(held_out[:, :10])


@pytest.mark.slow
def test_bundles_store_the_novelty_model(split, tmp_path):
    train, held_out = split
    params = {
        "n_clusterings": 20,
        "k1": 0.1,
        "delta": 0.5,
        "hidden_layer_sizes": [32],
        "max_epochs": 4,
        "random_state": 0,
        "map_points": 0,
    }
    path = train_bundle(train, tmp_path / "m", name="digits", params=params)
    bundle = load_bundle(path)
    assert NOVELTY_FILE in bundle.manifest["files"]
    section = bundle.manifest["novelty"]
    model = load_novelty(bundle)
    assert model is not None and model.threshold == section["threshold"]
    assert np.mean(model.is_novel(held_out)) <= 0.05
    assert np.mean(model.is_novel(16.0 - held_out)) > 0.9
