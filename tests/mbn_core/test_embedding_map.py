"""The 2-D map of the training embedding: building, locating new points, storing in bundles."""

import json
import subprocess
import sys

import numpy as np
import pytest
from sklearn.datasets import make_blobs
from sklearn.manifold import TSNE

from mbn_core.bundle import (
    EXACT_FILE,
    NOVELTY_FILE,
    ONNX_FILE,
    REFERENCE_FILE,
    BundleError,
    load_bundle,
)
from mbn_core.bundle.embedding_map import MAP_FILE, EmbeddingMap, build_map
from mbn_core.pipeline.training import TrainingParams, train_bundle

SMALL = {
    "n_clusterings": 20,
    "k1": 0.1,
    "hidden_layer_sizes": [32],
    "max_epochs": 4,
    "n_clusters": 5,
    "map_points": 400,
}


@pytest.fixture(scope="module")
def blobs():
    x, y = make_blobs(900, n_features=6, centers=4, cluster_std=0.6, random_state=0)
    return x.astype(np.float32), y


@pytest.fixture(scope="module")
def blob_map(blobs):
    x, y = blobs
    return build_map(x[:600], labels=y[:600], clusters=y[:600] + 10, random_state=0)


@pytest.mark.slow
def test_map_of_all_rows_keeps_their_order_and_colours(blob_map, blobs):
    _, y = blobs
    assert blob_map.n_points == 600
    assert blob_map.xy.shape == (600, 2) and blob_map.xy.dtype == np.float32
    assert np.isfinite(blob_map.xy).all()
    np.testing.assert_array_equal(blob_map.row, np.arange(600))
    np.testing.assert_array_equal(blob_map.cluster, y[:600] + 10)
    assert blob_map.label is not None and blob_map.label.tolist() == [str(v) for v in y[:600]]
    assert blob_map.color_by == "label"
    assert blob_map.summary() == {
        "method": "tsne",
        "n_points": 600,
        "color_by": "label",
        "has_clusters": True,
        "has_labels": True,
    }


@pytest.mark.slow
def test_map_separates_blobs(blob_map, blobs):
    _, y = blobs
    # Each map point's nearest other map point is of its own blob (t-SNE kept the groups).
    distances = np.linalg.norm(blob_map.xy[:, None] - blob_map.xy[None], axis=2)
    np.fill_diagonal(distances, np.inf)
    agreement = np.mean(y[:600][distances.argmin(axis=1)] == y[:600])
    assert agreement > 0.98


@pytest.mark.slow
def test_new_points_land_among_their_own_blob(blob_map, blobs):
    x, y = blobs
    placed = blob_map.locate(x[600:])  # rows the map never saw
    assert placed.shape == (300, 2) and placed.dtype == np.float32
    nearest = np.linalg.norm(placed[:, None] - blob_map.xy[None], axis=2).argmin(axis=1)
    assert np.mean(y[:600][nearest] == y[600:]) > 0.98


@pytest.mark.slow
def test_locating_a_map_point_finds_its_place(blob_map, blobs):
    x, _ = blobs
    placed = blob_map.locate(x[:5])
    # Its own point dominates the inverse-distance weights.
    np.testing.assert_allclose(placed, blob_map.xy[:5], atol=1e-2)


@pytest.mark.slow
def test_locating_is_row_independent(blob_map, blobs):
    x, _ = blobs
    together = blob_map.locate(x[600:700])
    alone = np.vstack([blob_map.locate(x[i : i + 1]) for i in range(600, 700)])
    np.testing.assert_array_equal(together, alone)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("queries", "message"),
    [
        (np.zeros((2, 5)), r"shape \(n >= 1, 6\)"),
        (np.zeros((0, 6)), r"shape \(n >= 1, 6\)"),
        (np.full((1, 6), np.nan), "NaN"),
        (np.full((1, 6), 1e39), "float32 range"),
    ],
)
def test_locate_refuses_bad_embeddings(blob_map, queries, message):
    with pytest.raises(ValueError, match=message):
        blob_map.locate(queries)


