"""The digits the tests use, defined once: scikit-learn's 1,797 8x8 images (features 0..16)
and their labels.

The ``digits`` fixture (tests/conftest.py) gives them whole, as scikit-learn loads them
(float64 rows, int64 labels), read-only, since every test of a session shares them; the
service's tests take them as float32, what its clients send (small integers: the same values).
A test module that wants fewer rows takes them from ``digits`` in a fixture named for what it
holds, never in a fixture of its own called ``digits``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from sklearn.datasets import load_digits


class Digits(NamedTuple):
    """Rows and labels: ``X, y = digits``."""

    X: np.ndarray
    y: np.ndarray


@functools.cache
def _loaded() -> Digits:
    X, y = load_digits(return_X_y=True)
    return Digits(X, y.astype(np.int64))


def digits(dtype: type = np.float64) -> Digits:
    """The 1,797 digits with their labels, rows as ``dtype``; read-only (a test that changes
    rows copies them)."""
    X, y = _loaded()
    rows, labels = X.astype(dtype), y.copy()
    rows.setflags(write=False)
    labels.setflags(write=False)
    return Digits(rows, labels)
