"""The layout methods (mbn_core.layouts): their libraries' fits on tiny data, the exact maps
(quality on new rows, bit-identical after a round trip through arrays), and the refusals.

Fits run on a few hundred rows with few iterations: the libraries are real, the data small.
"""

import itertools

import numba
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.cluster import KMeans
from sklearn.datasets import make_blobs
from sklearn.metrics import normalized_mutual_info_score

from mbn_core.exceptions import MethodFailed, MethodUnavailable, NoExactMap, TrainingStopped
from mbn_core.layouts import TSNE, UMAP, DensMAP, PaCMAP, TriMap
from mbn_core.layouts.base import INSTALL_LINE, describe_error

# Short fits: enough iterations to separate well-apart blobs.
FAST = {
    TSNE: {"early_exaggeration_iter": 50, "n_iter": 100, "perplexity": 10.0},
    UMAP: {"n_epochs": 60, "n_neighbors": 10},
    DensMAP: {"n_epochs": 60, "n_neighbors": 10},
    PaCMAP: {"num_iters": 250},
    TriMap: {"n_iters": 150},
}
EXACT = (TSNE, UMAP, PaCMAP)


def blobs(n, seed=0):
    X, y = make_blobs(n_samples=n, n_features=20, centers=4, cluster_std=1.0, random_state=seed)
    return X.astype(np.float32), y


def nmi(Z, y):
    labels = KMeans(len(np.unique(y)), n_init=10, random_state=0).fit_predict(Z)
    return normalized_mutual_info_score(y, labels)


def make(cls, **params):
    return cls(**{**FAST[cls], "random_state": 0, **params})


@pytest.fixture(scope="module")
def data():
    X, y = blobs(360)
    return X[:300], y[:300], X[300:], y[300:]


@pytest.fixture(scope="module")
def fitted(data):
    X, _, _, _ = data
    return {cls: make(cls).fit(X) for cls in FAST}


@pytest.mark.slow
@pytest.mark.parametrize("cls", list(FAST), ids=lambda cls: cls.__name__)
def test_layout_separates_the_clusters(cls, data, fitted):
    X, y, _, _ = data
    model = fitted[cls]
    assert model.embedding_.shape == (len(X), 2)
    assert model.n_features_in_ == X.shape[1] and model.n_components_ == 2
    assert nmi(model.embedding_, y) > 0.9


@pytest.mark.slow
@pytest.mark.parametrize("cls", EXACT, ids=lambda cls: cls.__name__)
def test_exact_map_places_new_rows_and_survives_arrays(cls, data, fitted):
    _, _, X_new, y_new = data
    model = fitted[cls]
    placed = model.transform(X_new)
    assert placed.shape == (len(X_new), 2)
    assert nmi(placed, y_new) > 0.9
    # Every call starts from the stored state, and a model rebuilt from its plain arrays
    # answers bit for bit.
    assert np.array_equal(model.transform(X_new), placed)
    arrays = model.to_arrays()
    assert all(isinstance(a, np.ndarray) and a.dtype != object for a in arrays.values())
    rebuilt = cls.from_arrays(arrays, model.get_params())
    assert np.array_equal(rebuilt.transform(X_new), placed)
    assert rebuilt.nbytes > 0


@pytest.mark.slow
@pytest.mark.parametrize("cls", [TSNE, PaCMAP], ids=lambda cls: cls.__name__)
def test_batch_independent_exact_maps(cls, data, fitted):
    """openTSNE (with the exact neighbours) and PaCMAP place each row on its own."""
    _, _, X_new, _ = data
    model = fitted[cls]
    assert np.array_equal(model.transform(X_new[:7]), model.transform(X_new)[:7])


@pytest.mark.slow
def test_umap_transform_depends_on_the_batch(data, fitted):
    """umap-learn prunes edges and samples negatives over the whole batch (recorded, so the
    registry's flag says so)."""
    _, _, X_new, _ = data
    model = fitted[UMAP]
    assert not np.array_equal(model.transform(X_new[:7]), model.transform(X_new)[:7])


@pytest.mark.slow
@pytest.mark.parametrize("cls", [DensMAP, TriMap], ids=lambda cls: cls.__name__)
def test_no_exact_map_refuses_and_points_to_the_fast_path(cls, data, fitted):
    _, _, X_new, _ = data
    model = fitted[cls]
    with pytest.raises(NoExactMap, match="fast path"):
        model.transform(X_new)
    rebuilt = cls.from_arrays(model.to_arrays(), model.get_params())
    assert rebuilt.n_features_in_ == X_new.shape[1] and rebuilt.n_components_ == 2
    with pytest.raises(NoExactMap):
        rebuilt.transform(X_new)


@pytest.mark.slow
def test_seeded_fits_repeat(data):
    X, _, _, _ = data
    for cls in (TSNE, UMAP, PaCMAP, TriMap):
        first, second = make(cls).fit(X).embedding_, make(cls).fit(X).embedding_
        assert np.array_equal(first, second), cls.__name__


@pytest.mark.slow
def test_fit_leaves_numba_threads_as_they_were(data):
    X, _, _, _ = data
    before = numba.get_num_threads()
    make(PaCMAP, n_jobs=1).fit(X[:60])
    assert numba.get_num_threads() == before


@pytest.mark.slow
def test_tsne_callback_reports_and_stops(data):
    X, _, _, _ = data
    seen = []
    make(TSNE, callback=lambda done, total: seen.append((done, total))).fit(X[:100])
    assert seen and seen[-1] == (150, 150)
    assert all(b[0] >= a[0] for a, b in itertools.pairwise(seen))
    with pytest.raises(TrainingStopped):
        make(TSNE, callback=lambda done, total: done >= 20).fit(X[:100])


