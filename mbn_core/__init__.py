"""mbn_core: Multilayer Bootstrap Networks, a numerical library with no web dependencies."""

from mbn_core.compress import CompressiveMBN
from mbn_core.modular_baselines import ModularBaseline
from mbn_core.modular_kpca import ModularKPCA
from mbn_core.multilevel import MultilevelEmbedding, MultilevelKMeans
from mbn_core.network import MBN, TrainingStopped, model_from_arrays, model_to_arrays

__all__ = [
    "MBN",
    "CompressiveMBN",
    "ModularBaseline",
    "ModularKPCA",
    "MultilevelEmbedding",
    "MultilevelKMeans",
    "TrainingStopped",
    "model_from_arrays",
    "model_to_arrays",
]
__version__ = "0.1.0"
