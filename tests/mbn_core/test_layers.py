"""The k-centers layers against brute-force references."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import scipy.sparse as sp

from mbn_core import MBN
from mbn_core.mbn import _bottom_kernels, _kernels
from mbn_core.mbn.bottom import (
    DIRECT_MAX_ROWS,
    TIE_MARGIN,
    bottom_clustering_codes,
    bottom_codes_direct,
    bottom_codes_sparse,
    input_row_norms,
    with_ones_column,
)
from mbn_core.mbn.dtypes import compact_values
from mbn_core.mbn.upper import (
    CodeIndex,
    PointPostings,
    Postings,
    UpperLayer,
    keep_threshold,
    upper_clustering_codes,
)


def reference_bottom(X, features, centers, metric):
    """Nearest center in float64, lowest index on ties."""
    Xs = np.asarray(X, dtype=np.float64)[:, features]
    W = np.asarray(centers, dtype=np.float64)
    if metric == "euclidean":
        distances = ((Xs[:, None, :] - W[None, :, :]) ** 2).sum(axis=2)
        return distances.argmin(axis=1)
    norms = np.linalg.norm(W, axis=1)
    similarity = Xs @ W.T / np.where(norms > 0, norms, 1.0)
    return similarity.argmax(axis=1)


def reference_upper(codes, center_codes, n_values, seed, fraction):
    """Shared chosen one-hot dimensions between every point and center, argmax."""
    n_clusterings = codes.shape[1]
    keys = (center_codes + np.arange(n_clusterings) * n_values).astype(np.uint64)
    kept = _kernels.dimension_kept(np.uint64(seed), keys.ravel(), keep_threshold(fraction))
    kept = kept.reshape(center_codes.shape) if fraction < 1 else np.ones(center_codes.shape, bool)
    shared = (codes[:, None, :] == center_codes[None, :, :]) & kept[None, :, :]
    return shared.sum(axis=2).argmax(axis=1)


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_bottom_codes_match_brute_force(metric):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 12)).astype(np.float32)
    features = np.array([0, 3, 4, 7, 11])
    centers = X[rng.choice(300, 40, replace=False)][:, features]
    codes = bottom_clustering_codes(with_ones_column(X), features, centers, metric)
    np.testing.assert_array_equal(codes, reference_bottom(X, features, centers, metric))


def test_bottom_exact_ties_go_to_the_lowest_center():
    X = np.array([[0.0, 0.0], [1.0, 1.0], [5.0, 5.0]], dtype=np.float32)
    # Centers 1 and 2 are identical; point 1 sits on them, point 0 is equidistant from 0 and 3.
    centers = np.array([[-1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]], dtype=np.float32)
    codes = bottom_clustering_codes(with_ones_column(X), np.array([0, 1]), centers, "euclidean")
    np.testing.assert_array_equal(codes, [0, 1, 1])


def test_bottom_near_ties_beyond_float32_are_ranked_exactly():
    # Two centers whose float32 GEMM scores collide while their float64 distances differ.
    rng = np.random.default_rng(1)
    base = rng.uniform(100, 200, size=64).astype(np.float32)
    nudged = base.copy()
    nudged[5] = np.nextafter(nudged[5], np.float32(np.inf))
    X = base[None, :] + np.float32(1e-3)
    centers = np.stack([nudged, base])
    codes = bottom_clustering_codes(with_ones_column(X), np.arange(64), centers, "euclidean")
    np.testing.assert_array_equal(codes, reference_bottom(X, np.arange(64), centers, "euclidean"))


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_bottom_sparse_input_gives_the_dense_codes(metric):
    rng = np.random.default_rng(2)
    X = sp.random(200, 30, density=0.2, format="csr", random_state=3, dtype=np.float32)
    features = np.sort(rng.choice(30, 15, replace=False))
    centers = X[rng.choice(200, 25, replace=False)][:, features].toarray()
    sparse_codes = bottom_clustering_codes(X, features, centers, metric)
    dense_codes = bottom_clustering_codes(with_ones_column(X.toarray()), features, centers, metric)
    np.testing.assert_array_equal(sparse_codes, dense_codes)
    np.testing.assert_array_equal(
        sparse_codes, reference_bottom(X.toarray(), features, centers, metric)
    )


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_sparse_bottom_codes_equal_the_gemm_path(metric):
    # Sparse rows against sparse centers: the chosen dimensions mask the centers instead of
    # slicing both sides. Whole-number counts make exact ties, and an all-zero row scores
    # every center alike.
    rng = np.random.default_rng(7)
    dense = rng.poisson(0.4, size=(240, 40)).astype(np.float32)
    dense[5] = 0.0
    dense[9] = dense[3]
    X = sp.csr_matrix(dense)
    model = MBN(n_clusterings=10, ks=[50, 12], metric=metric, random_state=0).fit(X)
    layer = model.bottom_layer_
    assert sp.issparse(layer.center_data)
    norms = input_row_norms(X)
    for v in range(10):
        features, centers = layer.features(v), layer.center_values(v)
        codes = bottom_codes_sparse(X, layer, v, norms)
        np.testing.assert_array_equal(codes, layer.clustering_codes(X, v, norms))
        np.testing.assert_array_equal(
            codes, bottom_clustering_codes(X, features, centers, metric, norms)
        )
        np.testing.assert_array_equal(codes, reference_bottom(dense, features, centers, metric))
        rows = [bottom_codes_sparse(X[i : i + 1], layer, v, norms[i : i + 1])[0] for i in range(9)]
        np.testing.assert_array_equal(rows, codes[:9])


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_sparse_input_that_lists_an_entry_twice_means_their_sum(metric):
    # A CSR matrix may store (row, column) twice and explicit zeros; both mean what the
    # dense matrix holds. Re-ranking read entries one by one: 129 of 10,000 codes differed.
    rng = np.random.default_rng(8)
    dense = rng.poisson(1.0, size=(400, 30)).astype(np.float32)
    canonical_csr = sp.csr_matrix(dense)
    data, indices, indptr = [], [], [0]
    for i in range(len(dense)):  # each entry as two halves, then one explicit zero
        row = canonical_csr[i]
        halves = row.data / 2
        data += [halves, halves, np.zeros(1, np.float32)]
        indices += [row.indices, row.indices, row.indices[:1]]
        indptr.append(indptr[-1] + 2 * row.nnz + min(row.nnz, 1))
    doubled = sp.csr_matrix(
        (np.concatenate(data), np.concatenate(indices), np.array(indptr)), shape=dense.shape
    )
    assert not doubled.has_canonical_format
    params = {"n_clusterings": 20, "ks": [80, 10], "metric": metric, "random_state": 0}
    canonical = MBN(**params).fit(canonical_csr)
    layer, norms = canonical.bottom_layer_, input_row_norms(canonical_csr)
    for v in range(20):
        np.testing.assert_array_equal(
            bottom_codes_sparse(doubled, layer, v, norms),
            reference_bottom(dense, layer.features(v), layer.center_values(v), metric),
        )
    listed_twice = MBN(**params).fit(doubled)
    np.testing.assert_array_equal(
        listed_twice.encode(doubled, layer=0), canonical.encode(canonical_csr, layer=0)
    )
    np.testing.assert_array_equal(listed_twice.transform(doubled), canonical.transform(dense))


def test_bottom_codes_do_not_depend_on_the_batch():
    rng = np.random.default_rng(3)
    X = rng.integers(0, 4, size=(150, 6)).astype(np.float32)  # many exact ties
    features = np.arange(6)
    centers = X[:30]
    Xw = with_ones_column(X)
    whole = bottom_clustering_codes(Xw, features, centers, "euclidean")
    rows = [
        bottom_clustering_codes(Xw[i : i + 1], features, centers, "euclidean")[0]
        for i in range(150)
    ]
    np.testing.assert_array_equal(whole, rows)


@pytest.mark.parametrize("shift_fraction", [0.0, 0.3])
@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("integer_data", [True, False])
def test_direct_bottom_codes_equal_the_gemm_path(metric, shift_fraction, integer_data):
    # Small requests score centers straight from the stored rows; the codes must be the
    # ones the GEMM path gives (and the float64 nearest centers), ties included.
    rng = np.random.default_rng(6)
    X = rng.integers(0, 4, size=(200, 12)).astype(np.float64)  # many exact ties
    if not integer_data:
        X = X + rng.normal(scale=0.3, size=X.shape)
    model = MBN(
        n_clusterings=12, ks=[40, 10], metric=metric, shift_fraction=shift_fraction,
        random_state=0,
    ).fit(X)  # fmt: skip
    layer = model.bottom_layer_
    Xw = with_ones_column(X)
    norms = input_row_norms(X)
    assert len(X) > DIRECT_MAX_ROWS  # layer.clustering_codes takes the GEMM path
    for v in range(12):
        want = layer.clustering_codes(Xw, v, norms)
        direct = bottom_codes_direct(Xw, layer, v, norms)
        np.testing.assert_array_equal(direct, want)
        reference = reference_bottom(X, layer.features(v), layer.center_values(v), metric)
        np.testing.assert_array_equal(want, reference)
        subset = np.array([3, 0, 7])
        np.testing.assert_array_equal(
            layer.center_values(v, subset), layer.center_values(v)[subset]
        )


@pytest.mark.parametrize(
    ("n_rows", "n_clusterings", "n_values", "dtype"),
    [
        (300, 40, 7, np.uint8),
        (1000, 13, 300, np.uint16),
        (1, 5, 3, np.uint8),
        (50, 3, 200, np.uint32),
    ],
)
def test_posting_lists_hold_each_codes_rows_in_order(n_rows, n_clusterings, n_values, dtype):
    rng = np.random.default_rng(n_values)
    # Some values never occur: their lists are empty.
    codes = rng.integers(0, max(1, n_values - 2), size=(n_rows, n_clusterings)).astype(dtype)
    indptr, rows = _kernels.build_postings(codes, n_values)
    assert indptr.shape == (n_clusterings * n_values + 1,) and indptr[0] == 0
    for v in range(n_clusterings):
        for c in range(n_values):
            key = v * n_values + c
            np.testing.assert_array_equal(
                rows[indptr[key] : indptr[key + 1]], np.flatnonzero(codes[:, v] == c)
            )
    assert indptr[-1] == rows.size == n_rows * n_clusterings


@pytest.mark.parametrize("fraction", [0.5, 1.0])
def test_point_postings_match_brute_force(fraction):
    rng = np.random.default_rng(8)
    n_values, n_clusterings = 6, 40
    center_rows = rng.integers(0, n_values, size=(50, n_clusterings)).astype(np.uint16)
    new = rng.integers(0, n_values, size=(7, n_clusterings)).astype(np.uint8)
    centers = rng.choice(50, 20, replace=False).astype(np.int32)
    postings = PointPostings.build(new, center_rows, n_values)
    got = upper_clustering_codes(postings, center_rows, centers, n_values, np.uint64(3), fraction)
    want = reference_upper(new, center_rows[centers], n_values, 3, fraction)
    np.testing.assert_array_equal(got, want)
    # A point sharing nothing with any center gets center 0, as in the other layouts.
    lonely = np.full((1, n_clusterings), n_values - 1, np.uint8)
    rows = np.zeros((50, n_clusterings), np.uint16)
    single = PointPostings.build(lonely, rows, n_values)
    assert upper_clustering_codes(single, rows, centers, n_values, np.uint64(3), 1.0)[0] == 0


def test_point_postings_are_chosen_for_small_batches_of_wide_layers():
    # MNIST 60k, layer 2: 2000 centers over 4000 values, 60,000 center rows, V = 400.
    assert PointPostings.cheaper(1, 60000, 4000, 2000, 400, 0.5)
    assert not PointPostings.cheaper(10000, 60000, 4000, 2000, 400, 0.5)
    # Deep layers have long lists: per-center counting wins even for one row.
    assert not PointPostings.cheaper(1, 5734, 31, 15, 400, 0.5)


@pytest.mark.parametrize("threads", [None, 2])
@pytest.mark.parametrize("centers_are_points", [True, False])
@pytest.mark.parametrize("inline", [True, False])
@pytest.mark.parametrize("fraction", [0.5, 0.2, 1.0])
def test_upper_codes_match_brute_force(fraction, inline, centers_are_points, threads):
    rng = np.random.default_rng(4)
    n_values, n_clusterings = 7, 25
    codes = rng.integers(0, n_values, size=(120, n_clusterings)).astype(np.int32)
    centers = rng.choice(120, 15, replace=False).astype(np.int32)
    with ThreadPoolExecutor(threads or 1) as pool:
        postings = Postings.build(
            codes,
            codes,
            n_values,
            inline=inline,
            centers_are_points=centers_are_points,
            pool=pool if threads else None,
        )
    got = upper_clustering_codes(postings, codes, centers, n_values, np.uint64(99), fraction)
    want = reference_upper(codes, codes[centers], n_values, 99, fraction)
    np.testing.assert_array_equal(got, want)


def test_inline_layouts_agree():
    """Training's scattered copy (self left out) holds the lists of the general gather."""
    rng = np.random.default_rng(6)
    codes = rng.integers(0, 9, size=(200, 40)).astype(np.int32)
    own = Postings.build(codes, codes, 9, inline=True, centers_are_points=True)
    general = Postings.build(codes, codes, 9, inline=True)
    assert own.segments is not None and own.neighbors is not None
    assert general.segments is not None and general.neighbors is not None
    for r in range(200):
        for v in range(40):
            lists = [
                layout.neighbors[layout.segments[r, v] : layout.segments[r, v + 1]]
                for layout in (own, general)
            ]
            np.testing.assert_array_equal(lists[0], lists[1][lists[1] != r])


