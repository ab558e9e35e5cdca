"""MBN on one NVIDIA GPU: every layer's codes computed there, the CPU's codes bit for bit.

``MBN(device="cuda")`` fits and encodes through ``CudaBackend``, the backend registered as
"cuda" (``backends.base``). The array code is
``gpu_arrays``, written against a namespace ``xp``: CuPy here, numpy in the tests, where the
same runner runs on the CPU. CuPy is imported lazily; without it (the ``gpu`` extra) or
without a visible GPU, ``device="cuda"`` is refused with a ValueError that says so.

Memory: the input is uploaded in row blocks that fit the budget (``device_budget``), and
each bottom clustering is scored block by block, so the data need not fit on the card; the
upper layers hold the (n, V) codes and their posting lists on the device (``max_rows``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from mbn_core.distribution import install_hint
from mbn_core.mbn._integer_scores import integral_range
from mbn_core.mbn.backends import gpu_arrays as ga
from mbn_core.mbn.backends.base import LayerBackend, ProgressCallback
from mbn_core.mbn.bottom import BottomLayer, input_row_norms
from mbn_core.mbn.dtypes import smallest_uint
from mbn_core.mbn.encoders import UpperClusterings
from mbn_core.mbn.upper import UpperLayer, keep_threshold

log = logging.getLogger(__name__)

DEVICES = ("cpu", "cuda", "auto")
INSTALL_HINT = f"{install_hint('gpu')}: CuPy for CUDA 12; on CUDA 13: pip install cupy-cuda13x"
# Bytes of scores (rows x centers) held on the device at once per block (at most a quarter
# of the budget).
_SCORE_BYTES = 4 << 30
# Bytes of input rows uploaded at once.
_INPUT_BYTES = 8 << 30
# Bytes of a group of upper clusterings' center keys and kept posting lists where the array
# code builds them (``center_lists``, under numpy or without the kernel), at about this many
# bytes per key: the key, its hash, the mask, and the kept lists' indices. It bounds the
# groups on the kernel's path too, which writes no lists, so the two paths group alike.
_LIST_BYTES = 2 << 30
_LIST_BYTES_PER_KEY = 64
# Bytes of counts per group when numpy runs this code on the CPU: groups that stay in the
# caches, since there a clustering's own overhead is small and memory traffic is not.
_HOST_COUNT_BYTES = 8 << 20
# Device bytes per row and clustering that the upper layers hold at their peak: the codes
# (int32, as batch and as centers), their keys (int64), the sort's output and scratch, the
# posting lists, and the layer's new codes (int32, copied back once). The new codes are
# allocated after the sort's scratch is freed, so this errs on the safe side.
_UPPER_BYTES_PER_CODE = 52

# The backend's own kernels; each has an array-code reference in ``gpu_arrays`` that the
# tests run with numpy and that stands in when NVRTC cannot build them.
_KERNEL_SOURCE = r"""
// No standard headers: NVRTC does not always find them.
#define LOWEST_INT (-2147483647 - 1)
#define HIGHEST_INT 2147483647

