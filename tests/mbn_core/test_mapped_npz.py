"""Exact models mapped from their bundles (``mbn_core.bundle.mapped_npz``): the aligned layout
written at training time, mapped arrays equal to read ones, and old or foreign files still
loadable."""

from __future__ import annotations

import io
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from digits_data import Digits

from mbn_core.bundle import BundleError, load_bundle
from mbn_core.bundle.load import load_exact
from mbn_core.bundle.mapped_npz import ALIGNMENT, aligned_npz_bytes, map_npz

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden" / "bundles"
EXPECTED = np.load(GOLDEN / "expected.npz")
ROWS = np.load(GOLDEN / "rows.npy")


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "float32": rng.random((7, 5)).astype(np.float32),
        "bytes": np.arange(13, dtype=np.uint8),
        "fortran": np.asfortranarray(rng.random((4, 3))),
        "empty": np.empty((0, 3)),
        "scalar": np.asarray(2.5),
        "int64": rng.integers(0, 100, (33, 17)),
    }


def _mapped(path: Path) -> dict[str, np.ndarray]:
    with open(path, "rb") as handle:
        return map_npz(handle, str(path))


def _data_offsets(data: bytes) -> dict[str, int]:
    """Where each member's array starts in the file."""
    offsets = {}
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            start = info.header_offset + 30
            name_length = int.from_bytes(data[start - 4 : start - 2], "little")
            extra_length = int.from_bytes(data[start - 2 : start], "little")
            npy = io.BytesIO(data[start + name_length + extra_length :])
            if np.lib.format.read_magic(npy) == (1, 0):
                np.lib.format.read_array_header_1_0(npy)
            else:
                np.lib.format.read_array_header_2_0(npy)
            offsets[info.filename] = start + name_length + extra_length + npy.tell()
    return offsets


def test_the_aligned_layout_is_an_npz_with_each_array_aligned(tmp_path: Path) -> None:
    arrays = _arrays()
    data = aligned_npz_bytes(arrays)
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:  # what any reader reads
        assert sorted(npz.files) == sorted(arrays)
        for name, array in arrays.items():
            np.testing.assert_array_equal(npz[name], array)
            assert npz[name].dtype == array.dtype
    assert all(offset % ALIGNMENT == 0 for offset in _data_offsets(data).values())
    assert aligned_npz_bytes(arrays) == data  # the same arrays, the same bytes


def test_mapped_arrays_equal_the_arrays_and_share_the_file(tmp_path: Path) -> None:
    arrays = _arrays()
    path = tmp_path / "a.npz"
    path.write_bytes(aligned_npz_bytes(arrays))
    mapped = _mapped(path)
    for name, array in arrays.items():
        np.testing.assert_array_equal(mapped[name], array)
        assert mapped[name].dtype == array.dtype and mapped[name].flags.aligned
        assert mapped[name].flags.f_contiguous == array.flags.f_contiguous
    big = mapped["int64"]
    assert isinstance(big.base, np.memmap)  # a view of the file's pages, not a copy
    big[0, 0] = -1  # copy-on-write: the process's own page, never the file
    np.testing.assert_array_equal(_mapped(path)["int64"], arrays["int64"])


def test_files_written_by_np_savez_are_read_where_they_cannot_be_mapped(tmp_path: Path) -> None:
    arrays = _arrays()
    for save in (np.savez, np.savez_compressed):
        path = tmp_path / f"{save.__name__}.npz"
        save(path, **arrays)
        mapped = _mapped(path)
        for name, array in arrays.items():
            np.testing.assert_array_equal(mapped[name], array)
            assert mapped[name].flags.aligned and mapped[name].flags.writeable


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"objects": np.array([{"a": 1}], dtype=object)}, "Python objects"),
    ],
)
def test_arrays_that_would_need_pickle_are_refused(
    tmp_path: Path, arrays: dict, message: str
) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, allow_pickle=True, **arrays)
    with pytest.raises(ValueError, match=message):
        _mapped(path)


def test_a_member_whose_header_disagrees_with_its_bytes_is_refused(tmp_path: Path) -> None:
    data = bytearray(aligned_npz_bytes({"x": np.arange(100, dtype=np.int64)}))
    at = data.index(b"'shape': (100,)")
    data[at : at + 15] = b"'shape': (900,)"  # a header promising more than the member holds
    path = tmp_path / "bad.npz"
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"member 'x\.npy' holds 800 bytes"):
        _mapped(path)


@pytest.mark.parametrize("name", ["mbn", "modular_kpca", "multilevel"])
def test_bundles_saved_before_embed_identically_when_mapped(name: str, tmp_path: Path) -> None:
    # Bundles written by np.savez (before the aligned layout): each member read or mapped.
    path = shutil.copytree(GOLDEN / name, tmp_path / name)
    exact = load_exact(path, mapped=True)
    embedding = load_bundle(path).embed(ROWS, mode="exact", exact=exact)
    np.testing.assert_array_equal(embedding, EXPECTED[f"{name}/exact"])


def test_a_new_bundle_maps_its_exact_model(tmp_path: Path, digits: Digits) -> None:
    from small_models import small_student

    from mbn_core import MBN
    from mbn_core.bundle import save_bundle

    x = digits.X[:300].astype(np.float32)
    model = small_student(MBN(n_clusterings=5, random_state=0, n_jobs=1), x)
    path = save_bundle(model, tmp_path / "m", name="m")
    bundle = load_bundle(path)
    exact = load_exact(path, mapped=True)
    mapped = [
        layer.center_data for layer in exact.estimator.layers_[:1]
    ]  # the largest array of MBN's exact model
    assert all(isinstance(array.base, np.memmap) for array in mapped)
    np.testing.assert_array_equal(
        bundle.embed(x[:50], mode="exact", exact=exact), bundle.embed(x[:50], mode="exact")
    )
    # Verified like a read one: a changed byte is refused before anything is mapped.
    data = bytearray((path / "exact.npz").read_bytes())
    data[-100] ^= 1
    (path / "exact.npz").write_bytes(bytes(data))
    with pytest.raises(BundleError, match="SHA-256 does not match"):
        load_exact(path, mapped=True)
