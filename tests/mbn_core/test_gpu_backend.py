"""The CUDA backend's array code, run with numpy: the CPU's codes and embeddings, bit for bit.

``DeviceLayerRunner`` and ``encode_layers`` take the array namespace; with numpy they run the
exact code CuPy runs on a GPU (the posting-list count through its ``bincount`` reference
instead of the CUDA kernel), so CI checks the backend's logic without a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits

from mbn_core import MBN
from mbn_core.mbn import _kernels, network
from mbn_core.mbn.backends import cuda
from mbn_core.mbn.backends import gpu_arrays as ga


def _fit_on(runner_factory, X, **params):
    token = network.layer_runner_factory.set(runner_factory)
    try:
        model = MBN(n_clusterings=12, k_max=120, random_state=0, n_jobs=2, **params)
        embedding, left_out = model.fit_transform_leave_self_out(X)
    finally:
        network.layer_runner_factory.reset(token)
    return model, embedding, left_out


def _images(n=360, seed=3):
    rng = np.random.default_rng(seed)
    prototypes = rng.random((4, 100)) > 0.6
    rows = prototypes[rng.integers(0, 4, n)] * 180.0 + rng.normal(0, 50, (n, 100))
    return np.clip(np.rint(rows), 0, 255).astype(np.uint8)


@pytest.mark.parametrize(
    "data, params",
    [
        ("digits", {}),
        ("images", {"metric": "cosine"}),
        ("scaled", {}),  # float data: near ties re-ranked on the host
        ("scaled", {"metric": "cosine", "shift_fraction": 0.3}),
        ("duplicated", {}),
    ],
)
def test_device_code_gives_the_cpu_model(data, params):
    if data == "digits":
        X = load_digits().data[:400]
    elif data == "images":
        X = _images()
    elif data == "scaled":
        X = _images().astype(np.float32) / 255
    else:
        X = np.repeat(load_digits().data[:120], 3, axis=0)
    device, embedding, left_out = _fit_on(cuda.runner_factory(np), X, **params)
    cpu, cpu_embedding, cpu_left_out = _fit_on(network._LayerRunner, X, **params)
    np.testing.assert_array_equal(embedding, cpu_embedding)
    np.testing.assert_array_equal(left_out, cpu_left_out)
    depth = len(cpu.ks_)
    bottom_codes, top_codes = cuda.encode_layers(
        cpu.bottom_layer_, cpu.upper_layers_, X, depth, xp=np
    )
    np.testing.assert_array_equal(bottom_codes, cpu.encode(X, layer=0))
    np.testing.assert_array_equal(top_codes, cpu.encode(X))
    for layer in range(depth):
        np.testing.assert_array_equal(device.encode(X, layer=layer), cpu.encode(X, layer=layer))
    projected = cuda.project(top_codes, cpu.top_.table, cpu.top_.offset, xp=np)
    np.testing.assert_array_equal(projected, cpu.transform(X))


def test_splitmix_matches_the_kernels():
    keys = np.arange(0, 10_000, 7, dtype=np.uint64)
    seed = np.uint64(0xDEADBEEF12345)
    threshold = np.uint64(2**63)
    np.testing.assert_array_equal(
        ga.splitmix64(np, seed, keys) < threshold, _kernels.dimension_kept(seed, keys, threshold)
    )


def test_counts_are_the_shared_kept_codes():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 5, size=(50, 6))
    postings = ga.build_postings(np, codes, 5)
    centers = np.array([3, 10, 44])
    lists = ga.center_lists(np, postings, codes[centers], np.uint64(99), 1.0)
    counts = ga.count_shared_codes(np, postings, lists, 3, 0, 50)
    np.testing.assert_array_equal(counts, (codes[:, None, :] == codes[centers][None]).sum(axis=2))
    # A row range counts the same rows.
    np.testing.assert_array_equal(
        ga.count_shared_codes(np, postings, lists, 3, 20, 30), counts[20:30]
    )


def test_cuda_without_a_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(cuda, "gpu_count", lambda: 0)
    X = load_digits().data[:100]
    with pytest.raises(ValueError, match="device"):
        MBN(n_clusterings=4, k_max=20, device="cuda").fit(X)
    model = MBN(n_clusterings=4, k_max=20, device="auto", random_state=0).fit(X)
    assert model.device_ == "cpu"
    with pytest.raises(ValueError, match="device"):
        MBN(device="tpu").fit(X)


def test_bad_input_is_refused_on_the_device_runner():
    X = load_digits().data[:100].copy()
    X[3, 4] = np.nan
    token = network.layer_runner_factory.set(cuda.runner_factory(np))
    try:
        with pytest.raises(ValueError, match="NaN"):
            MBN(n_clusterings=4, k_max=20).fit(X)
    finally:
        network.layer_runner_factory.reset(token)