@pytest.mark.slow
def test_a_sample_of_a_large_embedding(blobs):
    x, y = blobs
    sampled = build_map(x, clusters=y, max_points=100, random_state=1)
    assert sampled.n_points == 100
    assert np.all(np.diff(sampled.row) > 0) and sampled.row.max() < len(x)
    np.testing.assert_array_equal(sampled.embedding, x[sampled.row])
    np.testing.assert_array_equal(sampled.cluster, y[sampled.row])
    assert sampled.label is None and sampled.color_by == "cluster"
    again = build_map(x, clusters=y, max_points=100, random_state=1)
    np.testing.assert_array_equal(again.row, sampled.row)
    np.testing.assert_array_equal(again.xy, sampled.xy)


def test_tiny_embeddings_still_get_a_map():
    tiny = build_map(np.eye(3, dtype=np.float32), random_state=0)
    assert tiny.xy.shape == (3, 2) and tiny.color_by is None


@pytest.mark.slow
def test_a_one_component_embedding_gets_a_map():
    # Three groups on a line: sklearn's PCA start of two components refused this.
    values = np.repeat([0.0, 5.0, 10.0], 100) + np.random.default_rng(0).normal(0, 0.3, 300)
    line = build_map(values[:, None].astype(np.float32), random_state=0)
    assert line.xy.shape == (300, 2) and np.isfinite(line.xy).all()
    group = np.repeat([0, 1, 2], 100)
    distances = np.linalg.norm(line.xy[:, None] - line.xy[None], axis=2)
    np.fill_diagonal(distances, np.inf)
    assert np.mean(group[distances.argmin(axis=1)] == group) > 0.98


def test_a_constant_embedding_maps_to_one_point():
    same = build_map(np.full((50, 3), 7.0, np.float32), random_state=0)
    np.testing.assert_array_equal(same.xy, np.zeros((50, 2), np.float32))


# Embeddings whose points are a few float32 steps apart, or closer to each other than to 0:
# scikit-learn's Barnes-Hut t-SNE ended the process on both (a segmentation fault). Run in a
# child process, so that a regression fails this test rather than the whole run.
_NEAR_CONSTANT = """
import numpy as np
from mbn_core.bundle.embedding_map import build_map
rng = np.random.default_rng(0)
for offset, jitter in [(1.0, 1e-8), (0.0, 1e-30)]:
    points = (offset + jitter * rng.normal(size=(200, 3))).astype(np.float32)
    assert np.isfinite(build_map(points, random_state=0).xy).all()
"""


@pytest.mark.slow
def test_a_near_constant_embedding_does_not_crash_the_process():
    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", _NEAR_CONSTANT],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture(scope="module")
def wide_map():
    """Points wide enough (40 of 200) that PCA's "auto" takes the SVD, not the covariance,
    and their map made before any fault is injected."""
    wide, _ = make_blobs(200, n_features=40, centers=3, random_state=0)
    return wide, build_map(wide, random_state=0)


@pytest.mark.slow
def test_the_pca_start_survives_a_lapack_fault(wide_map, svd_fails):
    wide, clean = wide_map
    with pytest.raises(np.linalg.LinAlgError):  # the fault is real for sklearn's own start
        TSNE(init="pca", perplexity=30.0, random_state=0).fit(wide)
    faulted = build_map(wide, random_state=0)
    # The fallback's start spans the same plane, so the layout is the same up to numerics.
    np.testing.assert_allclose(faulted.xy, clean.xy, atol=1e-3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"embedding": np.zeros(5)}, "2-D"),
        ({"embedding": np.zeros((5, 2)), "max_points": 1}, "max_points"),
        ({"embedding": np.zeros((5, 2)), "labels": [1, 2]}, "labels has 2 entries"),
    ],
)
def test_build_map_refuses_bad_arguments(kwargs, message):
    embedding = kwargs.pop("embedding")
    with pytest.raises(ValueError, match=message):
        build_map(embedding, **kwargs)


@pytest.mark.slow
def test_bytes_round_trip(blob_map):
    again = EmbeddingMap.from_bytes(blob_map.to_bytes())
    for name in ("xy", "embedding", "row", "cluster", "label"):
        np.testing.assert_array_equal(getattr(again, name), getattr(blob_map, name))


