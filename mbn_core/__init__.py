"""mbn_core: Multilayer Bootstrap Networks, a numerical library with no web dependencies.

The estimators are imported on first use (PEP 562), so that importing one method, or
``mbn_core.exceptions``, does not load the others and their compiled kernels.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mbn_core.exceptions import TrainingStopped

if TYPE_CHECKING:
    from mbn_core.mbn.estimator import MBN
    from mbn_core.mbn.persistence import model_from_arrays, model_to_arrays
    from mbn_core.modular.baselines import ModularBaseline
    from mbn_core.modular.kpca import ModularKPCA
    from mbn_core.multilevel.embedding import MultilevelEmbedding, MultilevelKMeans
    from mbn_core.pipeline.distilled import CompressiveMBN, DistilledEmbedding

_LAZY = {
    "MBN": "mbn_core.mbn.estimator",
    "model_from_arrays": "mbn_core.mbn.persistence",
    "model_to_arrays": "mbn_core.mbn.persistence",
    "CompressiveMBN": "mbn_core.pipeline.distilled",
    "DistilledEmbedding": "mbn_core.pipeline.distilled",
    "ModularBaseline": "mbn_core.modular.baselines",
    "ModularKPCA": "mbn_core.modular.kpca",
    "MultilevelEmbedding": "mbn_core.multilevel.embedding",
    "MultilevelKMeans": "mbn_core.multilevel.embedding",
}

__all__ = [
    "MBN",
    "CompressiveMBN",
    "DistilledEmbedding",
    "ModularBaseline",
    "ModularKPCA",
    "MultilevelEmbedding",
    "MultilevelKMeans",
    "TrainingStopped",
    "model_from_arrays",
    "model_to_arrays",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mbn_core' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
