"""The layout pipeline (mbn_core.pipeline.layouts): one fit of the method, its student on
every row, and a report of students on rows they never saw, against the one layout."""

import numpy as np
import pytest
from sklearn.datasets import make_blobs
from sklearn.decomposition import PCA

from mbn_core.distill.student import Distiller
from mbn_core.exceptions import TrainingStopped
from mbn_core.pipeline.layouts import CROSS_FITTED, HELD_OUT, run_layout_pipeline

DISTILLER = Distiller(
    hidden_layer_sizes=(16,),
    max_epochs=8,
    batch_size=64,
    learning_rate=1e-2,
    alpha=1e-5,
    n_iter_no_change=None,
    input_noise=0.0,
    input_components=None,
    tol=1e-4,
    threads=1,
)


class CountingLayout:
    """A stand-in layout method: PCA's projection of the rows it is fitted on, counting its
    fits (the pipeline must fit the method once)."""

    def __init__(self):
        self.fits = 0

    def fit_transform(self, X):
        self.fits += 1
        return PCA(2, random_state=0).fit_transform(X)


def students(log):
    def fit(X, layout, split, rng, own):
        log.append((X.shape[0], own))
        student = DISTILLER.distil(X, layout, split.validation, split.train, rng, None)
        return student.embed, student

    return fit


def run(X, y, n_folds, **kwargs):
    log = []
    layout = CountingLayout()
    result = run_layout_pipeline(
        X,
        y,
        layout,
        students(log),
        holdout_fraction=kwargs.pop("holdout_fraction", 0.2),
        n_folds=n_folds,
        validation_fraction=0.1,
        n_clusters=kwargs.pop("n_clusters", 3),
        rng=np.random.RandomState(0),
        **kwargs,
    )
    return result, layout, log


@pytest.fixture(scope="module")
def blobs():
    X, y = make_blobs(n_samples=200, n_features=8, centers=3, random_state=0)
    return X.astype(np.float32), y


def test_cross_fitted_students_against_one_layout(blobs):
    X, y = blobs
    result, layout, log = run(X, y, 5)
    assert layout.fits == 1  # the method is fitted once, on every row
    # The model's student first, on every row, then one student per fold on the others.
    assert log[0] == (200, True) and [entry for entry in log[1:]] == [(160, False)] * 5
    assert np.array_equal(result.fitted_rows, np.arange(200)) and len(result.holdout) == 0
    fidelity = result.fidelity
    assert fidelity["holdout"] == CROSS_FITTED and fidelity["folds"] == 5
    assert fidelity["n_holdout"] == 200  # every row measured by a student that never saw it
    assert fidelity["r2"] > 0.9 and fidelity["nmi_labels_exact"] > 0.9
    assert fidelity["cluster_agreement"] > 0.9
    quality = result.quality
    assert quality["n_rows"] == 40 and quality["exact"]["trustworthiness"] > 0.8
    assert result.centers.shape == (3, 2)
    # The model's fast path is the student trained on every row.
    assert result.fitted.fast(X[:5]).shape == (5, 2)


def test_one_held_out_share_on_large_data(blobs):
    X, y = blobs
    result, layout, log = run(X, y, None, holdout_fraction=0.2)
    assert layout.fits == 1 and log == [(200, True), (160, False)]
    assert result.fidelity["holdout"] == HELD_OUT and "folds" not in result.fidelity
    assert result.fidelity["n_holdout"] == 40


def test_stopping_between_students(blobs):
    X, y = blobs
    told = []

    def fold_done(done, total):
        told.append((done, total))
        return done == 2

    with pytest.raises(TrainingStopped, match="student 2 of 5"):
        run(X, y, 5, fold_done=fold_done)
    assert told == [(1, 5), (2, 5)]


def test_more_folds_than_rows(blobs):
    X, y = blobs
    with pytest.raises(ValueError, match="report_folds=5 is more than the 4 rows"):
        run(X[:4], y[:4], 5)
