"""Writing a bundle: every file into a hidden temporary directory, then one rename.

Nothing is pickled, and readers (and a Ctrl-C) never see half a bundle.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mbn_core.bundle.manifest import (
    EXACT_FILE,
    FORMAT,
    FORMAT_VERSION,
    HEAD_CENTERS,
    HEAD_PREFIX,
    MANIFEST,
    ONNX_FILE,
    OPTIONAL_FILES,
    BundleError,
    fsync_directory,
    jsonable,
    library_versions,
    manifest_to_bytes,
    read_manifest,
    validate_model_id,
    validate_name,
    write_synced,
)
from mbn_core.bundle.mapped_npz import aligned_npz_bytes
from mbn_core.bundle.trained import Bundleable, TrainedModel
from mbn_core.data.scaling import SCALING_FILE

log = logging.getLogger(__name__)


def save_bundle(
    model: TrainedModel | Bundleable,
    directory: str | os.PathLike[str],
    *,
    name: str,
    model_id: str | None = None,
    overwrite: bool = False,
    extra: dict[str, Any] | None = None,
    extra_files: dict[str, bytes] | None = None,
    manifest_sections: dict[str, Any] | None = None,
) -> Path:
    """Write a fitted model as a bundle directory, atomically.

    Parameters
    ----------
    model : TrainedModel or DistilledEmbedding
        A trained model (``mbn_core.pipeline.training``), or a fitted ``DistilledEmbedding``
        (``CompressiveMBN``) whose teacher is a registered method's estimator: any model
        with ``as_trained_model()`` (``Bundleable``).
    directory : path
        The bundle directory to create. Its parent must exist.
    name : str
        Human-readable model name (1-200 printable characters).
    model_id : str, default=None
        The id; None means the directory's name, which must then be a valid id.
    overwrite : bool, default=False
        Replace an existing bundle (or empty directory) at ``directory``; anything else there
        is never replaced. The swap is two renames, so a reader may briefly find no bundle.
        Without it an existing path is an error.
    extra : dict, default=None
        JSON-able facts merged into the manifest's ``training`` section (e.g. the training
        parameters as the caller gave them).
    extra_files : dict, default=None
        Optional files by name (each one of ``OPTIONAL_FILES``), written and hashed like
        the data files, e.g. ``{MAP_FILE: embedding_map.to_bytes()}``.
    manifest_sections : dict, default=None
        JSON-able top-level manifest entries that describe them, e.g. ``{"map": {...}}``.

    Returns
    -------
    Path
        The bundle directory.
    """
    if not isinstance(model, TrainedModel):
        if not isinstance(model, Bundleable):
            raise TypeError(
                f"save_bundle takes a TrainedModel or a fitted DistilledEmbedding, not "
                f"{type(model).__name__}"
            )
        model = model.as_trained_model()
    directory = Path(directory)
    model_id = validate_model_id(directory.name if model_id is None else model_id)
    name = validate_name(name)
    check_target(directory, overwrite=overwrite)
    extra_files = dict(extra_files or {})
    # The scaling's file is the model's own (model.input_scaling), never an extra.
    allowed = [file_name for file_name in OPTIONAL_FILES if file_name != SCALING_FILE]
    unknown = sorted(set(extra_files) - set(allowed))
    if unknown:
        raise ValueError(f"extra_files may hold {allowed}, got {unknown}")
    sections = dict(manifest_sections or {})
    parent = directory.parent

    exact_bytes = _npz_bytes(model)
    onnx_bytes = model.fast_path.SerializeToString()
    manifest = _manifest(model, model_id, name, extra or {})
    clashes = sorted(set(sections) & {*manifest, "files"})
    if clashes:
        raise ValueError(f"manifest_sections may not replace manifest fields {clashes}")
    manifest.update(jsonable(sections))
    files = {EXACT_FILE: exact_bytes, ONNX_FILE: onnx_bytes, **extra_files}
    if not model.input_scaling.is_identity:
        files[SCALING_FILE] = model.input_scaling.to_bytes()
    manifest["files"] = {file_name: _file_entry(data) for file_name, data in files.items()}
    manifest_bytes = manifest_to_bytes(manifest)

    temporary = parent / f".{directory.name}.tmp-{uuid.uuid4().hex[:12]}"
    temporary.mkdir()
    try:
        for file_name, data in (*files.items(), (MANIFEST, manifest_bytes)):
            write_synced(temporary / file_name, data)
        fsync_directory(temporary)
        _move_into_place(temporary, directory, overwrite)
    except BaseException:
        # Also on KeyboardInterrupt: nothing half-written may stay behind.
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    fsync_directory(parent)
    log.info("bundle %s written to %s", model_id, directory)
    return directory


def check_target(directory: str | os.PathLike[str], *, overwrite: bool = False) -> None:
    """ValueError unless a bundle may be written at ``directory``.

    Its parent must exist and take a new directory (tried, since permissions do not tell:
    root, read-only mounts, /proc). An existing path is refused, except with ``overwrite``
    when it is an empty directory or a bundle (it has an MBN manifest): replacing anything
    else could delete a user's files on a mistyped ``--out``.
    """
    directory = Path(directory)
    if not directory.parent.is_dir():
        raise ValueError(f"{directory.parent}: the directory to hold the bundle does not exist")
    try:  # before a training of hours, not after it
        os.rmdir(tempfile.mkdtemp(prefix=".mbn-write-check-", dir=directory.parent))
    except OSError as error:
        raise ValueError(
            f"{directory.parent}: cannot write the bundle there ({error.strerror})"
        ) from None
    if not (directory.exists() or directory.is_symlink()):
        return
    if not overwrite:
        raise ValueError(f"{directory}: already exists (pass overwrite=True to replace it)")
    if directory.is_symlink() or not directory.is_dir():
        raise ValueError(f"{directory}: exists and is not a bundle directory; not replacing it")
    if any(directory.iterdir()):
        try:
            read_manifest(directory)
        except BundleError:
            raise ValueError(
                f"{directory}: exists and is not a model bundle; not replacing it"
            ) from None


def _move_into_place(temporary: Path, directory: Path, overwrite: bool) -> None:
    if not (overwrite and directory.exists()):
        # rename() refuses a non-empty target directory, so a bundle that appeared
        # meanwhile is never clobbered.
        try:
            os.rename(temporary, directory)
        except OSError as error:
            raise ValueError(
                f"{directory}: cannot move the new bundle into place: {error}"
            ) from None
        return
    old = directory.parent / f".{directory.name}.old-{uuid.uuid4().hex[:12]}"
    os.rename(directory, old)
    try:
        os.rename(temporary, directory)
    except BaseException:
        os.rename(old, directory)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _npz_bytes(model: TrainedModel) -> bytes:
    arrays = dict(model.method.save(model.estimator))
    if any(name.startswith(HEAD_PREFIX) for name in arrays):
        raise ValueError(f"method {model.method.name!r} saved arrays named {HEAD_PREFIX}*")
    if model.cluster_centers is not None:
        arrays[HEAD_CENTERS] = model.cluster_centers
    # Each array aligned in the file, so that a server maps it rather than reads it.
    return aligned_npz_bytes(arrays)


def _manifest(
    model: TrainedModel, model_id: str, name: str, extra: dict[str, Any]
) -> dict[str, Any]:
    training = dict(model.facts)
    training.update(extra)
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "id": model_id,
        "name": name,
        "created": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "method": model.method.name,
        "fast_path": model.method.fast_path,
        "input_dim": int(model.n_features_in),
        "output_dim": int(model.n_components),
        "n_clusters": None if model.cluster_centers is None else len(model.cluster_centers),
        "hyperparameters": jsonable(model.hyperparameters),
        "training": jsonable(training),
        "fidelity": jsonable(model.fidelity),
        "quality": jsonable(model.quality),
        "input_scaling": model.input_scaling.section(),
        "library_versions": library_versions(),
    }


def _file_entry(data: bytes) -> dict[str, Any]:
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
