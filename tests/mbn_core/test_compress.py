"""CompressiveMBN: fitting, fidelity report, cluster head, determinism, bad input."""

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.exceptions import NotFittedError
from sklearn.metrics import r2_score
from sklearn.neural_network import MLPRegressor
from sklearn.utils.estimator_checks import parametrize_with_checks
from sklearn.utils.validation import check_is_fitted

from mbn_core import MBN, CompressiveMBN, TrainingStopped, model_to_arrays
from mbn_core.distill.student import FINAL_STEP, _partial_fit, step_factor
from mbn_core.pipeline.fidelity import fidelity_report, knn_overlap
from mbn_core.pipeline.report import standard_errors
from mbn_core.pipeline.split import (
    AUTO_FOLDS,
    CROSS_FIT_BELOW,
    fold_fit_rows,
    measured_fold_count,
    teacher_fit_rows,
)


def small_mbn(**params):
    return MBN(**{"n_clusterings": 30, "k1": 0.1, "random_state": 0, **params})


def small_model(**params):
    # One held-out set unless a test asks for cross-fitting (K more fits, slower).
    defaults = {
        "hidden_layer_sizes": (64, 64),
        "max_epochs": 15,
        "random_state": 0,
        "report_folds": None,
    }
    return CompressiveMBN(**{"teacher": small_mbn(), **defaults, **params})


@pytest.fixture(scope="module")
def fitted(digits):
    X, y = digits
    return small_model(n_clusters=10).fit(X, y)


@pytest.mark.slow
@parametrize_with_checks(
    [
        CompressiveMBN(
            MBN(n_clusterings=5, k1=0.5, n_classes=1, n_components=2, random_state=0),
            hidden_layer_sizes=(8,),
            max_epochs=2,
            random_state=0,
        )
    ]
)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


@pytest.mark.slow
def _mlp_forward(model, X) -> np.ndarray:
    """The fast path recomputed from the fitted weights: ReLU layers, then a linear output,
    then the targets' scale and mean."""
    hidden = np.asarray(model.input_map_.transform(np.asarray(X, dtype=np.float32)), np.float64)
    layers = list(zip(model.mlp_.coefs_, model.mlp_.intercepts_, strict=True))
    for weights, bias in layers[:-1]:
        hidden = np.maximum(hidden @ weights + bias, 0.0)
    weights, bias = layers[-1]
    return (hidden @ weights + bias) * model.target_scale_ + model.target_mean_


