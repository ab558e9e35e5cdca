"""Shapes of data files from their headers: agree with what loading finds, refuse lies."""

import io
import zipfile

import numpy as np
import pytest
import scipy.sparse as sp

from mbn_core.data.files import SPARSE_BYTES_PER_FEATURE, DataShape, peek_data_file
from mbn_core.data.readers import load_training_data


def header_only(shape, dtype="<f8"):
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": dtype, "fortran_order": False, "shape": shape}
    )
    return buffer.getvalue()


@pytest.mark.parametrize("order", ["C", "F"])
def test_npy(tmp_path, order):
    x = np.asfortranarray(np.ones((7, 3))) if order == "F" else np.ones((7, 3))
    np.save(tmp_path / "d.npy", x)
    assert peek_data_file(tmp_path / "d.npy") == DataShape(7, 3, 7 * 3 * 8)
    assert load_training_data(tmp_path / "d.npy")[0].shape == (7, 3)


def test_npz_with_labels(tmp_path):
    np.savez_compressed(tmp_path / "d.npz", x=np.ones((5, 2), np.float32), y=np.arange(5))
    shape = peek_data_file(tmp_path / "d.npz")
    assert (shape.n_rows, shape.n_features, shape.has_labels) == (5, 2, True)
    assert shape.data_bytes == 5 * 2 * 4 + 5 * 8


def test_sparse_npz(tmp_path):
    sp.save_npz(tmp_path / "s.npz", sp.random(9, 4, density=0.5, format="csr", random_state=0))
    shape = peek_data_file(tmp_path / "s.npz")
    assert (shape.n_rows, shape.n_features, shape.sparse) == (9, 4, True)


def test_loaded_bytes_size_sparse_data_by_its_arrays_not_as_dense(tmp_path):
    # 1,000 documents over a vocabulary of 200,000 words: 800 MB as float32 rows, a few
    # hundred kB as the arrays training keeps (it never makes them dense).
    # 20 words per document, built directly: scipy's sp.random draws its positions among all
    # 200 million cells, which took 19 s.
    rng = np.random.default_rng(0)
    words = np.concatenate([np.sort(rng.choice(200_000, 20, replace=False)) for _ in range(1000)])
    indptr = np.arange(0, 20 * 1000 + 1, 20)
    X = sp.csr_matrix((rng.random(words.size, dtype=np.float32), words, indptr), (1000, 200_000))
    sp.save_npz(tmp_path / "bag.npz", X, compressed=False)
    shape = peek_data_file(tmp_path / "bag.npz")
    assert shape.loaded_bytes == shape.data_bytes + 200_000 * SPARSE_BYTES_PER_FEATURE
    assert shape.loaded_bytes < 200 * 2**20 < 1000 * 200_000 * 4
    np.save(tmp_path / "dense.npy", np.zeros((10, 3), dtype=np.uint8))
    assert peek_data_file(tmp_path / "dense.npy").loaded_bytes == 10 * 3 * 4  # as float32


@pytest.mark.parametrize("layout", ["csr", "csc", "bsr", "coo", "dia"])
def test_every_scipy_sparse_format_loads_as_csr(tmp_path, layout):
    # Only csr, csc and bsr (the ones with indptr) were recognised before.
    dense = np.random.default_rng(0).normal(size=(20, 3))
    sp.save_npz(tmp_path / "s.npz", sp.csr_matrix(dense).asformat(layout))
    shape = peek_data_file(tmp_path / "s.npz")
    assert (shape.n_rows, shape.n_features, shape.sparse) == (20, 3, True)
    loaded, _ = load_training_data(tmp_path / "s.npz")
    assert isinstance(loaded, sp.csr_matrix)
    np.testing.assert_allclose(loaded.toarray(), dense.astype(np.float32))


