"""Small models that tests build when they need any trained model (a bundle to serve, map or
benchmark), not the estimator's options themselves: made in seconds, defined once.

(Imported by the tests as ``small_models``, beside ``digits_data``: tests/ is on sys.path.)
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator

from mbn_core import CompressiveMBN

# A small MBN whose fast path follows its exact one (R^2 about 0.9 on the digits): the
# parameters of ``train_bundle`` for tests that compare a model's versions (read-only: the
# modules that share it copy it to change it).
FOLLOWING_PARAMS: Mapping[str, Any] = MappingProxyType(
    {
        "n_clusterings": 20,
        "k1": 0.1,
        "delta": 0.5,
        "hidden_layer_sizes": [32],
        "max_epochs": 8,
        "n_clusters": 5,
        "map_points": 0,
    }
)


def small_student(
    teacher: BaseEstimator,
    x: np.ndarray,
    y: np.ndarray | None = None,
    *,
    hidden_layer_sizes: tuple[int, ...] = (8,),
) -> CompressiveMBN:
    """``teacher`` fitted on ``x`` and distilled into a small student: two epochs and no
    cross-fitted report (five more fits for a report no test of this kind reads)."""
    return CompressiveMBN(
        teacher,
        hidden_layer_sizes=hidden_layer_sizes,
        max_epochs=2,
        report_folds=None,
        random_state=0,
    ).fit(x, y)
