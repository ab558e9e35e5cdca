"""The candidate scan of the upper layers gives the posting-list walk's codes, bit for bit:
ties, points sharing nothing, lists cut short, every dimension kept or few, and a fit's
layers through the local backend, whose progress and stopping still work."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from mbn_core import MBN
from mbn_core.exceptions import TrainingStopped
from mbn_core.mbn import neighbour_scan
from mbn_core.mbn.backends import local
from mbn_core.mbn.backends.local import LocalBackend
from mbn_core.mbn.encoders import UpperClusterings
from mbn_core.mbn.neighbour_scan import GROUP, NeighbourLists, new_point_codes, walk_entries
from mbn_core.mbn.upper import Postings, UpperLayer, lays_out_inline, upper_clustering_codes


def walked(codes, n_values, centers, seeds, fraction):
    """The codes by the posting-list walk, clustering by clustering."""
    postings = Postings.build(codes, codes, n_values, centers_are_points=True)
    return np.stack(
        [
            upper_clustering_codes(postings, codes, c.astype(np.int32), n_values, s, fraction)
            for c, s in zip(centers, seeds, strict=True)
        ],
        axis=1,
    )


def random_layer(n, V, n_values, k, n_new, seed, groups=5):
    """Codes of points drawn around a few groups (they share many codes), and a layer's
    draws: k distinct center rows per clustering and a seed each."""
    rng = np.random.default_rng(seed)
    group = rng.integers(0, groups, n)
    base = rng.integers(0, n_values, (groups, V))
    noisy = rng.random((n, V)) < 0.5
    codes = np.where(noisy, rng.integers(0, n_values, (n, V)), base[group]).astype(np.uint8)
    centers = np.stack([rng.choice(n, k, replace=False) for _ in range(n_new)])
    seeds = rng.integers(0, 2**63, n_new, dtype=np.int64).astype(np.uint64)
    return codes, centers, seeds


@pytest.mark.parametrize(
    ("n", "V", "n_values", "k", "n_new", "fraction", "width"),
    [
        (300, 40, 20, 100, 70, 0.5, 299),  # every neighbour listed, two groups
        (300, 40, 20, 100, 20, 0.5, 5),  # lists cut short: unlisted neighbours decide
        (200, 70, 8, 30, 10, 1.0, 50),  # every dimension kept, V above one word
        (200, 12, 50, 150, 10, 0.05, 20),  # few kept: many points share none, center 0
        (120, 30, 6, 120, 5, 0.5, 119),  # every point a center
    ],
)
def test_the_scan_gives_the_walks_codes(n, V, n_values, k, n_new, fraction, width):
    codes, centers, seeds = random_layer(n, V, n_values, k, n_new, seed=n + V + k)
    lists = NeighbourLists.build(codes, n_values, width)
    expected = walked(codes, n_values, centers, seeds, fraction)
    for first in range(0, n_new, GROUP):
        got = lists.scan(codes, centers[first : first + GROUP], seeds[first : first + GROUP],
                         n_values, fraction)  # fmt: skip
        np.testing.assert_array_equal(got, expected[:, first : first + GROUP])


def test_duplicate_points_tie_to_the_lowest_center():
    # Rows 0-9 are one point ten times: each shares every code with the others, so the
    # lowest-index center among them wins in every clustering.
    codes, centers, seeds = random_layer(150, 20, 10, 60, 64, seed=3)
    codes[:10] = codes[0]
    centers[:, :3] = [7, 2, 5]  # duplicates at centers 0, 1 and 2
    lists = NeighbourLists.build(codes, 10, 40)
    got = lists.scan(codes, centers, seeds, 10, 0.5)
    np.testing.assert_array_equal(got, walked(codes, 10, centers, seeds, 0.5))


def test_lists_rank_neighbours_by_shared_codes():
    codes = np.array([[0, 0, 0], [0, 0, 1], [0, 1, 1], [1, 1, 1]], dtype=np.uint8)
    lists = NeighbourLists.build(codes, 2, 2)
    assert lists.neighbours[0].tolist() == [1, 2] and lists.shared[0].tolist() == [2, 1]
    # Rows 1 and 2 have a third neighbour, sharing one code.
    assert lists.left_out.tolist() == [-1, 1, 1, -1]


def test_the_walk_serves_where_centers_are_few_or_lists_too_large(monkeypatch):
    codes, _, _ = random_layer(400, 40, 20, 10, 1, seed=1)
    assert NeighbourLists.pays(codes, 20, 200, 400, 0.5)
    assert not NeighbourLists.pays(codes, 20, 2, 400, 0.5)
    monkeypatch.setattr(neighbour_scan, "MAX_LIST_BYTES", 1000)
    assert not NeighbourLists.pays(codes, 20, 200, 400, 0.5)


# Long lists (20 points a code, in groups), read in place; short ones (about 2), copied.
@pytest.mark.parametrize(("n_values", "groups", "inline"), [(20, 5, False), (200, 400, True)])
def test_the_cost_model_prices_the_walk_in_the_layout_the_walk_uses(n_values, groups, inline):
    n_points, n_clusterings = 400, 40
    codes, _, _ = random_layer(n_points, n_clusterings, n_values, 10, 1, seed=2, groups=groups)
    entries = walk_entries(codes, n_values)
    assert lays_out_inline(entries, n_points * n_clusterings, n_points) == inline
    postings = Postings.build(codes, codes, n_values, centers_are_points=True)
    assert (postings.segments is not None) == inline
    if inline:  # the copied lists leave each point's own entry out
        assert int(postings.segments[-1, -1]) == entries - n_points * n_clusterings
    else:
        assert int(postings.length.sum(dtype=np.int64)) == entries


def test_a_fit_scans_its_upper_layers_with_the_saved_models_codes(monkeypatch, digits):
    X = digits.X[:400]
    walk_only = MBN(n_clusterings=70, random_state=0, n_jobs=2)
    monkeypatch.setattr(NeighbourLists, "pays", staticmethod(lambda *args: False))
    expected = walk_only.fit(X)
    scanned = []
    monkeypatch.setattr(NeighbourLists, "pays", staticmethod(lambda *args: True))
    original = LocalBackend.scan_upper_codes

    def spy(self, index, codes, clusterings):
        scanned.append(index)
        return original(self, index, codes, clusterings)

    monkeypatch.setattr(LocalBackend, "scan_upper_codes", spy)
    model = MBN(n_clusterings=70, random_state=0, n_jobs=2).fit(X)
    assert scanned == list(range(1, len(model.ks_)))
    for layer in range(len(model.ks_)):
        np.testing.assert_array_equal(model.encode(X, layer=layer), expected.encode(X, layer=layer))
    np.testing.assert_array_equal(model.transform(X), expected.transform(X))


def test_a_fit_stopped_in_a_scanned_layer_stops_there(monkeypatch, digits):
    monkeypatch.setattr(NeighbourLists, "pays", staticmethod(lambda *args: True))
    heard = []

    def stop_in_layer_two(layer, done, total):
        heard.append((layer, done, total))
        return layer == 2

    model = MBN(n_clusterings=70, random_state=0, n_jobs=2, callback=stop_in_layer_two)
    with pytest.raises(TrainingStopped, match="layer 2 after 64 of 70"):
        model.fit(digits.X[:300])
    # Told group by group above the bottom layer; nothing after the stop.
    assert [h for h in heard if h[0] == 1] == [(1, 64, 70), (1, 70, 70)]
    assert heard[-1] == (2, 64, 70)
    assert not hasattr(model, "ks_")


def test_the_local_backend_groups_more_clusterings_than_a_word():
    codes, centers, seeds = random_layer(250, 30, 12, 80, GROUP + 9, seed=9)
    clusterings = UpperClusterings(centers.astype(np.int32), seeds, 12, 0.5)
    with LocalBackend(n_jobs=2) as backend:
        got = backend.scan_upper_codes(1, codes, clusterings)
    np.testing.assert_array_equal(got, walked(codes, 12, centers, seeds, 0.5))
    assert got.dtype == np.uint8


def fitted_layer(n, V, n_values, k, n_new, fraction, seed, indexed):
    """A fitted upper layer over random codes (kept as its index or as the matrix)."""
    codes, centers, seeds = random_layer(n, V, n_values, k, n_new, seed)
    rows, inverse = np.unique(centers, return_inverse=True)
    center_codes = codes[rows]
    if indexed:  # the index is kept where row numbers are no wider than the codes
        center_codes = center_codes.astype(np.uint16)
    layer = UpperLayer.create(inverse.reshape(centers.shape).astype(np.int32), center_codes,
                              seeds, n_values, fraction)  # fmt: skip
    assert (layer.index is not None) == indexed
    return layer


def walked_new(layer, codes):
    """New points' codes by the batch walk over every clustering of a fitted layer."""
    center_codes = layer.center_codes
    postings = Postings.build(codes.astype(center_codes.dtype), center_codes, layer.n_values)
    return np.stack([
        upper_clustering_codes(postings, center_codes, c.astype(np.int32), layer.n_values, s,
                               layer.feature_fraction)
        for c, s in zip(layer.centers, layer.seeds, strict=True)
    ], axis=1)  # fmt: skip


