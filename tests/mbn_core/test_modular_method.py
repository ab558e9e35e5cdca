"""Modular kernel PCA through the method registry: bundle, CLI, both embedding paths."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mbn_core import ModularKPCA, cli
from mbn_core.bundle import load_bundle
from mbn_core.methods import get_method
from mbn_core.pipeline.training import train_bundle

PARAMS = {"n_modules": 3, "module_dim": 4, "n_landmarks": 80, "max_epochs": 15}


@pytest.fixture(scope="module")
def split(digits):
    """Rows fitted (the first 600) and new ones (the next 100): (X, y, X_new)."""
    X, y = digits
    return X[:600], y[:600], X[600:700]


def test_registered_with_an_exported_fast_path_and_its_options():
    method = get_method("modular_kpca")
    assert method.estimator is ModularKPCA
    assert method.fast_path == "exported"
    names = {param.name for param in method.params()}
    assert {"n_modules", "module_dim", "diversity", "n_landmarks", "gamma", "tol"} <= names
    assert "callback" not in names


@pytest.mark.slow
def test_bundle_stores_plain_arrays_and_serves_both_paths(split, tmp_path):
    X, y, new = split
    path = train_bundle(
        X, tmp_path / "mkpca", name="mkpca", y=y,
        params={"method": "modular_kpca", **PARAMS, "n_clusters": 10},
    )  # fmt: skip
    bundle = load_bundle(path)
    manifest = bundle.manifest
    assert (manifest["method"], manifest["fast_path"]) == ("modular_kpca", "exported")
    assert manifest["hyperparameters"]["modular_kpca"]["n_modules"] == 3
    assert manifest["training"]["diversity"] == 0.99
    assert manifest["training"]["rank"] <= 80
    # Fidelity of the ONNX graph against the float64 map, on held-out rows.
    assert manifest["fidelity"]["r2"] > 0.9999
    exact, fast = bundle.embed(new, mode="exact"), bundle.embed(new)
    assert exact.shape == (100, 12)
    np.testing.assert_allclose(fast, exact, atol=1e-4 * np.abs(exact).max())
    # The exact state is plain arrays: loadable without pickle.
    for npz in path.glob("*.npz"):
        with np.load(npz, allow_pickle=False) as arrays:
            assert all(arrays[name].dtype != object for name in arrays.files)
    assert isinstance(bundle.load_exact().estimator, ModularKPCA)


@pytest.mark.slow
def test_a_tampered_array_is_refused(split, tmp_path):
    X, _, _ = split
    path = train_bundle(X, tmp_path / "m", name="m", params={"method": "modular_kpca", **PARAMS})
    target = next(p for p in path.iterdir() if p.suffix == ".npz")
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"(?i)hash|sha|corrupt|checksum"):
        load_bundle(path)


@pytest.mark.slow
def test_cli_trains_with_method_modular_kpca(split, tmp_path, monkeypatch, capsys):
    X, y, new = split
    monkeypatch.chdir(tmp_path)
    np.savez("train.npz", x=X, y=y)
    np.save("new.npy", new)
    assert cli.main(["train", "train.npz", "--out", "m", "--method", "modular_kpca",
                     "--n-modules", "2", "--module-dim", "3", "--n-landmarks", "60",
                     "--diversity", "0.9", "--quiet"]) == 0  # fmt: skip
    assert "modular_kpca" in capsys.readouterr().out
    manifest = load_bundle(tmp_path / "m").manifest
    assert manifest["hyperparameters"]["modular_kpca"]["diversity"] == 0.9
    assert cli.main(["embed", "m", "new.npy", "--out", "e.npy", "--exact"]) == 0
    assert np.load("e.npy").shape == (len(new), 6)
    json.dumps(manifest)  # the manifest is plain JSON
