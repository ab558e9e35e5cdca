"""Bundles: a trained model's files on disk, how they are written, verified and read.

``load_bundle`` and ``save_bundle`` are the entry points; ``Bundle`` embeds rows in either mode.
The names are imported on first use (PEP 562): the method registry imports
``mbn_core.bundle.embedding_map``, which must not load the bundle code that imports the registry.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mbn_core.bundle.load import Bundle, ExactModel, OutOfRangeInput, load_bundle
    from mbn_core.bundle.manifest import (
        DATA_FILES,
        EXACT_FILE,
        FORMAT_VERSION,
        MANIFEST,
        NOVELTY_FILE,
        ONNX_FILE,
        OPTIONAL_FILES,
        REFERENCE_FILE,
        BundleError,
        bundle_path,
        new_model_id,
        read_manifest,
        validate_model_id,
        validate_name,
        write_manifest,
    )
    from mbn_core.bundle.save import check_target, save_bundle

# Where each public name lives: the format (manifest.py), writing (save.py), reading (load.py).
_MODULES = {
    **dict.fromkeys(("Bundle", "ExactModel", "OutOfRangeInput", "load_bundle"), "load"),
    **dict.fromkeys(("check_target", "save_bundle"), "save"),
}

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


def __getattr__(name: str) -> Any:
    if name in __all__:
        module = importlib.import_module(f"mbn_core.bundle.{_MODULES.get(name, 'manifest')}")
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mbn_core.bundle' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