@pytest.mark.parametrize("inline", [True, False])
def test_upper_codes_for_new_points_use_stored_center_codes(inline):
    rng = np.random.default_rng(5)
    n_values, n_clusterings = 5, 30
    train = rng.integers(0, n_values, size=(80, n_clusterings)).astype(np.int32)
    center_rows = train[rng.choice(80, 12, replace=False)]
    new = rng.integers(0, n_values, size=(9, n_clusterings)).astype(np.int32)
    centers = np.arange(12, dtype=np.int32)
    postings = Postings.build(new, center_rows, n_values, inline=inline)
    got = upper_clustering_codes(postings, center_rows, centers, n_values, np.uint64(7), 0.5)
    np.testing.assert_array_equal(got, reference_upper(new, center_rows, n_values, 7, 0.5))
    singles = [
        upper_clustering_codes(
            Postings.build(new[i : i + 1], center_rows, n_values, inline=inline),
            center_rows,
            centers,
            n_values,
            np.uint64(7),
            0.5,
        )[0]
        for i in range(9)
    ]
    np.testing.assert_array_equal(got, singles)


def test_posting_layout_follows_list_length():
    rng = np.random.default_rng(7)
    short = rng.integers(0, 50, size=(100, 20)).astype(np.int32)  # ~2 points per list
    long = rng.integers(0, 3, size=(100, 20)).astype(np.int32)  # ~33 points per list
    assert Postings.build(short, short, 50).segments is not None
    assert Postings.build(long, long, 3).segments is None


