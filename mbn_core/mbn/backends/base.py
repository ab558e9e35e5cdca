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

Backends choose themselves. Each registers where it is defined (``register_backend``: the
built-in ``local``, ``dask`` and ``cuda`` modules, which the package imports; an installed
package adds its own through the ``mbn.backends`` entry-point group), saying which device it
computes on, what it is in one line, what it serves (``FIT``, ``TRANSFORM`` or both) and
whether it can run here. ``choose_backend(purpose, device)`` then picks one for an estimator:
for "cuda" the first available backend on that device (ValueError naming what is missing
when there is none), for "cpu" the backend that ``use_backend`` set for the current context
when it serves the purpose, else the first available ``preferred`` one, else ``"local"``;
"auto" is "cuda" where a GPU backend can run, else "cpu". A backend that computes part of
its work elsewhere records it (``LayerBackend.fallbacks``), and the fitted model keeps the
record (``MBN.fallbacks_``, shown by ``mbn info``): nothing falls back quietly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from importlib import metadata
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

from mbn_core.exceptions import TrainingStopped

if TYPE_CHECKING:
    from typing import Self

    from mbn_core.mbn.bottom import BottomLayer
    from mbn_core.mbn.encoders import UpperClusterings
    from mbn_core.mbn.upper import UpperLayer

log = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int, int], object]

AUTO = "auto"
# What a backend is chosen for: fitting a network, or encoding new rows with a fitted one.
FIT = "fit"
TRANSFORM = "transform"
PURPOSES = frozenset({FIT, TRANSFORM})
# The devices a backend computes on, and the ``device`` parameter's values.
DEVICES = ("cpu", "cuda")
DEVICE_CHOICES = (*DEVICES, AUTO)
ENTRY_POINT_GROUP = "mbn.backends"


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
    # What the backend is chosen for. A backend whose fixed cost per layer pays off only over
    # a whole fit (Dask scatters each layer's input to every worker) serves ``FIT`` alone,
    # and ``transform`` then runs on another; its layer methods still work.
    purposes: ClassVar[frozenset[str]] = PURPOSES
    # Where the layers are computed ("cpu" or "cuda").
    device: str = "cpu"

    def __init__(self, *, n_jobs: int | None = None, callback: ProgressCallback | None = None):
        self.n_jobs = n_jobs
        self.callback = callback
        self.fallbacks: list[str] = []

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

    def fall_back(self, what: str) -> None:
        """Record (and log) that ``what`` was computed elsewhere than ``device``: one
        sentence, kept once however often it happens."""
        if what not in self.fallbacks:
            log.warning("%s backend: %s", self.name, what)
            self.fallbacks.append(what)

    def report(self, layer: int, done: int, total: int) -> None:
        """Tell the callback that ``done`` of ``total`` clusterings of ``layer`` are finished;
        raise ``TrainingStopped`` when it asks to stop."""
        if self.callback is not None and self.callback(layer, done, total):
            raise TrainingStopped(
                f"training stopped by the callback in layer {layer} after {done} "
                f"of {total} clusterings"
            )
        wanted = _still_wanted.get()
        if wanted is not None and not wanted():
            raise TrainingStopped(f"stopped in layer {layer}: its rows are no longer wanted")


class BackendFactory(Protocol):
    """Builds a backend for one ``fit`` or ``transform``."""

    def __call__(
        self, *, n_jobs: int | None = None, callback: ProgressCallback | None = None
    ) -> LayerBackend: ...


def _always() -> None:
    """Runs anywhere: nothing to require."""


@dataclass(frozen=True)
class BackendEntry:
    """A registered backend.

    Attributes
    ----------
    name : str
        Its name (``get_backend(name)``, ``use_backend(name)``).
    factory : BackendFactory
        Builds it for one fit or transform.
    device : {"cpu", "cuda"}
        Where it computes the layers.
    description : str
        What it is, in one line (``mbn info``, the documentation).
    require : callable
        ``require()`` returns when the backend can run here, and raises ValueError naming
        what is missing (a package, a device, a connection) when it cannot.
    purposes : frozenset of {"fit", "transform"}
        What it may be chosen for.
    preferred : bool
        Whether ``choose_backend`` prefers it, where it can run, to ``"local"`` on the CPU.
    """

    name: str
    factory: BackendFactory
    device: str
    description: str
    require: Callable[[], None] = _always
    purposes: frozenset[str] = PURPOSES
    preferred: bool = False

    def available(self) -> bool:
        """Whether it can run here (``require`` passes)."""
        try:
            self.require()
        except Exception:  # any reason not to run is "not here"
            return False
        return True

    def serves(self, purpose: str) -> bool:
        """Whether it may be chosen for ``purpose``."""
        return purpose in self.purposes


_registry: dict[str, BackendEntry] = {}
_discovered = False
# The backend the current context chose (``use_backend``), for the CPU.
_context_backend: ContextVar[BackendEntry | None] = ContextVar("mbn_context_backend", default=None)
# What ``stop_unless`` set for this context: asked as a layer's clusterings finish.
_still_wanted: ContextVar[Callable[[], bool] | None] = ContextVar("mbn_still_wanted", default=None)


