"""What every neighbour-graph layout method shares: its library, its checks, its errors.

t-SNE, UMAP, densMAP, PaCMAP and TriMap place the rows they are fitted on and nothing else:
their answer is a layout, not a map. ``LayoutMethod`` wraps such a library as a scikit-learn
transformer the pipeline can train:

- ``fit`` checks the rows as MBN's are checked (finite, 2-D, enough of them for the
  neighbourhood size: ``check_rows``), imports the library (``MethodUnavailable`` with the
  install line when it is missing), runs it on ``n_jobs`` threads and keeps its layout
  (``embedding_``); anything the library raises becomes ``MethodFailed``, naming the method
  and the problem;
- ``fit_transform`` is that layout;
- ``transform`` places new rows with the library's own out-of-sample procedure where it has
  one (``exact_map`` is None) and raises ``NoExactMap`` where it has none.

The exact procedures search a new row's neighbours exactly among the training rows, so a
model rebuilt from its arrays (``to_arrays`` / ``from_arrays``) answers bit for bit as the one
that was fitted.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from mbn_core.data.checks import check_spread
from mbn_core.distribution import install_hint
from mbn_core.exceptions import MethodFailed, MethodUnavailable, NoExactMap, TrainingStopped
from mbn_core.params import CheckedParams
from mbn_core.utils.blas import limited_threads

# The optional extra that installs every layout library.
EXTRA = "methods"
INSTALL_LINE = install_hint(EXTRA)
# A library's message names a file now and then: never shown to a client.
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:/[\w.+-]+){2,}/?")
_MAX_MESSAGE = 300


class LayoutMethod(CheckedParams, TransformerMixin, BaseEstimator):
    """Base class of the layout methods; subclasses fill in the class attributes and
    ``_fit_layout`` (and ``_transform``, ``_state`` and ``_restore`` when they have an exact
    map).

    Attributes
    ----------
    embedding_ : ndarray of shape (n_samples, n_components_)
        The layout of the rows ``fit`` was given, in their order.
    n_features_in_ : int
    n_components_ : int
    """

    # Shown in messages: "t-SNE (openTSNE)".
    title: ClassVar[str]
    # The module the method imports and the distribution that installs it.
    library: ClassVar[str]
    distribution: ClassVar[str]
    # None when ``transform`` places new rows; otherwise why it cannot.
    exact_map: ClassVar[str | None] = None

    n_jobs: int | None
    n_components: int

    # ------------------------------------------------------------------ fitting

    def fit(self, X, y=None):
        """Lay out the rows of X.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Dense rows (a sparse matrix is refused: these libraries take dense input).
        y : ignored

        Returns
        -------
        self
        """
        self._validate_params()
        X = self._check_input(X, reset=True)
        # The range every method trains on (values that fit float32's squares, rows that
        # differ): the same refusals and messages as the pipeline's.
        check_spread(X)
        self.check_rows(X.shape[0])
        self._check_features(X.shape[1])
        module = self.load_library()
        with self._threads():
            try:
                embedding = self._fit_layout(module, X)
            except (TrainingStopped, MemoryError, KeyboardInterrupt):
                raise
            except Exception as error:
                raise self._failure("fit", error) from error
        embedding = np.asarray(embedding)
        if embedding.shape != (X.shape[0], self.n_components) or not np.all(np.isfinite(embedding)):
            raise MethodFailed(
                f"{self.title} failed: its layout has shape {embedding.shape} or values that "
                "are not finite"
            )
        self.embedding_ = embedding
        self.n_components_ = int(embedding.shape[1])
        return self

    def fit_transform(self, X, y=None, **fit_params):
        """The layout of X (``fit(X).embedding_``)."""
        return self.fit(X, y).embedding_

    def check_rows(self, n_samples: int) -> None:
        """ValueError naming the parameter and the minimum when ``n_samples`` rows are too
        few for these parameters."""
        needed, reason = self._rows_needed()
        if n_samples < needed:
            raise ValueError(
                f"{self.title}: {reason} needs at least {needed} rows, got {n_samples}"
            )

    def check_features(self, n_features: int) -> None:
        """ValueError naming the parameter and the minimum when rows of ``n_features``
        features are too narrow for these parameters."""
        self._check_features(n_features)

    def _rows_needed(self) -> tuple[int, str]:
        """(fewest rows, which parameter asks for them)."""
        return 2, "a layout"

    def _check_features(self, n_features: int) -> None:
        """ValueError when the parameters cannot work on ``n_features`` columns."""

    def _check_pca_start(self, n_features: int, parameter: str) -> None:
        """A start from principal components needs as many features as components."""
        if n_features < self.n_components:
            raise ValueError(
                f"{self.title}: {parameter} starts the layout from "
                f"n_components={self.n_components} principal components, which needs at "
                f"least {self.n_components} features, got {n_features}"
            )

    def _fit_layout(self, module: ModuleType, X: np.ndarray) -> np.ndarray:
        """The library's layout of checked float32 rows X."""
        raise NotImplementedError

    # ------------------------------------------------------------------ new rows

    def transform(self, X):
        """Place new rows in the layout with the method's own procedure.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        embedding : ndarray of shape (n_samples, n_components_)

        Raises
        ------
        NoExactMap
            The method has no such procedure (``exact_map`` says why).
        """
        check_is_fitted(self, "embedding_")
        if self.exact_map is not None:
            raise NoExactMap(self.exact_map)
        X = self._check_input(X, reset=False)
        if X.shape[0] == 0:
            return np.zeros((0, self.n_components_), dtype=self.embedding_.dtype)
        module = self.load_library()
        with self._threads():
            try:
                return self._transform(module, X)
            except (MemoryError, KeyboardInterrupt):
                raise
            except Exception as error:
                raise self._failure("transform", error) from error

    def _transform(self, module: ModuleType, X: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    # ------------------------------------------------------------------ the exact state

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Every array ``transform`` needs (none beyond the shape without an exact map)."""
        check_is_fitted(self, "embedding_")
        arrays = {"shape": np.array([self.n_features_in_, self.n_components_], dtype=np.int64)}
        if self.exact_map is None:
            arrays.update(self._state())
        return arrays

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], params: dict[str, Any]) -> LayoutMethod:
        """The fitted estimator back from ``to_arrays`` and its stored parameters; ValueError
        naming the array that is missing or inconsistent."""
        model = cls(**{key: value for key, value in params.items() if key in cls._init_names()})
        model._validate_params()
        shape = _array(arrays, "shape", ndim=1)
        if shape.shape != (2,) or shape.dtype.kind not in "iu" or np.any(shape < 1):
            raise ValueError("array 'shape' must hold two positive integers")
        model.n_features_in_, model.n_components_ = int(shape[0]), int(shape[1])
        if model.n_components_ != model.n_components:
            raise ValueError(
                f"array 'shape' says {model.n_components_} components, the parameters "
                f"{model.n_components}"
            )
        if cls.exact_map is None:
            model._restore(arrays)
        else:
            # Nothing places new rows; the layout itself is the bundle's map, not its state.
            model.embedding_ = np.zeros((0, model.n_components_), dtype=np.float32)
        return model

    def _state(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _restore(self, arrays: dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays the exact map keeps."""
        if not hasattr(self, "embedding_") or self.exact_map is not None:
            return 0
        return sum(int(array.nbytes) for array in self._state().values())

    # ------------------------------------------------------------------ helpers

    @classmethod
    def load_library(cls) -> ModuleType:
        """The method's library; ``MethodUnavailable`` with the install line without it."""
        try:
            return importlib.import_module(cls.library)
        except ImportError as error:
            raise MethodUnavailable(cls.unavailable_reason()) from error

    @classmethod
    def unavailable_reason(cls) -> str:
        """What to install for the method's library."""
        return (
            f"{cls.title} needs the Python package {cls.distribution!r}, which is not "
            f"installed: {INSTALL_LINE}"
        )

    @classmethod
    def available(cls) -> bool:
        """Whether the library is installed. Found, not imported: importing some of them
        compiles their numba kernels (TriMap's take seconds), and ``mbn --help`` and a
        server's method list ask about every method. A library that is installed but does
        not import is refused by the fit (``load_library``)."""
        try:
            return importlib.util.find_spec(cls.library) is not None
        except (ImportError, ValueError):  # a parent package missing; a module set to None
            return False

    @classmethod
    def _init_names(cls) -> set[str]:
        return set(cls._get_param_names())

    def _check_input(self, X, *, reset: bool) -> np.ndarray:
        # The same refusals as every method's (NaN, infinity, shapes), and dense only.
        return validate_data(self, X, accept_sparse=False, dtype=np.float32, order="C", reset=reset)

    def _threads(self):
        return library_threads(self.n_jobs)

    def _failure(self, step: str, error: BaseException) -> MethodFailed:
        return MethodFailed(f"{self.title} failed in {step}: {describe_error(error)}")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        tags.non_deterministic = True  # a library's threads may order their work freely
        return tags


@contextmanager
def library_threads(n_jobs: int | None) -> Iterator[int]:
    """Run a library's numba, OpenMP and BLAS threads on ``n_jobs`` threads (None: one),
    restoring numba's count after."""
    threads = 1 if n_jobs is None else max(1, int(n_jobs))
    import numba

    threads = min(threads, numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        with limited_threads(threads):
            yield threads
    finally:
        numba.set_num_threads(before)


def describe_error(error: BaseException) -> str:
    """A library's error as one short line: its message without paths, else its class."""
    message = " ".join(str(error).split())
    message = _PATH.sub("<path>", message)
    if len(message) > _MAX_MESSAGE:
        message = message[: _MAX_MESSAGE - 3] + "..."
    return message or f"{type(error).__name__} (no message)"


def _array(arrays: dict[str, np.ndarray], name: str, *, ndim: int) -> np.ndarray:
    """``arrays[name]`` with ``ndim`` dimensions; ValueError naming it otherwise."""
    if name not in arrays:
        raise ValueError(f"array {name!r} is missing")
    array = np.asarray(arrays[name])
    if array.ndim != ndim or array.dtype.kind not in "iuf":
        raise ValueError(f"array {name!r} must be numeric with {ndim} dimensions")
    return array


def matrix_array(
    arrays: dict[str, np.ndarray], name: str, *, rows: int | None = None, columns: int
) -> np.ndarray:
    """``arrays[name]`` as a finite floating matrix of ``columns`` columns (and ``rows``
    rows); ValueError naming it otherwise."""
    array = _array(arrays, name, ndim=2)
    if array.dtype.kind != "f" or array.shape[1] != columns or not np.all(np.isfinite(array)):
        raise ValueError(f"array {name!r} must be a finite float matrix of {columns} columns")
    if rows is not None and array.shape[0] != rows:
        raise ValueError(f"array {name!r} has {array.shape[0]} rows, expected {rows}")
    return array
