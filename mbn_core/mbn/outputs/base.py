"""The output protocol: how the top of a fitted network becomes the embedding.

An ``Output`` is a strategy chosen by name (``output="pca"``): it says which layers of the
network it reads and fits a ``FittedOutput`` on the training rows' codes. A ``FittedOutput``
embeds any rows from their codes and is saved as named arrays (no pickle) and restored from
them. Adding an output is a new ``Output`` subclass registered in ``mbn_core.mbn.outputs``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import ClassVar

import numpy as np

# progress(stage, done, total): told how far an output's fit is through its named stages
# (``Output.stages``); it raises to stop the fit.
OutputProgress = Callable[[str, int, int], None]


class FittedOutput(ABC):
    """An output fitted on the training rows: embeds rows from their codes."""

    @property
    @abstractmethod
    def n_components(self) -> int:
        """Dimension of the embedding."""

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes of the arrays it holds."""

    @property
    def explained_variance_ratio(self) -> np.ndarray | None:
        """Variance of the codes explained by each dimension, where the output has one."""
        return None

    @abstractmethod
    def embed(self, bottom_codes: np.ndarray, top_codes: np.ndarray) -> np.ndarray:
        """(n, n_components) float64 embedding of rows with these (n, V) codes of the bottom
        and of the top layer (the same array in a network of one layer)."""

    @abstractmethod
    def to_arrays(self) -> dict[str, np.ndarray]:
        """Every array ``Output.from_arrays`` needs, by name."""


class Output(ABC):
    """How the top of the network becomes the embedding (see the module docstring).

    Attributes
    ----------
    name : str
        What ``MBN(output=...)`` and ``output_`` call it.
    bottom_only : bool
        The output reads the bottom layer alone: the network has that one layer.
    stages : tuple of str
        The named stages of its fit after the layers, reported to ``OutputProgress``.
    """

    name: str
    bottom_only: bool = False
    stages: ClassVar[tuple[str, ...]] = ()
    # Prefix of the names of the arrays it saves (``StoredArrays.has_prefix``).
    array_prefix: ClassVar[str]

    def check_available(self) -> None:  # noqa: B027 - optional: most need nothing more
        """Raise ImportError, saying what to install, when a dependency is missing."""

    def check_layers(self, upper_layers_given: bool) -> None:  # noqa: B027 - optional
        """ValueError when the caller fixed upper layers (several ``ks``, a number for
        ``delta``) that this output cannot have."""

    def network_sizes(self, ks: list[int]) -> list[int]:
        """The layers of a network with this output, from the layers planned for it."""
        return ks[:1] if self.bottom_only else list(ks)

    @abstractmethod
    def fit(
        self,
        bottom_codes: np.ndarray,
        top_codes: np.ndarray,
        ks: list[int],
        n_components: int,
        rng: np.random.RandomState,
        progress: OutputProgress | None = None,
    ) -> tuple[FittedOutput, np.ndarray]:
        """The output fitted on the training rows' (n, V) codes of the bottom and top layers
        of a network of ``ks`` centers, and the training rows' embedding. ``rng`` is the
        network's generator (drawn from in a fixed order: the same seed, the same model)."""

    def saved_these(self, stored: StoredArrays, ks: list[int]) -> bool:
        """Whether a saved model's arrays are this output's."""
        return stored.has_prefix(self.array_prefix)

    @abstractmethod
    def from_arrays(self, stored: StoredArrays, ks: list[int], n_clusterings: int) -> FittedOutput:
        """The fitted output that ``to_arrays`` saved, checked against the network's shape;
        ValueError naming the array when one is missing or inconsistent."""


class StoredArrays:
    """A saved model's arrays, read with checks that name the array at fault."""

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.arrays = arrays

    def __contains__(self, name: str) -> bool:
        return name in self.arrays

    def has_prefix(self, prefix: str) -> bool:
        return any(name.startswith(prefix) for name in self.arrays)

    def get(self, name: str) -> np.ndarray:
        if name not in self.arrays:
            raise ValueError(f"model array {name!r} is missing")
        return np.asarray(self.arrays[name])


def expect_shape(name: str, array: np.ndarray, shape: tuple[int, ...]) -> None:
    if array.shape != shape:
        raise ValueError(f"model array {name!r} has shape {array.shape}, expected {shape}")


def expect_index(name: str, array: np.ndarray, bound: int) -> None:
    if array.dtype.kind not in "ui":
        raise ValueError(f"model array {name!r} must hold integers, not {array.dtype}")
    if array.size and (array.min() < 0 or array.max() >= bound):
        raise ValueError(f"model array {name!r} holds indices outside [0, {bound})")