def register_backend(
    name: str,
    factory: BackendFactory,
    *,
    device: str = "cpu",
    description: str = "",
    require: Callable[[], None] = _always,
    available: Callable[[], bool] | None = None,
    purposes: frozenset[str] | set[str] = PURPOSES,
    preferred: bool = False,
) -> BackendEntry:
    """Make ``factory`` the backend called ``name`` (see ``BackendEntry`` for the rest).

    ``available()``, as an alternative to ``require``, says whether it can run here without
    saying why. Registering a name again replaces it. Returns the entry.
    """
    if not name or name == AUTO:
        raise ValueError(f"a backend cannot be called {name!r}")
    if device not in DEVICES:
        raise ValueError(f"backend {name!r}: device {device!r} must be one of {DEVICES}")
    purposes = frozenset(purposes)
    if not purposes or not purposes <= PURPOSES:
        raise ValueError(f"backend {name!r}: purposes must be among {sorted(PURPOSES)}")
    if available is not None:
        require = _requirement(name, available)
    entry = BackendEntry(name, factory, device, description, require, purposes, preferred)
    _registry[name] = entry
    return entry


def _requirement(name: str, available: Callable[[], bool]) -> Callable[[], None]:
    def require() -> None:
        if not available():
            raise ValueError(f"backend {name!r} cannot run here")

    return require


def _discover() -> None:
    """Register the installed packages' backends (``mbn.backends`` entry points) once."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            entry.load()  # the module registers its backend on import
        except Exception:  # a broken plug-in must not take the built-in backends down
            log.exception("backend plug-in %s could not be loaded", entry.value)


def backend_entries() -> tuple[BackendEntry, ...]:
    """Every registered backend, in the order they were registered."""
    _discover()
    return tuple(_registry.values())


def backend_names() -> tuple[str, ...]:
    """The registered backends' names (``"auto"`` besides them chooses one)."""
    return tuple(entry.name for entry in backend_entries())


def backend_entry(name: str) -> BackendEntry:
    """The backend registered as ``name``; ValueError listing the valid names otherwise."""
    _discover()
    entry = _registry.get(name)
    if entry is None:
        valid = ", ".join(repr(n) for n in (AUTO, *sorted(_registry)))
        raise ValueError(f"unknown backend {name!r}; valid backends are {valid}")
    return entry


def choose_backend(purpose: str, device: str = "cpu") -> BackendEntry:
    """The backend for ``purpose`` (``FIT`` or ``TRANSFORM``) on ``device`` ("cpu", "cuda"
    or "auto"), as the module docstring says.

    Raises ValueError for an unknown purpose or device, and for "cuda" when no backend can
    run there (naming what is missing).
    """
    if purpose not in PURPOSES:
        raise ValueError(f"purpose {purpose!r} must be one of {sorted(PURPOSES)}")
    if device not in DEVICE_CHOICES:
        raise ValueError(f"device={device!r} must be one of {', '.join(DEVICE_CHOICES)}")
    if device != "cpu":
        on_gpu = [e for e in backend_entries() if e.device == "cuda" and e.serves(purpose)]
        for entry in on_gpu:
            if entry.available():
                return entry
        if device == "cuda":
            if on_gpu:
                on_gpu[0].require()  # raises, saying what is missing
            raise ValueError(f'device="cuda" but no backend computes on a GPU for {purpose}')
    chosen = _context_backend.get()
    if chosen is not None and chosen.serves(purpose):
        return chosen
    for entry in backend_entries():
        wanted = entry.preferred and entry.device == "cpu" and entry.serves(purpose)
        if wanted and entry.available():
            return entry
    return backend_entry("local")


def resolve_backend(name: str = AUTO) -> BackendFactory:
    """The factory behind ``name``: a registered backend, or ``"auto"`` (the backend
    ``choose_backend`` picks for a fit on the CPU).

    Raises ``ValueError`` listing the valid names when ``name`` is not one.
    """
    if name == AUTO:
        return choose_backend(FIT).factory
    return backend_entry(name).factory


def get_backend(
    name: str = AUTO, *, n_jobs: int | None = None, callback: ProgressCallback | None = None
) -> LayerBackend:
    """A backend called ``name`` for one fit or transform: use it as ``with backend:``."""
    return resolve_backend(name)(n_jobs=n_jobs, callback=callback)


@contextlib.contextmanager
def stop_unless(wanted: Callable[[], bool]) -> Iterator[None]:
    """Within this context, a fit or transform computed by a backend stops with
    ``TrainingStopped`` as soon as ``wanted()`` is False, checked as a layer's clusterings
    finish: what a server uses to abandon work whose requester has gone. (Work on few rows
    that no backend computes runs to its end.)"""
    token = _still_wanted.set(wanted)
    try:
        yield
    finally:
        _still_wanted.reset(token)


@contextlib.contextmanager
def use_backend(
    backend: str | BackendEntry | BackendFactory, *, purposes: frozenset[str] | None = None
) -> Iterator[None]:
    """Make ``backend`` what the CPU's fits and transforms use in this context: a
    registered name, an entry, or a factory (a ``LayerBackend`` class says its own purposes;
    another factory serves both unless ``purposes`` says otherwise)."""
    if isinstance(backend, str):
        entry = backend_entry(backend)
    elif isinstance(backend, BackendEntry):
        entry = backend
    else:
        own = getattr(backend, "purposes", PURPOSES)
        entry = BackendEntry(
            name=getattr(backend, "name", getattr(backend, "__name__", "custom")),
            factory=backend,
            device="cpu",
            description="the backend this context set",
            purposes=frozenset(own if purposes is None else purposes),
        )
    if purposes is not None and isinstance(backend, str | BackendEntry):
        entry = dataclasses.replace(entry, purposes=frozenset(purposes))
    token = _context_backend.set(entry)
    try:
        yield
    finally:
        _context_backend.reset(token)
