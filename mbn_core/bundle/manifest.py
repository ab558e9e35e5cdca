"""The bundle format: file names, the manifest, its digest and upgrades, and model ids.

A bundle is a directory (named after the model id) holding

- ``manifest.json``: format, ids, the method (``mbn_core.methods``), dimensions,
  hyperparameters, training facts, fidelity, label-free quality (trustworthiness and
  continuity, beside PCA's), library versions, the SHA-256 and size of every other file, and
  its own SHA-256 (``manifest_sha256``, over the canonical JSON of every other field), so a
  changed byte anywhere in the bundle is refused;
- ``exact.npz`` (``mbn.npz`` before format version 3): the exact model's arrays, as the
  method's ``save`` gives them (``np.load(..., allow_pickle=False)``), plus the clustering
  head's centroids;
- ``compressor.onnx``: the fast path, self-contained: a distilled MLP or the method's own
  exported map;
- optionally ``map.npz``: a 2-D map of a sample of the training embedding
  (``mbn_core.bundle.embedding_map``), described by the manifest's ``map`` section.

Nothing is pickled. ``save_bundle`` writes into a hidden temporary directory beside the
target and renames it into place, so readers (and a Ctrl-C) never see half a bundle.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import re
import uuid
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from mbn_core.bundle.embedding_map import MAP_FILE
from mbn_core.data.scaling import SCALING_FILE, SCALINGS
from mbn_core.distribution import version
from mbn_core.methods import PIPELINE_PARAMS

log = logging.getLogger(__name__)

FORMAT = "mbn-bundle"
# Version 2 added the manifest's own digest (``manifest_sha256``); version 3 the method;
# version 4 the input scaling (a reader that ignored it would embed unscaled rows).
FORMAT_VERSION = 4
# Oldest format this code can read, upgrading the manifest step by step (see _UPGRADES).
MIN_FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MANIFEST_DIGEST = "manifest_sha256"
EXACT_FILE = "exact.npz"
# Before version 3 there was one method, MBN, and its exact file was named after it.
LEGACY_EXACT_FILE = "mbn.npz"
ONNX_FILE = "compressor.onnx"
DATA_FILES = (EXACT_FILE, ONNX_FILE)
# The input's novelty model (mbn_core.pipeline.novelty) and the reference rows that later
# versions are aligned on (mbn_core.pipeline.alignment).
NOVELTY_FILE = "novelty.npz"
REFERENCE_FILE = "reference.npz"
# Files a bundle may hold besides its data files (hashed like them when present): the 2-D map,
# the novelty model, the reference rows, the input scaling's arrays.
OPTIONAL_FILES = (MAP_FILE, NOVELTY_FILE, REFERENCE_FILE, SCALING_FILE)
MODEL_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# A manifest is a few kilobytes; refuse to parse anything absurdly larger.
_MAX_MANIFEST_BYTES = 1 << 20
HEAD_PREFIX = "head."
HEAD_CENTERS = HEAD_PREFIX + "cluster_centers"
_LIBRARIES = ("mbn", "numpy", "scipy", "scikit-learn", "onnx", "onnxruntime", "skl2onnx")


def _upgrade_v2(manifest: dict[str, Any]) -> dict[str, Any]:
    """Version 2 to 3: the method is named (it was always MBN) and the pipeline's options
    (held-out share, clusters, seed, threads) move out of the compressor's."""
    manifest = dict(manifest)
    manifest["method"] = "mbn"
    hyperparameters = dict(manifest.get("hyperparameters", {}))
    compressor = dict(hyperparameters.get("compressor", {}))
    hyperparameters["pipeline"] = {
        key: compressor.pop(key) for key in PIPELINE_PARAMS if key in compressor
    }
    hyperparameters["compressor"] = compressor
    manifest["hyperparameters"] = hyperparameters
    training = dict(manifest.get("training", {}))
    if "metric" in manifest:
        training.setdefault("metric", manifest["metric"])
    manifest["training"] = training
    return manifest


def _upgrade_v3(manifest: dict[str, Any]) -> dict[str, Any]:
    """Version 3 to 4: models before input scaling took their rows as they came."""
    return {**manifest, "input_scaling": {"method": "none", "requested": "none"}}


# Options that bundles may have been trained with and that this mbn no longer has, as
# (hyperparameter section, option, value) -> what to do instead. Such a bundle is refused
# when read, naming the option: its models cannot be rebuilt, or not as the manifest says.
REMOVED_OPTIONS: dict[tuple[str, str, str], str] = {
    ("mbn", "output", "spectral"): 'retrain it with output "auto", "pca" or "umap"',
    ("compressor", "targets", "leave-self-out"): 'retrain it with targets "in-sample"',
}


