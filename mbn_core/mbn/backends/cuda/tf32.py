"""The TF32 switch of CuPy's float32 matrix products, for the bottom layer's exact inputs.

CuPy has no public switch for TF32 in ``matmul``: the compute type lives in
``cupy._core._routines_linalg`` (get/set_compute_type, COMPUTE_TYPE_TF32), a private module.
pyproject.toml bounds CuPy to the releases where it is known there, and
tests/mbn_core/test_dependency_apis.py checks it wherever CuPy is installed. Without it the
GEMMs run in plain float32: slower, the same codes.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

# Where CuPy keeps its float32 GEMM compute type, and the names used there.
LINALG_MODULE = "cupy._core._routines_linalg"
LINALG_NAMES = ("get_compute_type", "set_compute_type", "COMPUTE_TYPE_TF32")


def compute_type_switch() -> Any:
    """CuPy's module with the compute type switch (``LINALG_NAMES``); ImportError or
    AttributeError when this CuPy has none."""
    import importlib

    linalg = importlib.import_module(LINALG_MODULE)
    for name in LINALG_NAMES:
        getattr(linalg, name)
    return linalg


class TF32Gemms:
    """Allows TF32 in CuPy's float32 matmul inside the block, where the inputs are exact in
    it (whole numbers up to 2048); restores the previous setting after. No-op for numpy or
    when CuPy lacks the switch. ``used`` says whether TF32 was on."""

    def __init__(self, xp: Any, allowed: bool) -> None:
        self.xp, self.allowed, self.previous = xp, allowed, None
        self.used = False
        self._linalg: Any = None

    def __enter__(self) -> TF32Gemms:
        if not self.allowed or self.xp is np:
            return self
        try:
            linalg = compute_type_switch()
            self.previous = linalg.get_compute_type(np.float32)
            linalg.set_compute_type(np.float32, linalg.COMPUTE_TYPE_TF32)
            self._linalg, self.used = linalg, True
        except Exception as exc:  # a CuPy without the switch: plain float32, same codes
            log.info("TF32 not available in this CuPy (%s); float32 GEMMs", exc)
            self.previous = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.used:
            self._linalg.set_compute_type(np.float32, self.previous)
