"""The GPU the CUDA backend runs on: CuPy (imported lazily), the device, its memory budget."""

from __future__ import annotations

from typing import Any

import numpy as np

from mbn_core.distribution import install_hint

DEVICES = ("cpu", "cuda", "auto")
INSTALL_HINT = f"{install_hint('gpu')}: CuPy for CUDA 12; on CUDA 13: pip install cupy-cuda13x"


def require_cupy() -> Any:
    """The ``cupy`` module, or ImportError saying what to install."""
    try:
        import cupy
    except ImportError as exc:
        raise ImportError(f'device="cuda" needs CuPy: {INSTALL_HINT}') from exc
    return cupy


def gpu_count() -> int:
    """NVIDIA GPUs CuPy can see (0 without CuPy or a driver)."""
    try:
        cupy = require_cupy()
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no CuPy, no driver, no device: all mean "none here"
        return 0


def gpu_present() -> bool:
    """Whether a GPU can run the backend here."""
    return gpu_count() > 0


def resolve_device(device: str) -> str:
    """ "cpu" or "cuda" for the ``device`` parameter; ValueError when "cuda" cannot run."""
    if device not in DEVICES:
        raise ValueError(f"device={device!r} must be one of {', '.join(DEVICES)}")
    if device == "cpu":
        return "cpu"
    if device == "auto":
        return "cuda" if gpu_present() else "cpu"
    require_gpu()
    return "cuda"


def require_gpu() -> None:
    """ValueError naming what is missing when the backend cannot run here (CuPy, a GPU)."""
    try:
        require_cupy()
    except ImportError as exc:
        raise ValueError(str(exc)) from None
    if not gpu_present():
        raise ValueError(
            'device="cuda" but CUDA finds no NVIDIA GPU here; use device="cpu" or "auto"'
        )


def device_name() -> str:
    """The name of the GPU ``device="cuda"`` uses (device 0 of CuPy's current device)."""
    cupy = require_cupy()
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def device_budget(xp: Any) -> int:
    """Bytes the backend may use on the device (numpy: a fixed 16 GiB, for the tests)."""
    if xp is np:
        return 16 << 30
    free, _total = xp.cuda.runtime.memGetInfo()
    return int(free * 0.8)


# Device bytes per row and clustering that the upper layers hold at their peak: the codes
# (int32, as batch and as centers), their keys (int64), the sort's output and scratch, the
# posting lists, and the layer's new codes (int32, copied back once). The new codes are
# allocated after the sort's scratch is freed, so this errs on the safe side.
UPPER_BYTES_PER_CODE = 52


def upper_rows_capacity(n_clusterings: int, budget: int) -> int:
    """Rows whose upper-layer codes and posting lists fit ``budget`` device bytes at
    ``n_clusterings`` clusterings per layer: the most rows a fit on this device can have."""
    return budget // (UPPER_BYTES_PER_CODE * n_clusterings)


# Bytes of scores (rows x centers) held on the device at once per block (at most a quarter
# of the budget in the bottom layer).
SCORE_BYTES = 4 << 30
