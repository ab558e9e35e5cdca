"""The CUDA backend: every layer's codes computed on one GPU, the CPU's codes bit for bit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from mbn_core.mbn.backends.base import LayerBackend, ProgressCallback
from mbn_core.mbn.backends.cuda.bottom import bottom_layer_codes
from mbn_core.mbn.backends.cuda.device import require_cupy
from mbn_core.mbn.backends.cuda.upper import upper_layer_codes
from mbn_core.mbn.backends.local import LocalBackend
from mbn_core.mbn.bottom import BottomLayer
from mbn_core.mbn.dtypes import smallest_uint
from mbn_core.mbn.encoders import UpperClusterings
from mbn_core.mbn.upper import UpperLayer


class CudaBackend(LayerBackend):
    """Computes every layer on the device of ``xp`` (CuPy's current GPU; numpy runs the same
    code on the CPU, as the tests do). Sparse input has no device path: its bottom layer runs
    on the local backend's threads, with the same codes, and the backend records it
    (``fallbacks``: the fitted model's ``fallbacks_``, the bundle's manifest, ``mbn info``)."""

    name = "cuda"
    # Told to the user when sparse input's bottom layer runs on the CPU.
    SPARSE_FALLBACK = "sparse input's bottom layer ran on the CPU's threads (no device path)"

    def __init__(
        self,
        *,
        n_jobs: int | None = None,
        callback: ProgressCallback | None = None,
        xp: Any = None,
    ) -> None:
        super().__init__(n_jobs=n_jobs, callback=callback)
        self.xp = require_cupy() if xp is None else xp
        # numpy runs the device code on the CPU (the tests): that is where it computes.
        self.device = "cpu" if self.xp is np else "cuda"
        self._local: LayerBackend | None = None

    def close(self) -> None:
        if self._local is not None:
            self._local.close()
        if self.xp is not np:
            self.xp.get_default_memory_pool().free_all_blocks()

    def bottom_codes(self, layer: BottomLayer, X) -> np.ndarray:
        if sp.issparse(X) or sp.issparse(layer.center_data):
            self.fall_back(self.SPARSE_FALLBACK)
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
