"""The members of an ``.npz`` archive, checked before any is read, and read as checked.

``np.load(path)["x"]`` opens a member named ``x`` when there is one and ``x.npy`` otherwise,
so an archive holding a small ``x.npy`` (whose header a size check reads) and a large raw ``x``
(which numpy then loads) passes the check with one array and trains on another. zipfile itself
raises ``RuntimeError`` for an encrypted member, ``NotImplementedError`` for a compression
method it lacks and ``zlib.error`` for a corrupt deflate stream. Here an archive is accepted
only when every member is a plain ``<name>.npy``, stored or deflated, unencrypted, and named
once; every failure is a ``ValueError`` naming the member; and arrays are read from the very
``ZipInfo`` entries that were checked (``read_member``), never looked up by name again.
"""

from __future__ import annotations

import tokenize
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

import numpy as np

# What numpy's savez and savez_compressed write.
_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}
_ENCRYPTED = 0x1
# Errors zipfile and zlib raise for damaged or unsupported members, which callers report as
# an unreadable file rather than let through as crashes.
MEMBER_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError)
# What numpy's .npy header parser raises for a header that is not a Python literal, besides
# ValueError (found by benchmarks/fuzz_parsers.py).
HEADER_ERRORS = (SyntaxError, tokenize.TokenError)
# The arrays each scipy sparse format's .npz needs besides format, shape and data.
SPARSE_FORMAT_ARRAYS = {
    "csr": ("indices", "indptr"),
    "csc": ("indices", "indptr"),
    "bsr": ("indices", "indptr"),
    "coo": ("row", "col"),
    "dia": ("offsets",),
}


def checked_members(archive: zipfile.ZipFile, source: str) -> dict[str, zipfile.ZipInfo]:
    """The archive's members by array name (``x`` for ``x.npy``), or ValueError when one is
    not a plain ``.npy`` member, is named twice (also as ``x`` beside ``x.npy``), encrypted,
    or compressed with a method other than stored or deflated."""
    members: dict[str, zipfile.ZipInfo] = {}
    for info in archive.infolist():
        name = info.filename
        shown = repr(name[:80])
        if not name.endswith(".npy") or "/" in name or "\\" in name:
            raise ValueError(
                f"{source}: member {shown} is not an array: an .npz holds only '<name>.npy' "
                "members (which member would be read is ambiguous otherwise)"
            )
        array = name.removesuffix(".npy")
        if array in members:
            raise ValueError(f"{source}: member {shown} appears more than once")
        if info.flag_bits & _ENCRYPTED:
            raise ValueError(f"{source}: member {shown} is encrypted")
        if info.compress_type not in _METHODS:
            raise ValueError(
                f"{source}: member {shown} uses compression method {info.compress_type}; "
                "only stored or deflated members are read"
            )
        members[array] = info
    # numpy opens a member named exactly as the key first: refuse the shadowing names by
    # their array name too ("x" and "x.npy" both map to "x" above, but a raw "x.npy.npy"
    # would be read for "x.npy").
    for array in members:
        if array.endswith(".npy") and array.removesuffix(".npy") in members:
            raise ValueError(
                f"{source}: members {array!r} and {array + '.npy'!r} shadow each other"
            )
    return members


@contextmanager
def open_member(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, source: str
) -> Iterator[IO[bytes]]:
    """The member's bytes; zipfile's and zlib's failures become ValueError naming it."""
    try:
        with archive.open(info) as handle:
            yield handle
    except (*MEMBER_ERRORS, *HEADER_ERRORS) as error:
        name = info.filename[:80]
        raise ValueError(f"{source}: member {name!r} is unreadable: {error}") from None


def read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, source: str) -> np.ndarray:
    """The array in the member ``info`` (no pickles), ValueError when it is damaged."""
    with open_member(archive, info, source) as handle:
        return np.lib.format.read_array(handle, allow_pickle=False)


def sparse_format(
    archive: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo], source: str
) -> str:
    """The scipy sparse format an archive names, ValueError unless it is known and its arrays
    are all there (scipy's loader raised KeyError for a missing one)."""
    value = read_member(archive, members["format"], source)
    name = value.item() if value.shape == () and value.dtype.kind in "SU" else None
    name = name.decode("ascii", "replace") if isinstance(name, bytes) else name
    if name not in SPARSE_FORMAT_ARRAYS:
        shown = repr(name)[:40] if name is not None else "not a string"
        raise ValueError(
            f"{source}: unknown sparse format {shown}; known: {', '.join(SPARSE_FORMAT_ARRAYS)}"
        )
    missing = [array for array in SPARSE_FORMAT_ARRAYS[name] if array not in members]
    if missing:
        raise ValueError(f"{source}: a sparse {name} .npz needs the arrays {missing}")
    return name
