"""The CUDA backend's array code, run with numpy: the CPU's codes and embeddings, bit for bit.

``CudaBackend`` takes the array namespace; with numpy (``cuda.numpy_backend``) it runs the
exact code CuPy runs on a GPU (the posting-list count through its ``bincount`` reference
instead of the CUDA kernel), so CI checks the backend's logic without a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from mbn_core import MBN
from mbn_core.mbn.backends import cuda, use_backend
from mbn_core.mbn.backends.cuda import arrays as ga
from mbn_core.mbn.backends.cuda import bottom as cuda_bottom
from mbn_core.mbn.backends.cuda import device as cuda_device
from mbn_core.mbn.backends.cuda import kernels
from mbn_core.mbn.backends.cuda import upper as cuda_upper
from mbn_core.mbn.keep_hash import keep_threshold


def _fit_on(backend, X, **params):
    with use_backend(backend):
        model = MBN(n_clusterings=12, k_max=120, random_state=0, n_jobs=2, **params)
        return model, model.fit_transform(X)


def _images(n=360, seed=3):
    rng = np.random.default_rng(seed)
    prototypes = rng.random((4, 100)) > 0.6
    rows = prototypes[rng.integers(0, 4, n)] * 180.0 + rng.normal(0, 50, (n, 100))
    return np.clip(np.rint(rows), 0, 255).astype(np.uint8)


@pytest.mark.slow
@pytest.mark.parametrize(
    "data, params",
    [
        ("digits", {}),
        ("images", {"metric": "cosine"}),
        ("images", {"shift_fraction": 0.3}),  # centred exact scores, reconstructed centers
        ("offset images", {}),  # whole numbers in [1000, 1255]: centred by 1128
        ("scaled", {}),  # float data: near ties re-ranked on the host
        ("scaled", {"metric": "cosine", "shift_fraction": 0.3}),
        ("duplicated", {}),
    ],
)
def test_device_code_gives_the_cpu_model(data, params, digits):
    if data == "digits":
        X = digits.X[:400]
    elif data == "images":
        X = _images()
    elif data == "offset images":
        X = _images().astype(np.float64) + 1000
    elif data == "scaled":
        X = _images().astype(np.float32) / 255
    else:
        X = np.repeat(digits.X[:120], 3, axis=0)
    device, embedding = _fit_on(cuda.numpy_backend, X, **params)
    cpu, cpu_embedding = _fit_on("local", X, **params)
    np.testing.assert_array_equal(embedding, cpu_embedding)
    for layer in range(len(cpu.ks_)):
        on_cpu = cpu.encode(X, layer=layer)
        np.testing.assert_array_equal(device.encode(X, layer=layer), on_cpu)
        with use_backend(cuda.numpy_backend):  # new rows encoded by the device code
            np.testing.assert_array_equal(cpu.encode(X, layer=layer), on_cpu)
    with use_backend(cuda.numpy_backend):
        np.testing.assert_array_equal(cpu.transform(X), cpu_embedding)


def test_counts_are_the_shared_kept_codes():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 5, size=(50, 6))
    postings = ga.build_postings(np, codes, 5)
    centers = np.array([3, 10, 44])
    lists = ga.center_lists(np, postings, codes[centers][None], np.array([99]), 1.0)
    counts = ga.count_shared_codes(np, postings, lists, 3, 0, 50)
    np.testing.assert_array_equal(counts, (codes[:, None, :] == codes[centers][None]).sum(axis=2))
    # A row range counts the same rows, and so do runs of a few postings at a time.
    np.testing.assert_array_equal(
        ga.count_shared_codes(np, postings, lists, 3, 20, 30), counts[20:30]
    )
    np.testing.assert_array_equal(
        ga.count_shared_codes(np, postings, lists, 3, 0, 50, max_entries=7), counts
    )


def test_a_group_of_clusterings_counts_as_each_alone():
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 9, size=(80, 12))
    postings = ga.build_postings(np, codes, 9)
    centers = rng.integers(0, 80, size=(4, 6))
    seeds = rng.integers(0, 2**63, size=4, dtype=np.uint64)
    grouped = ga.center_lists(np, postings, codes[centers], seeds, 0.5)
    counts = ga.count_shared_codes(np, postings, grouped, 4 * 6, 0, 80)
    for g in range(4):
        alone = ga.center_lists(np, postings, codes[centers[g]][None], seeds[g : g + 1], 0.5)
        np.testing.assert_array_equal(
            counts[:, g * 6 : (g + 1) * 6], ga.count_shared_codes(np, postings, alone, 6, 0, 80)
        )
        np.testing.assert_array_equal(
            ga.upper_block_codes(np, counts, 6)[:, g],
            ga.upper_block_codes(np, ga.count_shared_codes(np, postings, alone, 6, 0, 80), 6)[:, 0],
        )


def _upper_case(seed: int = 4):
    """Arguments of ``cuda.upper_layer_codes`` for a small random layer, under numpy."""
    rng = np.random.default_rng(seed)
    batch = rng.integers(0, 20, size=(300, 16)).astype(np.uint8)
    centers = rng.integers(0, 300, size=(7, 10))
    seeds = rng.integers(0, 2**63, size=7, dtype=np.uint64)
    return (np, batch, batch, centers, seeds, 20, 0.5, np.uint8)


def test_upper_layers_in_groups_give_the_same_codes(monkeypatch):
    """Clusterings one at a time, in groups of three and all together: the same codes."""

    def layer(group: int) -> np.ndarray:
        monkeypatch.setattr(cuda_upper, "clusterings_per_group", lambda *_: group)
        return cuda.upper_layer_codes(*_upper_case(2))

    # MNIST-70k's layers: the last in one group, the second (k = 4,000) three at a time.
    assert cuda.clusterings_per_group(400, 15, 70_000, 400) == 400
    assert cuda.clusterings_per_group(400, 4000, 70_000, 400) == 3
    alone = layer(1)
    np.testing.assert_array_equal(layer(3), alone)
    np.testing.assert_array_equal(layer(7), alone)


def test_cuda_without_a_gpu_is_refused(monkeypatch, digits):
    monkeypatch.setattr(cuda_device, "gpu_count", lambda: 0)
    X = digits.X[:100]
    with pytest.raises(ValueError, match="device"):
        MBN(n_clusterings=4, k_max=20, device="cuda").fit(X)
    model = MBN(n_clusterings=4, k_max=20, device="auto", random_state=0).fit(X)
    assert model.device_ == "cpu"
    with pytest.raises(ValueError, match="device"):
        MBN(device="tpu").fit(X)


def test_sparse_input_on_the_device_backend_falls_back_on_the_record(digits):
    from mbn_core.mbn.method import METHOD
    from mbn_core.mbn.persistence import model_from_arrays, model_to_arrays

    X = sp.csr_matrix(digits.X[:200])
    model, embedding = _fit_on(cuda.numpy_backend, X, metric="cosine")
    cpu, cpu_embedding = _fit_on("local", X, metric="cosine")
    np.testing.assert_array_equal(embedding, cpu_embedding)
    assert model.fallbacks_ == [cuda.CudaBackend.SPARSE_FALLBACK] and cpu.fallbacks_ == []
    assert model.device_ == "cpu"  # numpy ran the device code on the CPU
    assert METHOD.facts(model)["fallbacks"] == model.fallbacks_
    assert "fallbacks" not in METHOD.facts(cpu)
    loaded = model_from_arrays(model_to_arrays(model), model.get_params())
    assert loaded.fallbacks_ == model.fallbacks_ and loaded.device_ == model.device_


def test_bad_input_is_refused_on_the_device_runner(digits):
    X = digits.X[:100].copy()
    X[3, 4] = np.nan
    with use_backend(cuda.numpy_backend), pytest.raises(ValueError, match="NaN"):
        MBN(n_clusterings=4, k_max=20).fit(X)


@pytest.mark.slow  # over a second; the full suite runs it
def test_the_device_is_recorded_in_the_bundle(tmp_path, digits):
    from mbn_core.bundle import load_bundle
    from mbn_core.cli import main
    from mbn_core.pipeline.training import train_bundle

    X = digits.X[:200]
    params = {"n_clusterings": 4, "k_max": 20, "max_epochs": 2, "device": "auto"}
    path = train_bundle(X, tmp_path / "m", name="m", params=params)
    expected = f"cuda ({cuda.device_name()})" if cuda.gpu_present() else "cpu"
    assert load_bundle(path).manifest["training"]["device"] == expected
    assert "device" not in load_bundle(path).manifest["hyperparameters"]["mbn"]
    main(["info", str(path)])


def test_centred_scores_pick_the_exact_nearest_center():
    # At the dimension bound, with the extreme values, exact ties (repeated centers, rows
    # midway between two) and every row's float64 distances as the reference.
    rng = np.random.default_rng(7)
    d = ga.CENTRED_EXACT_DIMENSIONS
    centers = rng.integers(-128, 128, (12, d)).astype(np.float32)
    centers[3] = -128
    centers[4] = 127
    centers[5] = centers[2]  # a repeat: never chosen over center 2
    even = 2 * np.floor(centers[:2] / 2)
    centers[:2] = even
    rows = np.vstack(
        [
            rng.integers(-128, 128, (40, d)),
            np.full((1, d), -128),
            np.full((1, d), 127),
            (even[0] + even[1])[None] / 2,  # midway between centers 0 and 1: a tie
            centers,
        ]
    ).astype(np.float32)
    got = ga.centred_best(np, rows, centers)
    distances = ((rows[:, None, :].astype(np.float64) - centers[None]) ** 2).sum(axis=2)
    np.testing.assert_array_equal(got, np.argmin(distances, axis=1))
    assert got[42] == 0 and got[43 + 5] == 2 and got[41] == 4 and got[40] == 3


@pytest.mark.slow  # over a second; the full suite runs it
def test_small_integer_images_take_the_centred_scores(monkeypatch):
    # Euclidean images within 256 levels never reach the near-tie re-rank.
    def no_rerank(*args):
        raise AssertionError("the re-rank path ran")

    monkeypatch.setattr(cuda_bottom, "_pick", no_rerank)
    X = _images()
    _, embedding = _fit_on(cuda.numpy_backend, X)
    _, cpu_embedding = _fit_on("local", X)
    np.testing.assert_array_equal(embedding, cpu_embedding)
    assert ga.centred_scores_are_exact(0, 255, ga.CENTRED_EXACT_DIMENSIONS, "euclidean")
    assert not ga.centred_scores_are_exact(0, 256, 10, "euclidean")  # 257 levels
    assert not ga.centred_scores_are_exact(0, 255, ga.CENTRED_EXACT_DIMENSIONS + 1, "euclidean")
    assert not ga.centred_scores_are_exact(0, 255, 10, "cosine")


def test_centred_scoring_leaves_the_callers_rows_alone():
    # Under numpy the device runner sees the caller's float32 rows themselves: shifting
    # them must not write into them.
    X = _images().astype(np.float32)
    before = X.copy()
    _fit_on(cuda.numpy_backend, X)
    np.testing.assert_array_equal(X, before)


def test_kernels_that_cannot_be_built_leave_their_array_code(monkeypatch):
    """Where NVRTC cannot build the kernels, each step takes its array-code reference
    (under numpy the kernels cannot build, as on a bad driver)."""

    def no_nvrtc():
        raise RuntimeError("NVRTC unavailable")

    monkeypatch.setattr(kernels, "compiled_module", no_nvrtc)
    monkeypatch.setattr(kernels, "_failed", set())
    assert kernels.centred_pick() is None
    assert kernels.block_codes() is ga.upper_block_codes
    assert isinstance(cuda.kernel_counting(np), cuda.ArrayCounting)
    assert cuda.kernels_in_use() == (
        "array code for count_kept_shared, centred_first_best, first_max_per_segment"
    )


class _KernelsByArrayCode:
    """Stands in for the compiled module: each "kernel" takes the launch's arguments as
    CUDA does and computes its outputs with the array-code references, so the launch
    wrappers' arguments, shapes and outputs are checked on the CPU."""

    def get_function(self, name):
        return getattr(self, name)

    @staticmethod
    def centred_first_best(grid, block, args):
        dots, sq_norms, n_rows, k, best = args
        assert dots.shape == (n_rows, k) and best.shape == (n_rows,)
        assert grid[0] * block[0] >= 32 * n_rows  # a warp per row
        best[:] = ga.first_best_centred(np, dots, sq_norms)

    @staticmethod
    def first_max_per_segment(grid, block, args):
        counts, n_segments, k, best = args
        assert counts.size == n_segments * k and grid[0] * block[0] >= 32 * n_segments
        best[:] = ga.upper_block_codes(np, counts, int(k))

    @staticmethod
    def count_kept_shared(grid, block, args):
        (stored, centers, seeds, threshold, keep_all, indptr, rows, n_previous, n_values, k,
         n_dimensions, row_start, row_stop, columns, counts) = args  # fmt: skip
        assert stored.flags.c_contiguous and stored.shape[1] == n_previous and centers.shape[1] == k
        assert n_dimensions == centers.size * n_previous and grid[0] * block[0] >= n_dimensions
        fraction = 1.0 if keep_all else float(threshold) / 2.0**64
        assert keep_all or keep_threshold(fraction) == threshold
        postings = ga.DevicePostings(indptr, rows, 0, int(n_values))
        lists = ga.center_lists(np, postings, stored[centers], seeds, fraction)
        counts += ga.count_shared_codes(np, postings, lists, int(columns), row_start, row_stop)


