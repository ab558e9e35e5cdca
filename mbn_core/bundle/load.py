"""Reading a bundle: verify every file's size and SHA-256, then embed with either path.

``load_bundle`` checks the manifest (``mbn_core.bundle.manifest``) and every file it lists and
opens the fast path; the exact model is read, and verified again, when it is asked for.
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

import numpy as np
import scipy.sparse as sp

from mbn_core.bundle.embedding_map import MAP_FILE, EmbeddingMap
from mbn_core.bundle.manifest import (
    HEAD_CENTERS,
    MANIFEST,
    ONNX_FILE,
    OPTIONAL_FILES,
    BundleError,
    exact_file,
    read_manifest,
)
from mbn_core.bundle.mapped_npz import map_npz
from mbn_core.data.scaling import SCALING_FILE, InputScaling
from mbn_core.exceptions import NoExactMap
from mbn_core.methods import MODES, Method, get_method
from mbn_core.utils.npz import arrays_from_npz

if TYPE_CHECKING:
    from mbn_core.distill.onnx import OnnxEmbedder

T = TypeVar("T")


class OutOfRangeInput(ValueError):
    """Rows whose embedding overflowed to NaN or infinity: their values are too far outside
    what the model was trained on (a fast path's MLP or kernel extrapolates without bound).

    Attributes
    ----------
    rows : ndarray of int
        The offending rows' indices in the batch.
    """

    def __init__(self, message: str, rows: np.ndarray) -> None:
        super().__init__(message)
        self.rows = rows


@dataclass(frozen=True)
class ExactModel:
    """A bundle's exact model in memory: the method's fitted estimator and the clustering
    head. An immutable value; whoever keeps one decides how long (the service's registry keeps
    a few in an LRU cache; dropping one is dropping a reference, nothing is read again).

    Make one with ``Bundle.load_exact``.
    """

    bundle_id: str
    estimator: Any
    centers: np.ndarray | None
    # What the model does to raw rows first (mbn_core.data.scaling); the identity for most.
    input_scaling: InputScaling = field(default_factory=lambda: InputScaling("none"))
    # A version aligned to an earlier one (mbn_core.pipeline.alignment): the estimator's
    # embedding times ``matrix`` plus ``shift``; None for an unaligned model.
    alignment: tuple[np.ndarray, np.ndarray] | None = None

    def embed_with_clusters(self, X) -> tuple[np.ndarray, np.ndarray | None]:
        """Embedding (float32) and cluster ids (int64; None without a head) of checked X.

        Raises ``OutOfRangeInput`` for rows the input scaling takes beyond float32."""
        return self.finish(self.embed_raw(X))

    def embed_raw(self, X) -> np.ndarray:
        """The estimator's float32 embedding of checked X, scaled as the model scales its
        input: the first half of ``embed_with_clusters``. For a method whose ``transform`` is
        batch independent, row i is the same whatever other rows share the call, so a server
        may compute the rows of several requests in one call and ``finish`` each request's
        own rows. Raises ``OutOfRangeInput`` for rows the input scaling takes beyond
        float32."""
        with np.errstate(over="ignore", invalid="ignore"):  # refused just below
            X = self.input_scaling.transform(X)
        if not self.input_scaling.is_identity:
            _check_finite(X, scaled=True)
        return np.asarray(self.estimator.transform(X), dtype=np.float32)

    def finish(self, embedding: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The second half of ``embed_with_clusters``: ``embed_raw``'s rows in the space of
        the version they are aligned to, and their cluster ids."""
        if self.alignment is not None:
            matrix, shift = self.alignment
            embedding = (embedding.astype(np.float64) @ matrix + shift).astype(np.float32)
        if self.centers is None:
            return embedding, None
        scores = embedding @ (-2.0 * self.centers.T) + np.sum(self.centers**2, axis=1)
        return embedding, np.argmin(scores, axis=1).astype(np.int64)

    @property
    def nbytes(self) -> int:
        """Bytes of the estimator's arrays, when it says (``nbytes``), else 0."""
        return int(getattr(self.estimator, "nbytes", 0) or 0)


class Bundle:
    """A verified, loaded bundle: an immutable value holding the manifest and the fast path.

    Use ``load_bundle`` to make one. Thread safe: ``embed`` and ``predict_clusters`` may be
    called from several threads. Exact mode reads the exact model (verifying its hash) on its
    first use and keeps it, so a script embedding row by row reads it once; ``release_exact``
    drops it. ``load_exact`` reads a fresh one, kept by the caller (a server's own cache) and
    passed back as ``exact=``.

    Attributes
    ----------
    path : Path
    manifest : dict
        The parsed ``manifest.json`` (upgraded to the current format version).
    id, name, created, method : str
    input_dim, output_dim : int
    n_clusters : int or None
        Clusters of the clustering head; None without one.
    """

    def __init__(
        self,
        path: Path,
        manifest: dict[str, Any],
        embedder: OnnxEmbedder,
        threads: int,
        input_scaling: InputScaling,
    ):
        self.path = path
        self.manifest = manifest
        self.id: str = manifest["id"]
        self.name: str = manifest["name"]
        self.created: str = manifest["created"]
        self.method: str = manifest["method"]
        self.input_dim: int = manifest["input_dim"]
        self.output_dim: int = manifest["output_dim"]
        self.n_clusters: int | None = manifest["n_clusters"]
        self.threads = threads
        self.input_scaling = input_scaling
        self._embedder = embedder
        self._map: EmbeddingMap | None = None
        self._map_lock = threading.Lock()
        self._exact: ExactModel | None = None
        self._exact_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Bundle(id={self.id!r}, name={self.name!r}, path={str(self.path)!r})"

    def embed(self, X, mode: str = "fast", *, exact: ExactModel | None = None) -> np.ndarray:
        """Embedding of X, float32 of shape (n_samples, output_dim).

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, input_dim)
            Finite real values.
        mode : {"fast", "exact"}, default="fast"
            The ONNX fast path, or the exact model.
        exact : ExactModel, default=None
            This bundle's exact model from ``load_exact``; None uses the one the bundle
            keeps (read on first use).
        """
        return self.embed_with_clusters(X, mode, exact=exact)[0]

    def predict_clusters(
        self, X, mode: str = "fast", *, exact: ExactModel | None = None
    ) -> np.ndarray:
        """Cluster id (int64) of each row: nearest k-means centroid of its embedding.

        Raises ValueError when the bundle has no clustering head.
        """
        if self.n_clusters is None:
            raise ValueError(f"model {self.id!r} has no clustering head")
        clusters = self.embed_with_clusters(X, mode, exact=exact)[1]
        assert clusters is not None
        return clusters

    def embed_with_clusters(
        self, X, mode: str = "fast", *, exact: ExactModel | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Embedding (float32) and cluster ids (int64; None without a head) in one pass.

        Cheaper than ``embed`` then ``predict_clusters``, which would run the model twice.
        """
        X = self._check_input(X, mode)
        if mode == "fast":
            result = self._embedder.run(X)
        else:
            self.check_exact()
            if exact is None:
                exact = self._kept_exact()
            elif exact.bundle_id != self.id:
                raise ValueError(f"the exact model of {exact.bundle_id!r} is not {self.id!r}'s")
            result = exact.embed_with_clusters(X)
        _check_finite(result[0], mode)
        return result

    def _kept_exact(self) -> ExactModel:
        with self._exact_lock:
            if self._exact is None:
                self._exact = self.load_exact()
            return self._exact

    def release_exact(self) -> None:
        """Drop the exact model kept by exact-mode calls (the next one reads it again)."""
        with self._exact_lock:
            self._exact = None

    @property
    def no_exact_map(self) -> str | None:
        """Why exact mode is refused (the method has no map for new rows), or None."""
        return _no_exact_map(self.method)

    def check_exact(self) -> None:
        """``NoExactMap`` (a ValueError) when exact mode is refused for this model: before an
        exact request takes a slot or reads the exact model."""
        _check_exact(self.id, self.method)

    def load_exact(self, *, mapped: bool = False) -> ExactModel:
        """Read the exact model from the bundle's arrays, verifying their SHA-256 again.

        Every call reads the file: keep the result to reuse it. With ``mapped``, the arrays
        stored uncompressed are mapped from the file instead of read (``mapped_npz``): every
        process mapping the same bundle shares their pages. Raises ``BundleError`` when the
        file changed since the bundle was loaded, ``NoExactMap`` when the method has no
        exact map.
        """
        return _exact_model(self.path, self.manifest, self.threads, self.input_scaling, mapped)

    @property
    def has_map(self) -> bool:
        """Whether the bundle holds a 2-D map of its training embedding."""
        return MAP_FILE in self.manifest["files"]

    def embedding_map(self) -> EmbeddingMap:
        """The stored 2-D map (read, hash checked, on the first call).

        Raises BundleError when the bundle has none (trained before maps, or without one)
        or its file is damaged.
        """
        with self._map_lock:
            if self._map is None:
                file = self.path / MAP_FILE
                if not self.has_map:
                    raise BundleError(f"{file}: model {self.id!r} has no stored map")
                data = _verified_bytes(self.path, self.manifest, MAP_FILE)
                try:
                    loaded = EmbeddingMap.from_bytes(data, str(file))
                except ValueError as error:
                    raise BundleError(str(error)) from None
                if loaded.embedding.shape[1] != self.output_dim:
                    raise BundleError(f"{file}: map embedding dimension disagrees")
                self._map = loaded
            return self._map

    def optional_bytes(self, file_name: str) -> bytes:
        """The verified bytes of one of ``OPTIONAL_FILES`` the bundle holds.

        Raises BundleError when the bundle has none (``file_name not in
        manifest["files"]``) or it is damaged.
        """
        if file_name not in OPTIONAL_FILES or file_name not in self.manifest["files"]:
            raise BundleError(f"{self.path / file_name}: model {self.id!r} has no {file_name}")
        return _verified_bytes(self.path, self.manifest, file_name)

    def read_optional(self, file_name: str, parse: Callable[[bytes, str], T]) -> T | None:
        """``parse(bytes, source)`` of one of ``OPTIONAL_FILES``, verified; None when the
        bundle has none. A ValueError of ``parse`` (a damaged file) becomes a BundleError."""
        if file_name not in self.manifest["files"]:
            return None
        source = f"{self.id}/{file_name}"
        try:
            return parse(self.optional_bytes(file_name), source)
        except BundleError:
            raise
        except ValueError as error:
            raise BundleError(str(error)) from None

    def _check_input(self, X, mode: str):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if sp.issparse(X):
            X = sp.csr_matrix(X, dtype=np.float32)
            values = X.data
        else:
            try:
                X = np.asarray(X, dtype=np.float32)
            except (TypeError, ValueError) as error:
                raise ValueError(f"X must be a 2-D array of numbers: {error}") from None
            values = X
        if X.ndim != 2 or X.shape[1] != self.input_dim or X.shape[0] == 0:
            raise ValueError(
                f"X must have shape (n_samples >= 1, {self.input_dim}) for model "
                f"{self.id!r}, got {tuple(X.shape)}"
            )
        if not np.isfinite(values).all():
            raise ValueError("X contains NaN or infinity")
        if not sp.issparse(X):
            check_scaled_range(self.input_scaling, X)
        return X


def check_scaled_range(scaling: InputScaling, X: np.ndarray) -> None:
    """``OutOfRangeInput`` for rows of the finite float32 matrix ``X`` that ``scaling`` takes
    beyond float32: the rows both paths see first (the fast path's graph scales them as
    ``scaling.transform`` does, bit for bit), checked before either runs, so that both refuse
    them alike. Two reductions over ``X`` against per-feature bounds clear nearly every
    batch; only one near the bounds is scaled to find its rows."""
    if scaling.is_identity or X.shape[0] == 0:
        return
    low, high = _safe_bounds(scaling)
    if (X.min(axis=0) >= low).all() and (X.max(axis=0) <= high).all():
        return
    with np.errstate(over="ignore", invalid="ignore"):
        _check_finite(scaling.transform(X), scaled=True)


def _safe_bounds(scaling: InputScaling) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature raw values within which the scaled value, ``(x - offset) * factor`` in
    float32, is certainly finite: half float32's largest, divided by the factor when it
    exceeds 1 (so the difference and the product both stay in range, rounding included)."""
    assert scaling.offset is not None and scaling.factor is not None
    offset = scaling.offset.astype(np.float64)
    room = 0.5 * float(np.finfo(np.float32).max) / np.maximum(scaling.factor, 1.0)
    return offset - room, offset + room


def _check_finite(values: np.ndarray, mode: str = "", *, scaled: bool = False) -> None:
    # On every embed: the whole-array test first, an order of magnitude cheaper than the
    # per-row reduction, which only a failing batch needs.
    if np.isfinite(values).all():
        return
    rows = np.flatnonzero(~np.isfinite(values).all(axis=1))
    shown = ", ".join(str(row) for row in rows[:5]) + (", ..." if rows.size > 5 else "")
    what = (
        "overflow float32 once scaled by the model's input scaling"
        if scaled
        else f"embed to NaN or infinity in {mode} mode"
    )
    raise OutOfRangeInput(
        f"{rows.size} row(s) ({shown}) {what}: their values are too far outside the range "
        "the model was trained on",
        rows,
    )


def load_bundle(directory: str | os.PathLike[str], *, threads: int = 1) -> Bundle:
    """Read and verify a bundle directory.

    Checks the manifest's format and version, then the size and SHA-256 of every file it
    lists, then that the ONNX graph matches the manifest's dimensions. The exact model is
    read later, on first use.

    Parameters
    ----------
    directory : path
        The bundle directory (never build it from untrusted input without
        ``validate_model_id`` / ``bundle_path``).
    threads : int, default=1
        Threads of the ONNX session and of the exact model.

    Raises
    ------
    BundleError
        Naming the file: missing, truncated, tampered with, foreign, or of a format
        version this code cannot read.
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    path = Path(directory)
    if not path.is_dir():
        what = "a file, not a bundle directory" if path.exists() else "no such bundle directory"
        raise BundleError(f"{path}: {what}")
    manifest = read_manifest(path)
    for file_name in manifest["files"]:
        _verified_bytes(path, manifest, file_name, keep=False)
    onnx_bytes = _verified_bytes(path, manifest, ONNX_FILE)
    # Imported here: ONNX Runtime is the fast path's, and a process that only reads exact
    # models (the service's exact runtime) is spared its 25 MiB.
    from mbn_core.distill.onnx import OnnxEmbedder

    try:
        embedder = OnnxEmbedder(onnx_bytes, threads=threads)
    except Exception as error:  # onnxruntime raises its own exception types
        raise BundleError(f"{path / ONNX_FILE}: not a loadable compressor: {error}") from None
    if (embedder.input_dim, embedder.output_dim) != (manifest["input_dim"], manifest["output_dim"]):
        raise BundleError(
            f"{path / ONNX_FILE}: maps {embedder.input_dim} -> {embedder.output_dim} dimensions "
            f"but the manifest says {manifest['input_dim']} -> {manifest['output_dim']}"
        )
    if embedder.has_clusters != (manifest["n_clusters"] is not None):
        raise BundleError(f"{path / ONNX_FILE}: clustering head disagrees with the manifest")
    scaling = _input_scaling(path, manifest)
    return Bundle(path, manifest, embedder, threads, scaling)


def _input_scaling(path: Path, manifest: dict[str, Any]) -> InputScaling:
    """The bundle's input scaling, its file (if any) verified against the manifest."""
    scaling_bytes = None
    if SCALING_FILE in manifest["files"]:
        scaling_bytes = _verified_bytes(path, manifest, SCALING_FILE)
    try:
        return InputScaling.from_manifest(
            manifest["input_scaling"], scaling_bytes, manifest["input_dim"]
        )
    except ValueError as error:
        raise BundleError(f"{path / SCALING_FILE}: {error}") from None


def _verified_bytes(path: Path, manifest: dict[str, Any], file_name: str, keep: bool = True):
    """Read a bundle file and check its size and SHA-256 against the manifest."""
    chunks: list[bytes] | None = [] if keep else None
    with _verified_file(path, manifest, file_name, chunks):
        pass
    return None if chunks is None else b"".join(chunks)


@contextmanager
def _verified_file(
    path: Path, manifest: dict[str, Any], file_name: str, chunks: list[bytes] | None = None
) -> Iterator[BinaryIO]:
    """A bundle file, open, once its size and SHA-256 were checked against the manifest
    through that very handle (its bytes appended to ``chunks`` when given)."""
    file = path / file_name
    entry = manifest["files"][file_name]
    if file.is_symlink():
        raise BundleError(f"{file}: a symbolic link; bundle files must be regular files")
    try:
        handle = file.open("rb")
    except FileNotFoundError:
        raise BundleError(f"{file}: missing") from None
    except OSError as error:
        raise BundleError(f"{file}: cannot be read: {error.strerror}") from None
    with handle:
        try:
            size = os.fstat(handle.fileno()).st_size
            if size != entry["bytes"]:
                raise BundleError(
                    f"{file}: {size} bytes, the manifest says {entry['bytes']} "
                    f"({'truncated' if size < entry['bytes'] else 'changed'})"
                )
            digest = hashlib.sha256()
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
                if chunks is not None:
                    chunks.append(chunk)
        except OSError as error:
            raise BundleError(f"{file}: cannot be read: {error.strerror}") from None
        if digest.hexdigest() != entry["sha256"]:
            raise BundleError(f"{file}: SHA-256 does not match the manifest (file was modified)")
        handle.seek(0)
        yield handle


def load_exact(
    directory: str | os.PathLike[str], *, threads: int = 1, mapped: bool = True
) -> ExactModel:
    """The exact model of the bundle at ``directory`` without its fast path: the manifest,
    the input scaling and the exact arrays, each verified (size and SHA-256), the arrays
    mapped from the file with ``mapped`` (see ``Bundle.load_exact``).

    For a process that serves exact mode only. Raises ``BundleError`` naming the file.
    """
    path = Path(directory)
    manifest = read_manifest(path)
    scaling = _input_scaling(path, manifest)
    return _exact_model(path, manifest, threads, scaling, mapped)


def _no_exact_map(method_name: str) -> str | None:
    try:
        return get_method(method_name).no_exact_map
    except ValueError:  # a method this install does not know: _load_exact says so
        return None


def _check_exact(model_id: str, method_name: str) -> None:
    reason = _no_exact_map(method_name)
    if reason is not None:
        raise NoExactMap(f"model {model_id!r} ({method_name}) has no exact mode: {reason}")


def _exact_model(
    path: Path, manifest: dict[str, Any], threads: int, scaling: InputScaling, mapped: bool
) -> ExactModel:
    _check_exact(manifest["id"], manifest["method"])
    estimator, centers = _load_exact(path, manifest, threads, mapped)
    return ExactModel(
        bundle_id=manifest["id"],
        estimator=estimator,
        centers=centers,
        input_scaling=scaling,
        alignment=_alignment(path, manifest),
    )


def _load_exact(
    path: Path, manifest: dict[str, Any], threads: int, mapped: bool = False
) -> tuple[Any, np.ndarray | None]:
    name = exact_file(manifest)
    file = path / name
    try:
        method = get_method(manifest["method"])
    except ValueError as error:
        raise BundleError(f"{path / MANIFEST}: {error} (is the plug-in installed?)") from None
    try:
        if mapped:
            # Mapped from the very file that was verified (a bundle replaced meanwhile is
            # a new file at the same path).
            with _verified_file(path, manifest, name) as handle:
                arrays = map_npz(handle, str(file))
        else:
            data = _verified_bytes(path, manifest, name)
            try:
                arrays = arrays_from_npz(data, str(file), "array archive")
            except ValueError as error:  # it names the file already
                raise BundleError(str(error)) from None
    except BundleError:
        raise
    except OSError as error:
        if error.errno == errno.ENOMEM:  # short of memory to map it: not the file's fault
            raise MemoryError(f"{file}: cannot be mapped: {error.strerror}") from None
        raise BundleError(f"{file}: not a readable array archive: {error}") from None
    except (ValueError, zipfile.BadZipFile, EOFError) as error:
        raise BundleError(f"{file}: not a readable array archive: {error}") from None
    centers = arrays.pop(HEAD_CENTERS, None)
    try:
        model = method.load(arrays, _load_params(method, manifest, threads))
    except (TypeError, ValueError) as error:
        raise BundleError(f"{file}: {error}") from None
    n_features = getattr(model, "n_features_in_", manifest["input_dim"])
    n_components = getattr(model, "n_components_", manifest["output_dim"])
    if (n_features, n_components) != (manifest["input_dim"], manifest["output_dim"]):
        raise BundleError(f"{file}: model dimensions disagree with the manifest")
    if manifest["n_clusters"] is not None and (
        centers is None or centers.shape != (manifest["n_clusters"], manifest["output_dim"])
    ):
        raise BundleError(f"{file}: clustering head centroids missing or misshapen")
    return model, None if centers is None else centers.astype(np.float32)


def _alignment(path: Path, manifest: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """The exact path's map into the space of the model it was aligned to (the manifest's
    ``alignment`` section), or None."""
    section = manifest.get("alignment")
    if section is None:
        return None
    c = manifest["output_dim"]
    try:
        matrix = np.asarray(section["matrix"], dtype=np.float64)
        shift = np.asarray(section["shift"], dtype=np.float64)
    except (KeyError, TypeError, ValueError):
        matrix = shift = np.empty(0)
    if matrix.shape != (c, c) or shift.shape != (c,) or not np.isfinite(matrix).all():
        raise BundleError(f"{path / MANIFEST}: alignment section malformed")
    return matrix, shift


def _load_params(method: Method, manifest: dict[str, Any], threads: int) -> dict[str, Any]:
    """The estimator's parameters as stored, with the reader's thread count."""
    params = dict(manifest["hyperparameters"].get(method.name, {}))
    if "n_jobs" in method.constraints:
        params["n_jobs"] = threads
    return params
