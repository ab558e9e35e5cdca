"""How far incoming rows are from the training data: a per-row novelty score and the range check.

A fast path extrapolates without warning on rows unlike its training data. The score here
is cheap enough to compute beside it (two small matrix products per batch) and is calibrated
at training time on training rows it was not fitted on:

- the rows' distance to the principal subspace of a reference sample of the training rows
  (the PCA reconstruction error: noise and patterns the training data never had), and
- their mean distance to the ``NEIGHBORS`` nearest reference rows inside that subspace
  (rows that lie in the subspace, but where no training row does: an inverted image).

Each part is divided by its median on the calibration rows and the score is the larger of
the two, so neither part's units dominate; the threshold is the score's ``QUANTILE`` on the
calibration rows, so about ``1 - QUANTILE`` of rows from the training distribution are
flagged. benchmarks/bench_novelty.py compares this score with each part alone.

The range check says whether a row has a feature beyond the training rows' range, widened
by a margin (``RANGE_MARGIN`` of the feature's span, at least that share of the typical
feature's span), so that a pixel the training rows never set counts only when set clearly.

Both live in ``novelty.npz`` beside a bundle (``Novelty.to_bytes`` / ``from_bytes``) and are
described by the manifest's ``novelty`` section. Dense input only: sparse input (text) has
no novelty model, and bundles trained before it have none either.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.utils import check_random_state

from mbn_core.bundle import NOVELTY_FILE, Bundle, BundleError
from mbn_core.data.scaling import InputScaling
from mbn_core.utils.npz import arrays_from_npz, npz_bytes
from mbn_core.utils.pca import fit_pca

# The share of calibration rows scoring at or below the threshold.
QUANTILE = 0.99
# Principal directions of the subspace (fewer for narrow input or few rows).
COMPONENTS = 50
# Reference rows kept (a random sample of the training rows): a row's neighbour search
# costs COMPONENTS multiply-adds per reference row.
MAX_REFERENCE_ROWS = 2000
# Nearest reference rows whose mean distance is the in-subspace part.
NEIGHBORS = 5
# Calibration rows scored at training time (the rest of the training rows, sampled).
MAX_CALIBRATION_ROWS = 5000
# A feature is out of range beyond its training span widened by this share of it (and at
# least this share of the median span of the features that vary).
RANGE_MARGIN = 0.1
# Rows scored at a time: bounds the rows x reference-rows distance matrix.
_CHUNK_ROWS = 1024
_ARRAYS = (
    "mean",
    "components",
    "reference",
    "scales",
    "threshold",
    "feature_low",
    "feature_high",
)


@dataclass(frozen=True)
class Novelty:
    """A fitted novelty score and range check of one model's input.

    Attributes
    ----------
    mean : ndarray of shape (n_features,)
        Mean of the reference rows (float32).
    components : ndarray of shape (n_components, n_features)
        Principal directions of the reference rows (float32, orthonormal rows).
    reference : ndarray of shape (n_reference, n_components)
        The reference rows in the subspace (float32).
    scales : ndarray of shape (2,)
        Median reconstruction error and median neighbour distance of the calibration rows;
        a zero (a subspace that spans the input) leaves that part out.
    threshold : float
        Scores above it are novel: the ``QUANTILE`` of the calibration rows' scores.
    feature_low, feature_high : ndarray of shape (n_features,)
        Per feature, the range beyond which a row is out of range (margin included).
    input_scaling : InputScaling
        The model's scaling of raw rows, applied before scoring: the novelty model is fitted
        on the rows the method saw (set from the bundle by ``load_novelty``, not stored).
    """

    mean: np.ndarray
    components: np.ndarray
    reference: np.ndarray
    scales: np.ndarray
    threshold: float
    feature_low: np.ndarray
    feature_high: np.ndarray
    input_scaling: InputScaling = field(default_factory=lambda: InputScaling("none"))

    def __post_init__(self) -> None:
        # Scoring runs beside the fast path: its float64 operands are prepared once.
        object.__setattr__(self, "_mean64", self.mean.astype(np.float64))
        object.__setattr__(self, "_components64", self.components.astype(np.float64))
        reference = self.reference.astype(np.float64)
        object.__setattr__(self, "_reference64", reference)
        object.__setattr__(self, "_reference_norms", np.einsum("ij,ij->i", reference, reference))

    @property
    def n_features(self) -> int:
        return int(self.mean.shape[0])

    @property
    def degenerate(self) -> str | None:
        """Why the score cannot tell rows apart, or None when it can.

        A calibration whose parts all have a zero median (input where one feature dwarfs
        the others, on a model without input scaling: every difference of squared norms
        rounds to zero) scores every row 0 and flags none, however far it is. The range
        check does not depend on the calibration and stays valid."""
        if not np.isfinite(self.threshold) or self.threshold <= 0 or not (self.scales > 0).any():
            return (
                "the novelty calibration is degenerate (threshold "
                f"{float(self.threshold):.3g}: every calibration row scored 0, as happens "
                "when one feature is many orders of magnitude larger than the others and "
                "the model has no input scaling); scores would flag no row"
            )
        return None

    # ----------------------------------------------------------------- fitting

    @classmethod
    def fit(
        cls, X, *, random_state: int | np.random.RandomState | None = 0
    ) -> tuple[Novelty, dict[str, Any]]:
        """Fit on training rows ``X``: a reference sample (at most ``MAX_REFERENCE_ROWS``,
        at most half the rows) and calibration on the others, which neither the subspace nor
        the neighbour search has seen.

        Returns the model and its summary for the manifest (``summary``). ValueError for
        sparse input or fewer than 4 rows.
        """
        if sp.issparse(X):
            raise ValueError("novelty scores need dense input")
        X = np.asarray(X, dtype=np.float32)
        if X.ndim != 2 or X.shape[0] < 4:
            raise ValueError(f"novelty needs at least 4 training rows, got shape {X.shape}")
        rng = check_random_state(random_state)
        order = rng.permutation(X.shape[0])
        n_reference = min(MAX_REFERENCE_ROWS, X.shape[0] // 2)
        reference_rows = X[order[:n_reference]]
        calibration_rows = X[order[n_reference:][:MAX_CALIBRATION_ROWS]]
        n_components = max(1, min(COMPONENTS, X.shape[1], n_reference - 1))
        pca = fit_pca(reference_rows, n_components, svd_solver="full", random_state=0)
        mean = pca.mean_.astype(np.float32)
        components = pca.components_.astype(np.float32)
        reference = ((reference_rows - mean) @ components.T).astype(np.float32)
        low, high = _widened_range(X)
        unscaled = cls(mean, components, reference, np.ones(2), np.inf, low, high)
        parts = unscaled._parts(calibration_rows)
        scales = np.median(parts, axis=0)
        scores = _combine(parts, scales)
        threshold = float(np.quantile(scores, QUANTILE))
        model = cls(mean, components, reference, scales, threshold, low, high)
        summary = {
            "score": "max(PCA reconstruction error, mean distance to the nearest reference "
            "rows in the PCA subspace), each over its calibration median",
            "quantile": QUANTILE,
            "threshold": threshold,
            "n_components": int(n_components),
            "n_reference_rows": int(n_reference),
            "n_neighbors": min(NEIGHBORS, int(n_reference)),
            "n_calibration_rows": len(calibration_rows),
            "calibration_novel_share": float(np.mean(scores > threshold)),
            "calibration_out_of_range_share": float(np.mean(model.out_of_range(calibration_rows))),
            "range_margin": RANGE_MARGIN,
            "degenerate": model.degenerate is not None,
        }
        if model.degenerate is not None:
            summary["degenerate_reason"] = model.degenerate
        return model, summary

    # ----------------------------------------------------------------- scoring

    def score(self, X) -> np.ndarray:
        """Novelty score of each row (float64, >= 0); above ``threshold`` is novel."""
        return _combine(self._parts(self._dense(X)), self.scales)

    def is_novel(self, X) -> np.ndarray:
        """Whether each row's score is above the calibrated threshold."""
        return self.score(X) > self.threshold

    def out_of_range(self, X) -> np.ndarray:
        """Whether each row has a feature outside the (widened) training range."""
        X = self._dense(X)
        return np.any((self.feature_low > X) | (self.feature_high < X), axis=1)

    def _dense(self, X) -> np.ndarray:
        if sp.issparse(X):
            X = X.toarray()
        X = np.asarray(X, dtype=np.float32)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(
                f"X must have shape (n_samples, {self.n_features}), got {tuple(X.shape)}"
            )
        return self.input_scaling.transform(X)

    def _parts(self, X: np.ndarray) -> np.ndarray:
        """(reconstruction error, mean neighbour distance) of each row, unscaled.

        In float64: both parts are differences of nearly equal squared norms, and float32
        would make a row's score depend on the batch it came in (BLAS blocks differ).
        """
        out = np.empty((X.shape[0], 2))
        components: np.ndarray = self._components64  # type: ignore[attr-defined]
        reference: np.ndarray = self._reference64  # type: ignore[attr-defined]
        reference_norms: np.ndarray = self._reference_norms  # type: ignore[attr-defined]
        mean: np.ndarray = self._mean64  # type: ignore[attr-defined]
        k = min(NEIGHBORS, reference.shape[0])
        for start in range(0, X.shape[0], _CHUNK_ROWS):
            centred = X[start : start + _CHUNK_ROWS].astype(np.float64) - mean
            inside = centred @ components.T
            inside_norms = np.einsum("ij,ij->i", inside, inside)
            total = np.einsum("ij,ij->i", centred, centred)
            # |x|^2 - |Px|^2 for orthonormal components: the squared distance to the subspace.
            out[start : start + len(centred), 0] = np.sqrt(np.maximum(total - inside_norms, 0))
            squared = inside_norms[:, None] - 2.0 * (inside @ reference.T) + reference_norms
            nearest = np.partition(np.maximum(squared, 0), k - 1, axis=1)[:, :k]
            out[start : start + len(centred), 1] = np.sqrt(np.mean(nearest, axis=1))
        return out

    # ----------------------------------------------------------------- storage

    def to_bytes(self) -> bytes:
        """The arrays as an ``.npz`` (no pickles)."""
        return npz_bytes({name: np.asarray(getattr(self, name)) for name in _ARRAYS})

    @classmethod
    def from_bytes(cls, data: bytes, source: str = NOVELTY_FILE) -> Novelty:
        """Read ``to_bytes``' output; ValueError naming ``source`` when malformed."""
        arrays = arrays_from_npz(data, source, "novelty model", _ARRAYS)
        d = arrays["mean"].shape
        components, reference = arrays["components"], arrays["reference"]
        if (
            len(d) != 1
            or components.ndim != 2
            or components.shape[1] != d[0]
            or reference.ndim != 2
            or reference.shape[1] != components.shape[0]
            or reference.shape[0] < 1
            or arrays["scales"].shape != (2,)
            or arrays["threshold"].shape != ()
            or arrays["feature_low"].shape != d
            or arrays["feature_high"].shape != d
        ):
            raise ValueError(f"{source}: novelty arrays of inconsistent shapes")
        return cls(
            mean=arrays["mean"].astype(np.float32),
            components=components.astype(np.float32),
            reference=reference.astype(np.float32),
            scales=arrays["scales"].astype(np.float64),
            threshold=float(arrays["threshold"]),
            feature_low=arrays["feature_low"].astype(np.float32),
            feature_high=arrays["feature_high"].astype(np.float32),
        )


