"""``mbn info``: verify a bundle and describe it, from its manifest.

What a method records of its own fit (an MBN's layers and device) it also phrases
(``Method.describe``): this module names no method.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from typing import Any

from mbn_core.bundle import load_bundle
from mbn_core.cli.common import say
from mbn_core.methods import get_method
from mbn_core.pipeline.fidelity import (
    LAYOUT_CROSS_FITTED,
    LAYOUT_HELD_OUT,
    LAYOUT_REPORT_MEANING,
    fidelity_report,
)
from mbn_core.pipeline.quality import (
    MEASURES,
    clusters_summary,
    fast_path_summary,
    quality_summary,
)


def add_parser(subparsers: Any) -> None:
    """The ``info`` command."""
    info = subparsers.add_parser(
        "info", help="show a bundle's manifest", description="Verify BUNDLE and describe it."
    )
    info.add_argument("bundle", metavar="BUNDLE", help="bundle directory")
    info.add_argument("--json", action="store_true", help="print the raw manifest")
    info.set_defaults(handler=info_command)


def info_command(args: argparse.Namespace) -> None:
    """Run ``mbn info``."""
    bundle = load_bundle(args.bundle)
    if args.json:
        say(json.dumps(bundle.manifest, indent=2))
        return
    for line in describe(bundle.manifest, brief=False):
        say(line)
    say(f"verified:    every file matches its SHA-256 ({bundle.path})")


def describe(manifest: dict[str, Any], *, brief: bool) -> list[str]:
    """A manifest as ``mbn info`` prints it (``brief``: what ``mbn train`` prints after)."""
    training = manifest.get("training", {})
    seconds = training.get("seconds", {})
    own = _method_phrases(manifest.get("method"), training)
    lines = []
    if not brief:
        lines += [
            f"id:          {manifest['id']}",
            f"name:        {manifest['name']}",
            f"created:     {manifest['created']}",
            f"format:      {manifest['format']} version {manifest['format_version']}",
        ]
    clusters = manifest["n_clusters"]
    details = list(own.get("dimensions", []))
    if clusters:
        details.append(f"clustering head with {clusters} clusters")
    fit = [f"{training.get('n_samples', '?')} points"]
    if training.get("input_sparse"):
        fit[0] += " (sparse)"
    fit.extend(own.get("training", []))
    if "n_epochs" in training:
        fit.append(f"{training['n_epochs']} MLP epochs")
    if training.get("student_head") == "atoms":
        fit.append(f"student classifies {training.get('n_atoms', '?')} atoms of the embedding")
    if "input_noise" in training:
        fit.append(f"input noise {training['input_noise']:.3g}")
    times = [f"{phase} {value:.1f} s" for phase, value in seconds.items()]
    map_seconds = manifest.get("map", {}).get("seconds")
    if isinstance(map_seconds, int | float):
        times.append(f"map {map_seconds:.1f} s")
    times.append(f"total {training.get('total_seconds', 0):.1f} s")
    lines += [
        f"method:      {manifest.get('method', '?')} (fast path: "
        f"{manifest.get('fast_path', 'distilled')})",
        f"dimensions:  {manifest['input_dim']} -> {manifest['output_dim']}"
        + (f" ({', '.join(details)})" if details else ""),
        f"training:    {', '.join(fit)}",
        f"time:        {', '.join(times)}",
    ]
    # The measures a user acts on first (clusters, then the fast path), each with what it
    # says; then the full reports.
    fidelity = manifest.get("fidelity")
    quality = manifest.get("quality")
    clusters = clusters_summary(fidelity) if fidelity else None
    if clusters:
        lines += [f"clusters:    {clusters}", _reads(MEASURES["clusters"])]
    fast_path = fast_path_summary(fidelity) if fidelity else None
    if fast_path:
        lines += [f"fast path:   {fast_path}", _reads(MEASURES["fast path"])]
    if fidelity:
        lines.append(f"fidelity:    {fidelity_report(_nan_for_none(fidelity))}")
        if fidelity.get("holdout") in (LAYOUT_CROSS_FITTED, LAYOUT_HELD_OUT):
            lines.append(f"meaning:     {LAYOUT_REPORT_MEANING}")
    if quality:
        lines += [f"quality:     {quality_summary(quality)}", _reads(MEASURES["neighbourhoods"])]
    alignment = manifest.get("alignment")
    if alignment:
        lines.append(
            f"aligned to:  {alignment['reference_model']} on {alignment['reference_rows']} "
            f"reference rows, residual {alignment['residual']:.4f} "
            f"(unaligned {alignment['unaligned_residual']:.4f})"
        )
    scaling = manifest.get("input_scaling")
    if isinstance(scaling, dict):
        lines.append(f"input:       {_scaling_summary(scaling)}")
    novelty = manifest.get("novelty")
    if novelty and "threshold" in novelty:
        lines.append(
            f"novelty:     threshold {novelty['threshold']:.4g} (the {novelty['quantile']:.0%} "
            f"quantile of {novelty['n_calibration_rows']} training rows)"
        )
    if not brief:
        for part, params in manifest["hyperparameters"].items():
            text = ", ".join(f"{key}={value}" for key, value in sorted(params.items()))
            lines.append(f"{part + ':':<12} {text}")
        versions = manifest.get("library_versions", {})
        lines.append(
            "libraries:   " + ", ".join(f"{key} {value}" for key, value in versions.items())
        )
        for file_name, entry in manifest["files"].items():
            lines.append(
                f"file:        {file_name}  {entry['bytes']:,} bytes  sha256 {entry['sha256']}"
            )
    return lines


def _method_phrases(name: Any, training: dict[str, Any]) -> dict[str, list[str]]:
    """The method's own facts as it phrases them; none for a method not installed here."""
    try:
        method = get_method(str(name))
    except ValueError:
        return {}
    return {} if method.describe is None else method.describe(training)


def _scaling_summary(section: dict) -> str:
    """``standard scaling (auto: feature ranges 64.5x apart)``: what the model does to raw
    rows and why."""
    method, requested = section.get("method"), section.get("requested")
    text = "no scaling" if method == "none" else f"{method} scaling"
    if requested == "auto":
        ratio = section.get("feature_range_ratio")
        why = "" if ratio is None else f": feature ranges {ratio:.3g}x apart"
        text += f" (auto{why})"
    elif requested != method:
        text += f" (requested {requested})"
    return text


def _reads(text: str) -> str:
    """What a measure says, wrapped under its line of ``mbn info``."""
    return textwrap.fill(
        f"(reads: {text})", width=100, initial_indent=" " * 13, subsequent_indent=" " * 13
    )


def _nan_for_none(fidelity: dict[str, Any]) -> dict[str, Any]:
    # JSON has no NaN: the manifest stores an undefined score (R^2 of one point) as null.
    return {
        key: float("nan") if value is None and key in ("r2", "cosine", "nmi_fast_exact")
        else value
        for key, value in fidelity.items()
    }  # fmt: skip
