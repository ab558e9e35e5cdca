"""Input scaling: the per-feature standardisation a bundle applies to raw rows, chosen from
the data.

Distances between rows are what every method here works on, so a feature measured in large
units (a wine's proline, in the hundreds) outweighs the others (hues near 1) until the
features are standardised. Images must be left alone: their pixels share one unit, and a
pixel that is rarely on would be blown up to the weight of one that carries the digit.

``choose_scaling`` decides label-free, from the features' value ranges: the features of one
unit (pixels, one sensor's channels) span ranges of the same size, and a table that mixes
units spans ranges orders of magnitude apart. It compares the 90th and 10th percentiles of
the non-constant features' ranges (percentiles, so that a few edge pixels that are nearly
always off, or a single outlying column, do not decide) against ``RANGE_RATIO_LIMIT``.

The bundle keeps the choice: its fast path takes raw rows (``fold_into_graph`` puts the
scaling in front of the ONNX graph), its exact path and novelty model scale rows first, and
the manifest records what was chosen and why. Sparse input is never scaled by ``auto``:
centring would make it dense, and reweighting terms is a text-weighting choice (tf-idf) that
belongs to the user.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from mbn_core.params import Param, StrOptions
from mbn_core.utils.npz import arrays_from_npz, npz_bytes

SCALING_FILE = "input_scaling.npz"
SCALINGS = ("none", "standard")
# Ranges 10x apart between the 10th and 90th percentile feature mean mixed units: images and
# one-unit tables measure 1-3x, the mixed-unit tables of scikit-learn's sets 50x and more
# (docs/decisions/0024-input-scaling.md).
RANGE_RATIO_LIMIT = 10.0

INPUT_SCALING = Param(
    name="input_scaling",
    default="auto",
    constraints=[StrOptions({"auto", *SCALINGS})],
    help=(
        "Per-feature scaling applied to raw rows inside the model: 'standard' (zero mean, "
        "unit variance), 'none', or 'auto' (standard when the features' value ranges differ "
        "by more than 10x, as in tables of mixed units; images and sparse input are left as "
        "they are)."
    ),
    owner="the input",
)


@dataclass(frozen=True)
class InputScaling:
    """``(X - offset) * factor`` per feature, in float32; the identity when ``method`` is
    "none".

    Attributes
    ----------
    method : {"none", "standard"}
    offset, factor : ndarray of shape (n_features,), float32, or None
        The feature means and inverse standard deviations (1 for a constant feature); None
        for "none".
    requested : {"auto", "none", "standard"}
        What training asked for.
    range_ratio : float or None
        The training rows' ``feature_range_ratio``, which decided "auto".
    """

    method: str
    offset: np.ndarray | None = None
    factor: np.ndarray | None = None
    requested: str = "none"
    range_ratio: float | None = None

    @property
    def is_identity(self) -> bool:
        return self.method == "none"

    @classmethod
    def fit(cls, X, method: str) -> InputScaling:
        """The scaling ``method`` ("none" or "standard") fitted on the training rows X."""
        if method not in SCALINGS:
            raise ValueError(f"input_scaling must be one of {SCALINGS}, got {method!r}")
        if method == "none":
            return cls("none", requested="none")
        if sp.issparse(X):
            raise ValueError(
                "input_scaling='standard' centres every feature, which would make sparse input "
                "dense; weight sparse features yourself (tf-idf, say) and use 'none'"
            )
        X = np.asarray(X)
        # float64 sums: a float32 mean of 60,000 rows loses digits the codes would notice.
        mean = X.mean(axis=0, dtype=np.float64)
        std = X.std(axis=0, dtype=np.float64)
        check_deviations(std)
        factor = np.ones_like(std)
        np.divide(1.0, std, out=factor, where=std > 0)
        return cls("standard", mean.astype(np.float32), factor.astype(np.float32), "standard")

    def transform(self, X):
        """Scaled rows, float32 (X itself when the scaling is the identity)."""
        if self.is_identity:
            return X
        assert self.offset is not None and self.factor is not None
        # The same two float32 operations, in the same order, as the graph's Sub and Mul
        # nodes: the fast and exact paths see bit-identical scaled rows.
        return (np.asarray(X, dtype=np.float32) - self.offset) * self.factor

    def section(self) -> dict[str, Any]:
        """The manifest's ``input_scaling`` section: what was asked, what was chosen, the
        range ratio that decided."""
        section: dict[str, Any] = {"method": self.method, "requested": self.requested}
        if self.range_ratio is not None:
            section["feature_range_ratio"] = round(self.range_ratio, 3)
            section["range_ratio_limit"] = RANGE_RATIO_LIMIT
        if not self.is_identity:
            section["file"] = SCALING_FILE
        return section

    def to_bytes(self) -> bytes:
        assert self.offset is not None and self.factor is not None
        return npz_bytes({"offset": self.offset, "factor": self.factor})

    @classmethod
    def from_manifest(cls, section: Any, data: bytes | None, n_features: int) -> InputScaling:
        """The scaling a manifest's ``input_scaling`` section describes, with the bytes of
        ``SCALING_FILE`` (None when the bundle has none). ValueError saying what is wrong."""
        if not isinstance(section, dict) or section.get("method") not in SCALINGS:
            raise ValueError(f"input_scaling section malformed: {section!r:.200}")
        if section["method"] == "none":
            if data is not None:
                raise ValueError(f"{SCALING_FILE} present but the input_scaling is 'none'")
            scaling = cls("none")
        elif data is None:
            raise ValueError(f"input_scaling {section['method']!r} needs {SCALING_FILE}")
        else:
            scaling = cls.from_bytes(data, n_features)
        requested = section.get("requested")
        ratio = section.get("feature_range_ratio")
        return replace(
            scaling,
            requested=requested if isinstance(requested, str) else scaling.method,
            range_ratio=float(ratio) if isinstance(ratio, int | float) else None,
        )

    @classmethod
    def from_bytes(cls, data: bytes, n_features: int, source: str = SCALING_FILE) -> InputScaling:
        """The "standard" scaling stored in ``data``; ValueError naming ``source`` when the
        arrays are missing, of the wrong shape or not finite."""
        arrays = arrays_from_npz(data, source, "scaling file", ("offset", "factor"))
        offset, factor = arrays["offset"], arrays["factor"]
        for name, array in (("offset", offset), ("factor", factor)):
            if array.dtype != np.float32 or array.shape != (n_features,):
                raise ValueError(f"{source}: {name} must be float32 of shape ({n_features},)")
            if not np.isfinite(array).all():
                raise ValueError(f"{source}: {name} is not finite")
        return cls("standard", offset, factor, "standard")


# The smallest standard deviation "standard" can divide by: below it the factor overflows
# float32 (and the column's values differ only in their last digits anyway).
MIN_SCALED_DEVIATION = 1.0 / float(np.finfo(np.float32).max)


def check_deviations(std: np.ndarray, names: list[str] | None = None) -> None:
    """ValueError naming the first column whose standard deviation is positive but too
    small for "standard" scaling (its factor would overflow float32). ``names``: the
    columns' names, when they have any."""
    tiny = np.flatnonzero((std > 0) & (std < MIN_SCALED_DEVIATION))
    if tiny.size == 0:
        return
    column = int(tiny[0])
    name = f"{names[column]!r} ({column + 1})" if names and column < len(names) else column + 1
    raise ValueError(
        f"column {name} varies by a standard deviation of {float(std[column]):.3g}, too "
        "small to scale to unit variance in float32 (input_scaling 'standard'); rescale or "
        "drop the column, or train with input_scaling 'none'"
    )