def test_transform_is_the_mlp_and_exact_transform_the_teacher(fitted, digits):
    X, _ = digits
    fast = fitted.transform(X[:50])
    exact = fitted.exact_transform(X[:50])
    assert fast.dtype == np.float32 and exact.dtype == np.float64
    assert fast.shape == exact.shape == (50, fitted.n_components_) == (50, 10)
    np.testing.assert_allclose(fast, _mlp_forward(fitted, X[:50]), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(exact, fitted.teacher_.transform(X[:50]))
    assert fitted.n_features_in_ == 64
    assert fitted.n_samples_ == len(X)


@pytest.mark.slow
def test_fidelity_report_is_complete_and_faithful(fitted):
    report = fitted.fidelity_
    assert report["n_holdout"] == round(0.1 * 1797) == len(fitted.holdout_)
    assert report["holdout"] == "outside the teacher's fit"
    keys = ("r2", "cosine", "cosine_median", "knn_overlap", "nmi_fast_exact")
    for key in (*keys, "nmi_labels_exact", "nmi_labels_fast"):
        assert 0.0 <= report[key] <= 1.0, key
    # Even this tiny MBN and MLP track the exact embedding on unseen points.
    assert report["r2"] > 0.5
    assert report["cosine"] > 0.7
    assert report["nmi_fast_exact"] > 0.6
    assert report["cluster_agreement"] > 0.7
    assert set(fitted.timings_) == {"teacher", "compressor", "evaluation"}


@pytest.mark.slow
def test_quality_report_on_the_held_out_points(fitted):
    report = fitted.quality_
    assert report["n_rows"] == fitted.fidelity_["n_holdout"] and report["n_neighbors"] == 10
    for name in ("exact", "fast", "pca"):
        for key in ("trustworthiness", "continuity"):
            assert 0.5 < report[name][key] <= 1.0, (name, key)
    assert report["pca"]["n_components"] == fitted.n_components_


@pytest.mark.slow
def test_no_row_of_the_report_is_in_the_mbn_fit(fitted, digits):
    # The MBN must be exactly the one fitted on the other rows: refitting the same MBN on
    # them reproduces every array, so no held-out row took part in the fit.
    X, _ = digits
    holdout = fitted.holdout_
    assert len(np.unique(holdout)) == len(holdout)
    rest = np.setdiff1d(np.arange(len(X)), holdout)
    refit = small_mbn().fit(X[rest].astype(np.float32))
    for name, array in model_to_arrays(refit).items():
        np.testing.assert_array_equal(model_to_arrays(fitted.teacher_)[name], array, err_msg=name)
    # And no held-out row is a bottom-layer center (the rows a fit keeps of its data).
    centers = {
        row.tobytes() for row in fitted.teacher_.bottom_layer_.center_data.astype(np.float32)
    }
    in_fit = {row.tobytes() for row in X[rest].astype(np.float32)}
    held_out = [X[i].astype(np.float32).tobytes() for i in holdout]
    assert not [row for row in held_out if row in centers and row not in in_fit]


@pytest.mark.slow
def test_report_agrees_with_a_test_set(digits):
    # The report's rows are new to the MBN: its fast-exact agreement is that of new data,
    # here rows outside the training set altogether.
    X, y = digits
    model = small_model(max_epochs=8).fit(X[:1200], y[:1200])
    fast, exact = model.transform(X[1200:]), model.exact_transform(X[1200:])
    test_r2 = r2_score(exact, fast, multioutput="variance_weighted")
    assert abs(model.fidelity_["r2"] - test_r2) < 0.1
    assert model.fidelity_["knn_overlap"] == pytest.approx(
        knn_overlap(model.exact_transform(X[model.holdout_]), model.transform(X[model.holdout_]))
    )


class RecordingMBN(MBN):
    """An MBN that notes the rows and the output asked for of every fit (the report's folds
    must not be in theirs, and must repeat the model's choice of output)."""

    fits: list[set[bytes]] = []
    outputs: list[str] = []

    def fit_transform(self, X, y=None):
        RecordingMBN.fits.append({row.tobytes() for row in np.asarray(X, dtype=np.float32)})
        RecordingMBN.outputs.append(self.output)
        return super().fit_transform(X, y)


@pytest.mark.slow
def test_cross_fitted_report_measures_every_row_with_a_fit_that_never_saw_it(digits):
    X, y = digits
    X, y = X[:600].astype(np.float32), y[:600]
    distinct = np.sort(np.unique(X, axis=0, return_index=True)[1])  # told apart by bytes
    X, y = X[distinct], y[distinct]
    rows = [row.tobytes() for row in X]
    RecordingMBN.fits, RecordingMBN.outputs = [], []
    teacher = RecordingMBN(n_clusterings=30, k1=0.1, random_state=0)
    model = small_model(teacher=teacher, max_epochs=8, report_folds=3).fit(X, y)
    # output="auto" decides once, on every row; the folds' teachers are asked for its choice.
    assert RecordingMBN.outputs == ["auto", *[model.teacher_.output_] * 3]
    report = model.fidelity_
    assert report["holdout"] == "cross-fitted" and report["folds"] == 3
    assert report["n_holdout"] == len(X) and len(model.holdout_) == 0
    # The model's own fit has every row; then one fit per fold, each without its fold.
    model_fit, *fold_fits = RecordingMBN.fits
    assert model_fit == set(rows) and len(fold_fits) == 3
    left_out = [set(rows) - fit for fit in fold_fits]
    assert sum(len(fold) for fold in left_out) == len(X)
    assert set().union(*left_out) == set(rows)  # every row left out once, by its own fold
    assert all(len(fold) >= len(X) // 3 for fold in left_out)
    for key in ("r2", "cosine", "knn_overlap", "nmi_fast_exact", "nmi_labels_fast"):
        assert 0.0 < report[key] <= 1.0, key
    assert model.quality_["n_rows"] == len(left_out[0])
    # The report is of new data: its R^2 is that of rows outside the training set.
    test = slice(600, None)
    fast, exact = model.transform(digits[0][test]), model.exact_transform(digits[0][test])
    assert abs(report["r2"] - r2_score(exact, fast, multioutput="variance_weighted")) < 0.1
    assert "3-fold cross-fitting" in fidelity_report(report)
    # An explicit K measures every fold; the figures carry their spread over the folds.
    assert report["folds_measured"] == 3
    errors = report["standard_error"]
    assert errors["r2"] is not None and 0 <= errors["r2"] < 0.5
    assert f"R^2 {report['r2']:.4f} ± {errors['r2']:.4f}" in fidelity_report(report)


def test_report_folds_auto_cross_fits_small_data_only():
    # A held-out tenth below CROSS_FIT_BELOW rows is cross-fitted, with AUTO_FOLDS folds.
    assert teacher_fit_rows(1797, 0.1, "auto") == 1797
    assert fold_fit_rows(1797, 0.1, "auto") == 1797 - 360
    assert teacher_fit_rows(5000, 0.1, "auto") == 4500 == fold_fit_rows(5000, 0.1, "auto")
    assert teacher_fit_rows(1797, 0.1, None) == 1617
    assert teacher_fit_rows(1797, 0.1, 4) == 1797 and fold_fit_rows(1797, 0.1, 4) == 1347
    assert CROSS_FIT_BELOW == 500 and AUTO_FOLDS == 5


def test_report_folds_auto_measures_the_folds_that_make_enough_rows():
    # "auto" fits and measures the fewest of its folds that hold CROSS_FIT_BELOW rows, and
    # at least two (their spread is the standard error); an explicit K measures all.
    assert measured_fold_count(1797, 5, "auto") == 2  # folds of 359 or 360 rows
    assert measured_fold_count(1249, 5, "auto") == 3  # 249 rows each: 2 make only 498
    assert measured_fold_count(1250, 5, "auto") == 2
    assert measured_fold_count(400, 5, "auto") == 5  # all 400 rows, fewer than 500
    assert measured_fold_count(4000, 5, "auto") == 2
    assert measured_fold_count(1797, 5, 5) == 5 and measured_fold_count(300, 3, 3) == 3


def test_standard_errors_are_those_of_the_folds_mean():
    reports = [
        {"r2": 0.9, "cosine": 0.95, "nmi_labels_exact": None},
        {"r2": 0.8, "cosine": 0.97, "nmi_labels_exact": None},
        {"r2": 0.7, "cosine": 0.96, "nmi_labels_exact": None},
    ]
    errors = standard_errors(reports)
    assert errors["r2"] == pytest.approx(np.std([0.9, 0.8, 0.7], ddof=1) / np.sqrt(3))
    assert errors["cosine"] == pytest.approx(0.01 / np.sqrt(3))
    assert errors["nmi_labels_exact"] is None  # not measured without labels
    assert "knn_overlap" not in errors  # a figure the reports do not have
    assert standard_errors(reports[:1])["r2"] is None  # one fold has no spread


@pytest.mark.slow
def test_prefit_teacher_keeps_the_held_out_report(digits):
    X = digits[0].astype(np.float32)
    mbn = small_mbn().fit(X[:500])
    model = CompressiveMBN(mbn, prefit=True, hidden_layer_sizes=(16,), max_epochs=2).fit(X)
    report = model.fidelity_
    assert report["holdout"] == "prefit teacher"  # report_folds="auto" ignored
    # One held-out tenth, kept out of the MLP's training; the teacher is used as it is.
    holdout = model.holdout_
    assert len(holdout) == report["n_holdout"] == round(0.1 * len(X))
    assert model.teacher_ is mbn and len(model.embedding_) == len(X) - len(holdout)
    np.testing.assert_array_equal(
        model.embedding_, mbn.transform(np.delete(X, holdout, axis=0)).astype(np.float32)
    )
    # The report's numbers are those of the prefit teacher against the MLP on those rows.
    exact = mbn.transform(X[holdout])
    fast = model.transform(X[holdout]).astype(np.float64)
    assert report["r2"] == pytest.approx(r2_score(exact, fast, multioutput="variance_weighted"))
    assert report["knn_overlap"] == pytest.approx(knn_overlap(exact, fast))
    norms = np.linalg.norm(exact, axis=1) * np.linalg.norm(fast, axis=1)
    assert report["cosine"] == pytest.approx(np.mean(np.sum(exact * fast, axis=1) / norms))


def test_knn_overlap():
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(60, 3))
    assert knn_overlap(Z, Z) == 1.0
    assert knn_overlap(Z, 2 * Z + 1) == 1.0  # neighbours survive scaling and shifts
    assert knn_overlap(Z, rng.normal(size=(60, 3))) < 0.4
    assert knn_overlap(Z[:10], Z[:10]) is None  # no 10 neighbours among 10 rows


@pytest.mark.slow
def test_removed_leave_self_out_targets_are_refused(digits):
    X, _ = digits
    for targets in ("leave-self-out", "self"):
        with pytest.raises(ValueError, match="targets"):
            small_model(targets=targets).fit(X[:100])


@pytest.mark.slow
def test_labels_are_optional(digits):
    X, _ = digits
    model = small_model(max_epochs=2).fit(X)
    assert model.fidelity_["nmi_labels_exact"] is None
    assert model.fidelity_["cluster_agreement"] is None
    with pytest.raises(ValueError, match="no clustering head"):
        model.predict_clusters(X[:3])


@pytest.mark.slow
def test_exact_transform_is_the_mbn(fitted, digits):
    X, _ = digits
    np.testing.assert_array_equal(fitted.exact_transform(X[:20]), fitted.teacher_.transform(X[:20]))


@pytest.mark.slow
def test_cluster_head(fitted, digits):
    X, _ = digits
    fast = fitted.predict_clusters(X[:200])
    exact = fitted.predict_clusters(X[:200], mode="exact")
    assert fast.dtype == exact.dtype == np.int64
    assert set(np.unique(fast)) <= set(range(10))
    assert np.mean(fast == exact) > 0.8
    with pytest.raises(ValueError, match="mode"):
        fitted.predict_clusters(X[:2], mode="slow")


@pytest.mark.slow
def test_same_seed_same_model(digits):
    X, _ = digits
    first = small_model(max_epochs=3).fit(X)
    second = small_model(max_epochs=3).fit(X)
    np.testing.assert_array_equal(first.transform(X[:30]), second.transform(X[:30]))
    assert first.fidelity_ == second.fidelity_
    assert first.quality_ == second.quality_


@pytest.mark.slow
def test_transform_is_batch_independent(fitted, digits):
    X, _ = digits
    batch = fitted.transform(X[:10])
    rows = np.vstack([fitted.transform(X[i : i + 1]) for i in range(10)])
    np.testing.assert_allclose(batch, rows, rtol=1e-5, atol=1e-5 * np.abs(batch).max())


@pytest.mark.slow
def test_prefit_mbn_is_used_as_is(digits):
    X, _ = digits
    mbn = small_mbn().fit(X)
    model = CompressiveMBN(mbn, prefit=True, hidden_layer_sizes=(16,), max_epochs=2).fit(X)
    assert model.teacher_ is mbn
    with pytest.raises(ValueError, match="features"):
        CompressiveMBN(mbn, prefit=True, max_epochs=1).fit(X[:, :10])


def test_unfitted_prefit_mbn_is_refused(digits):
    X, _ = digits
    with pytest.raises(NotFittedError):
        CompressiveMBN(small_mbn(), prefit=True).fit(X)


@pytest.mark.slow
def test_sparse_input(digits):
    X, _ = digits
    model = small_model(max_epochs=2).fit(sp.csr_matrix(X))
    assert model.input_sparse_
    assert model.input_map_.projection is not None  # 64 features > input_components
    dense = model.transform(X[:5])
    np.testing.assert_allclose(model.transform(sp.csr_matrix(X[:5])), dense, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_wide_input_reaches_the_mlp_projected(digits):
    X, _ = digits
    model = small_model(max_epochs=1, input_components=16).fit(X)
    assert model.input_map_.projection is not None
    assert model.mlp_.coefs_[0].shape[0] == 16
    plain = small_model(max_epochs=1, input_components=None).fit(X)
    assert plain.input_map_.projection is None
    assert plain.mlp_.coefs_[0].shape[0] == X.shape[1]


@pytest.mark.slow
def test_wide_input_with_fewer_rows_than_input_components(digits):
    from mbn_core.distill.onnx import OnnxEmbedder, to_onnx

    X, _ = digits
    model = small_model(max_epochs=2, teacher=small_mbn(n_clusterings=5, k1=0.5)).fit(X[:12])
    n_fitted = 12 - len(model.holdout_)
    # Projected onto the directions the fitted rows span (at most their count - 1).
    assert model.input_map_.n_outputs <= n_fitted - 1
    fast = model.transform(X[100:110])
    assert np.all(np.isfinite(fast))
    np.testing.assert_allclose(OnnxEmbedder(to_onnx(model)).embed(X[100:110]), fast, atol=1e-4)


@pytest.mark.slow
def test_callback_sees_every_epoch_and_can_stop(digits):
    X, _ = digits
    seen = []

    def callback(epoch, total, loss):
        seen.append((epoch, total, loss))
        return epoch == 2

    model = small_model(max_epochs=10, callback=callback)
    with pytest.raises(TrainingStopped):
        model.fit(X)
    assert [s[0] for s in seen] == [1, 2]
    assert all(s[1] == 10 and np.isfinite(s[2]) for s in seen)
    with pytest.raises(NotFittedError):
        check_is_fitted(model)


class FoldListener:
    """An epoch callback that also hears the folds of a cross-fitted report."""

    def __init__(self, stop_after_fold: int | None = None) -> None:
        self.folds: list[tuple[int, int]] = []
        self.stop_after_fold = stop_after_fold

    def __call__(self, epoch: int, total: int, loss: float) -> bool:
        return False

    def fold_done(self, done: int, total: int) -> bool:
        self.folds.append((done, total))
        return done == self.stop_after_fold


@pytest.mark.slow
def test_callback_hears_each_fold_of_the_report_and_can_stop_there(digits):
    X, _ = digits
    listener = FoldListener()
    small_model(max_epochs=2, report_folds=3, callback=listener).fit(X[:300])
    assert listener.folds == [(1, 3), (2, 3), (3, 3)]
    stopper = FoldListener(stop_after_fold=2)
    model = small_model(max_epochs=2, report_folds=3, callback=stopper)
    with pytest.raises(TrainingStopped, match="after fold 2 of 3"):
        model.fit(X[:300])
    assert stopper.folds == [(1, 3), (2, 3)]
    with pytest.raises(NotFittedError):
        check_is_fitted(model)


class CtrlCMLP(MLPRegressor):
    """A real MLPRegressor whose Ctrl-C arrives in the middle of an epoch's minibatches."""

    def _backprop(self, *args, **kwargs):
        self.batches_seen = getattr(self, "batches_seen", 0) + 1
        if self.batches_seen == 3:
            raise KeyboardInterrupt  # what the SIGINT handler raises between two bytecodes
        return super()._backprop(*args, **kwargs)


def test_ctrl_c_inside_an_epoch_is_not_swallowed():
    # sklearn's MLP catches KeyboardInterrupt mid-epoch and only warns, in its own words;
    # training must stop instead.
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(200, 4)), rng.normal(size=(200, 2))
    mlp = CtrlCMLP(hidden_layer_sizes=(8,), batch_size=20, random_state=0)
    with pytest.raises(KeyboardInterrupt):
        _partial_fit(mlp, X, Y)
    assert mlp.batches_seen == 3
    # Without a Ctrl-C the same call trains an epoch and returns.
    _partial_fit(MLPRegressor(hidden_layer_sizes=(8,), batch_size=20, random_state=0), X, Y)


@pytest.mark.slow
def test_early_stopping_keeps_best_epoch(digits):
    X, _ = digits
    losses = []
    model = small_model(
        max_epochs=40, n_iter_no_change=2, tol=0.5, callback=lambda e, t, loss: losses.append(loss)
    ).fit(X)
    # tol=0.5 makes no improvement count, so training stops after patience + 1 epochs.
    assert model.n_epochs_ == len(losses) == 3


@pytest.mark.slow
def test_without_early_stopping_every_epoch_trains(digits):
    X, _ = digits
    # tol=0.5 makes no improvement count: only n_iter_no_change=None keeps it going.
    assert small_model(max_epochs=6, tol=0.5).fit(X).n_epochs_ == 6


def test_the_step_decays_from_learning_rate_to_its_final_share():
    factors = [step_factor(epoch, 40) for epoch in range(1, 41)]
    assert factors[0] == 1.0 and factors[-1] == pytest.approx(FINAL_STEP)
    assert all(earlier > later for earlier, later in itertools.pairwise(factors))
    assert step_factor(1, 1) == 1.0


@pytest.mark.slow
def test_each_epoch_updates_at_its_scheduled_step(monkeypatch, digits):
    import mbn_core.distill.student as student

    used = []

    def recording(mlp, X_epoch, Y, classes=None):
        _partial_fit(mlp, X_epoch, Y, classes)
        # Adam's last update used learning_rate_init times its bias correction.
        optimizer = mlp._optimizer
        t = optimizer.t
        correction = np.sqrt(1 - optimizer.beta_2**t) / (1 - optimizer.beta_1**t)
        used.append(optimizer.learning_rate / correction)

    monkeypatch.setattr(student, "_partial_fit", recording)
    small_model(max_epochs=5, learning_rate=0.02).fit(digits[0])
    assert used == pytest.approx([0.02 * step_factor(epoch, 5) for epoch in range(1, 6)])


def _epoch_inputs(monkeypatch, model, X) -> list:
    """The training matrix of each MLP epoch of ``model.fit(X)`` (recorded, then trained)."""
    import mbn_core.distill.student as student

    seen = []

    def recording(mlp, X_epoch, Y, classes=None):
        seen.append(X_epoch.toarray() if sp.issparse(X_epoch) else np.array(X_epoch))
        _partial_fit(mlp, X_epoch, Y, classes)  # the real one, imported above

    monkeypatch.setattr(student, "_partial_fit", recording)
    model.fit(X)
    return seen


@pytest.mark.slow
def test_input_noise_is_a_fresh_draw_each_epoch(monkeypatch, digits):
    X, _ = digits
    clean = _epoch_inputs(
        monkeypatch, small_model(max_epochs=3, validation_fraction=0.0, input_noise=0.0), X
    )
    noisy = _epoch_inputs(
        monkeypatch, small_model(max_epochs=3, validation_fraction=0.0, input_noise=0.5), X
    )
    assert all(np.array_equal(epoch, clean[0]) for epoch in clean)
    for epoch in noisy:
        assert np.std(epoch - clean[0]) == pytest.approx(0.5, rel=0.02)
    # A fresh draw each epoch: the noise of two epochs is uncorrelated (a repeated draw would
    # correlate fully).
    first, second = (epoch - clean[0] for epoch in noisy[:2])
    assert abs(np.corrcoef(first.ravel(), second.ravel())[0, 1]) < 0.05
    # The same seed draws the same noise.
    again = _epoch_inputs(
        monkeypatch, small_model(max_epochs=3, validation_fraction=0.0, input_noise=0.5), X
    )
    assert all(np.array_equal(a, b) for a, b in zip(noisy, again, strict=True))


@pytest.mark.slow
def test_auto_input_noise_is_what_the_epochs_see(monkeypatch, digits):
    X, _ = digits
    params = {"max_epochs": 2, "validation_fraction": 0.0}
    clean = _epoch_inputs(monkeypatch, small_model(input_noise=0.0, **params), X)
    model = small_model(**params)
    assert model.input_noise == "auto"
    noisy = _epoch_inputs(monkeypatch, model, X)
    assert model.input_noise_ == 0.3  # digits are wide: the calibrated noise
    for epoch in noisy:
        assert np.std(epoch - clean[0]) == pytest.approx(model.input_noise_, rel=0.02)
    # The same model as asking for 0.3.
    fixed = _epoch_inputs(monkeypatch, small_model(input_noise=0.3, **params), X)
    assert all(np.array_equal(a, b) for a, b in zip(noisy, fixed, strict=True))


@pytest.mark.slow
def test_input_noise_leaves_sparse_input_as_it_is(monkeypatch, digits):
    X, _ = digits
    # Standardised sparse input stays sparse, so there is nothing to add noise to (projected
    # sparse input is dense once projected, and gets noise like any other).
    params = {"max_epochs": 2, "validation_fraction": 0.0, "input_components": None}
    sparse = sp.csr_matrix(X)
    plain = _epoch_inputs(monkeypatch, small_model(input_noise=0.0, **params), sparse)
    model = small_model(input_noise=0.5, **params)
    noisy = _epoch_inputs(monkeypatch, model, sparse)
    assert all(np.array_equal(a, b) for a, b in zip(plain, noisy, strict=True))
    assert model.input_noise_ == 0.0


@pytest.mark.slow
def test_without_validation_runs_all_epochs(digits):
    X, _ = digits
    model = small_model(max_epochs=3, validation_fraction=0.0).fit(X)
    assert model.n_epochs_ == 3


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({"hidden_layer_sizes": ()}, "hidden_layer_sizes"),
        ({"hidden_layer_sizes": (0,)}, "hidden_layer_sizes"),
        ({"hidden_layer_sizes": "64"}, "hidden_layer_sizes"),
        ({"max_epochs": 0}, "max_epochs"),
        ({"batch_size": 1.5}, "batch_size"),
        ({"learning_rate": 0}, "learning_rate"),
        ({"alpha": -1.0}, "alpha"),
        ({"holdout_fraction": 0.0}, "holdout_fraction"),
        ({"validation_fraction": 0.5}, "validation_fraction"),
        ({"n_clusters": 0}, "n_clusters"),
        ({"n_jobs": 0}, "n_jobs"),
        ({"callback": 3}, "callback"),
        ({"teacher": "MBN"}, "teacher"),
        ({"input_noise": "loud"}, "input_noise"),
        ({"input_noise": -0.1}, "input_noise"),
    ],
)
def test_bad_parameters_name_themselves(params, name, digits):
    X, _ = digits
    with pytest.raises(ValueError, match=name):
        small_model(**params).fit(X)


@pytest.mark.slow
def test_bad_input(fitted, digits):
    X, y = digits
    with pytest.raises(ValueError, match="labels"):
        small_model().fit(X, y[:10])
    with pytest.raises(ValueError):
        fitted.transform(X[:3, :10])
    bad = X[:3].copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError):
        fitted.transform(bad)
    with pytest.raises(ValueError, match="samples"):
        small_model(holdout_fraction=0.5, validation_fraction=0.4).fit(X[:4])