def _combine(parts: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The score from the unscaled parts: the larger part over its scale (parts with a zero
    scale left out)."""
    used = scales > 0
    if not used.any():
        return np.zeros(parts.shape[0])
    return np.max(parts[:, used] / scales[used], axis=1)


def _widened_range(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    low = X.min(axis=0).astype(np.float64)
    high = X.max(axis=0).astype(np.float64)
    span = high - low
    varying = span[span > 0]
    typical = float(np.median(varying)) if varying.size else 1.0
    margin = RANGE_MARGIN * np.maximum(span, typical)
    return (low - margin).astype(np.float32), (high + margin).astype(np.float32)


def novelty_section(X, rows, random_state) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The bundle files and manifest section of a novelty model fitted on ``X[rows]`` (the
    rows the method was fitted on): ``({NOVELTY_FILE: bytes}, {"novelty": summary})``, or
    a section that says why there is none (sparse input, too few rows)."""
    if sp.issparse(X):
        return {}, {"novelty": {"unavailable": "sparse input has no novelty model"}}
    rows = np.arange(X.shape[0]) if rows is None else np.asarray(rows)
    if len(rows) < 4:
        return {}, {"novelty": {"unavailable": "fewer than 4 training rows"}}
    model, summary = Novelty.fit(np.asarray(X)[rows], random_state=random_state)
    return {NOVELTY_FILE: model.to_bytes()}, {"novelty": summary}


def load_novelty(bundle: Bundle) -> Novelty | None:
    """``bundle``'s novelty model, or None when it has none (trained before novelty models,
    or on sparse input). BundleError when its file is damaged."""
    model = bundle.read_optional(NOVELTY_FILE, Novelty.from_bytes)
    if model is None:
        return None
    if model.n_features != bundle.input_dim:
        raise BundleError(f"{bundle.id}/{NOVELTY_FILE}: input dimension disagrees")
    return dataclasses.replace(model, input_scaling=bundle.input_scaling)
