"""Training parameters, reading data files, and train_bundle's progress and cancellation."""

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import make_circles

from mbn_core import MBN, TrainingStopped
from mbn_core.bundle import load_bundle
from mbn_core.data.files import peek_data_file
from mbn_core.data.readers import check_matrix, load_training_data
from mbn_core.pipeline.training import (
    PHASES,
    TrainingEvent,
    TrainingParams,
    check_feasible,
    train_bundle,
)

SMALL = {
    "n_clusterings": 20,
    "k1": 0.1,
    "delta": 0.5,  # layers known in advance (auto may add layers with few clusterings)
    "hidden_layer_sizes": [32],
    "max_epochs": 4,
    "n_clusters": 5,
    "map_points": 200,
}


# ---------------------------------------------------------------------- parameters


def test_defaults_round_trip_through_json():
    params = TrainingParams.from_dict({})
    again = TrainingParams.from_dict(json.loads(json.dumps(params.to_dict())))
    assert again == params
    assert TrainingParams.from_dict(None) == params


def test_lists_become_tuples():
    params = TrainingParams.from_dict({"ks": [40, 20], "hidden_layer_sizes": [8, 8]})
    assert params["ks"] == (40, 20)
    assert params["hidden_layer_sizes"] == (8, 8)
    assert params.to_dict()["ks"] == [40, 20]
    assert params.estimator_kwargs()["ks"] == [40, 20]
    assert params.compressor_kwargs()["hidden_layer_sizes"] == (8, 8)


def test_method_is_recorded_and_checked():
    assert TrainingParams.from_dict({}).to_dict()["method"] == "mbn"
    assert TrainingParams.from_dict({"method": "mbn"}) == TrainingParams.from_dict(None)
    with pytest.raises(ValueError, match=r"unknown method 'nope'; known: .*mbn"):
        TrainingParams.from_dict({"method": "nope"})


def test_training_defaults_differ_from_the_estimators_only_where_declared():
    # k_max is capped for a service and the seed fixed; everything else is MBN's own default.
    params = TrainingParams.from_dict(None)
    assert params["k_max"] == 2000 and params["random_state"] == 0
    assert MBN().k_max is None
    for key, value in MBN().get_params().items():
        if key not in ("k_max", "random_state", "callback"):
            assert params[key] == value, key


def test_unknown_key_is_named():
    with pytest.raises(ValueError, match="unknown training parameter 'n_clustering'"):
        TrainingParams.from_dict({"n_clustering": 10})
    with pytest.raises(ValueError, match="object"):
        TrainingParams.from_dict([1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"n_clusterings": 0}, "n_clusterings"),
        ({"n_clusterings": "400"}, "n_clusterings"),
        ({"n_clusterings": 400.0}, "n_clusterings"),
        ({"n_clusterings": True}, "n_clusterings"),
        ({"feature_fraction": 1.5}, "feature_fraction"),
        ({"k1": "half"}, "k1"),
        ({"delta": 1.0}, "delta"),
        ({"ks": [1]}, "ks"),
        ({"ks": "4000"}, "ks"),
        ({"k_max": 1}, "k_max"),
        ({"metric": "manhattan"}, "metric"),
        ({"random_state": -1}, "random_state"),
        ({"random_state": 2**40}, "random_state"),
        ({"n_jobs": 0}, "n_jobs"),
        ({"hidden_layer_sizes": [0]}, "hidden_layer_sizes"),
        ({"hidden_layer_sizes": []}, "hidden_layer_sizes"),
        ({"max_epochs": -3}, "max_epochs"),
        ({"learning_rate": "fast"}, "learning_rate"),
        ({"holdout_fraction": 0.9}, "holdout_fraction"),
        ({"n_clusters": 0}, "n_clusters"),
        ({"alpha": float("inf")}, "alpha"),
        ({"tol": float("nan")}, "tol"),
        ({"learning_rate": float("inf")}, "learning_rate"),
        ({"hidden_layer_sizes": [8, True]}, "hidden_layer_sizes"),
        ({"n_clusters": True}, "n_clusters"),
    ],
)
def test_bad_values_name_the_key(values, key):
    with pytest.raises(ValueError, match=key):
        TrainingParams.from_dict(values)


