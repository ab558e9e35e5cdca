"""``.npz`` files whose arrays are mapped from the file itself rather than read into memory.

An uncompressed zip member holds an ``.npy`` header, then the raw array. Such a member is
mapped at its offset (``np.memmap``), so every process that maps the same file shares its
pages through the page cache: a host holds one copy of a model however many processes use it.

``np.savez`` places members wherever the previous one ended, so an array's first byte is
rarely aligned to its element size, and numpy (its BLAS calls) and numba would treat such an
array apart or copy it. ``aligned_npz_bytes`` writes the same archive, readable by ``np.load``,
with each member's data at a multiple of ``ALIGNMENT`` bytes: the zip format's "extra field"
of each member's local header pads it there (the field Android's ``zipalign`` writes). Older
files stay readable: a member that is deflated (``np.savez_compressed``) or misaligned for its
element type is read into memory instead of mapped.

The mapping is copy-on-write (``mode="c"``): the arrays are writable like any loaded array,
and a write would stay private to the process instead of reaching the file.
"""

from __future__ import annotations

import io
import struct
import zipfile
from collections.abc import Mapping
from typing import Any, BinaryIO, Literal

import numpy as np

from mbn_core.data.npz_members import HEADER_ERRORS, checked_members, read_member

# A zip member's local header: signature, then fixed fields up to the name and extra lengths.
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")
_LOCAL_SIGNATURE = b"PK\x03\x04"
# Where each member's array starts: a multiple of this many bytes in the file (a cache line;
# numpy pads an .npy header to a multiple of 64 bytes, so the array follows an aligned member).
ALIGNMENT = 64
# The extra field that pads a member: Android's zipalign id, its alignment, then zeros.
_PAD_FIELD = 0xD935
_PAD_HEADER = struct.Struct("<HHH")
# What zipfile appends to a large member's local header (id, size, two 8-byte sizes).
_ZIP64_FIELD_BYTES = 20
# The date written for every member: the same arrays give the same bytes.
_DATE = (1980, 1, 1, 0, 0, 0)


def aligned_npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """The ``.npz`` of ``arrays`` (what ``np.savez`` writes, uncompressed, no pickles), each
    member's array starting at a multiple of ``ALIGNMENT`` bytes, so it can be mapped."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            npy = io.BytesIO()
            np.lib.format.write_array(npy, np.asanyarray(array), allow_pickle=False)
            data = npy.getbuffer()
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_DATE)
            info.compress_type = zipfile.ZIP_STORED
            # zipfile's own rule for adding its zip64 field after ours.
            zip64 = len(data) * 1.05 > zipfile.ZIP64_LIMIT
            fixed = _LOCAL_HEADER.size + len(info.filename.encode("utf-8"))
            fixed += _PAD_HEADER.size + (_ZIP64_FIELD_BYTES if zip64 else 0)
            padding = -(buffer.tell() + fixed) % ALIGNMENT
            info.extra = _PAD_HEADER.pack(_PAD_FIELD, 2 + padding, ALIGNMENT) + bytes(padding)
            archive.writestr(info, data)
    return buffer.getvalue()


def map_npz(file: BinaryIO, source: str) -> dict[str, np.ndarray]:
    """Every array of the ``.npz`` open as ``file`` (a real file, opened for reading in
    binary), by name: stored members mapped, deflated ones read. ``source`` names the file in
    errors. ValueError naming the member when one is not a plain array (object arrays, which
    would need pickle, included) or its bytes disagree with its header. The mappings outlive
    ``file``."""
    arrays: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(file) as archive:
        members = checked_members(archive, source)
        for name, info in members.items():
            if info.compress_type == zipfile.ZIP_STORED:
                arrays[name] = _mapped_member(file, info, source)
            else:
                arrays[name] = read_member(archive, info, source)
    return arrays


def _mapped_member(file: BinaryIO, info: zipfile.ZipInfo, source: str) -> np.ndarray:
    shown = repr(info.filename[:80])
    file.seek(info.header_offset)
    fixed = file.read(_LOCAL_HEADER.size)
    if len(fixed) != _LOCAL_HEADER.size or fixed[:4] != _LOCAL_SIGNATURE:
        raise ValueError(f"{source}: member {shown} has no local header where the index says")
    name_length, extra_length = _LOCAL_HEADER.unpack(fixed)[-2:]
    start = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
    file.seek(start)
    try:
        version = np.lib.format.read_magic(file)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(file)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(file)
        else:
            raise ValueError(f"unknown .npy format version {version}")
    except (ValueError, *HEADER_ERRORS) as error:
        raise ValueError(f"{source}: member {shown} has an unreadable header: {error}") from None
    if dtype.hasobject:
        raise ValueError(f"{source}: member {shown} holds Python objects (they need pickle)")
    offset = file.tell()
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if offset - start + size != info.file_size or info.compress_size != info.file_size:
        raise ValueError(
            f"{source}: member {shown} holds {info.file_size - (offset - start)} bytes of data "
            f"but its header says {size}"
        )
    order: Literal["C", "F"] = "F" if fortran else "C"
    if size == 0:  # nothing to map (mmap refuses an empty range)
        return np.empty(shape, dtype=dtype, order=order)
    if offset % dtype.alignment:  # np.savez's layout: read, as np.load would
        file.seek(offset)
        flat = np.frombuffer(file.read(size), dtype=dtype)
        if flat.size * dtype.itemsize != size:
            raise ValueError(f"{source}: member {shown} is truncated")
        return flat.reshape(shape, order=order).copy(order=order)
    handle: Any = file  # numpy's stubs take names and paths; it maps file objects too
    mapped = np.memmap(handle, dtype=dtype, mode="c", offset=offset, shape=shape, order=order)
    # A plain ndarray view of the mapping, like what np.load gives; the pages stay mapped
    # for as long as any view of them lives.
    return np.asarray(mapped)
