"""The registry of embedding methods: what ``mbn train``, ``POST /train`` and bundles offer.

A method is a scikit-learn transformer (its parameters declared in ``_parameter_constraints``)
plus what the pipeline cannot guess about it:

- how its fitted state becomes plain arrays for the bundle and back (``save`` / ``load``;
  no pickle);
- how its fast path is made: ``export`` turns the fitted estimator into an ONNX graph of its
  own map, or, when ``export`` is None, the pipeline's ``DistilledEmbedding`` distils it into
  an MLP.

Registering a method (``register``) is all it takes for the trainer, the bundle format, the
CLI and the service to offer it: none of them names a method. The contract is written out in
``docs/METHODS.md``. Built-in methods are the modules listed in ``BUILTIN_MODULES``; installed
packages add theirs through the ``mbn.methods`` entry-point group (each entry point names a
module that registers on import), and ``MBN_METHODS`` (comma-separated module names) imports
more, e.g. a site's own method that is not packaged.

The registry sits at the bottom of the library, beside ``params``: the method packages
register here, and the bundle and the pipeline look methods up here by the name a manifest or
a job gives. It imports no other part of ``mbn_core``; it names the built-in methods only by
module, importing them on the first lookup as it does the plug-ins. The options a training of
a method takes (its own, its distiller's, the pipeline's) are assembled above it, by the
pipeline (``mbn_core.pipeline.options``).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Literal

import numpy as np

from mbn_core.params import Param, estimator_params

log = logging.getLogger(__name__)

# (fraction of the current phase in 0..1, what just finished) -> True to stop training.
Reporter = Callable[[float, str], bool]

ENTRY_POINT_GROUP = "mbn.methods"
ENVIRONMENT_VARIABLE = "MBN_METHODS"
DEFAULT_METHOD = "mbn"
# Modules that register a built-in method when imported. A new method in mbn_core adds its
# module here: that line is its whole registration.
BUILTIN_MODULES: tuple[str, ...] = (
    "mbn_core.mbn.method",
    "mbn_core.multilevel.method",
    "mbn_core.modular.method",
    "mbn_core.layouts.method",
)
# Parameters of the pipeline around every method (held-out fidelity rows, the clustering
# head, the seed, threads). They are declared once, by DistilledEmbedding
# (mbn_core.pipeline.distilled), whose fit runs the pipeline as every method's training does.
PIPELINE_PARAMS = ("holdout_fraction", "n_clusters", "random_state", "n_jobs")
# Of those, the ones an estimator may have too, meaning the same: it gets the job's value.
SHARED_PARAMS = ("random_state", "n_jobs")
# Training defaults that differ from the estimators': a reproducible seed.
PIPELINE_DEFAULTS: dict[str, Any] = {"random_state": 0}
# Parameters that are never training options: callbacks (no form can carry a function), the
# distiller's teacher (the method itself) and its prefit flag.
NOT_OPTIONS = frozenset({"callback", "teacher", "prefit"})
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
# The two ways a bundle embeds: its fast path (an ONNX graph) or the method's exact model.
MODES = ("fast", "exact")
# The names of a fast path's ONNX graph's input (n, d) float32 rows and output (n, c) float32
# embedding: what ``export`` writes and the bundle's reader runs.
INPUT = "input"
EMBEDDING = "embedding"


@dataclass(frozen=True)
class Method:
    """An embedding method the pipeline can train, bundle and serve.

    Attributes
    ----------
    name : str
        Lower-case identifier (``[a-z][a-z0-9_-]*``), recorded in bundle manifests and given
        as ``method`` to ``mbn train`` and ``POST /train``.
    estimator : type
        A scikit-learn transformer class with ``_parameter_constraints`` covering every
        ``__init__`` parameter and a numpydoc "Parameters" section (the help texts).
        ``fit(X, y=None)`` takes dense float32 rows (and CSR when ``sparse``), ``transform``
        returns the embedding.
    summary : str
        One line for ``--help`` and the documentation.
    save : callable
        ``save(fitted_estimator) -> dict[str, ndarray]``: every array exact ``transform``
        needs. Names must not start with ``head.`` (the pipeline's own).
    load : callable
        ``load(arrays, params) -> fitted_estimator``: the inverse, given the estimator's
        parameters as stored in the manifest. ValueError naming the array when one is
        missing or inconsistent.
    export : callable or None
        ``export(fitted_estimator) -> onnx.ModelProto`` with input ``INPUT`` (n, d) float32
        and output ``EMBEDDING`` (n, c) float32: the method's own map as the fast path. None
        distils the method into an MLP (``mbn_core.pipeline.distilled.DistilledEmbedding``),
        whose options then become training options too.
    defaults : mapping
        Training defaults that differ from the estimator's own (e.g. a cap on cost).
    track : callable or None
        ``track(estimator, shape, report)``: make the unfitted estimator call
        ``report(fraction, message)`` as it fits (fraction of its fit in 0..1) and stop
        (raise ``mbn_core.TrainingStopped``) when ``report`` returns True. None: the
        progress moves when the fit ends.
    cost : callable or None
        ``cost(estimator, shape) -> float``: expected fit cost in multiply-adds, to weigh
        progress against the compressor's. None: half of the progress goes to the fit.
    check_rows : callable or None
        ``check_rows(estimator, n_samples)``: ValueError at once when the parameters cannot
        work for that many rows (before a job is queued).
    check_features : callable or None
        ``check_features(estimator, n_features)``: ValueError at once, naming the parameter
        and the minimum, when the parameters cannot work on rows of that many features
        (before a job is queued).
    memory : callable or None
        ``memory(estimator, shape) -> float``: the bytes the fit holds at its peak beyond
        its input rows, an upper estimate, checked against the host's memory before a job
        is queued. None: only the pipeline's own (the distilled MLP) is counted.
    facts : callable or None
        ``facts(fitted_estimator) -> dict``: JSON-able facts for the manifest's ``training``
        section (e.g. layer sizes).
    describe : callable or None
        ``describe(training) -> {"dimensions": [...], "training": [...]}``: the method's own
        facts of a manifest's ``training`` section (what ``facts`` wrote) as phrases for
        ``mbn info``: what qualifies the embedding (its metric, its output) and what
        describes the fit (its layers, its device). None: the pipeline's facts alone.
    sparse : bool
        Whether the estimator accepts scipy CSR input.
    layout : bool
        The method lays out the rows it is fitted on (t-SNE, UMAP, ...): it is fitted once,
        on every row, and its report measures students cross-fitted against that one layout
        (``mbn_core.pipeline.layouts``) instead of refitting the method without the rows
        that measure it. Distilled methods only.
    no_exact_map : str or None
        Why exact mode is refused, naming the fast path instead: the method has no map of
        its own for new rows (its ``transform`` raises ``NoExactMap``). None: exact mode
        runs ``transform``.
    missing : callable or None
        ``missing() -> str | None``: why the method cannot train on this install (its library
        is not installed; the message gives the install line), or None. Such a method is
        still listed; a training asking for it is refused before it is queued.
    batch_independent_exact : bool
        Whether the fitted estimator's ``transform`` gives each row the same bits whatever
        other rows share the call (MBN's does). Only then may a server compute several
        requests' rows in one call; otherwise each request is computed alone.
    module : str
        The module that registered the method (training processes import it); set by
        ``register``.
    """

    name: str
    estimator: type
    summary: str
    save: Callable[[Any], dict[str, np.ndarray]]
    load: Callable[[dict[str, np.ndarray], dict[str, Any]], Any]
    export: Callable[[Any], Any] | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    track: Callable[[Any, tuple[int, int], Reporter], None] | None = None
    cost: Callable[[Any, tuple[int, int]], float] | None = None
    check_rows: Callable[[Any, int], None] | None = None
    check_features: Callable[[Any, int], None] | None = None
    memory: Callable[[Any, tuple[int, int]], float] | None = None
    facts: Callable[[Any], dict[str, Any]] | None = None
    describe: Callable[[Mapping[str, Any]], dict[str, list[str]]] | None = None
    sparse: bool = False
    layout: bool = False
    no_exact_map: str | None = None
    missing: Callable[[], str | None] | None = None
    batch_independent_exact: bool = True
    module: str = ""

    @property
    def constraints(self) -> dict[str, list[Any]]:
        """The estimator's ``_parameter_constraints``."""
        return self.estimator._parameter_constraints  # type: ignore[attr-defined]

    @property
    def unavailable(self) -> str | None:
        """Why the method cannot train on this install, or None (``missing``)."""
        return None if self.missing is None else self.missing()

    @property
    def fast_path(self) -> Literal["exported", "distilled"]:
        """``"exported"`` (the method's own ONNX graph) or ``"distilled"`` (an MLP)."""
        return "distilled" if self.export is None else "exported"

    def params(self) -> list[Param]:
        """The method's own training options (without the pipeline's), in signature order."""
        return [
            param
            for param in estimator_params(
                self.estimator, exclude=NOT_OPTIONS, defaults=dict(self.defaults)
            )
            if param.name not in SHARED_PARAMS
        ]


# ---------------------------------------------------------------------- the registry

_registry: dict[str, Method] = {}
_lock = threading.RLock()
_discovered = False


def register(method: Method, *, replace: bool = False) -> Method:
    """Add ``method`` to the registry and return it (with ``module`` filled in).

    Raises
    ------
    ValueError
        A bad name, a name already registered (unless ``replace``), or an option that
        clashes with the pipeline's (``PIPELINE_PARAMS``). Clashes with a distiller's
        options are found where a training's options are assembled
        (``mbn_core.pipeline.options``).
    TypeError
        An estimator parameter without constraints.
    """
    if not _NAME.fullmatch(method.name):
        raise ValueError(f"method name {method.name!r} must match {_NAME.pattern}")
    if method.layout and method.export is not None:
        raise ValueError(f"method {method.name!r}: a layout method is distilled (export=None)")
    if not method.module:
        # The module that registers is the one a fresh process must import to know it.
        caller = sys._getframe(1).f_globals.get("__name__", "")
        method = dataclasses.replace(method, module=caller)
    own = {param.name for param in method.params()}
    clash = own & (set(PIPELINE_PARAMS) - set(SHARED_PARAMS))
    if clash:
        raise ValueError(
            f"method {method.name!r}: parameters {sorted(clash)} clash with the pipeline's "
            "or the compressor's options; rename them"
        )
    with _lock:
        if method.name in _registry and not replace and _registry[method.name] != method:
            raise ValueError(f"a method named {method.name!r} is already registered")
        _registry[method.name] = method
    return method


def unregister(name: str) -> None:
    """Remove a method (tests register throw-away ones)."""
    with _lock:
        _registry.pop(name, None)


def get_method(name: str) -> Method:
    """The registered method ``name``; ValueError listing the known ones otherwise."""
    _discover()
    with _lock:
        method = _registry.get(name)
        known = sorted(_registry)
    if method is None:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(known)}")
    return method


def method_names() -> list[str]:
    """Names of every registered method, sorted (the default first)."""
    _discover()
    with _lock:
        names = sorted(_registry)
    return sorted(names, key=lambda name: name != DEFAULT_METHOD)


def method_of(estimator: Any) -> Method:
    """The registered method whose estimator class ``estimator`` is an instance of."""
    _discover()
    with _lock:
        for method in _registry.values():
            if type(estimator) is method.estimator:
                return method
    raise ValueError(f"no registered method trains {type(estimator).__name__}")


def _discover() -> None:
    """Import the built-in modules and the installed plug-ins once."""
    global _discovered
    if _discovered:
        return
    with _lock:
        if _discovered:
            return
        for module in BUILTIN_MODULES:
            importlib.import_module(module)
        extra = os.environ.get(ENVIRONMENT_VARIABLE, "")
        for module in filter(None, (part.strip() for part in extra.split(","))):
            importlib.import_module(module)  # asked for by name: failing loudly is right
        for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                importlib.import_module(entry.value.split(":")[0])
            except Exception:  # a broken plug-in must not take the built-in methods down
                log.exception("method plug-in %s could not be loaded", entry.value)
        _discovered = True


def registered_modules() -> list[str]:
    """Modules that registered the known methods (what a fresh process must import)."""
    _discover()
    with _lock:
        return sorted({method.module for method in _registry.values()})