@pytest.mark.parametrize("method", ["mbn", "modular_kpca", "multilevel"])
def test_pipeline_options_are_named_as_the_trainings(method):
    # Not "of CompressiveMBN": a modular_kpca user never meets that class.
    with pytest.raises(ValueError, match=r"^The 'holdout_fraction' parameter of training "):
        TrainingParams.from_dict({"method": method, "holdout_fraction": 0.9})


# ---------------------------------------------------------------------- data files


def test_npy(tmp_path):
    X = np.arange(12, dtype=np.uint8).reshape(4, 3)
    np.save(tmp_path / "d.npy", X)
    data, y = load_training_data(tmp_path / "d.npy")
    assert data.dtype == np.float32
    np.testing.assert_array_equal(data, X)
    assert y is None


def test_npz_with_labels(tmp_path):
    X, y = np.random.default_rng(0).random((5, 2)), np.arange(5)
    np.savez(tmp_path / "d.npz", x=X, y=y)
    data, labels = load_training_data(tmp_path / "d.npz")
    np.testing.assert_allclose(data, X, rtol=1e-6)
    np.testing.assert_array_equal(labels, y)


def test_sparse_npz(tmp_path):
    X = sp.random(6, 5, density=0.4, format="csr", random_state=0)
    sp.save_npz(tmp_path / "s.npz", X)
    data, y = load_training_data(tmp_path / "s.npz")
    assert sp.issparse(data) and data.dtype == np.float32
    np.testing.assert_allclose(data.toarray(), X.toarray(), rtol=1e-6)
    assert y is None


@pytest.mark.parametrize("header", ["", "a,b,c\n"])
@pytest.mark.parametrize("mark", ["", "\ufeff"], ids=["plain", "byte-order-mark"])
def test_csv(tmp_path, header, mark):
    # A spreadsheet's UTF-8 byte order mark made the first data row look like a header,
    # and it was dropped without a word.
    (tmp_path / "d.csv").write_text(mark + header + "1,2,3\n4,5,6.5\n", encoding="utf-8")
    assert peek_data_file(tmp_path / "d.csv").n_rows == 2
    data, _ = load_training_data(tmp_path / "d.csv")
    np.testing.assert_array_equal(data, [[1, 2, 3], [4, 5, 6.5]])


@pytest.mark.parametrize(
    ("name", "write", "message"),
    [
        ("missing.npy", None, "no such file"),
        ("d.txt", lambda p: p.write_text("1 2"), "unsupported format '.txt'"),
        ("d.npy", lambda p: p.write_text("garbage"), "not a NumPy .npy file"),
        ("d.npz", lambda p: np.savez(p, data=np.ones((3, 2))), "array named 'x'"),
        ("d.npz", lambda p: p.write_bytes(b"PK\x03\x04broken"), "unreadable .npz"),
        ("d.npy", lambda p: np.save(p, np.array([{}, 1], dtype=object)), "Python objects"),
        ("d.npy", lambda p: np.save(p, np.ones(4)), "2-D"),
        ("d.npy", lambda p: np.save(p, np.ones((1, 4))), "at least 2 rows"),
        ("d.npy", lambda p: np.save(p, np.array([[1.0, np.nan], [0, 0]])), "NaN"),
        ("d.npy", lambda p: np.save(p, np.array([["a", "b"], ["c", "d"]])), "numbers"),
        ("d.csv", lambda p: p.write_text("1,2\n3\n"), "unreadable .csv"),
        ("d.csv", lambda p: p.write_text("a,b\n"), "no data rows"),
        # A first row with one bad cell is data to report, not a header to drop.
        ("d.csv", lambda p: p.write_text("1,2x\n3,4\n5,6\n"), "'2x' is not a number: data row 1"),
        # A short row: counted from 1 as well, and numpy's usecols advice left out.
        (
            "e.csv",
            lambda p: p.write_text("a,b\n1,2\n\n3\n"),
            r"data row 2 has 1 column where the rows before have 2 \(rows count from 1",
        ),
        ("d.csv", lambda p: p.write_text("0x10,2\n3,4\n5,6\n"), "'0x10'"),
        ("d.npz", lambda p: np.savez(p, x=np.ones((3, 2)), y=np.ones(2)), "one label per row"),
    ],
)
def test_bad_files_name_the_file(tmp_path, name, write, message):
    path = tmp_path / name
    if write is not None:
        write(path)
    with pytest.raises(ValueError, match=message) as error:
        load_training_data(path)
    assert str(path) in str(error.value)