def test_kept_fraction_is_close_to_the_request():
    keys = np.arange(200_000, dtype=np.uint64)
    kept = _kernels.dimension_kept(np.uint64(12345), keys, keep_threshold(0.3))
    assert abs(kept.mean() - 0.3) < 0.005


def test_best_scores_flags_near_ties_and_returns_the_first_maximum():
    scores = np.array(
        [[1.0, 3.0, 3.0, 2.0], [5.0, 4.0, 4.99, 0.0], [0.0, -1.0, -2.0, 9.0]], dtype=np.float32
    )
    best = np.empty(3, np.int32)
    near = np.empty(3, np.bool_)
    _bottom_kernels.best_scores(scores, np.array([0.0, 0.05, 0.5], np.float32), best, near)
    np.testing.assert_array_equal(best, [1, 0, 3])
    np.testing.assert_array_equal(near, [True, True, False])


def test_project_codes_equals_one_hot_product():
    rng = np.random.default_rng(6)
    codes = rng.integers(0, 4, size=(10, 3)).astype(np.int32)
    table = rng.normal(size=(3, 4, 2))
    offset = rng.normal(size=2)
    out = np.empty((10, 2))
    _kernels.project_codes(codes, table, offset, out)
    onehot = np.zeros((10, 12))
    onehot[np.arange(10)[:, None], codes + np.arange(3) * 4] = 1
    np.testing.assert_allclose(out, onehot @ table.reshape(12, 2) - offset)


