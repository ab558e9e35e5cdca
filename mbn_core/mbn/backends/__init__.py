"""Where an MBN's layers run: one public interface, backends that register themselves.

``LayerBackend`` is the interface and ``choose_backend`` the choice (``base``); ``local`` runs
a layer on this machine's threads, ``dask`` on a Dask cluster, ``cuda`` on one NVIDIA GPU.
Each registers itself where it is defined; importing this package imports the three, and
installed packages add theirs through the ``mbn.backends`` entry-point group.
``get_backend(name)`` builds one by name and ``use_backend(name)`` makes one what the CPU's
fits and transforms use in a context.
"""

from mbn_core.mbn.backends import cuda, dask, local  # noqa: F401 - each registers itself
from mbn_core.mbn.backends.base import (
    AUTO,
    FIT,
    TRANSFORM,
    BackendEntry,
    BackendFactory,
    LayerBackend,
    ProgressCallback,
    backend_entries,
    backend_entry,
    backend_names,
    choose_backend,
    get_backend,
    register_backend,
    resolve_backend,
    stop_unless,
    use_backend,
)

__all__ = [
    "AUTO",
    "FIT",
    "TRANSFORM",
    "BackendEntry",
    "BackendFactory",
    "LayerBackend",
    "ProgressCallback",
    "backend_entries",
    "backend_entry",
    "backend_names",
    "choose_backend",
    "get_backend",
    "register_backend",
    "resolve_backend",
    "stop_unless",
    "use_backend",
]