@pytest.mark.parametrize(
    ("n", "V", "n_values", "k", "n_new", "fraction", "indexed", "depth", "list_bytes"),
    [
        (300, 40, 20, 100, 70, 0.5, True, 7.0, 64 << 20),  # two groups, one block
        (300, 40, 20, 100, 70, 0.5, False, 7.0, 64 << 20),  # the code matrix kept
        (300, 40, 20, 60, 20, 0.5, True, 0.02, 64 << 20),  # lists cut short
        (200, 70, 8, 30, 10, 1.0, True, 7.0, 2000),  # every dimension kept, blocks of rows
        (200, 12, 50, 150, 70, 0.05, True, 7.0, 3000),  # few kept: many share none; blocks
    ],
)
def test_new_points_scan_to_the_walks_codes(
    monkeypatch, n, V, n_values, k, n_new, fraction, indexed, depth, list_bytes
):
    monkeypatch.setattr(neighbour_scan, "SCAN_DEPTH", depth)
    monkeypatch.setattr(neighbour_scan, "MAX_LIST_BYTES", list_bytes)
    layer = fitted_layer(n, V, n_values, k, n_new, fraction, seed=n + k, indexed=indexed)
    new, _, _ = random_layer(150, V, n_values, 1, 1, seed=V)
    new[:5] = new[0]  # the same point five times
    heard = []
    with ThreadPoolExecutor(2) as pool:
        got = new_point_codes(layer, new, pool, 2, lambda *told: heard.append(told))
    np.testing.assert_array_equal(got, walked_new(layer, new))
    np.testing.assert_array_equal(got, layer.codes_few(new))
    assert got.dtype == np.uint8 and heard == sorted(heard)
    assert heard[-1][0] == heard[-1][1] and len({total for _, total in heard}) == 1


