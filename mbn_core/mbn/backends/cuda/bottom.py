"""The bottom layer on the device: each clustering's nearest centers, the CPU's codes.

Small-integer data (images) within 256 consecutive integers, Euclidean, is scored in a
centred range where float32 (TF32) scores are exact; other data gets float32 scores with
every near tie re-ranked exactly (see ``arrays``). The input is uploaded in row blocks that
fit the device budget, so the data need not fit on the card.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from mbn_core.mbn._integer_scores import integral_range
from mbn_core.mbn.backends.cuda import arrays as ga
from mbn_core.mbn.backends.cuda import kernels
from mbn_core.mbn.backends.cuda.device import SCORE_BYTES, device_budget
from mbn_core.mbn.backends.cuda.tf32 import TF32Gemms
from mbn_core.mbn.bottom import BottomLayer, input_row_norms

# Bytes of input rows uploaded at once.
_INPUT_BYTES = 8 << 30


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
    score_bytes = min(SCORE_BYTES, budget // 4)
    pick = kernels.centred_pick() if xp is not np else None
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
    with TF32Gemms(xp, tf32):
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