_EVIL_SPARSE = {
    "decreasing indptr": ("csr", (2, 3), {"indices": [0, 1], "indptr": [0, 5, 2]}, "indptr"),
    "csc index past the shape": ("csc", (3, 2), {"indices": [0, 9], "indptr": [0, 1, 2]}, "< 3"),
    "coo index past the shape": ("coo", (5, 3), {"row": [0, 100], "col": [0, 1]}, "exceeds"),
}


@pytest.mark.parametrize("case", _EVIL_SPARSE, ids=list(_EVIL_SPARSE))
def test_sparse_index_arrays_are_checked_before_use(tmp_path, case):
    # scipy's constructors check only lengths: a decreasing indptr raised a C++ RuntimeError
    # in the conversion, and a column index past the shape was loaded.
    layout, shape, index_arrays, message = _EVIL_SPARSE[case]
    arrays = {key: np.array(value) for key, value in index_arrays.items()}
    np.savez(tmp_path / "e.npz", format=np.array(layout), shape=np.array(shape),
             data=np.ones(2), **arrays)  # fmt: skip
    with pytest.raises(ValueError, match=message):
        load_training_data(tmp_path / "e.npz")


def test_string_labels_in_an_npz(tmp_path):
    x = np.random.default_rng(0).normal(size=(6, 2))
    np.savez(tmp_path / "d.npz", x=x, y=np.array(["cat", "dog"] * 3))
    assert peek_data_file(tmp_path / "d.npz").has_labels
    assert load_training_data(tmp_path / "d.npz")[1].tolist() == ["cat", "dog"] * 3
    np.savez(tmp_path / "c.npz", x=x, y=np.ones(6, complex))
    with pytest.raises(ValueError, match="labels must be numbers, strings or booleans"):
        peek_data_file(tmp_path / "c.npz")


def test_csv_with_and_without_header(tmp_path):
    (tmp_path / "a.csv").write_text("a,b,c\n1,2,3\n\n4,5,6\n7,8,9")
    (tmp_path / "b.csv").write_text("1,2\n3,4\n")
    with_header = peek_data_file(tmp_path / "a.csv")
    assert (with_header.n_rows, with_header.n_features) == (3, 3)
    assert peek_data_file(tmp_path / "b.csv").n_rows == 2


def test_header_claiming_more_than_the_file_holds(tmp_path):
    (tmp_path / "d.npy").write_bytes(header_only((10**9, 64)) + bytes(1024))
    with pytest.raises(ValueError, match=r"claims shape \(1000000000, 64\).*holds 1152 bytes"):
        peek_data_file(tmp_path / "d.npy")
    # The loader checks the same before numpy allocates anything.
    with pytest.raises(ValueError, match="claims shape"):
        load_training_data(tmp_path / "d.npy")


def test_npz_member_whose_declared_size_disagrees_with_its_header(tmp_path):
    # An x.npy member that claims a shape its (declared, decompressed) size cannot hold.
    with zipfile.ZipFile(tmp_path / "d.npz", "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("x.npy", header_only((10**8, 100)) + bytes(4096))
    with pytest.raises(ValueError, match=r"member 'x\.npy'.*claims shape"):
        peek_data_file(tmp_path / "d.npz")


def test_objects_and_non_numbers_are_refused(tmp_path):
    np.save(tmp_path / "o.npy", np.array([[{"a": 1}]], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="Python objects"):
        peek_data_file(tmp_path / "o.npy")
    np.save(tmp_path / "s.npy", np.array([["a", "b"]]))
    with pytest.raises(ValueError, match="expected numbers"):
        peek_data_file(tmp_path / "s.npy")


def test_not_2d_and_unknown_suffix(tmp_path):
    np.save(tmp_path / "v.npy", np.arange(4.0))
    with pytest.raises(ValueError, match="2-D"):
        peek_data_file(tmp_path / "v.npy")
    (tmp_path / "d.txt").write_text("1")
    with pytest.raises(ValueError, match="unsupported format"):
        peek_data_file(tmp_path / "d.txt")