def test_a_directory_is_not_a_file(tmp_path):
    with pytest.raises(ValueError, match="not a file"):
        load_training_data(tmp_path)


def test_check_matrix_names_its_source():
    with pytest.raises(ValueError, match=r"^inputs: .*NaN"):
        check_matrix(np.array([[np.inf, 1.0], [1, 2]]), "inputs")


# ---------------------------------------------------------------------- train_bundle


@pytest.mark.slow
def test_train_bundle_reports_progress_in_order(digits, tmp_path):
    X, y = digits
    calls, events = [], []
    path = train_bundle(
        X, tmp_path / "digits", name="Digits", params=SMALL, y=y,
        progress=lambda phase, fraction: calls.append((phase, fraction)),
        events=events.append,
    )  # fmt: skip
    bundle = load_bundle(path)
    assert bundle.id == "digits" and bundle.n_clusters == 5
    assert bundle.manifest["training"]["params"]["n_clusterings"] == 20
    assert bundle.manifest["fidelity"]["nmi_labels_fast"] is not None
    phases = [phase for phase, _ in calls]
    assert phases[0] == "fit" and calls[-1] == ("export", 1.0)
    assert sorted(set(phases), key=PHASES.index) == list(PHASES)
    assert phases == sorted(phases, key=PHASES.index)
    fractions = [fraction for _, fraction in calls]
    assert fractions == sorted(fractions) and fractions[0] > 0 and fractions[-1] == 1.0
    # One call per clustering, per epoch and per fold of the report (plus two around the
    # export).
    n_layers = len(bundle.manifest["training"]["ks"])
    assert phases.count("fit") == 20 * n_layers
    assert phases.count("compressor") == bundle.manifest["training"]["n_epochs"]
    assert all(isinstance(e, TrainingEvent) for e in events) and len(events) == len(calls)
    # 180 held-out rows would be too few: the report is cross-fitted (5 fits of the MBN and
    # MLP on four fifths, a step each) and the model fitted on all 1797 rows.
    assert bundle.manifest["training"]["n_fit_samples"] == 1797
    assert bundle.manifest["fidelity"]["folds"] == 5
    report = [e for e in events if e.phase == "report"]
    assert [e.message for e in report] == [f"fidelity report: fold {k}/5" for k in range(1, 6)]
    # The folds refit the model five times: they get more of the bar than the model did.
    assert report[-1].fraction - report[0].fraction > 0.3
    assert events[0].message == f"layer 1/{n_layers} (k=180): clustering 1/20"  # 0.1 n
    assert events[-1].phase_fraction == 1.0


@pytest.mark.slow
def test_params_object_and_model_id(digits, tmp_path):
    X, _ = digits
    params = TrainingParams.from_dict({**SMALL, "n_clusters": None})
    path = train_bundle(X[:400], tmp_path / "dir", name="n", params=params, model_id="the-id")
    assert load_bundle(path).id == "the-id"


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["fit", "compressor", "report", "export"])
def test_stopping_writes_nothing(digits, tmp_path, phase):
    X, _ = digits

    def progress(current, fraction):
        return current == phase

    with pytest.raises(TrainingStopped):
        train_bundle(X[:500], tmp_path / "m", name="m", params=SMALL, progress=progress)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("out", "kwargs", "message"),
    [
        ("bad id!", {}, "model id"),
        ("ok", {"model_id": "../x"}, "model id"),
        ("ok", {"name": ""}, "name"),
        ("missing/ok", {}, "does not exist"),
        ("ok", {"params": {"bogus": 1}}, "bogus"),
        ("ok", {"y": [1, 2]}, "one label per row"),
        # Mixed objects failed the report's NMI with a TypeError; NaN with sklearn's message.
        ("ok", {"y": np.array([None, 1] * 25, dtype=object)}, "numbers, strings or booleans"),
        ("ok", {"y": [np.nan] + [1.0] * 49}, "labels contain NaN"),
        # A continuous target made every row its own class: the report's NMI read 1.0.
        ("ok", {"y": [2.0, 0.25] + [1.0] * 48}, r"row 1 has 0.25, and 1 of 50"),
        ("ok", {"y": np.array([None, "a"] * 25, dtype=object)}, "got object values"),
        ("ok", {"params": {**SMALL, "n_clusters": 51}}, "more than the 50 rows"),
        # An exported method's head sees only the rows it was fitted on (sklearn's KMeans
        # refused it after the fit).
        ("ok", {"params": {"method": "modular_kpca", "n_clusters": 50}}, r"45 rows .* \(of 50\)"),
        # SMALL gives delta a number: a one-layer network has no use for it.
        ("ok", {"params": {**SMALL, "output": "umap-bottom"}}, "bottom layer alone"),
    ],
)
def test_refused_before_training(digits, tmp_path, out, kwargs, message):
    X, _ = digits

    def progress(phase, fraction):
        raise AssertionError("training started")

    arguments = {"name": "m", "params": SMALL, **kwargs}
    with pytest.raises(ValueError, match=message):
        train_bundle(X[:50], tmp_path / out, progress=progress, **arguments)


