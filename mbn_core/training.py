"""Training a bundle end to end: parameters, reading data, MBN + compressor + export.

Both the ``mbn train`` command and the service's worker call ``train_bundle``; it reports
progress as one fraction 0..1 over the whole job, weighted by the expected cost of each step,
and stops (writing nothing) when the progress callback returns True.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from mbn_core.bundle import check_target, save_bundle, validate_model_id, validate_name
from mbn_core.compress import CompressiveMBN, mbn_fit_rows
from mbn_core.network import MBN, TrainingStopped

log = logging.getLogger(__name__)

PHASES = ("mbn", "compressor", "export")
# Which TrainingParams fields go to MBN, to CompressiveMBN, or to both.
MBN_FIELDS = (
    "n_components", "n_clusterings", "feature_fraction", "k1", "delta", "n_classes", "ks",
    "k_max", "metric", "shift_fraction",
)  # fmt: skip
COMPRESSOR_FIELDS = (
    "hidden_layer_sizes", "max_epochs", "batch_size", "learning_rate", "alpha",
    "n_iter_no_change", "tol", "validation_fraction", "holdout_fraction", "targets",
    "n_clusters",
)  # fmt: skip
SHARED_FIELDS = ("random_state", "n_jobs")
ProgressCallback = Callable[[str, float], object]

# Relative cost of the steps, in bottom-layer multiply-adds (measured on MNIST on two cores):
# an upper-layer clustering walks posting lists at about this many bottom-layer GEMM
# multiply-adds per (point, clustering + center) ...
_UPPER_COST = 40.0
# ... and an MLP weight costs about this many per point and epoch (forward, backward and
# update, on one BLAS thread against the bottom layer's two).
_MLP_COST = 7.0
# Share of the whole job left to the fidelity evaluation and the export.
_EXPORT_SHARE = 0.02
_SPARSE_KEYS = {"format", "shape", "data", "indices", "indptr"}


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True)
class TrainingParams:
    """Every option of a training job: the MBN's and the compressor's.

    Build from JSON with ``TrainingParams.from_dict`` (unknown keys and bad values raise
    ``ValueError`` naming the key); ``to_dict`` gives the JSON-able form back. Defaults suit
    tens of thousands of points: ``k_max`` bounds the bottom layer, the dominant cost (linear
    in k1). With 2000, 60,000 MNIST images cost about 2e13 multiply-adds, an estimated 10 to
    15 minutes on two quiet cores (extrapolated from smaller measured runs).
    """

    n_components: int | None = field(
        default=None, metadata=_help("embedding dimension; none means n_classes")
    )
    n_clusterings: int = field(default=400, metadata=_help("clusterings per layer (V)"))
    feature_fraction: float | str = field(
        default="auto", metadata=_help("fraction of input dimensions per clustering (a)")
    )
    k1: int | float | str = field(
        default="auto",
        metadata=_help("bottom-layer centers: an integer, a fraction of n, or auto (0.5 n)"),
    )
    delta: float = field(default=0.5, metadata=_help("centers shrink by this factor per layer"))
    n_classes: int = field(
        default=10, metadata=_help("guessed number of classes: stops the layers at 1.5 c")
    )
    ks: tuple[int, ...] | None = field(
        default=None, metadata=_help("explicit centers per layer, e.g. 4000,2000,1000")
    )
    k_max: int | None = field(default=2000, metadata=_help("cap on bottom-layer centers"))
    metric: str = field(default="euclidean", metadata=_help("euclidean or cosine"))
    shift_fraction: float = field(default=0.0, metadata=_help("random reconstruction fraction (r)"))
    random_state: int | None = field(default=0, metadata=_help("random seed"))
    n_jobs: int | None = field(default=None, metadata=_help("threads; none means every core"))
    hidden_layer_sizes: tuple[int, ...] = field(
        default=(256, 256), metadata=_help("hidden layers of the compressor MLP")
    )
    max_epochs: int = field(default=40, metadata=_help("most MLP epochs"))
    batch_size: int = field(default=256, metadata=_help("MLP minibatch size"))
    learning_rate: float = field(default=1e-3, metadata=_help("Adam learning rate"))
    alpha: float = field(default=1e-5, metadata=_help("L2 penalty of the MLP"))
    n_iter_no_change: int = field(default=5, metadata=_help("early stopping patience in epochs"))
    tol: float = field(default=1e-4, metadata=_help("smallest validation-loss improvement"))
    validation_fraction: float = field(
        default=0.1, metadata=_help("fraction used for early stopping")
    )
    holdout_fraction: float = field(
        default=0.1,
        metadata=_help("fraction kept out of the MBN fit and the MLP to measure fidelity"),
    )
    targets: str = field(
        default="leave-self-out",
        metadata=_help("what the MLP learns: leave-self-out or in-sample embeddings"),
    )
    n_clusters: int | None = field(
        default=None, metadata=_help("add a k-means clustering head with this many clusters")
    )

    def __post_init__(self) -> None:
        for key in ("ks", "hidden_layer_sizes"):
            value = getattr(self, key)
            if isinstance(value, list):
                object.__setattr__(self, key, tuple(value))
        seed = self.random_state
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32
        ):
            raise ValueError(f"random_state must be an integer in [0, 2**32) or None, got {seed!r}")
        MBN(**self.mbn_kwargs())._validate_params()
        CompressiveMBN(**self.compressor_kwargs())._validate_params()

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> TrainingParams:
        """Parameters from a JSON object; ValueError names an unknown key or a bad value."""
        if values is None:
            return cls()
        if not isinstance(values, dict):
            raise ValueError(f"training parameters must be an object, got {type(values).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        for key in values:
            if key not in known:
                raise ValueError(
                    f"unknown training parameter {key!r}; known: {', '.join(sorted(known))}"
                )
        try:
            return cls(**values)
        except TypeError as error:  # e.g. a list where a number belongs, in a comparison
            raise ValueError(f"invalid training parameters: {error}") from None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able parameters (tuples as lists)."""
        return {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in dataclasses.asdict(self).items()
        }

    def mbn_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``MBN``."""
        kwargs = {name: getattr(self, name) for name in (*MBN_FIELDS, *SHARED_FIELDS)}
        if kwargs["ks"] is not None:
            kwargs["ks"] = list(kwargs["ks"])
        return kwargs

    def compressor_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``CompressiveMBN`` (without the MBN)."""
        return {name: getattr(self, name) for name in (*COMPRESSOR_FIELDS, *SHARED_FIELDS)}


