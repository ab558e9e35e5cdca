"""Bundles: a trained model's files on disk, how they are written, verified and read.

``load_bundle`` and ``save_bundle`` are the entry points; ``Bundle`` embeds rows in either mode.
"""

from mbn_core.bundle.bundle import (
    DATA_FILES,
    EXACT_FILE,
    FORMAT_VERSION,
    MANIFEST,
    NOVELTY_FILE,
    ONNX_FILE,
    OPTIONAL_FILES,
    REFERENCE_FILE,
    Bundle,
    BundleError,
    ExactModel,
    OutOfRangeInput,
    bundle_path,
    check_target,
    load_bundle,
    new_model_id,
    read_manifest,
    save_bundle,
    validate_model_id,
    validate_name,
    write_manifest,
)

__all__ = [
    "DATA_FILES",
    "EXACT_FILE",
    "FORMAT_VERSION",
    "MANIFEST",
    "NOVELTY_FILE",
    "ONNX_FILE",
    "OPTIONAL_FILES",
    "REFERENCE_FILE",
    "Bundle",
    "BundleError",
    "ExactModel",
    "OutOfRangeInput",
    "bundle_path",
    "check_target",
    "load_bundle",
    "new_model_id",
    "read_manifest",
    "save_bundle",
    "validate_model_id",
    "validate_name",
    "write_manifest",
]
