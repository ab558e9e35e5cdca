"""MBN's outputs: how the top of the network becomes the embedding, one strategy each.

``Output`` (``base``) is the protocol; ``pca`` and ``umap`` implement it. Outputs are found by
the name ``MBN(output=...)`` gives: "pca", "umap" (UMAP's layout of the bottom x top
co-association) and "umap-bottom" (the same output reading the bottom layer alone,
``UmapOutput(layers="bottom")``). ``output_`` and saved models keep these names.
"""

from __future__ import annotations

from mbn_core.mbn.outputs.base import FittedOutput, Output, OutputProgress, StoredArrays
from mbn_core.mbn.outputs.pca import PcaOutput
from mbn_core.mbn.outputs.umap import UmapOutput

AUTO = "auto"

_registry: dict[str, Output] = {}


def register_output(output: Output) -> None:
    """Make ``output`` what ``MBN(output=output.name)`` uses."""
    if output.name == AUTO:
        raise ValueError("an output cannot be called 'auto'")
    _registry[output.name] = output


def output_names() -> tuple[str, ...]:
    """The registered outputs' names ("auto" besides them lets the data choose)."""
    return tuple(_registry)


def get_output(name: str) -> Output:
    """The output called ``name``; ValueError listing the valid names when none is."""
    output = _registry.get(name)
    if output is None:
        valid = ", ".join(repr(n) for n in _registry)
        raise ValueError(f"unknown output {name!r}; valid outputs are {valid}")
    return output


def output_of_arrays(stored: StoredArrays, ks: list[int]) -> Output:
    """The output whose arrays a saved model holds (what an ``output="auto"`` fit chose);
    the PCA output when none matches, whose restore then names the missing array."""
    for output in _registry.values():
        if output.saved_these(stored, ks):
            return output
    return _registry[PcaOutput.name]


register_output(PcaOutput())
register_output(UmapOutput(layers="bottom+top"))
register_output(UmapOutput(layers="bottom"))

__all__ = [
    "AUTO",
    "FittedOutput",
    "Output",
    "OutputProgress",
    "PcaOutput",
    "StoredArrays",
    "UmapOutput",
    "get_output",
    "output_names",
    "output_of_arrays",
    "register_output",
]