def _refuse_removed_options(file: Path, manifest: dict[str, Any]) -> None:
    for (section, option, value), advice in REMOVED_OPTIONS.items():
        options = manifest["hyperparameters"].get(section)
        if isinstance(options, dict) and options.get(option) == value:
            raise BundleError(
                f"{file}: the model was trained with {section} option {option}={value!r}, "
                f"which this mbn (version {_own_version()}) no longer has; {advice}"
            )


# Manifest upgrades: _UPGRADES[v] turns a version-v manifest into a version v+1 one.
# Version 2 only added the self-digest, which a version-1 manifest cannot have: its fields
# are read as they are (and a warning says that the manifest itself is not protected).
_UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    1: dict,
    2: _upgrade_v2,
    3: _upgrade_v3,
}


class BundleError(ValueError):
    """A bundle is missing, truncated, tampered with, foreign or of an unreadable version.

    The message starts with the path of the offending file.
    """


def validate_model_id(model_id: str) -> str:
    """Return ``model_id`` if it is a safe directory name, else raise ValueError.

    Ids are 1 to 64 characters from letters, digits, ``.``, ``_`` and ``-``, starting with a
    letter or digit: never ``..``, a path separator, or a hidden name.
    """
    if not isinstance(model_id, str) or not MODEL_ID_PATTERN.fullmatch(model_id):
        raise ValueError(
            f"model id {model_id!r} must be 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return model_id


def new_model_id() -> str:
    """A fresh random model id."""
    return f"m-{uuid.uuid4().hex[:16]}"


def bundle_path(model_dir: str | os.PathLike[str], model_id: str) -> Path:
    """The directory of bundle ``model_id`` inside ``model_dir``, after validating the id."""
    return Path(model_dir) / validate_model_id(model_id)


def library_versions() -> dict[str, str]:
    """Versions of Python and of the libraries a bundle's numbers depend on."""
    versions = {"python": platform.python_version()}
    for package in _LIBRARIES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "unknown"
    return versions


def manifest_digest(manifest: dict[str, Any]) -> str:
    """SHA-256 of a manifest's canonical JSON (sorted keys, no spaces), without its own
    ``manifest_sha256`` field: what that field must hold."""
    fields = {key: value for key, value in manifest.items() if key != MANIFEST_DIGEST}
    canonical = json.dumps(
        fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def manifest_to_bytes(manifest: dict[str, Any]) -> bytes:
    """The bytes of ``manifest.json`` for ``manifest``, with a fresh ``manifest_sha256``."""
    sealed = {**manifest, MANIFEST_DIGEST: manifest_digest(manifest)}
    # allow_nan=False: the manifest must be strict JSON for every reader (NaN became null).
    return (json.dumps(sealed, indent=2, allow_nan=False) + "\n").encode()


def write_manifest(directory: str | os.PathLike[str], manifest: dict[str, Any]) -> None:
    """Replace a bundle's manifest (atomically, with a fresh digest): for tools that edit
    a manifest on purpose. The data files' entries must still match, or loading refuses."""
    file = Path(directory) / MANIFEST
    temporary = file.with_name(f".{MANIFEST}.tmp-{uuid.uuid4().hex[:12]}")
    try:
        write_synced(temporary, manifest_to_bytes(manifest))
        os.replace(temporary, file)
    finally:
        temporary.unlink(missing_ok=True)
    fsync_directory(file.parent)


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse, check and upgrade a bundle's ``manifest.json`` without reading the other files.

    Raises BundleError naming the manifest when it is missing, not JSON, foreign, of an
    unreadable format version, or lacks a required field.
    """
    file = Path(directory) / MANIFEST
    try:
        with file.open("rb") as handle:
            data = handle.read(_MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise BundleError(f"{file}: missing (not a model bundle)") from None
    except OSError as error:
        raise BundleError(f"{file}: cannot be read: {error.strerror}") from None
    if len(data) > _MAX_MANIFEST_BYTES:
        raise BundleError(f"{file}: larger than {_MAX_MANIFEST_BYTES} bytes, not a manifest")
    try:
        manifest = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BundleError(f"{file}: not valid JSON (truncated or corrupted?): {error}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f'{file}: not an MBN bundle manifest (no "format": "{FORMAT}")')
    _check_manifest_digest(file, manifest)
    version = manifest.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise BundleError(f"{file}: format_version must be an integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise BundleError(
            f"{file}: bundle format version {version} was written by a newer mbn; this one "
            f"(mbn {_own_version()}) reads versions {MIN_FORMAT_VERSION} to {FORMAT_VERSION}. "
            "Upgrade mbn to load it."
        )
    if version < MIN_FORMAT_VERSION:
        raise BundleError(
            f"{file}: bundle format version {version} is older than the oldest this mbn reads "
            f"({MIN_FORMAT_VERSION}) and there is no upgrade from it: its files cannot be "
            "verified the way this version requires. Retrain the model with `mbn train`."
        )
    while version < FORMAT_VERSION:
        manifest = _UPGRADES[version](manifest)
        version += 1
        manifest["format_version"] = version
    _check_manifest_fields(file, manifest)
    _refuse_removed_options(file, manifest)
    return manifest


def _check_manifest_digest(file: Path, manifest: dict[str, Any]) -> None:
    """Refuse a manifest whose own digest does not match (checked whenever it is present,
    whatever version the manifest claims: a flipped version digit is caught too)."""
    recorded = manifest.get(MANIFEST_DIGEST)
    if recorded is None:
        if manifest.get("format_version") == 1:
            log.warning("%s: format version 1 has no manifest digest; re-save to protect it", file)
            return
        raise BundleError(f"{file}: no {MANIFEST_DIGEST}; the manifest cannot be verified")
    try:
        expected = manifest_digest(manifest)
    except ValueError:  # NaN or infinity: never written by save_bundle
        expected = None
    if recorded != expected:
        raise BundleError(
            f"{file}: {MANIFEST_DIGEST} does not match its content (the manifest was modified)"
        )


def _check_manifest_fields(file: Path, manifest: dict[str, Any]) -> None:
    required: dict[str, type | tuple[type, ...]] = {
        "id": str,
        "name": str,
        "created": str,
        "input_dim": int,
        "output_dim": int,
        "method": str,
        "n_clusters": (int, type(None)),
        "hyperparameters": dict,
        "files": dict,
    }
    for key, kind in required.items():
        if key not in manifest:
            raise BundleError(f"{file}: field {key!r} is missing")
        value = manifest[key]
        if isinstance(value, bool) or not isinstance(value, kind):
            raise BundleError(f"{file}: field {key!r} has an invalid value {value!r}")
    try:
        validate_model_id(manifest["id"])
    except ValueError as error:
        raise BundleError(f"{file}: {error}") from None
    if manifest["input_dim"] < 1 or manifest["output_dim"] < 1:
        raise BundleError(f"{file}: dimensions must be positive")
    files = manifest["files"]
    expected = sorted((exact_file(manifest), ONNX_FILE))
    if not set(expected) <= set(files) <= {*expected, *OPTIONAL_FILES}:
        raise BundleError(
            f"{file}: lists files {sorted(files)}, expected {expected} "
            f"and optionally {sorted(OPTIONAL_FILES)}"
        )
    section = manifest.get("input_scaling")
    method = section.get("method") if isinstance(section, dict) else None
    if method not in SCALINGS:
        raise BundleError(f"{file}: field 'input_scaling' has an invalid value {section!r:.200}")
    if (method != "none") != (SCALING_FILE in files):
        raise BundleError(
            f"{file}: input_scaling {method!r} "
            f"{'needs' if method != 'none' else 'takes no'} {SCALING_FILE}"
        )
    for file_name, entry in files.items():
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("sha256"), str)
            or not re.fullmatch(r"[0-9a-f]{64}", entry["sha256"])
            or isinstance(entry.get("bytes"), bool)
            or not isinstance(entry.get("bytes"), int)
        ):
            raise BundleError(f"{file}: entry of {file_name!r} needs a sha256 and a size")


def exact_file(manifest: dict[str, Any]) -> str:
    """Name of the exact model's file: ``exact.npz``, or ``mbn.npz`` in a version-1 bundle."""
    return LEGACY_EXACT_FILE if LEGACY_EXACT_FILE in manifest.get("files", {}) else EXACT_FILE


def write_synced(file: Path, data: bytes) -> None:
    """Write a new file and flush it to the disk before returning (a bundle's files are
    synced before the directory that holds them is renamed into place)."""
    with file.open("xb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def fsync_directory(directory: Path) -> None:
    """Sync a directory's entries: makes a rename into it durable. Some file systems cannot
    open directories, which is harmless."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def validate_name(name: str) -> str:
    if not isinstance(name, str) or not 1 <= len(name.strip()) <= 200 or not name.isprintable():
        raise ValueError(f"name must be 1-200 printable characters, got {name!r}")
    return name.strip()


def jsonable(value: Any) -> Any:
    """Plain JSON values from numpy scalars, tuples and arrays."""
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [jsonable(item) for item in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def _own_version() -> str:
    return version() or "unknown"