extern "C" __global__ void count_kept_shared(
    const int* __restrict__ stored, const long long* __restrict__ centers,
    const unsigned long long* __restrict__ seeds, const unsigned long long threshold,
    const int keep_all, const long long* __restrict__ indptr, const int* __restrict__ rows,
    const int n_previous, const int n_values, const int k, const long long n_dimensions,
    const int row_start, const int row_stop, const int columns, int* __restrict__ counts)
{
    // Thread t: dimension (v, code) of center j of the group's clustering g, t = (g * k + j)
    // * n_previous + v; kept when splitmix64(seed_g, key) falls below the threshold, as
    // gpu_arrays.center_lists. Then the warp walks each of its kept lists together: every
    // point on it shares one more kept code with that center, column g * k + j.
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int lane = threadIdx.x & 31;
    bool kept = false;
    long long begin = 0;
    int length = 0, column = 0;
    if (t < n_dimensions) {
        const long long pair = t / n_previous;
        const int v = (int)(t - pair * n_previous);
        const long long key = (long long)v * n_values + stored[centers[pair] * n_previous + v];
        kept = keep_all != 0;
        if (!kept) {
            unsigned long long z = (unsigned long long)key * 0x9E3779B97F4A7C15ull;
            z += seeds[pair / k];
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            kept = (z ^ (z >> 31)) < threshold;
        }
        if (kept) {
            begin = indptr[key];
            length = (int)(indptr[key + 1] - begin);
            column = (int)pair;
            kept = length > 0;
        }
    }
    unsigned int todo = __ballot_sync(0xffffffffu, kept);
    while (todo) {
        const int source = __ffs(todo) - 1;
        todo &= todo - 1;
        const long long list_begin = __shfl_sync(0xffffffffu, begin, source);
        const int list_length = __shfl_sync(0xffffffffu, length, source);
        const int list_column = __shfl_sync(0xffffffffu, column, source);
        for (int p = lane; p < list_length; p += 32) {
            const int i = rows[list_begin + p];
            if (i >= row_start && i < row_stop) {
                atomicAdd(&counts[(long long)(i - row_start) * columns + list_column], 1);
            }
        }
    }
}

// The first maximum of a warp's (value, index) pairs: larger value, then lower index.
__device__ __forceinline__ void warp_first_max(int& top, int& where)
{
    for (int offset = 16; offset > 0; offset >>= 1) {
        const int other_top = __shfl_down_sync(0xffffffffu, top, offset);
        const int other_where = __shfl_down_sync(0xffffffffu, where, offset);
        if (other_top > top || (other_top == top && other_where < where)) {
            top = other_top;
            where = other_where;
        }
    }
}

extern "C" __global__ void centred_first_best(
    const float* __restrict__ dots, const int* __restrict__ sq_norms, const long long n_rows,
    const int k, int* __restrict__ best)
{
    // One warp per row: 2 x.w - |w|^2 of each center, exact in int32 (the dots are whole
    // numbers), read once; the first maximum, as gpu_arrays.first_best_centred.
    const long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (row >= n_rows) return;
    const float* d = dots + row * k;
    int top = LOWEST_INT, where = HIGHEST_INT;
    for (int j = lane; j < k; j += 32) {
        const int score = 2 * __float2int_rz(d[j]) - sq_norms[j];
        if (score > top) { top = score; where = j; }
    }
    warp_first_max(top, where);
    if (lane == 0) best[row] = where;
}

extern "C" __global__ void first_max_per_segment(
    const int* __restrict__ values, const long long n_segments, const int k,
    int* __restrict__ best)
{
    // One warp per run of k values (a row's counts in one clustering): the first maximum,
    // as gpu_arrays.upper_block_codes.
    const long long segment = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (segment >= n_segments) return;
    const int* v = values + segment * k;
    int top = LOWEST_INT, where = HIGHEST_INT;
    for (int j = lane; j < k; j += 32) {
        const int value = v[j];
        if (value > top) { top = value; where = j; }
    }
    warp_first_max(top, where);
    if (lane == 0) best[segment] = where;
}
"""


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


def resolve_device(device: str) -> str:
    """ "cpu" or "cuda" for the ``device`` parameter; ValueError when "cuda" cannot run."""
    if device not in DEVICES:
        raise ValueError(f"device={device!r} must be one of {', '.join(DEVICES)}")
    if device == "cpu":
        return "cpu"
    if device == "auto":
        return "cuda" if gpu_count() > 0 else "cpu"
    try:
        require_cupy()
    except ImportError as exc:
        raise ValueError(str(exc)) from None
    if gpu_count() == 0:
        raise ValueError(
            'device="cuda" but CUDA finds no NVIDIA GPU here; use device="cpu" or "auto"'
        )
    return "cuda"


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


def max_rows(n_clusterings: int, budget: int) -> int:
    """Rows whose upper-layer codes and posting lists fit ``budget`` device bytes."""
    return budget // (_UPPER_BYTES_PER_CODE * n_clusterings)


@functools.lru_cache(maxsize=1)
def _kernel_module() -> Any:
    cupy = require_cupy()
    return cupy.RawModule(code=_KERNEL_SOURCE)


# Kernels that NVRTC could not build: their array-code references run instead.
_failed_kernels: set[str] = set()
_WARP_THREADS = 32
_BLOCK_THREADS = 256


def _kernel(name: str) -> Any | None:
    """The compiled kernel ``name``, or None where it cannot be built (NVRTC missing or too
    old); its caller then runs the array-code reference, which gives the same result. Only
    the build is guarded: a launch's own errors (out of device memory, say) are raised."""
    if name in _failed_kernels:
        return None
    try:
        return _kernel_module().get_function(name)
    except Exception as exc:  # any build failure: the array code serves, and agrees
        log.warning("CUDA kernel %s unavailable (%s); using array code", name, exc)
        _failed_kernels.add(name)
        return None


