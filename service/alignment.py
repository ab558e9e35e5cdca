"""Versions whose vectors stay comparable: ``align_to`` checked at submission, and comparisons.

A training job may name an earlier model (``align_to``: id or name) whose embedding space
the new model is mapped into (``mbn_core.pipeline.alignment``). The reference is resolved
and checked when the job is submitted, so a client learns at once that it is missing (404),
damaged (409) or incompatible (422: other input or output dimension); the job records the
model's id (``params["align_to"]``), which the worker hands to the training process.

``compare`` reports how comparable two models' vectors are on reference rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mbn_core.bundle import Bundle, BundleError, OutOfRangeInput
from mbn_core.pipeline.alignment import (
    ReferenceRows,
    check_compatible,
    compare_embeddings,
    load_reference,
)
from service.domain import Conflict, InvalidInput
from service.registry import ModelRegistry

# The job parameter naming the model to align to (not a method's option).
ALIGN_TO = "align_to"


def aligned_params(
    registry: ModelRegistry,
    ref: str,
    params: dict[str, Any],
    n_features: int,
    *,
    sparse: bool = False,
) -> dict[str, Any]:
    """``params`` with the id of the model ``ref`` names, after checking that a model of
    ``n_features`` inputs (and ``params``' n_components), trained on ``sparse`` input or
    not, can be aligned to it."""
    bundle = registry.get(ref)  # NotFound, or Conflict for a damaged model
    _reference(registry, bundle)  # a damaged reference file is found now, not in the job
    n_components = params.get("n_components")
    try:
        check_compatible(
            bundle,
            n_features,
            n_components if isinstance(n_components, int) else None,
            sparse=sparse,
        )
    except ValueError as error:
        raise InvalidInput(str(error)) from None
    return {**params, ALIGN_TO: bundle.id}


def compare(registry: ModelRegistry, ref_a: str, ref_b: str) -> dict[str, Any]:
    """How comparable the vectors of models ``ref_a`` and ``ref_b`` are, on reference rows
    (``a``'s, else ``b``'s): both fast paths, and both exact paths when the two bundles hold
    the same reference rows (their stored exact embeddings)."""
    a, b = registry.get(ref_a), registry.get(ref_b)
    if (a.input_dim, a.output_dim) != (b.input_dim, b.output_dim):
        raise InvalidInput(
            f"models {a.id!r} ({a.input_dim} -> {a.output_dim}) and {b.id!r} "
            f"({b.input_dim} -> {b.output_dim}) embed different spaces; nothing to compare"
        )
    reference_a, reference_b = _reference(registry, a), _reference(registry, b)
    reference, source = (reference_a, a) if reference_a is not None else (reference_b, b)
    if reference is None:
        raise Conflict(
            f"neither {a.id!r} nor {b.id!r} has reference rows (trained before them, or on "
            "sparse input); retrain one to compare them"
        )
    kept, (fast_a, clusters_a), (fast_b, clusters_b) = _embed_both(a, b, reference.rows)
    report: dict[str, Any] = {
        "a": _describe(a),
        "b": _describe(b),
        "reference_rows_of": source.id,
        "fast": compare_embeddings(fast_a, fast_b, clusters_a, clusters_b),
        "exact": None,
        "rows_not_compared": _left_out(kept),
    }
    if _same_rows(reference_a, reference_b):
        assert reference_a is not None and reference_b is not None
        report["exact"] = compare_embeddings(reference_a.embedding, reference_b.embedding)
    return report


def _embed_both(
    a: Bundle, b: Bundle, rows: np.ndarray
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray | None], tuple[np.ndarray, np.ndarray | None]]:
    """Both fast paths' embeddings (and clusters) of the reference rows each model can
    embed: rows one of them refuses (``OutOfRangeInput``: beyond its input scaling's range,
    or embedded to NaN) are left out, and the mask of those kept comes first. InvalidInput
    when fewer than two rows are left to compare."""
    kept = np.ones(len(rows), dtype=bool)
    while kept.sum() >= 2:
        index = np.flatnonzero(kept)
        try:
            return kept, a.embed_with_clusters(rows[index]), b.embed_with_clusters(rows[index])
        except OutOfRangeInput as refusal:
            kept[index[refusal.rows]] = False
    raise InvalidInput(
        f"models {a.id!r} and {b.id!r} cannot both embed the reference rows: one of them "
        "takes them beyond its range (its input scaling), so there is nothing to compare"
    )


def _left_out(kept: np.ndarray) -> dict[str, Any] | None:
    """The report's account of reference rows left out of the fast comparison, or None."""
    if kept.all():
        return None
    rows = np.flatnonzero(~kept)
    return {
        "count": int(rows.size),
        "rows": rows[:20].tolist(),
        "reason": "out of range for one of the models (beyond its input scaling, or "
        "embedded to NaN): the fast comparison uses the other rows",
    }


def _describe(bundle: Bundle) -> dict[str, Any]:
    alignment = bundle.manifest.get("alignment") or {}
    return {
        "id": bundle.id,
        "name": bundle.name,
        "created": bundle.created,
        "aligned_to": alignment.get("reference_model"),
        "alignment_residual": alignment.get("residual"),
    }


def _same_rows(a: ReferenceRows | None, b: ReferenceRows | None) -> bool:
    return a is not None and b is not None and np.array_equal(a.rows, b.rows)


def _reference(registry: ModelRegistry, bundle: Bundle) -> ReferenceRows | None:
    try:
        return load_reference(bundle)
    except BundleError as error:
        raise registry.mark_damaged(bundle, error) from None
