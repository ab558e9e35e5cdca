"""mbn_core: Multilayer Bootstrap Networks, a numerical library with no web dependencies."""

from mbn_core.network import MBN, TrainingStopped

__all__ = ["MBN", "TrainingStopped"]
__version__ = "0.1.0"
