"""The upper layers' keep-hash (splitmix64): its three implementations agree bit for bit.

The numba kernels (CPU, Dask), the array code (CuPy, numpy) and the CUDA C kernels each
compute it; ``mbn_core.mbn.keep_hash`` holds the constants once. The CUDA C is checked three
ways, each where its tool exists: its hash function compiled alone by the host's C compiler
(anywhere with ``cc``), the whole source compiled to PTX by ``nvcc`` (a CUDA toolkit, no GPU
needed), and the kernels built by NVRTC and run on a GPU (CuPy and a device).
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import numpy as np
import pytest

from mbn_core.mbn import _kernels, keep_hash
from mbn_core.mbn.backends.cuda import arrays as ga
from mbn_core.mbn.backends.cuda import device, kernels

SEEDS = [0, 1, 0xDEADBEEF12345, 2**63 + 12345, 2**64 - 1]


def _keys() -> np.ndarray:
    rng = np.random.default_rng(0)
    edges = np.array([0, 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1], dtype=np.uint64)
    return np.concatenate([edges, rng.integers(0, 2**64 - 1, 2000, dtype=np.uint64)])


def _reference(seed: int, keys: np.ndarray) -> np.ndarray:
    """splitmix64 in Python integers, from the constants alone."""
    mask = 2**64 - 1
    s1, s2, s3 = keep_hash.SHIFTS
    out = []
    for key in keys.tolist():
        z = (seed + key * keep_hash.GOLDEN) & mask
        z = ((z ^ (z >> s1)) * keep_hash.MIX1) & mask
        z = ((z ^ (z >> s2)) * keep_hash.MIX2) & mask
        out.append(z ^ (z >> s3))
    return np.array(out, dtype=np.uint64)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_numba_kernels_and_the_array_code_hash_alike(seed):
    keys = _keys()
    expected = _reference(seed, keys)
    np.testing.assert_array_equal(ga.splitmix64(np, np.uint64(seed), keys), expected)
    for fraction in (0.1, 0.5, 0.9):
        threshold = keep_hash.keep_threshold(fraction)
        np.testing.assert_array_equal(
            _kernels.dimension_kept(np.uint64(seed), keys, threshold), expected < threshold
        )


def _cuda_hash_function() -> str:
    source = kernels.kernel_source()
    match = re.search(r"// BEGIN splitmix64[^\n]*\n(.*)// END splitmix64", source, re.DOTALL)
    assert match, "kernels.cu lost its splitmix64 markers"
    defines = source[: source.index("#define LOWEST_INT")]
    return defines + match.group(1)


def test_the_cuda_c_hash_compiled_on_the_host_hashes_alike(tmp_path):
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no C compiler here to build the CUDA C hash on the host")
    (tmp_path / "hash.c").write_text(
        "#define __device__\n#define __forceinline__ static inline\n"
        + _cuda_hash_function()
        + "\nvoid hash_all(unsigned long long seed, const unsigned long long* keys,"
        " long n, unsigned long long* out)\n"
        "{ for (long i = 0; i < n; ++i) out[i] = splitmix64(seed, keys[i]); }\n"
    )
    library = tmp_path / "hash.so"
    subprocess.run(
        [compiler, "-O2", "-shared", "-fPIC", "-o", str(library), str(tmp_path / "hash.c")],
        check=True,
        capture_output=True,
    )
    hash_all = ctypes.CDLL(str(library)).hash_all
    pointer = ctypes.POINTER(ctypes.c_ulonglong)
    hash_all.argtypes = [ctypes.c_ulonglong, pointer, ctypes.c_long, pointer]
    keys = _keys()
    for seed in SEEDS:
        out = np.empty_like(keys)
        hash_all(seed, keys.ctypes.data_as(pointer), len(keys), out.ctypes.data_as(pointer))
        np.testing.assert_array_equal(out, _reference(seed, keys), err_msg=f"seed {seed}")


def test_the_cuda_source_compiles_with_nvcc(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no CUDA toolkit (nvcc) here to compile kernels.cu")
    source = tmp_path / "kernels.cu"
    source.write_text(kernels.kernel_source())
    result = subprocess.run(
        [nvcc, "--ptx", "-o", str(tmp_path / "kernels.ptx"), str(source)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    ptx = (tmp_path / "kernels.ptx").read_text()
    for name in kernels.KERNEL_NAMES:
        assert f".entry {name}" in ptx, name


def test_the_kernels_built_by_nvrtc_keep_what_the_cpu_keeps():
    if not device.gpu_present():
        pytest.skip("NVRTC runs the kernels on a GPU: no CuPy or no GPU here")
    import cupy

    from mbn_core.mbn.backends.cuda import upper

    rng = np.random.default_rng(5)
    batch = rng.integers(0, 20, size=(300, 16)).astype(np.uint8)
    centers = rng.integers(0, 300, size=(7, 10))
    seeds = rng.integers(0, 2**63, size=7, dtype=np.uint64)
    args = (batch, batch, centers, seeds, 20, 0.5, np.uint8)
    counting = upper.kernel_counting(cupy)
    assert isinstance(counting, upper.KernelCounting), kernels.kernels_in_use()
    np.testing.assert_array_equal(
        upper.upper_layer_codes(cupy, *args, counting=counting),
        upper.upper_layer_codes(np, *args),
    )