# ---------------------------------------------------------------------- refusals (quick)


@pytest.mark.parametrize(
    ("cls", "params", "rows", "named"),
    [
        (TSNE, {"perplexity": 30.0}, 90, "perplexity=30 needs at least 91 rows"),
        (UMAP, {"n_neighbors": 15}, 15, "n_neighbors=15"),
        (DensMAP, {"n_neighbors": 40}, 40, "needs at least 41 rows"),
        (PaCMAP, {"n_neighbors": 10}, 11, "n_neighbors=10 needs at least 12 rows"),
        (TriMap, {}, 17, "n_inliers=12 with n_outliers=4 needs at least 18 rows"),
    ],
)
def test_too_few_rows_for_the_neighbourhood(cls, params, rows, named):
    X, _ = blobs(rows)
    with pytest.raises(ValueError, match=named):
        cls(**params).fit(X)
    cls(**params).check_rows(rows + 1)


@pytest.mark.parametrize(
    ("cls", "params"),
    [(TSNE, {}), (UMAP, {"init": "pca"}), (PaCMAP, {"init": "random"}), (TriMap, {})],
    ids=lambda value: getattr(value, "__name__", ""),
)
def test_a_pca_start_needs_as_many_features_as_components(cls, params):
    X, _ = blobs(120)
    with pytest.raises(ValueError, match="needs at least 2 features, got 1"):
        cls(**params).fit(X[:, :1])


@pytest.mark.parametrize("cls", list(FAST), ids=lambda cls: cls.__name__)
def test_rows_that_do_not_differ_are_refused_as_for_every_method(cls):
    X, _ = blobs(120)
    with pytest.raises(ValueError, match="every row is the same"):
        cls().fit(np.ones_like(X))
    with pytest.raises(ValueError, match="values as large as"):
        cls().fit(X * 1e20)


@pytest.mark.parametrize("cls", list(FAST), ids=lambda cls: cls.__name__)
def test_bad_input_is_refused_before_the_library(cls):
    X, _ = blobs(120)
    bad = X.copy()
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        cls().fit(bad)
    bad[3, 2] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        cls().fit(bad)
    with pytest.raises(ValueError, match="2D"):
        cls().fit(X[0])
    with pytest.raises(TypeError, match=r"[Ss]parse"):
        cls().fit(sp.csr_matrix(X))


@pytest.mark.parametrize(
    ("cls", "params", "named"),
    [
        (TSNE, {"perplexity": -1}, "perplexity"),
        (TSNE, {"n_components": 4}, "n_components"),
        (TSNE, {"layout_learning_rate": "fast"}, "layout_learning_rate"),
        (UMAP, {"min_dist": 2.0}, "min_dist=2 must be at most spread=1"),
        (UMAP, {"metric": "hamming"}, "metric"),
        (DensMAP, {"dens_frac": 1.5}, "dens_frac"),
        (PaCMAP, {"num_iters": 200}, "num_iters"),
        (PaCMAP, {"apply_pca": 1}, "apply_pca"),
        (TriMap, {"n_components": 1}, "n_components"),
        (TriMap, {"n_inliers": True}, "n_inliers"),
    ],
)
def test_bad_parameters_name_themselves(cls, params, named):
    X, _ = blobs(120)
    with pytest.raises(ValueError, match=named):
        cls(**params).fit(X)


def test_a_missing_library_gives_the_install_line():
    class Missing(PaCMAP):
        library = "mbn_no_such_library"

    X, _ = blobs(120)
    with pytest.raises(MethodUnavailable, match=r"pip install 'mbn-embeddings\[methods\]'"):
        Missing().fit(X)
    assert not Missing.available() and PaCMAP.available()
    assert "methods" in INSTALL_LINE


def test_a_library_error_names_the_method_and_hides_paths():
    class Broken(PaCMAP):
        def _fit_layout(self, module, X):
            raise RuntimeError("cannot open /srv/mbn/data/jobs/17/x.npy: disk on fire")

    X, _ = blobs(120)
    with pytest.raises(MethodFailed) as caught:
        Broken().fit(X)
    message = str(caught.value)
    assert message.startswith("PaCMAP failed in fit: ")
    assert "disk on fire" in message and "/srv" not in message


def test_describe_error_is_one_short_line():
    assert describe_error(ValueError("")) == "ValueError (no message)"
    long = describe_error(ValueError("x\n" * 500))
    assert "\n" not in long and len(long) <= 300


def test_corrupt_arrays_are_named():
    with pytest.raises(ValueError, match="'shape'"):
        TSNE.from_arrays({}, {})
    shape = np.array([20, 2])
    with pytest.raises(ValueError, match="'X_fit'"):
        TSNE.from_arrays({"shape": shape}, {})
    with pytest.raises(ValueError, match="'embedding'"):
        TSNE.from_arrays(
            {"shape": shape, "X_fit": np.zeros((5, 20), np.float32), "embedding": np.zeros((4, 2))},
            {},
        )
    with pytest.raises(ValueError, match="'curve'"):
        UMAP.from_arrays(
            {"shape": shape, "X_fit": np.zeros((5, 20), np.float32), "embedding": np.zeros((5, 2))},
            {},
        )
    with pytest.raises(ValueError, match="components"):
        TriMap.from_arrays({"shape": np.array([20, 3])}, {})