def test_a_new_point_sharing_no_code_takes_center_zero():
    rng = np.random.default_rng(4)
    center_codes = rng.integers(0, 9, (60, 20)).astype(np.uint16)  # value 9 never used
    centers = np.stack([rng.choice(60, 30, replace=False) for _ in range(5)]).astype(np.int32)
    seeds = rng.integers(0, 2**63, 5, dtype=np.int64).astype(np.uint64)
    layer = UpperLayer.create(centers, center_codes, seeds, 10, 0.5)
    new = np.full((2, 20), 9, dtype=np.uint16)
    new[1, 0] = center_codes[centers[0, 7], 0]  # one code shared, with center 7's row
    got = new_point_codes(layer, new)
    assert got[0].tolist() == [0] * 5
    np.testing.assert_array_equal(got, walked_new(layer, new))


def test_a_transform_scans_new_points_to_the_walks_codes(monkeypatch, digits):
    model = MBN(n_clusterings=70, random_state=0, n_jobs=2).fit(digits.X[:400])
    new = digits.X[400:700]  # past the few-rows paths
    monkeypatch.setattr(neighbour_scan, "NEW_POINTS_PER_CENTER", 0)
    walked_layers = [model.encode(new, layer=layer) for layer in range(len(model.ks_))]
    walked_embedding = model.transform(new)
    scanned = []
    original = local.new_point_codes

    def spy(layer, codes, *args):
        scanned.append(layer.n_centers)
        return original(layer, codes, *args)

    monkeypatch.setattr(neighbour_scan, "NEW_POINTS_PER_CENTER", 300)
    monkeypatch.setattr(local, "new_point_codes", spy)
    embedding = model.transform(new)
    assert scanned == model.ks_[1:]
    np.testing.assert_array_equal(embedding, walked_embedding)
    for layer, expected in enumerate(walked_layers):
        np.testing.assert_array_equal(model.encode(new, layer=layer), expected)


def test_a_scanned_transform_reports_and_stops_between_groups(digits):
    model = MBN(n_clusterings=70, random_state=0, n_jobs=2).fit(digits.X[:400])
    layer = model.upper_layers_[0]
    heard = []

    def stop_halfway(index, done, total):
        heard.append((index, done, total))
        return index == 1 and done >= GROUP

    with LocalBackend(n_jobs=2, callback=stop_halfway) as backend:
        codes = backend.bottom_codes(model.bottom_layer_, digits.X[400:700])
        assert neighbour_scan.scans_new_points(layer, 300)
        with pytest.raises(TrainingStopped, match="layer 1 after 64 of 70"):
            backend.upper_codes(1, codes, layer)
    assert heard[-1] == (1, 64, 70)


def test_a_batch_of_a_quarter_of_the_centers_leaves_the_index_for_the_scan(monkeypatch):
    layer = fitted_layer(300, 40, 20, 100, 70, 0.5, seed=8, indexed=True)
    new, _, _ = random_layer(60, 40, 20, 1, 1, seed=9)
    scanned = []
    original = local.new_point_codes

    def spy(layer, codes, *args):
        scanned.append(len(codes))
        return original(layer, codes, *args)

    monkeypatch.setattr(local, "new_point_codes", spy)
    with LocalBackend(n_jobs=2) as backend:
        for n in (20, 25, 26, 60):  # row by row up to k / 4 = 25 rows, then scanned
            got = backend.upper_codes(1, new[:n].astype(np.uint16), layer)
            np.testing.assert_array_equal(got, layer.codes_few(new[:n]))
    assert scanned == [26, 60]