def _launch_per_warp(kernel: Any, n_warps: int, args: tuple) -> None:
    """Launch ``kernel`` with one warp per item, ``n_warps`` items."""
    if n_warps:
        blocks = (n_warps * _WARP_THREADS + _BLOCK_THREADS - 1) // _BLOCK_THREADS
        kernel((blocks,), (_BLOCK_THREADS,), args)


def _kernel_centred_pick() -> ga.CentredPick | None:
    """The fused kernel for ``gpu_arrays.first_best_centred`` (the scores read once, never
    written out), or None where it cannot be built."""
    kernel = _kernel("centred_first_best")
    if kernel is None:
        return None

    def pick(xp, dots, sq_norms):
        dots = xp.ascontiguousarray(dots, dtype=xp.float32)
        n_rows, k = dots.shape
        best = xp.empty(n_rows, dtype=xp.int32)
        sq_norms = xp.ascontiguousarray(sq_norms, dtype=xp.int32)
        _launch_per_warp(kernel, n_rows, (dots, sq_norms, np.int64(n_rows), np.int32(k), best))
        return best

    return pick


def _kernel_block_codes() -> ga.BlockCodes:
    """The kernel for ``gpu_arrays.upper_block_codes`` (one pass over the counts), or the
    array code where it cannot be built."""
    kernel = _kernel("first_max_per_segment")
    if kernel is None:
        return ga.upper_block_codes

    def block_codes(xp, counts, k):
        counts = xp.ascontiguousarray(counts, dtype=xp.int32)
        n_rows, columns = counts.shape
        best = xp.empty((n_rows, columns // k), dtype=xp.int32)
        n_segments = int(best.size)
        _launch_per_warp(kernel, n_segments, (counts, np.int64(n_segments), np.int32(k), best))
        return best

    return block_codes


def kernel_in_use() -> str:
    """Which of the backend's kernels ran, and which fell back to their array code."""
    names = ("count_kept_shared", "centred_first_best", "first_max_per_segment")
    failed = [name for name in names if name in _failed_kernels]
    return "CUDA kernels" if not failed else f"array code for {', '.join(failed)}"


_last_gemm: dict[str, bool] = {}


def tf32_used() -> bool:
    """Whether the last bottom layer's GEMMs ran in TF32."""
    return bool(_last_gemm.get("tf32"))


class _TF32:
    """Allows TF32 in CuPy's float32 matmul inside the block, where the inputs are exact in
    it (whole numbers up to 2048); restores the previous setting after. No-op for numpy or
    when CuPy lacks the switch."""

    def __init__(self, xp: Any, allowed: bool) -> None:
        self.xp, self.allowed, self.previous = xp, allowed, None
        self.used = False

    def __enter__(self) -> _TF32:
        if not self.allowed or self.xp is np:
            return self
        try:
            from cupy._core import _routines_linalg as linalg

            self.previous = linalg.get_compute_type(np.float32)
            linalg.set_compute_type(np.float32, linalg.COMPUTE_TYPE_TF32)
            self.used = True
        except Exception as exc:  # a CuPy without the switch: plain float32, same codes
            log.info("TF32 not available in this CuPy (%s); float32 GEMMs", exc)
            self.previous = None
        _last_gemm["tf32"] = self.used
        return self

    def __exit__(self, *exc: object) -> None:
        if self.used:
            from cupy._core import _routines_linalg as linalg

            linalg.set_compute_type(np.float32, self.previous)


# ---------------------------------------------------------------------- bottom layer


def bottom_layer_codes(
    xp: Any,
    layer: BottomLayer,
    X: np.ndarray,
    code_dtype: type[np.unsignedinteger],
    report: Callable[[int, int], None] | None = None,
    budget: int | None = None,
) -> np.ndarray:
    """(n, V) bottom codes of dense X on the device; ``report(done, total)`` hears each
    clustering."""
    if sp.issparse(X) or sp.issparse(layer.center_data):
        raise ValueError("the CUDA backend takes dense input; sparse input trains on the CPU")
    n_rows, _ = X.shape
    V, k = layer.centers.shape
    X32 = np.ascontiguousarray(X, dtype=np.float32)
    rows_range, centers_range = integral_range(X32), integral_range(layer.center_data)
    features = [layer.features(v) for v in range(V)]
    integer = rows_range is not None and centers_range is not None
    tf32 = False
    # Small-integer data shifted to [-128, 127]: scores exact in float32, no re-rank.
    offset: int | None = None
    if integer:
        assert rows_range is not None and centers_range is not None
        low, high = min(rows_range[0], centers_range[0]), max(rows_range[1], centers_range[1])
        integer = ga.integer_exact(low, high, layer.n_features)
        tf32 = integer and max(abs(low), abs(high)) <= ga.TF32_EXACT_MAX
        if ga.centred_scores_are_exact(low, high, max(map(len, features)), layer.metric):
            offset, tf32 = low + ga.CENTRE, True
    budget = device_budget(xp) if budget is None else budget
    score_bytes = min(_SCORE_BYTES, budget // 4)
    pick = _kernel_centred_pick() if xp is not np else None
    # Centred scores by array code hold the float32 products and their int32 scores at once.
    per_score = 8 if offset is not None and pick is None else 4
    block = max(
        1, min(n_rows, score_bytes // (per_score * k), _INPUT_BYTES // (4 * X32.shape[1] + 1))
    )
    n_blocks = (n_rows + block - 1) // block
    # Kept in its compact dtype (uint8 for pixels), gathered to float32 per clustering.
    center_data = xp.asarray(layer.center_data)
    centers = xp.asarray(layer.centers.astype(np.int64))
    # The re-rank's tolerances scale with the rows' norms; centred scores need none.
    norms = input_row_norms(X32) if offset is None else None
    codes = np.empty((n_rows, V), dtype=code_dtype)
    # Uploaded once: a copy from pageable host memory waits for the device's queued work.
    chosen_features = [xp.asarray(chosen) for chosen in features]
    with _TF32(xp, tf32):
        for b, start in enumerate(range(0, n_rows, block)):
            stop = min(start + block, n_rows)
            X_block = xp.asarray(X32[start:stop])
            if offset is not None:
                # Not in place: under numpy, X_block is a view of the caller's rows.
                X_block = X_block - xp.float32(offset)
            else:
                assert norms is not None
                tolerance_norms = xp.asarray(norms[start:stop])
            # The block's codes stay on the device until its last clustering.
            block_codes = xp.empty((stop - start, V), dtype=xp.int32)
            for v in range(V):
                chosen = chosen_features[v]
                if layer.shift_masks is None:
                    values = xp.take(xp.take(center_data, centers[v], axis=0), chosen, axis=1)
                    values = values.astype(xp.float32)
                else:
                    values = xp.asarray(layer.center_values(v))
                A = xp.ascontiguousarray(xp.take(X_block, chosen, axis=1))
                if offset is not None:
                    best = ga.centred_best(xp, A, values - xp.float32(offset), pick)
                else:
                    prepared = ga.prepare_centers(xp, values, layer.metric, integer)
                    scores = ga.score_block(xp, A, prepared, layer.metric)
                    tolerance = ga.row_tolerance(xp, tolerance_norms, prepared)
                    host_rows = _HostRows(X32, start, features[v], layer, v)
                    best = _pick(
                        xp, scores, tolerance, A, prepared, layer.metric, integer, host_rows
                    )
                block_codes[:, v] = best
                if report is not None and v < V - 1:  # queued; the last once copied back
                    report((b * V + v + 1) // n_blocks, V)
            codes[start:stop] = ga.to_host(xp, block_codes.astype(code_dtype))
            if report is not None:
                report((b * V + V) // n_blocks, V)
    return codes


class _HostRows:
    """The host's view of one block and clustering, for the CPU's re-rank of float data."""

    def __init__(self, X32: np.ndarray, start: int, features: np.ndarray, layer, v: int):
        self.X32, self.start, self.features, self.layer, self.v = X32, start, features, layer, v

    def rows(self, local: np.ndarray) -> np.ndarray:
        return self.X32[self.start + local][:, self.features]

    @functools.cached_property
    def values(self) -> np.ndarray:
        return self.layer.center_values(self.v)


def _pick(xp, scores, tolerance, A, prepared, metric, integer, host_rows):
    """Each row's best center: the first arg-max, near ties re-ranked exactly."""
    best, near = ga.best_and_near_ties(xp, scores, tolerance)
    near_rows = xp.flatnonzero(near)
    if int(near_rows.size) == 0:
        return best
    if integer:
        rows64 = A[near_rows].astype(xp.float64)
        best[near_rows] = ga.exact_best_on_device(xp, rows64, prepared, metric)
    else:
        local = ga.to_host(xp, near_rows)
        exact = ga.exact_best_on_host(
            ga.to_host(xp, scores[near_rows]),
            ga.to_host(xp, tolerance[near_rows]),
            host_rows.rows(local),
            host_rows.values,
            metric,
        )
        best[near_rows] = xp.asarray(exact)
    return best


# ---------------------------------------------------------------------- upper layers


def upper_layer_codes(
    xp: Any,
    batch_codes: np.ndarray,
    center_codes: np.ndarray,
    centers: np.ndarray,
    seeds: np.ndarray,
    n_values: int,
    feature_fraction: float,
    code_dtype: type[np.unsignedinteger],
    report: Callable[[int, int], None] | None = None,
    counting: SharedCodeCounting | None = None,
) -> np.ndarray:
    """(n, V) codes of an upper layer for the batch's previous-layer ``batch_codes``.

    ``center_codes`` are the previous-layer codes of the rows ``centers`` (V, k) index.
    Clusterings are counted in groups (``clusterings_per_group``): one count and one arg-max
    per group instead of per clustering, because a clustering's own work (a few million
    increments) is too small to hide a round of launches.
    """
    if counting is None:
        counting = kernel_counting(xp) if xp is not np else ArrayCounting(xp)
    block_codes = _kernel_block_codes() if xp is not np else ga.upper_block_codes
    n_points = batch_codes.shape[0]
    V, k = centers.shape
    # Uploaded in their compact dtypes (half the bytes of int32 or less), widened there.
    postings = ga.build_postings(xp, xp.asarray(batch_codes).astype(xp.int32), n_values)
    # Row-major: the counting kernel reads a center row's codes as one run.
    stored = xp.ascontiguousarray(xp.asarray(np.asarray(center_codes)), dtype=xp.int32)
    all_centers = xp.asarray(centers.astype(np.int64))
    all_seeds = xp.asarray(np.asarray(seeds, dtype=np.uint64))
    block = max(1, min(n_points, _SCORE_BYTES // (4 * k)))
    count_bytes = _SCORE_BYTES if xp is not np else _HOST_COUNT_BYTES
    group = clusterings_per_group(V, k, block, stored.shape[1], count_bytes)
    # Every group's codes stay on the device until the last: one copy back, no waits.
    codes = xp.empty((n_points, V), dtype=xp.int32)
    for first in range(0, V, group):
        last = min(first + group, V)
        kept = counting.kept_dimensions(
            postings, stored, all_centers[first:last], all_seeds[first:last], feature_fraction
        )
        for start in range(0, n_points, block):
            stop = min(start + block, n_points)
            counts = counting.count(postings, kept, (last - first) * k, start, stop)
            codes[start:stop, first:last] = block_codes(xp, counts, k)
        if report is not None and last < V:  # queued; the last once copied back
            report(last, V)
    out = ga.to_host(xp, codes.astype(code_dtype))
    if report is not None:
        report(V, V)
    return out


class SharedCodeCounting:
    """How an upper layer's group of clusterings counts the kept codes each point shares
    with each center: ``kept_dimensions`` once per group, then ``count`` per row block."""

    def kept_dimensions(self, postings, stored, centers, seeds, feature_fraction) -> Any:
        """What ``count`` needs of the group: ``stored`` (n_rows, V_prev) int32 codes of the
        center rows, ``centers`` (G, k) int64 rows of it, ``seeds`` (G,) uint64."""
        raise NotImplementedError

    def count(self, postings, kept, columns: int, row_start: int, row_stop: int) -> Any:
        """(row_stop - row_start, columns) int32 counts: column g * k + j for center j of
        the group's clustering g."""
        raise NotImplementedError


class ArrayCounting(SharedCodeCounting):
    """The array-code reference: the kept posting lists (``gpu_arrays.center_lists``) once
    per group, counted by ``gpu_arrays.count_shared_codes``."""

    def __init__(self, xp: Any) -> None:
        self.xp = xp

    def kept_dimensions(self, postings, stored, centers, seeds, feature_fraction):
        return ga.center_lists(self.xp, postings, stored[centers], seeds, feature_fraction)

    def count(self, postings, kept, columns, row_start, row_stop):
        return ga.count_shared_codes(self.xp, postings, kept, columns, row_start, row_stop)


@dataclass(frozen=True)
class _GroupCenters:
    """A group's centers as the fused kernel reads them (nothing computed ahead)."""

    stored: Any
    centers: Any
    seeds: Any
    feature_fraction: float


class KernelCounting(SharedCodeCounting):
    """One CUDA kernel per row block (``count_kept_shared``): each thread hashes one
    (center, previous clustering) dimension of the group's centers, and the warp walks the
    kept ones' posting lists together, so the kept lists are never written out."""

    def __init__(self, xp: Any, kernel: Any) -> None:
        self.xp, self.kernel = xp, kernel

    def kept_dimensions(self, postings, stored, centers, seeds, feature_fraction):
        return _GroupCenters(stored, centers, seeds, feature_fraction)

    def count(self, postings, kept: _GroupCenters, columns, row_start, row_stop):
        xp = self.xp
        counts = xp.zeros((row_stop - row_start, columns), dtype=xp.int32)
        n_groups, k = kept.centers.shape
        n_previous = kept.stored.shape[1]
        n_dimensions = n_groups * k * n_previous
        if n_dimensions:
            blocks = (n_dimensions + _BLOCK_THREADS - 1) // _BLOCK_THREADS
            self.kernel(
                (blocks,),
                (_BLOCK_THREADS,),
                (
                    kept.stored, kept.centers, kept.seeds,
                    keep_threshold(kept.feature_fraction),
                    np.int32(kept.feature_fraction >= 1.0),
                    postings.indptr, postings.rows, np.int32(n_previous),
                    np.int32(postings.n_values), np.int32(k), np.int64(n_dimensions),
                    np.int32(row_start), np.int32(row_stop), np.int32(columns), counts,
                ),
            )  # fmt: skip
        return counts


def kernel_counting(xp: Any) -> SharedCodeCounting:
    """``KernelCounting`` on the device, or ``ArrayCounting`` where its kernel cannot be
    built."""
    kernel = _kernel("count_kept_shared")
    return ArrayCounting(xp) if kernel is None else KernelCounting(xp, kernel)


def clusterings_per_group(
    n_clusterings: int, k: int, block_rows: int, n_previous: int, count_bytes: int = _SCORE_BYTES
) -> int:
    """Upper clusterings counted together: as many as keep a block's counts (rows x
    clusterings x centers, int32) within ``count_bytes``, and the centers' keys and lists
    (clusterings x centers x previous clusterings) within ``_LIST_BYTES``."""
    by_counts = count_bytes // (4 * k * block_rows)
    by_lists = _LIST_BYTES // (_LIST_BYTES_PER_KEY * k * n_previous)
    return max(1, min(n_clusterings, by_counts, by_lists))


# ---------------------------------------------------------------------- the backend


class CudaBackend(LayerBackend):
    """Computes every layer on the device of ``xp`` (CuPy's current GPU; numpy runs the same
    code on the CPU, as the tests do). Sparse input has no device path: its bottom layer runs
    on the local backend's threads, with the same codes."""

    name = "cuda"

    def __init__(
        self,
        *,
        n_jobs: int | None = None,
        callback: ProgressCallback | None = None,
        xp: Any = None,
    ) -> None:
        super().__init__(n_jobs=n_jobs, callback=callback)
        self.xp = require_cupy() if xp is None else xp
        self._local: LayerBackend | None = None

    def close(self) -> None:
        if self._local is not None:
            self._local.close()
        if self.xp is not np:
            self.xp.get_default_memory_pool().free_all_blocks()

    def bottom_codes(self, layer: BottomLayer, X) -> np.ndarray:
        if sp.issparse(X) or sp.issparse(layer.center_data):
            from mbn_core.mbn.backends.local import LocalBackend

            self._local = self._local or LocalBackend(n_jobs=self.n_jobs, callback=self.callback)
            return self._local.bottom_codes(layer, X)
        code_dtype = smallest_uint(layer.n_centers - 1)
        return bottom_layer_codes(self.xp, layer, X, code_dtype, self._reporter(0))

    def fit_upper_codes(
        self, index: int, codes: np.ndarray, clusterings: UpperClusterings
    ) -> np.ndarray:
        return upper_layer_codes(
            self.xp, codes, codes, clusterings.centers, clusterings.seeds,
            clusterings.n_values, clusterings.feature_fraction,
            smallest_uint(clusterings.n_centers - 1), self._reporter(index),
        )  # fmt: skip

    def upper_codes(self, index: int, codes: np.ndarray, layer: UpperLayer) -> np.ndarray:
        return upper_layer_codes(
            self.xp, codes, layer.center_codes, layer.centers.astype(np.int64), layer.seeds,
            layer.n_values, layer.feature_fraction, smallest_uint(layer.n_centers - 1),
        )  # fmt: skip

    def _reporter(self, layer: int) -> Callable[[int, int], None]:
        return lambda done, total: self.report(layer, done, total)


def numpy_backend(
    *, n_jobs: int | None = None, callback: ProgressCallback | None = None
) -> CudaBackend:
    """The CUDA backend's code run with numpy on the CPU (a ``BackendFactory``, for
    ``use_backend``): what the tests and ``bench_gpu.py --device cpu`` check."""
    return CudaBackend(n_jobs=n_jobs, callback=callback, xp=np)