def test_the_kernels_launch_with_what_their_references_take(monkeypatch):
    monkeypatch.setattr(kernels, "compiled_module", _KernelsByArrayCode)
    monkeypatch.setattr(kernels, "_failed", set())
    rng = np.random.default_rng(4)
    dots = rng.integers(-(2**20), 2**20, size=(50, 33)).astype(np.float32)
    sq_norms = rng.integers(0, 2**20, size=33).astype(np.int32)
    pick = kernels.centred_pick()
    assert pick is not None
    np.testing.assert_array_equal(
        pick(np, dots, sq_norms), ga.first_best_centred(np, dots, sq_norms)
    )
    counts = rng.integers(0, 3, size=(40, 5 * 7)).astype(np.int32)
    np.testing.assert_array_equal(
        kernels.block_codes()(np, counts, 7), ga.upper_block_codes(np, counts, 7)
    )
    counting = cuda.kernel_counting(np)
    assert isinstance(counting, cuda.KernelCounting)
    np.testing.assert_array_equal(
        cuda.upper_layer_codes(*_upper_case(), counting=counting),
        cuda.upper_layer_codes(*_upper_case(), counting=cuda.ArrayCounting(np)),
    )
    assert cuda.kernels_in_use() == "CUDA kernels"


@pytest.mark.slow  # over a second; the full suite runs it
def test_progress_reaches_the_end_only_after_the_codes_are_back():
    """The device queues a layer's clusterings and copies the codes back once: progress is
    reported as they are queued, and a layer's last report comes after the copy."""
    X = _images()
    model, _ = _fit_on(cuda.numpy_backend, X)
    heard: list[tuple[int, int]] = []

    def record(done: int, total: int) -> None:
        heard.append((done, total))

    codes = cuda.bottom_layer_codes(
        np, model.bottom_layer_, X.astype(np.float32), np.uint16, record
    )
    np.testing.assert_array_equal(codes, model.encode(X, layer=0))
    V = model.n_clusterings
    assert heard[-1] == (V, V) and [done for done, _ in heard] == sorted(done for done, _ in heard)
    heard.clear()
    layer = model.upper_layers_[0]
    cuda.upper_layer_codes(
        np, codes, layer.center_codes, layer.centers.astype(np.int64), layer.seeds,
        layer.n_values, layer.feature_fraction, np.uint16, record,
    )  # fmt: skip
    assert heard[-1] == (V, V)
