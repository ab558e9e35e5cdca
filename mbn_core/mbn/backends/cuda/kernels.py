"""The CUDA backend's own kernels (``kernels.cu``, shipped as package data), built by NVRTC.

Each kernel has an array-code reference in ``arrays`` that gives the same result. Where
NVRTC cannot build a kernel (missing, or too old), the backend logs a warning and runs that
reference instead; ``kernels_in_use`` says which ran, for reports.
"""

from __future__ import annotations

import functools
import logging
from importlib import resources
from typing import Any

import numpy as np

from mbn_core.mbn import keep_hash
from mbn_core.mbn.backends.cuda import arrays as ga
from mbn_core.mbn.backends.cuda.device import require_cupy

log = logging.getLogger(__name__)

KERNEL_NAMES = ("count_kept_shared", "centred_first_best", "first_max_per_segment")
WARP_THREADS = 32
BLOCK_THREADS = 256


def kernel_source() -> str:
    """The CUDA C of the kernels as NVRTC compiles it: ``kernels.cu`` after the splitmix64
    constants' ``#define`` lines (``keep_hash.cuda_defines``)."""
    source = resources.files(__package__).joinpath("kernels.cu").read_text(encoding="utf-8")
    return keep_hash.cuda_defines() + source


@functools.lru_cache(maxsize=1)
def compiled_module() -> Any:
    """The kernels compiled for the current device (CuPy's ``RawModule``), built once."""
    cupy = require_cupy()
    return cupy.RawModule(code=kernel_source())


# Kernels that NVRTC could not build: their array-code references run instead.
_failed: set[str] = set()


def kernel(name: str) -> Any | None:
    """The compiled kernel ``name``, or None where it cannot be built (NVRTC missing or too
    old); its caller then runs the array-code reference, which gives the same result. Only
    the build is guarded: a launch's own errors (out of device memory, say) are raised."""
    if name in _failed:
        return None
    try:
        return compiled_module().get_function(name)
    except Exception as exc:  # any build failure: the array code serves, and agrees
        log.warning("CUDA kernel %s unavailable (%s); using array code", name, exc)
        _failed.add(name)
        return None


def kernels_in_use() -> str:
    """Which of the backend's kernels ran, and which fell back to their array code."""
    failed = [name for name in KERNEL_NAMES if name in _failed]
    return "CUDA kernels" if not failed else f"array code for {', '.join(failed)}"


def launch_per_warp(kernel: Any, n_warps: int, args: tuple) -> None:
    """Launch ``kernel`` with one warp per item, ``n_warps`` items."""
    if n_warps:
        blocks = (n_warps * WARP_THREADS + BLOCK_THREADS - 1) // BLOCK_THREADS
        kernel((blocks,), (BLOCK_THREADS,), args)


def centred_pick() -> ga.CentredPick | None:
    """The fused kernel for ``arrays.first_best_centred`` (the scores read once, never
    written out), or None where it cannot be built."""
    compiled = kernel("centred_first_best")
    if compiled is None:
        return None

    def pick(xp, dots, sq_norms):
        dots = xp.ascontiguousarray(dots, dtype=xp.float32)
        n_rows, k = dots.shape
        best = xp.empty(n_rows, dtype=xp.int32)
        sq_norms = xp.ascontiguousarray(sq_norms, dtype=xp.int32)
        launch_per_warp(compiled, n_rows, (dots, sq_norms, np.int64(n_rows), np.int32(k), best))
        return best

    return pick


def block_codes() -> ga.BlockCodes:
    """The kernel for ``arrays.upper_block_codes`` (one pass over the counts), or the array
    code where it cannot be built."""
    compiled = kernel("first_max_per_segment")
    if compiled is None:
        return ga.upper_block_codes

    def codes(xp, counts, k):
        counts = xp.ascontiguousarray(counts, dtype=xp.int32)
        n_rows, columns = counts.shape
        best = xp.empty((n_rows, columns // k), dtype=xp.int32)
        n_segments = int(best.size)
        launch_per_warp(compiled, n_segments, (counts, np.int64(n_segments), np.int32(k), best))
        return best

    return codes