@pytest.mark.slow
def test_malformed_bytes_are_refused(blob_map):
    with pytest.raises(ValueError, match="not a readable array archive"):
        EmbeddingMap.from_bytes(b"not an npz", "x/map.npz")
    broken = EmbeddingMap(blob_map.xy[:3], blob_map.embedding, blob_map.row)
    with pytest.raises(ValueError, match="inconsistent shapes"):
        EmbeddingMap.from_bytes(broken.to_bytes())


# ---------------------------------------------------------------------- in training and bundles


@pytest.fixture(scope="module")
def mapped_bundle(digits, tmp_path_factory):
    x, y = digits
    path = tmp_path_factory.mktemp("models") / "m-mapped"
    train_bundle(x[:1200], path, name="mapped", params=SMALL, y=y[:1200])
    return path


@pytest.mark.slow
def test_training_stores_a_map_of_a_sample(mapped_bundle, digits):
    x, y = digits
    bundle = load_bundle(mapped_bundle)
    manifest = bundle.manifest
    assert set(manifest["files"]) == {EXACT_FILE, ONNX_FILE, MAP_FILE, NOVELTY_FILE, REFERENCE_FILE}
    assert manifest["map"]["n_points"] == 400 and manifest["map"]["color_by"] == "label"
    assert bundle.has_map
    stored = bundle.embedding_map()
    assert stored.n_points == 400 and stored.embedding.shape == (400, bundle.output_dim)
    assert stored.label.tolist() == [str(v) for v in y[stored.row]]
    # The stored embedding is the model's exact embedding of those training rows.
    np.testing.assert_allclose(
        stored.embedding, bundle.embed(x[stored.row], mode="exact"), rtol=1e-4, atol=1e-4
    )
    # Clusters are the clustering head's.
    np.testing.assert_array_equal(stored.cluster, bundle.predict_clusters(x[stored.row], "exact"))


@pytest.mark.slow
def test_unseen_digits_land_beside_their_class(mapped_bundle, digits):
    x, y = digits
    bundle = load_bundle(mapped_bundle)
    stored = bundle.embedding_map()
    # Rows training never saw, embedded exactly: this tiny model's compressor is too rough
    # (4 epochs) for the fast path to say where they belong.
    placed = stored.locate(bundle.embed(x[1200:], mode="exact"))
    nearest = np.linalg.norm(placed[:, None] - stored.xy[None], axis=2).argmin(axis=1)
    agreement = np.mean(stored.label[nearest] == y[1200:].astype(str))
    assert agreement > 0.8, agreement


@pytest.mark.slow
def test_a_tampered_map_is_refused(mapped_bundle, tmp_path):
    import shutil

    copy = tmp_path / "m-mapped"
    shutil.copytree(mapped_bundle, copy)
    data = bytearray((copy / MAP_FILE).read_bytes())
    data[-10] ^= 0xFF
    (copy / MAP_FILE).write_bytes(bytes(data))
    with pytest.raises(BundleError, match="SHA-256"):
        load_bundle(copy)


@pytest.mark.slow
def test_no_map_when_asked_for_none(digits, tmp_path):
    x, _ = digits
    path = train_bundle(
        x[:300], tmp_path / "m-plain", name="plain", params={**SMALL, "map_points": 0}
    )
    manifest = json.loads((path / "manifest.json").read_text())
    assert MAP_FILE not in manifest["files"] and "map" not in manifest
    bundle = load_bundle(path)
    assert not bundle.has_map
    with pytest.raises(BundleError, match="no stored map"):
        bundle.embedding_map()


@pytest.mark.slow
def test_a_one_component_model_trains_with_a_map(digits, tmp_path):
    x, _ = digits
    params = {**SMALL, "n_components": 1, "map_points": 200}
    bundle = load_bundle(train_bundle(x[:300], tmp_path / "m-line", name="line", params=params))
    assert bundle.output_dim == 1
    stored = bundle.embedding_map()
    assert stored.xy.shape == (200, 2) and np.isfinite(stored.xy).all()


@pytest.mark.parametrize("points", [-1, 20_001, 2.5, "all"])
def test_map_points_is_validated(points):
    with pytest.raises(ValueError, match="map_points"):
        TrainingParams.from_dict({"map_points": points})
