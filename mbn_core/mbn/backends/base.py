"""The backend interface: where an MBN's layers run, and how a backend is chosen by name.

An MBN makes every random choice itself, on the calling thread, and hands a backend one
whole layer at a time: the V clusterings of the layer with their centers, chosen features
and seeds already drawn. The backend returns the (n, V) codes. How it gets there is its own
business: the local backend maps one clustering per thread task, the Dask backend ships the
layer's input once per worker and maps blocks of clusterings as tasks, a GPU backend may
score every clustering of the layer (or a block of them) in one batched kernel. Every
backend returns the same codes, bit for bit, so a model never depends on where it ran.

A backend is a context manager: ``fit`` and ``transform`` open one for their duration
(``get_backend(...)`` then ``with backend:``), so a backend may hold a thread pool, a
cluster connection or device memory between layers, and must release them in ``close``.

Backends are chosen by name (``get_backend("local")``), through the registry that
``register_backend`` fills; ``"auto"`` is the backend that ``use_backend`` set for the current
context (``mbn_core.mbn.backends.dask.use_dask`` sets Dask's), else the first registered
``preferred`` backend whose ``available()`` says it can run here, else ``"local"``.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

from mbn_core.exceptions import TrainingStopped

if TYPE_CHECKING:
    from typing import Self

    from mbn_core.mbn.bottom import BottomLayer
    from mbn_core.mbn.encoders import UpperClusterings
    from mbn_core.mbn.upper import UpperLayer

ProgressCallback = Callable[[int, int, int], object]

AUTO = "auto"


class LayerBackend(ABC):
    """Computes the codes of whole MBN layers.

    Parameters
    ----------
    n_jobs : int, default=None
        Parallelism on this machine (threads for the local backend); None or -1 uses every
        available core. Backends that run elsewhere may ignore it.
    callback : callable, default=None
        ``callback(layer, done, total)``, as ``MBN``'s: told how many of a layer's
        clusterings are finished, it may return True to stop (``report`` raises
        ``TrainingStopped`` then). A backend that computes a layer in blocks reports after
        each block, with ``done`` counting every clustering finished so far.

    Notes
    -----
    Implement the three layer methods. Inputs are already validated: ``X`` is a dense
    float32/float64 array or a canonical CSR matrix, codes are unsigned integer arrays.
    Each method returns a C- or F-ordered (n_rows, V) array whose dtype is
    ``smallest_uint(k - 1)`` for the layer's k centers, equal bit for bit to what
    ``LocalBackend`` returns.
    """

    name: ClassVar[str]
    # Whether ``MBN.transform`` runs here too. A backend whose fixed cost per layer pays off
    # only over a whole fit (Dask scatters each layer's input to every worker) says False,
    # and ``transform`` then runs on the local backend; its layer methods still work.
    embeds_new_rows: ClassVar[bool] = True

    def __init__(self, *, n_jobs: int | None = None, callback: ProgressCallback | None = None):
        self.n_jobs = n_jobs
        self.callback = callback

    @abstractmethod
    def bottom_codes(self, layer: BottomLayer, X) -> np.ndarray:
        """(n, V) codes of the rows of ``X`` in the bottom ``layer`` (layer 0).

        Used for the training rows during ``fit`` and for new rows in ``transform``.
        """

    @abstractmethod
    def fit_upper_codes(
        self, index: int, codes: np.ndarray, clusterings: UpperClusterings
    ) -> np.ndarray:
        """(n, V) codes of the training rows in upper layer ``index`` (1 is the first above
        the bottom), from their (n, V_prev) ``codes`` in the layer below.

        The centers are training rows: clustering v's centers are ``codes[centers[v]]``.
        """

    @abstractmethod
    def upper_codes(self, index: int, codes: np.ndarray, layer: UpperLayer) -> np.ndarray:
        """(n, V) codes of new rows in the fitted upper ``layer`` (number ``index``), from
        their (n, V_prev) ``codes`` in the layer below."""

    def close(self) -> None:  # noqa: B027 - optional: a backend holding nothing keeps it
        """Release what the backend holds (threads, connections, device memory)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def report(self, layer: int, done: int, total: int) -> None:
        """Tell the callback that ``done`` of ``total`` clusterings of ``layer`` are finished;
        raise ``TrainingStopped`` when it asks to stop."""
        if self.callback is not None and self.callback(layer, done, total):
            raise TrainingStopped(
                f"training stopped by the callback in layer {layer} after {done} "
                f"of {total} clusterings"
            )