def test_compact_values_keeps_whole_numbers_small():
    assert compact_values(np.array([[0.0, 255.0]])).dtype == np.uint8
    assert compact_values(np.array([[0.0, 256.0]])).dtype == np.uint16
    assert compact_values(np.array([[0.5, 1.0]])).dtype == np.float32
    assert compact_values(np.array([[-1.0, 1.0]])).dtype == np.float32


def test_code_index_lists_every_center_row_by_code():
    rng = np.random.default_rng(11)
    n_values = 9
    codes = rng.integers(0, n_values, size=(70, 30)).astype(np.uint8)
    index = CodeIndex.build(codes, n_values)
    assert index.rows.dtype == np.uint8  # 70 rows
    assert index.offsets.dtype == np.uint8 and index.offsets.shape == (30, n_values + 1)
    for v in range(30):
        for c in range(n_values):
            listed = index.rows_with(v, c)
            np.testing.assert_array_equal(listed, np.flatnonzero(codes[:, v] == c))
    rebuilt = index.codes()
    assert rebuilt.dtype == codes.dtype
    np.testing.assert_array_equal(rebuilt, codes)


@pytest.mark.parametrize("storage", ["index", "matrix"])
@pytest.mark.parametrize("fraction", [0.5, 0.2, 1.0])
def test_upper_codes_few_match_brute_force(storage, fraction):
    rng = np.random.default_rng(12)
    n_values, n_prev, V, k = 6, 40, 5, 12
    center_codes = rng.integers(0, n_values, size=(50, n_prev)).astype(np.uint8)
    centers = np.stack([rng.choice(50, k, replace=False) for _ in range(V)]).astype(np.uint8)
    seeds = rng.integers(0, 2**63, size=V, dtype=np.int64).astype(np.uint64)
    layer = UpperLayer(
        centers, seeds, n_values, fraction,
        index=CodeIndex.build(center_codes, n_values) if storage == "index" else None,
        stored_codes=center_codes if storage == "matrix" else None,
    )  # fmt: skip
    points = rng.integers(0, n_values, size=(7, n_prev)).astype(np.uint8)
    points[3] = center_codes[centers[0, 4]]  # a point equal to a center
    points[5] = n_values - 1  # shares little: ties go to the lowest center
    got = layer.codes_few(points)
    for w in range(V):
        want = reference_upper(points, center_codes[centers[w]], n_values, seeds[w], fraction)
        np.testing.assert_array_equal(got[:, w], want)
        # The layouts that large batches use give the same codes.
        postings = Postings.build(points, center_codes, n_values)
        batch = upper_clustering_codes(
            postings, center_codes, centers[w].astype(np.int32), n_values, seeds[w], fraction
        )
        np.testing.assert_array_equal(got[:, w], batch)
    np.testing.assert_array_equal(layer.center_codes, center_codes)