def feature_range_ratio(X) -> float | None:
    """The 90th over the 10th percentile of the non-constant features' value ranges (None
    when fewer than two features vary; with ten or fewer, the widest over the narrowest)."""
    if sp.issparse(X):
        X = sp.csc_matrix(X)
        high = np.maximum(X.max(axis=0).toarray().ravel(), 0.0)
        low = np.minimum(X.min(axis=0).toarray().ravel(), 0.0)
    else:
        X = np.asarray(X)
        high, low = X.max(axis=0), X.min(axis=0)
    return range_ratio(low, high)


def range_ratio(low: np.ndarray, high: np.ndarray) -> float | None:
    """``feature_range_ratio`` from the features' smallest and largest values."""
    spans = (high.astype(np.float64) - low)[high > low]
    if spans.size < 2:
        return None
    # Percentiles of the features themselves, never interpolated between two: with a
    # handful of features they are the widest and the narrowest range.
    return float(
        np.percentile(spans, 90, method="higher") / np.percentile(spans, 10, method="lower")
    )


def choose_scaling(X, requested: str = "auto") -> InputScaling:
    """The scaling ``requested`` ("auto", "none" or "standard") fitted on training rows X."""
    if requested not in ("auto", *SCALINGS):
        raise ValueError(f"input_scaling must be 'auto', 'none' or 'standard', got {requested!r}")
    ratio = feature_range_ratio(X)
    method = chosen_scaling(requested, ratio, sparse=sp.issparse(X))
    return replace(InputScaling.fit(X, method), requested=requested, range_ratio=ratio)


def chosen_scaling(requested: str, ratio: float | None, *, sparse: bool = False) -> str:
    """The scaling ("none" or "standard") that ``requested`` gives for data whose
    ``feature_range_ratio`` is ``ratio``."""
    if requested != "auto":
        return requested
    mixed_units = ratio is not None and ratio > RANGE_RATIO_LIMIT
    return "standard" if mixed_units and not sparse else "none"


def scale_graph_input(proto, scaling: InputScaling):
    """``proto`` (an ONNX model with input ``input``) taking raw rows: a Sub and a Mul node
    put the scaling in front of every node that read the input."""
    if scaling.is_identity:
        return proto
    from onnx import TensorProto, helper, numpy_helper

    assert scaling.offset is not None and scaling.factor is not None
    graph = proto.graph
    (graph_input,) = [value for value in graph.input if value.name == "input"]
    if graph_input.type.tensor_type.elem_type != TensorProto.FLOAT:
        raise ValueError("the fast path's input is not float32")
    scaled = "mbn_scaled_input"
    for node in graph.node:
        for position, name in enumerate(node.input):
            if name == "input":
                node.input[position] = scaled
    graph.initializer.extend(
        [
            numpy_helper.from_array(scaling.offset, "mbn_input_offset"),
            numpy_helper.from_array(scaling.factor, "mbn_input_factor"),
        ]
    )
    nodes = [
        helper.make_node("Sub", ["input", "mbn_input_offset"], ["mbn_centred_input"]),
        helper.make_node("Mul", ["mbn_centred_input", "mbn_input_factor"], [scaled]),
    ]
    existing = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + existing)
    return proto
