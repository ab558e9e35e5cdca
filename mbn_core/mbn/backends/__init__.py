"""Where an MBN's layers run: one public interface, backends registered by name.

``LayerBackend`` is the interface (``base``); ``local`` runs a layer on this machine's
threads, ``dask`` on a Dask cluster. ``get_backend(name)`` builds one by name and
``use_backend(name)`` makes one what ``"auto"`` means in a context.
"""

from mbn_core.mbn.backends.base import (
    AUTO,
    BackendFactory,
    LayerBackend,
    ProgressCallback,
    backend_names,
    get_backend,
    register_backend,
    resolve_backend,
    use_backend,
)

__all__ = [
    "AUTO",
    "BackendFactory",
    "LayerBackend",
    "ProgressCallback",
    "backend_names",
    "get_backend",
    "register_backend",
    "resolve_backend",
    "use_backend",
]
