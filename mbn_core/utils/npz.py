"""Named arrays as ``.npz`` bytes and back: how every file of a bundle that holds arrays is
written and read (never with pickled objects)."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterable, Mapping

import numpy as np


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """``arrays`` as the bytes of an uncompressed ``.npz`` (no pickled objects)."""
    buffer = io.BytesIO()
    np.savez(buffer, allow_pickle=False, **arrays)
    return buffer.getvalue()


def arrays_from_npz(
    data: bytes, source: str, what: str, names: Iterable[str] | None = None
) -> dict[str, np.ndarray]:
    """The arrays of ``npz_bytes``' output: all of them, or those ``names`` (a missing one is
    an error). ValueError ``"{source}: not a readable {what}: ..."`` when ``data`` is not an
    archive of plain arrays."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            wanted = npz.files if names is None else list(names)
            return {name: npz[name] for name in wanted}
    except (KeyError, ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        raise ValueError(f"{source}: not a readable {what}: {error}") from None