def test_upper_layer_keeps_an_index_for_wide_layers_and_the_matrix_for_deep_ones():
    rng = np.random.default_rng(13)
    V = 400
    seeds = np.zeros(V, np.uint64)
    # MNIST-60k shapes: layer 2 (2000 centers, codes < 4000) and the top (15 of < 31).
    wide_codes = rng.integers(0, 4000, size=(3000, V)).astype(np.uint16)
    wide = UpperLayer.create(np.zeros((V, 2000), np.uint16), wide_codes, seeds, 4000, 0.5)
    deep_codes = rng.integers(0, 31, size=(3000, V)).astype(np.uint8)
    deep = UpperLayer.create(np.zeros((V, 15), np.uint16), deep_codes, seeds, 31, 0.5)
    assert wide.index is not None and wide.stored_codes is None
    assert deep.stored_codes is not None and deep.index is None
    # The index replaces the matrix: as many row numbers as codes, in as narrow a dtype.
    assert wide.index.rows.nbytes == wide_codes.nbytes


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("integer_data", [True, False])
def test_bottom_codes_few_equal_the_gemm_path(metric, integer_data):
    rng = np.random.default_rng(14)
    X = rng.integers(0, 4, size=(200, 12)).astype(np.float64)  # many exact ties
    if not integer_data:
        X = X + rng.normal(scale=0.3, size=X.shape)
    model = MBN(n_clusterings=15, ks=[40, 10], metric=metric, random_state=0).fit(X)
    layer = model.bottom_layer_
    assert layer.few_rows_supported
    Xw = with_ones_column(X)
    norms = input_row_norms(X)
    want = np.stack([layer.clustering_codes(Xw, v, norms) for v in range(15)], axis=1)
    for start in range(0, 200, 7):
        rows = slice(start, start + 7)
        got = layer.codes_few(X[rows].astype(np.float32), norms[rows])
        np.testing.assert_array_equal(got, want[rows])


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
@pytest.mark.parametrize("integer_data", [True, False])
def test_bottom_small_batches_of_any_size_equal_every_other_path(metric, integer_data):
    # ``codes_few`` scores one row in one pass over the stored rows and 2 or more clustering
    # by clustering in register tiles of several rows; both must give the GEMM path's codes
    # and each other's, whatever the batch size, near ties included. Midpoints of two stored
    # rows are equidistant from both on every choice of dimensions: exact ties in real
    # arithmetic, which float32 scores see as near ties (the float data nudges some of them
    # off by less than the tolerance). A zero row ties every center in cosine similarity.
    rng = np.random.default_rng(52)
    fit_rows = rng.integers(0, 6, size=(300, 40)).astype(np.float64)
    if not integer_data:
        fit_rows += rng.normal(scale=0.4, size=fit_rows.shape)
    model = MBN(n_clusterings=24, ks=[101, 20], metric=metric, random_state=0).fit(fit_rows)
    layer = model.bottom_layer_
    assert layer.few_rows_supported
    stored = np.asarray(layer.center_data, dtype=np.float64)
    pairs = rng.integers(0, len(stored), size=(150, 2))
    midpoints = (stored[pairs[:, 0]] + stored[pairs[:, 1]]) / 2
    if not integer_data:
        midpoints[::3] += rng.normal(scale=1e-6, size=midpoints[::3].shape)
    others = rng.integers(0, 6, size=(150, 40)).astype(np.float64)
    new_rows = np.vstack([midpoints, others, np.zeros((6, 40))])
    X = rng.permutation(new_rows).astype(np.float32)
    norms = input_row_norms(X)
    want = np.stack(
        [layer.clustering_codes(with_ones_column(X), v, norms) for v in range(24)], axis=1
    )
    singles = np.vstack([layer.codes_few(X[i : i + 1], norms[i : i + 1]) for i in range(len(X))])
    np.testing.assert_array_equal(singles, want)
    start = 0
    while start < len(X):
        stop = start + int(rng.integers(1, 65))
        got = layer.codes_few(X[start:stop], norms[start:stop])
        np.testing.assert_array_equal(got, want[start:stop])
        start = stop
    # The batch kernel met near ties and handed them back for exact re-ranking.
    codes = np.empty((64, 24), dtype=np.int32)
    n_ties, _, _ = _bottom_kernels.bottom_codes_batch(
        X[:64], layer.center_data, layer.centers, layer._masks, layer._center_sq_norms,
        metric == "cosine", TIE_MARGIN, norms[:64], codes, np.empty((1, 4), np.int64),
        np.empty(1, np.int64),
    )  # fmt: skip
    assert n_ties > 10