_ROWS = np.random.default_rng(0).normal(size=(60, 5))


@pytest.mark.parametrize("method", ["mbn", "modular_kpca", "multilevel"])
@pytest.mark.parametrize(
    ("X", "message"),
    [
        (np.ones((60, 5)), "every row is the same"),
        (sp.csr_matrix(np.tile([0.0, 2.0, 0.0], (60, 1))), "every row is the same"),
        # 1e6 + 1e-6 is 1e6 in float32: rows that differ only below its precision.
        (1e6 + 1e-6 * _ROWS, "every row is the same"),
        (1e30 * _ROWS, r"has values as large as .*within \+-1e\+15"),
        (1e-20 * _ROWS, r"its rows lie within .* of their mean; .* at least 1e-15"),
    ],
    ids=["constant", "constant-sparse", "below-float32-precision", "huge", "tiny-spread"],
)
def test_data_the_methods_cannot_embed_is_refused_before_training(tmp_path, method, X, message):
    # Each once failed inside a method with an unrelated message ("attempt to get argmin of
    # an empty sequence", "Input X contains NaN", "cannot reshape array of size 0").
    def progress(phase, fraction):
        raise AssertionError("training started")

    if sp.issparse(X) and method != "mbn":
        pytest.skip("only MBN takes sparse input")
    params = {"method": method, "map_points": 0}
    with pytest.raises(ValueError, match=f"^X: {message}"):
        train_bundle(X, tmp_path / "m", name="m", params=params, progress=progress)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_object_arrays_of_strings_are_labels(digits, tmp_path):
    # What pandas and fetch_openml give: refused as "object" for a while.
    X, y = digits
    labels = np.array([str(v) for v in y[:300]], dtype=object)
    params = {**SMALL, "map_points": 100}
    bundle = load_bundle(train_bundle(X[:300], tmp_path / "m", name="m", params=params, y=labels))
    assert bundle.manifest["fidelity"]["nmi_labels_fast"] is not None
    assert set(bundle.embedding_map().label) <= {str(v) for v in range(10)}


@pytest.mark.slow
def test_sparse_data_far_from_zero_is_not_taken_for_constant(tmp_path):
    # E[x^2] - E[x]^2 in float32 cancelled to 0 here and refused it; the spread is ~0.02.
    rows = (1e4 + 0.01 * _ROWS).astype(np.float32)
    # Rows this close tie at every center, and each tie is re-ranked: few clusterings and
    # epochs keep that to seconds.
    params = {"map_points": 0, "n_clusterings": 20, "max_epochs": 2}
    path = train_bundle(sp.csr_matrix(rows), tmp_path / "m", name="m", params=params)
    assert load_bundle(path).input_dim == 5


@pytest.mark.slow
@pytest.mark.parametrize("method", ["mbn", "modular_kpca", "multilevel"])
@pytest.mark.parametrize("scale", [1e-14, 1e14])
def test_every_method_trains_at_the_edges_of_the_range(tmp_path, method, scale):
    X = scale * _ROWS
    params = {"method": method, "max_epochs": 2, "map_points": 30}
    bundle = load_bundle(train_bundle(X, tmp_path / "m", name="m", params=params))
    for mode in ("fast", "exact"):
        assert np.isfinite(bundle.embed(X[:5], mode=mode)).all()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux's /proc")