@dataclass(frozen=True)
class TrainingEvent:
    """A detailed progress report (for progress bars).

    Attributes
    ----------
    phase : {"mbn", "compressor", "export"}
    fraction : float
        Of the whole job, 0..1 (what ``progress`` receives).
    phase_fraction : float
        Of the current phase, 0..1.
    message : str
        What just finished, e.g. "layer 2/7 (k=1000): clustering 40/400".
    """

    phase: str
    fraction: float
    phase_fraction: float
    message: str


# ---------------------------------------------------------------------- data


def load_training_data(path: str | os.PathLike[str]) -> tuple[Any, np.ndarray | None]:
    """Read a data file: ``.npy``, ``.npz`` (``x`` and optional ``y``), scipy sparse ``.npz``
    or ``.csv`` (numbers only, an optional header row).

    Returns
    -------
    X : ndarray of shape (n_samples, n_features) float32, or CSR matrix float32
    y : ndarray of shape (n_samples,) or None
        Labels from an ``.npz``'s ``y``, used only to report fidelity.

    Raises
    ------
    ValueError
        Naming the file: missing, unreadable, an unknown format, or malformed content
        (not 2-D, not numeric, NaN or infinity, fewer than 2 rows).
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    if not path.is_file():
        raise ValueError(f"{path}: not a file")
    suffix = path.suffix.lower()
    y = None
    try:
        _check_magic(path, suffix)
        if suffix == ".npy":
            X = np.load(path, allow_pickle=False)
        elif suffix == ".npz":
            X, y = _read_npz(path)
        elif suffix == ".csv":
            X = _read_csv(path)
        else:
            raise ValueError(
                f"{path}: unsupported format {suffix or '(no suffix)'!r}; use .npy, .npz or .csv"
            )
    except (OSError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(f"{path}: unreadable {suffix} file: {error}") from None
    except ValueError as error:
        message = str(error)
        if "allow_pickle" in message:  # numpy's advice to unpickle is not ours to give
            message = f"{path}: holds Python objects (pickled data), which mbn never loads"
        elif not message.startswith(str(path)):
            message = f"{path}: unreadable {suffix} file: {message}"
        raise ValueError(message) from None
    return check_matrix(X, str(path)), _check_labels(y, X.shape[0], str(path))


def check_matrix(X, source: str = "X"):
    """``X`` as float32 (dense or CSR), or ValueError naming ``source``."""
    if sp.issparse(X):
        X = sp.csr_matrix(X)
        values = X.data
    else:
        X = np.asarray(X)
        values = X
    if X.ndim != 2:
        raise ValueError(f"{source}: expected a 2-D matrix (rows = points), got shape {X.shape}")
    if X.dtype.kind not in "biuf":
        raise ValueError(f"{source}: expected numbers, got dtype {X.dtype}")
    if X.shape[0] < 2 or X.shape[1] < 1:
        raise ValueError(f"{source}: needs at least 2 rows and 1 column, got shape {X.shape}")
    values = values.astype(np.float32, copy=False)
    if not np.isfinite(values).all():
        raise ValueError(f"{source}: contains NaN or infinity")
    return X.astype(np.float32, copy=False)


def _check_magic(path: Path, suffix: str) -> None:
    """Refuse files that are not what their suffix says, before numpy guesses at pickles."""
    magic = {".npy": b"\x93NUMPY", ".npz": b"PK"}.get(suffix)
    if magic is None:
        return
    with path.open("rb") as handle:
        if handle.read(len(magic)) != magic:
            raise ValueError(f"{path}: not a NumPy {suffix} file")


def _read_npz(path: Path):
    with np.load(path, allow_pickle=False) as npz:
        keys = set(npz.files)
        if keys >= _SPARSE_KEYS:
            return sp.load_npz(path).tocsr(), None
        if "x" not in keys:
            raise ValueError(
                f"{path}: an .npz needs an array named 'x' (and optionally 'y'), "
                f"found {sorted(keys)}"
            )
        return npz["x"], npz["y"] if "y" in keys else None


def _read_csv(path: Path) -> np.ndarray:
    with path.open("r", encoding="utf-8", errors="replace") as handle:
        first = handle.readline()
    try:
        [float(cell) for cell in first.split(",")]
        header = 0
    except ValueError:
        header = 1  # a header row of column names
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "no data": reported below, by name
        X = np.loadtxt(path, delimiter=",", skiprows=header, ndmin=2, dtype=np.float64)
    if X.size == 0:
        raise ValueError(f"{path}: no data rows")
    return X


def _check_labels(y, n_samples: int, source: str) -> np.ndarray | None:
    if y is None:
        return None
    y = np.asarray(y)
    if y.ndim != 1 or len(y) != n_samples:
        raise ValueError(f"{source}: 'y' must be 1-D with one label per row of 'x'")
    return y


# ---------------------------------------------------------------------- training


def train_bundle(
    X,
    out_dir: str | os.PathLike[str],
    *,
    name: str,
    params: TrainingParams | dict[str, Any] | None = None,
    y=None,
    model_id: str | None = None,
    progress: ProgressCallback | None = None,
    events: Callable[[TrainingEvent], object] | None = None,
    overwrite: bool = False,
) -> Path:
    """Train MBN and its compressor on X and write the bundle to ``out_dir``.

    Parameters
    ----------
    X : array-like or sparse matrix of shape (n_samples, n_features)
    out_dir : path
        The bundle directory to create (its parent must exist).
    name : str
        Human-readable model name.
    params : TrainingParams or dict, default=None
        None means the defaults.
    y : array-like of shape (n_samples,), default=None
        Labels, used only for the fidelity report.
    model_id : str, default=None
        None means ``out_dir``'s name.
    progress : callable, default=None
        ``progress(phase, fraction)`` with phase in "mbn", "compressor", "export" and
        fraction of the whole job in 0..1, called after every clustering and MLP epoch.
        Returning True stops: ``TrainingStopped`` is raised and nothing is written. The
        last call, ``("export", 1.0)``, comes after the bundle is written and cannot stop it.
    events : callable, default=None
        Receives a ``TrainingEvent`` at the same moments (for progress bars); returning
        True stops too.
    overwrite : bool, default=False
        Replace an existing bundle at ``out_dir``.

    Returns
    -------
    Path
        The bundle directory.
    """
    if not isinstance(params, TrainingParams):
        params = TrainingParams.from_dict(params)
    out_dir = Path(out_dir)
    # Everything checkable is checked before hours of training, not after.
    validate_model_id(out_dir.name if model_id is None else model_id)
    validate_name(name)
    check_target(out_dir, overwrite=overwrite)
    X = check_matrix(X)
    labels = _check_labels(y, X.shape[0], "y")

    mbn = MBN(**params.mbn_kwargs())
    # The MBN is fitted without the rows held out for the fidelity report.
    ks = mbn.layer_sizes(mbn_fit_rows(X.shape[0], params.holdout_fraction))
    tracker = _Tracker(params, X.shape, ks, progress, events)
    mbn.set_params(callback=tracker.clustering_done)
    model = CompressiveMBN(mbn, **params.compressor_kwargs(), callback=tracker.epoch_done)
    started = time.perf_counter()
    log.info("training %r on %d x %d points, layers %s", name, *X.shape, ks)
    model.fit(X, labels)
    if tracker.report("export", 0.0, "writing the bundle"):
        raise TrainingStopped("training stopped by the progress callback before export")
    seconds = time.perf_counter() - started
    path = save_bundle(
        model,
        out_dir,
        name=name,
        model_id=model_id,
        overwrite=overwrite,
        extra={"total_seconds": round(seconds, 3), "params": params.to_dict()},
    )
    tracker.report("export", 1.0, "bundle written")
    return path


class _Tracker:
    """Turns clustering and epoch callbacks into one cost-weighted fraction of the job."""

    def __init__(self, params: TrainingParams, shape, ks, progress, events) -> None:
        n, d = shape
        V = params.n_clusterings
        fraction = 0.5 if params.feature_fraction == "auto" else float(params.feature_fraction)
        n_fit = mbn_fit_rows(n, params.holdout_fraction)
        bottom = float(n_fit) * max(1.0, fraction * d) * ks[0]
        # Leave-self-out targets walk the upper layers a second time.
        passes = 2 if params.targets == "leave-self-out" else 1
        upper = [passes * _UPPER_COST * n_fit * (V + k) for k in ks[1:]]
        self.layer_costs = [V * bottom] + [V * cost for cost in upper]
        mlp_macs = sum(
            a * b
            for a, b in zip(
                (d, *params.hidden_layer_sizes),
                (*params.hidden_layer_sizes, params.n_components or params.n_classes),
                strict=True,
            )
        )
        n_train = n_fit * (1 - params.validation_fraction)
        mlp = _MLP_COST * mlp_macs * n_train * params.max_epochs
        mbn = sum(self.layer_costs)
        # The held-out rows' exact embedding (for the report) runs after the MLP, unreported:
        # its bottom layer, counted in the last share with the export.
        evaluation = V * float(n - n_fit) * max(1.0, fraction * d) * ks[0]
        total = mbn + mlp + evaluation
        self.export_share = _EXPORT_SHARE + (1 - _EXPORT_SHARE) * evaluation / total
        self.mbn_share = (1 - _EXPORT_SHARE) * mbn / total
        self.compressor_share = (1 - self.export_share) - self.mbn_share
        self.ks = ks
        self.progress = progress
        self.events = events

    def clustering_done(self, layer: int, clustering: int, total: int) -> bool:
        done = sum(self.layer_costs[:layer]) + self.layer_costs[layer] * clustering / total
        phase_fraction = done / sum(self.layer_costs)
        message = (
            f"layer {layer + 1}/{len(self.ks)} (k={self.ks[layer]}): "
            f"clustering {clustering}/{total}"
        )
        return self.report("mbn", phase_fraction, message)

    def epoch_done(self, epoch: int, max_epochs: int, loss: float) -> bool:
        message = f"epoch {epoch}/{max_epochs}"
        if np.isfinite(loss):
            message += f", validation loss {loss:.4g}"
        return self.report("compressor", epoch / max_epochs, message)

    def report(self, phase: str, phase_fraction: float, message: str) -> bool:
        start = {
            "mbn": 0.0,
            "compressor": self.mbn_share,
            "export": self.mbn_share + self.compressor_share,
        }[phase]
        width = {
            "mbn": self.mbn_share,
            "compressor": self.compressor_share,
            "export": self.export_share,
        }[phase]
        fraction = min(1.0, start + width * phase_fraction)
        stop = False
        if self.progress is not None:
            stop = bool(self.progress(phase, fraction))
        if self.events is not None:
            event = TrainingEvent(phase, fraction, phase_fraction, message)
            stop = bool(self.events(event)) or stop
        return stop
