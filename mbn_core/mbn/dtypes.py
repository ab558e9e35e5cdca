"""The narrowest dtypes that hold an MBN's codes and input values exactly."""

from __future__ import annotations

import numpy as np


def smallest_uint(max_value: int) -> type[np.unsignedinteger]:
    """The narrowest unsigned dtype holding values in [0, max_value]."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if max_value <= np.iinfo(dtype).max:
            return dtype
    return np.uint64


def compact_values(X: np.ndarray) -> np.ndarray:
    """Store dense input in the smallest dtype that holds it exactly as float32.

    Images arrive as uint8 pixels or floats that are whole numbers; storing them as uint8 or
    uint16 quarters or halves the exact model without changing any computed distance.
    """
    X32 = np.asarray(X, dtype=np.float32)
    if X32.size and np.array_equal(X32, np.rint(X32)):
        low, high = float(X32.min()), float(X32.max())
        if low >= 0:
            dtype = smallest_uint(int(high))
            if dtype in (np.uint8, np.uint16):
                return X32.astype(dtype)
    return X32