def test_a_directory_that_cannot_be_written_is_refused_before_training(digits):
    # /proc takes no new directory, even for root (whom permission bits would not stop): the
    # bundle's move into place failed there after the whole training.
    X, _ = digits

    def progress(phase, fraction):
        raise AssertionError("training started")

    with pytest.raises(ValueError, match=r"^/proc: cannot write the bundle there"):
        train_bundle(X[:50], "/proc/mbn-bundle", name="m", params=SMALL, progress=progress)


@pytest.mark.slow
def test_existing_bundle_is_refused_unless_overwrite(digits, tmp_path):
    X, _ = digits
    (tmp_path / "m").mkdir()
    with pytest.raises(ValueError, match="already exists"):
        train_bundle(X[:300], tmp_path / "m", name="m", params=SMALL)
    train_bundle(X[:300], tmp_path / "m", name="m2", params=SMALL, overwrite=True)
    assert load_bundle(tmp_path / "m").name == "m2"


@pytest.mark.slow
def test_a_thin_manifold_trains_a_bundle_of_the_bottom_umap_output(tmp_path):
    # The default output="auto" with the default 400 clusterings: two rings are thin.
    X, _ = make_circles(400, factor=0.5, noise=0.04, random_state=7)
    params = {
        **SMALL, "n_clusterings": 400, "k1": "auto", "delta": "auto", "n_classes": 2,
        "report_folds": None,
    }  # fmt: skip
    events = []
    path = train_bundle(X, tmp_path / "rings", name="rings", params=params, events=events.append)
    bundle = load_bundle(path)
    training = bundle.manifest["training"]
    assert training["params"]["output"] == "auto" and training["output"] == "umap-bottom"
    assert len(training["ks"]) == 1  # the bottom layer alone
    # The fit's progress follows that plan: its bottom layer, then the output's layout.
    fit = [event for event in events if event.phase == "fit"]
    assert [e.phase_fraction for e in fit] == sorted(e.phase_fraction for e in fit)
    bottom = [e for e in fit if e.message.startswith("layer ")]
    assert bottom[-1].message.startswith("layer 1/1 ") and bottom[-1].phase_fraction < 1.0
    assert fit[-1].phase_fraction == 1.0
    assert fit[-1].message == "umap-bottom output, layout: epoch 500/500"
    estimator = bundle.load_exact().estimator
    assert estimator.output_ == "umap-bottom" and estimator.ks_ == training["ks"]
    exact = bundle.embed(X[:30], mode="exact")
    np.testing.assert_array_equal(exact, estimator.transform(X[:30]).astype(np.float32))
    assert np.isfinite(bundle.embed(X[:30])).all()


@pytest.mark.slow
@pytest.mark.parametrize("output", ["umap", "umap-bottom"])
def test_an_output_that_keeps_codes_trains_a_bundle(digits, tmp_path, output):
    X, _ = digits
    params = {**SMALL, "output": output, "n_clusters": None}
    if output == "umap-bottom":
        params["delta"] = "auto"  # a one-layer network takes no shrink factor
    bundle = load_bundle(train_bundle(X[:400], tmp_path / "s", name="s", params=params))
    assert bundle.manifest["training"]["params"]["output"] == output
    exact = bundle.embed(X[400:420], mode="exact")
    assert exact.shape == (20, 10) and np.isfinite(exact).all()
    np.testing.assert_array_equal(bundle.embed(X[405:406], mode="exact"), exact[5:6])
    fast = bundle.embed(X[400:420])
    assert fast.shape == exact.shape and np.isfinite(fast).all()


def test_more_report_folds_than_rows_are_refused_before_the_fit():
    """Checked only inside the fit: 4 rows and 5 folds failed after the network."""
    params = TrainingParams.from_dict({"report_folds": 5, "n_components": 2})
    with pytest.raises(ValueError, match="report_folds=5 is more than the 4 rows"):
        check_feasible(params, 4)
    check_feasible(params, 5)
