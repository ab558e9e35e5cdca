"""The candidate scan of the upper layers gives the posting-list walk's codes, bit for bit:
ties, points sharing nothing, lists cut short, every dimension kept or few, and a fit's
layers through the local backend, whose progress and stopping still work."""

import numpy as np
import pytest

from mbn_core import MBN
from mbn_core.exceptions import TrainingStopped
from mbn_core.mbn import neighbour_scan
from mbn_core.mbn.backends.local import LocalBackend
from mbn_core.mbn.encoders import UpperClusterings
from mbn_core.mbn.neighbour_scan import GROUP, NeighbourLists, walk_entries
from mbn_core.mbn.upper import Postings, lays_out_inline, upper_clustering_codes


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