class BackendFactory(Protocol):
    """Builds a backend for one ``fit`` or ``transform``."""

    def __call__(
        self, *, n_jobs: int | None = None, callback: ProgressCallback | None = None
    ) -> LayerBackend: ...


@dataclass(frozen=True)
class BackendEntry:
    """A registered backend: its factory, whether it can run here, whether "auto" prefers
    it to the local backend."""

    name: str
    factory: BackendFactory
    available: Callable[[], bool]
    preferred: bool


def _always() -> bool:
    return True


_registry: dict[str, BackendEntry] = {}
# The backend "auto" means in this context (``use_backend``), as a factory.
_context_backend: ContextVar[BackendFactory | None] = ContextVar(
    "mbn_context_backend", default=None
)


def register_backend(
    name: str,
    factory: BackendFactory,
    *,
    available: Callable[[], bool] = _always,
    preferred: bool = False,
) -> None:
    """Make ``factory`` the backend called ``name``.

    ``available()`` says whether it can run on this machine (a GPU backend: whether a device
    is present); ``preferred`` backends that are available are what ``"auto"`` picks before
    ``"local"``, in the order they were registered. Registering a name again replaces it.
    """
    if not name or name == AUTO:
        raise ValueError(f"a backend cannot be called {name!r}")
    _registry[name] = BackendEntry(name, factory, available, preferred)


def backend_names() -> tuple[str, ...]:
    """The registered backends' names (``"auto"`` besides them chooses one)."""
    return tuple(_registry)


def resolve_backend(name: str = AUTO) -> BackendFactory:
    """The factory behind ``name`` (see the module docstring for ``"auto"``).

    Raises ``ValueError`` listing the valid names when ``name`` is not one.
    """
    if name == AUTO:
        chosen = _context_backend.get()
        if chosen is not None:
            return chosen
        for preferred in _registry.values():
            if preferred.preferred and preferred.available():
                return preferred.factory
        return _registry["local"].factory
    entry = _registry.get(name)
    if entry is None:
        valid = ", ".join(repr(n) for n in (AUTO, *_registry))
        raise ValueError(f"unknown backend {name!r}; valid backends are {valid}")
    return entry.factory


def get_backend(
    name: str = AUTO, *, n_jobs: int | None = None, callback: ProgressCallback | None = None
) -> LayerBackend:
    """A backend called ``name`` for one fit or transform: use it as ``with backend:``."""
    return resolve_backend(name)(n_jobs=n_jobs, callback=callback)


@contextlib.contextmanager
def use_backend(backend: str | BackendFactory) -> Iterator[None]:
    """Make ``backend`` (a registered name or a factory) what ``"auto"`` means in this
    context: every ``MBN.fit`` and ``transform`` inside runs its layers there."""
    factory = resolve_backend(backend) if isinstance(backend, str) else backend
    token = _context_backend.set(factory)
    try:
        yield
    finally:
        _context_backend.reset(token)


def _local(*, n_jobs: int | None = None, callback: ProgressCallback | None = None) -> LayerBackend:
    from mbn_core.mbn.backends.local import LocalBackend

    return LocalBackend(n_jobs=n_jobs, callback=callback)


def _dask(*, n_jobs: int | None = None, callback: ProgressCallback | None = None) -> LayerBackend:
    from mbn_core.mbn.backends.dask import DaskBackend

    return DaskBackend.on_default_client(n_jobs=n_jobs, callback=callback)


def _cuda(*, n_jobs: int | None = None, callback: ProgressCallback | None = None) -> LayerBackend:
    from mbn_core.mbn.backends.cuda import CudaBackend

    return CudaBackend(n_jobs=n_jobs, callback=callback)


def _gpu_present() -> bool:
    from mbn_core.mbn.backends.cuda import gpu_count

    return gpu_count() > 0


register_backend("local", _local)
register_backend("dask", _dask)
# Not preferred: "auto" stays on the CPU unless asked (MBN's device="cuda" or "auto").
register_backend("cuda", _cuda, available=_gpu_present)
