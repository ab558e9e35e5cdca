"""Archives whose checked member is not the member read, or that zipfile cannot read: each
refused with a ValueError naming the member, by the header check and by the loader alike."""

from __future__ import annotations

import io
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

from mbn_core.data.files import peek_data_file
from mbn_core.data.readers import load_training_data


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def archive(members: list[tuple[str, bytes]], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=method) as zf, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Duplicate name": what is under test
        for name, data in members:
            zf.writestr(name, data)
    return buffer.getvalue()


def patch_headers(data: bytes, *, flag: int | None = None, method: int | None = None) -> bytes:
    """Set the general-purpose flag bits and/or compression method of every member, in
    both its local header and its central directory entry."""
    out = bytearray(data)
    for signature, flag_at, method_at in ((b"PK\x03\x04", 6, 8), (b"PK\x01\x02", 8, 10)):
        start = 0
        while (start := out.find(signature, start)) >= 0:
            if flag is not None:
                out[start + flag_at : start + flag_at + 2] = flag.to_bytes(2, "little")
            if method is not None:
                out[start + method_at : start + method_at + 2] = method.to_bytes(2, "little")
            start += 4
    return bytes(out)


def both_refuse(path: Path, data: bytes, message: str) -> None:
    path.write_bytes(data)
    with pytest.raises(ValueError, match=message) as peeked:
        peek_data_file(path)
    with pytest.raises(ValueError, match=message) as loaded:
        load_training_data(path)
    for error in (peeked.value, loaded.value):
        assert str(error).startswith(str(path))


def test_a_shadow_member_beside_the_checked_one_is_refused(tmp_path: Path) -> None:
    """A small 'x.npy' passed the size checks while np.load(...)['x'] read a raw 'x' 200
    times larger: the row limits were bypassed."""
    small = npy_bytes(np.ones((200, 8), np.float32))
    large = npy_bytes(np.ones((40_000, 8), np.float32))
    data = archive([("x.npy", small), ("x", large)])
    both_refuse(tmp_path / "d.npz", data, "'x' is not an array")


def test_a_raw_member_alone_is_refused(tmp_path: Path) -> None:
    data = archive([("x", npy_bytes(np.ones((20, 3))))])
    both_refuse(tmp_path / "d.npz", data, "not an array")


def test_a_member_named_twice_is_refused(tmp_path: Path) -> None:
    small = npy_bytes(np.ones((20, 3)))
    data = archive([("x.npy", small), ("x.npy", npy_bytes(np.ones((4000, 3))))])
    both_refuse(tmp_path / "d.npz", data, "more than once")


def test_an_npy_suffix_twice_shadowing_is_refused(tmp_path: Path) -> None:
    data = archive([("x.npy", npy_bytes(np.ones((20, 3)))), ("x.npy.npy", b"junk")])
    both_refuse(tmp_path / "d.npz", data, "shadow each other")


def test_an_encrypted_member_is_refused(tmp_path: Path) -> None:
    """zipfile raised RuntimeError ("password required"): a 500."""
    data = patch_headers(archive([("x.npy", npy_bytes(np.ones((20, 3))))]), flag=1)
    both_refuse(tmp_path / "d.npz", data, "encrypted")


@pytest.mark.parametrize("method", [1, 6, 99])
def test_an_unknown_compression_method_is_refused(tmp_path: Path, method: int) -> None:
    """zipfile raised NotImplementedError for method 1 ("shrunk"): a 500."""
    data = patch_headers(archive([("x.npy", npy_bytes(np.ones((20, 3))))]), method=method)
    both_refuse(tmp_path / "d.npz", data, f"compression method {method}")


@pytest.mark.parametrize("where", ["header", "data"])
def test_a_corrupt_deflate_stream_is_refused(tmp_path: Path, where: str) -> None:
    """zlib.error went through as a 500. Corrupted in the array header, the header check
    refuses it; further in, the loader does."""
    rng = np.random.default_rng(0)
    data = bytearray(archive([("x.npy", npy_bytes(rng.normal(size=(500, 8))))]))
    start = data.find(b"x.npy") + len("x.npy")  # the member's compressed bytes follow
    offset = start + (2 if where == "header" else 2000)
    data[offset : offset + 16] = b"\xff" * 16
    path = tmp_path / "d.npz"
    path.write_bytes(bytes(data))
    if where == "header":
        with pytest.raises(ValueError, match="unreadable"):
            peek_data_file(path)
    with pytest.raises(ValueError, match="unreadable"):
        load_training_data(path)


def test_numpys_own_archives_still_load(tmp_path: Path) -> None:
    x, y = np.ones((30, 4), np.float32), np.arange(30)
    for save in (np.savez, np.savez_compressed):
        save(tmp_path / "d.npz", x=x, y=y)
        assert peek_data_file(tmp_path / "d.npz").n_rows == 30
        loaded, labels = load_training_data(tmp_path / "d.npz")
        assert np.array_equal(loaded, x) and np.array_equal(labels, y)
