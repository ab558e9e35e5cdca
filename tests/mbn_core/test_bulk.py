"""Chunked embedding of files with dask.array (mbn_core/bundle/bulk.py) and `mbn embed` on it."""

import re
import warnings

import numpy as np
import pytest

pytest.importorskip("dask.array")
zarr = pytest.importorskip("zarr")

from mbn_core import cli  # noqa: E402
from mbn_core.bundle import load_bundle  # noqa: E402
from mbn_core.bundle.bulk import NpyRows, embed_file  # noqa: E402
from mbn_core.pipeline.training import train_bundle  # noqa: E402

SMALL = {
    "n_clusterings": 20, "k1": 0.1, "hidden_layer_sizes": [32], "max_epochs": 4,
    "n_clusters": 4,
}  # fmt: skip


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, digits):
    path = tmp_path_factory.mktemp("bulk")
    X, y = digits
    train_bundle(X, path / "model", name="digits", params=SMALL, y=y)
    np.save(path / "rows.npy", X[:700].astype(np.uint8))
    return path


@pytest.fixture(scope="module")
def expected(workdir):
    bundle = load_bundle(workdir / "model")
    X = np.load(workdir / "rows.npy")
    embedding, clusters = bundle.embed_with_clusters(X)
    return X, bundle, embedding, clusters


def leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


@pytest.mark.slow
def test_npy_in_chunks_equals_the_whole_embedding(workdir, expected):
    _, _, embedding, clusters = expected
    result = embed_file(workdir / "model", workdir / "rows.npy", workdir / "e.npy",
                        clusters_out=workdir / "c.npy", chunk_rows=64, threads=2)  # fmt: skip
    assert (result.n_rows, result.output_dim, result.n_chunks) == (700, 10, 11)
    np.testing.assert_array_equal(np.load(workdir / "e.npy"), embedding)
    np.testing.assert_array_equal(np.load(workdir / "c.npy"), clusters)
    assert leftovers(workdir) == []


@pytest.mark.slow
def test_zarr_in_and_out_exact_mode(workdir, expected):
    X, bundle, _, _ = expected
    source = zarr.open_array(str(workdir / "rows.zarr"), mode="w", shape=X.shape,
                             chunks=(150, 32), dtype=X.dtype)  # fmt: skip
    source[:] = X
    embed_file(workdir / "model", workdir / "rows.zarr", workdir / "exact.zarr", mode="exact",
               chunk_rows=128)  # fmt: skip
    written = zarr.open_array(str(workdir / "exact.zarr"), mode="r")
    assert written.chunks == (128, 10)
    np.testing.assert_array_equal(written[:], bundle.embed(X, mode="exact"))


@pytest.mark.slow
def test_a_row_whose_embedding_overflows_is_named_by_its_place_in_the_file(workdir):
    X = np.load(workdir / "rows.npy").astype(np.float32)
    params = {"method": "multilevel", "max_epochs": 2, "map_points": 0}
    train_bundle(X[:400], workdir / "ml", name="ml", params=params)
    X[333] = 3.4e38  # finite, but the distilled MLP overflows float32 on it
    np.save(workdir / "far.npy", X)
    with pytest.raises(ValueError, match=r"far\.npy: row 333 embeds to NaN or infinity"):
        embed_file(workdir / "ml", workdir / "far.npy", workdir / "far-out.npy", chunk_rows=100)
    assert not (workdir / "far-out.npy").exists()
    assert leftovers(workdir) == []


@pytest.mark.slow
@pytest.mark.parametrize("value", [np.nan, 1e39])  # 1e39: finite, beyond float32's range
def test_a_bad_row_is_named_and_nothing_is_left(workdir, value):
    X = np.load(workdir / "rows.npy").astype(np.float64)
    X[333, 5] = value
    np.save(workdir / "bad.npy", X)
    message = r"bad\.npy: row 333 contains NaN, infinity or a value beyond the float32 range"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow warning named the file's path
        with pytest.raises(ValueError, match=message):
            embed_file(
                workdir / "model", workdir / "bad.npy", workdir / "bad-out.npy", chunk_rows=100
            )
    assert not (workdir / "bad-out.npy").exists()
    assert leftovers(workdir) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("source", "out", "message"),
    [
        ("narrow.npy", "o.npy", "has 10 columns but bundle 'model' expects 64"),
        ("rows.npy", "o.csv", "unsupported output format '.csv'"),
        ("rows.npz", "o.npy", "unsupported format '.npz'"),
        ("missing.npy", "o.npy", "missing.npy: no such file"),
        # Chunking by rows assumed two dimensions: a 1-D file was an IndexError.
        ("vector.npy", "o.npy", "expected a 2-D matrix with at least one row, got (64,)"),
        ("cube.npy", "o.npy", "expected a 2-D matrix with at least one row, got (2, 8, 8)"),
        ("cube.zarr", "o.npy", "expected a 2-D matrix with at least one row, got (2, 8, 8)"),
    ],
)
def test_bad_requests_are_value_errors(workdir, source, out, message):
    np.save(workdir / "narrow.npy", np.zeros((5, 10)))
    np.save(workdir / "vector.npy", np.zeros(64))
    np.save(workdir / "cube.npy", np.zeros((2, 8, 8)))
    zarr.open_array(str(workdir / "cube.zarr"), mode="w", shape=(2, 8, 8), dtype="f4")[:] = 0
    with pytest.raises(ValueError, match=re.escape(message)):
        embed_file(workdir / "model", workdir / source, workdir / out)


@pytest.mark.slow
def test_npy_rows_open_a_map_per_read(workdir):
    rows = NpyRows(str(workdir / "rows.npy"))
    assert rows.shape == (700, 64) and rows.dtype == np.uint8
    chunk = rows[10:20]
    assert type(chunk) is np.ndarray  # a copy, not a view keeping the file mapped
    np.testing.assert_array_equal(chunk, np.load(workdir / "rows.npy")[10:20])


@pytest.mark.slow
def test_on_a_cluster_the_workers_write_the_chunks(workdir, expected, dask_client):
    _, _, embedding, clusters = expected
    embed_file(workdir / "model", workdir / "rows.npy", workdir / "cluster.npy",
               clusters_out=workdir / "cluster-ids.zarr", chunk_rows=100,
               client=dask_client)  # fmt: skip
    np.testing.assert_array_equal(np.load(workdir / "cluster.npy"), embedding)
    np.testing.assert_array_equal(zarr.open_array(str(workdir / "cluster-ids.zarr"))[:], clusters)


@pytest.mark.slow
def test_mbn_embed_streams_npy_and_zarr(workdir, expected, monkeypatch, capsys):
    _, _, embedding, _ = expected
    monkeypatch.chdir(workdir)
    argv = ["embed", "model", "rows.npy", "--out", "cli.zarr", "--chunk-rows", "300"]
    assert cli.main(argv) == 0
    assert "Wrote 700 x 10 fast embeddings to cli.zarr (3 chunks" in capsys.readouterr().out
    np.testing.assert_array_equal(zarr.open_array("cli.zarr")[:], embedding)
