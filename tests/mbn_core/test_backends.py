"""The backend interface (mbn_core/mbn/backends/): the registry, "auto", and the local backend."""

import numpy as np
import pytest

from mbn_core import MBN, TrainingStopped, model_to_arrays
from mbn_core.mbn.backends import (
    FIT,
    TRANSFORM,
    LayerBackend,
    backend_entries,
    backend_names,
    base,
    choose_backend,
    get_backend,
    register_backend,
    stop_unless,
    use_backend,
)
from mbn_core.mbn.backends.local import LocalBackend, clusterings_per_task

PARAMS = {"n_clusterings": 12, "delta": 0.5, "random_state": 3}


@pytest.fixture(scope="module")
def rows(digits):
    """The first 300 digits."""
    return digits.X[:300]


@pytest.fixture(scope="module")
def fitted(rows):
    return MBN(**PARAMS, n_jobs=2).fit(rows)


class RecordingBackend(LocalBackend):
    """The local backend, noting which layer method ran for which layer."""

    calls: list[tuple[str, int]]

    def __init__(self, **options):
        super().__init__(**options)
        self.calls = []
        self.closed = False

    def bottom_codes(self, layer, X):
        self.calls.append(("bottom_codes", 0))
        return super().bottom_codes(layer, X)

    def fit_upper_codes(self, index, codes, clusterings):
        self.calls.append(("fit_upper_codes", index))
        return super().fit_upper_codes(index, codes, clusterings)

    def upper_codes(self, index, codes, layer):
        self.calls.append(("upper_codes", index))
        return super().upper_codes(index, codes, layer)

    def close(self):
        self.closed = True
        super().close()


def test_builtin_backends_are_registered_by_name():
    assert {"local", "dask"} <= set(backend_names())
    with get_backend("local", n_jobs=1) as backend:
        assert isinstance(backend, LocalBackend)
        assert backend.name == "local"


def test_unknown_backend_lists_the_valid_names():
    with pytest.raises(ValueError, match=r"unknown backend 'gpu'.*'auto', 'cuda', 'dask', 'local'"):
        get_backend("gpu")


def test_auto_is_local_without_a_context_or_a_preferred_backend():
    with get_backend("auto") as backend:
        assert type(backend) is LocalBackend


def test_auto_prefers_an_available_preferred_backend(monkeypatch):
    monkeypatch.setattr(base, "_registry", dict(base._registry))
    register_backend("absent", RecordingBackend, available=lambda: False, preferred=True)
    with get_backend() as backend:
        assert type(backend) is LocalBackend  # not available here: "auto" passes it over
    register_backend("present", RecordingBackend, available=lambda: True, preferred=True)
    with get_backend() as backend:
        assert isinstance(backend, RecordingBackend)
    with use_backend("local"), get_backend() as backend:  # a context's choice comes first
        assert type(backend) is LocalBackend


def test_auto_cannot_be_registered():
    with pytest.raises(ValueError, match="cannot be called 'auto'"):
        register_backend("auto", RecordingBackend)


def test_every_layer_of_fit_and_transform_runs_on_the_context_backend(rows, fitted):
    backends: list[RecordingBackend] = []

    def factory(**options):
        backends.append(RecordingBackend(**options))
        return backends[-1]

    model = MBN(**PARAMS, n_jobs=2)
    with use_backend(factory):
        embedding = model.fit_transform(rows)
        new_rows = model.transform(rows[:100])  # more than FEW_ROWS: through the backend
    n_upper = len(model.ks_) - 1
    assert n_upper >= 1
    fit_backend, transform_backend = backends
    assert fit_backend.calls == [("bottom_codes", 0)] + [
        ("fit_upper_codes", i) for i in range(1, n_upper + 1)
    ]
    assert transform_backend.calls == [("bottom_codes", 0)] + [
        ("upper_codes", i) for i in range(1, n_upper + 1)
    ]
    assert fit_backend.closed and transform_backend.closed
    # The same model, bit for bit, as outside the context.
    for name, array in model_to_arrays(fitted).items():
        np.testing.assert_array_equal(model_to_arrays(model)[name], array, err_msg=name)
    np.testing.assert_array_equal(embedding, fitted.transform(rows))
    np.testing.assert_array_equal(new_rows, embedding[:100])


def test_local_backend_layer_methods_give_the_models_codes(rows, fitted):
    X = rows[:50].astype(np.float64)
    with get_backend("local", n_jobs=2) as backend:
        bottom = backend.bottom_codes(fitted.bottom_layer_, X)
        upper = backend.upper_codes(1, bottom, fitted.upper_layers_[0])
    assert bottom.dtype == np.uint8  # k1 = 150 <= 256 centers
    np.testing.assert_array_equal(bottom, fitted.encode(X, layer=0))
    np.testing.assert_array_equal(upper, fitted.encode(X, layer=1))


def test_a_backend_reports_progress_and_stops_when_told(rows, fitted):
    seen: list[tuple[int, int, int]] = []

    def stop_at_five(layer, done, total):
        seen.append((layer, done, total))
        return done == 5

    with (
        LocalBackend(n_jobs=2, callback=stop_at_five) as backend,
        pytest.raises(TrainingStopped, match="layer 0 after 5 of 12 clusterings"),
    ):
        backend.bottom_codes(fitted.bottom_layer_, rows)
    assert seen == [(0, done, 12) for done in range(1, 6)]


def test_a_transform_stops_once_its_rows_are_no_longer_wanted(rows, fitted):
    # What a server does with a step whose clients have all left.
    asked: list[int] = []

    def wanted() -> bool:
        asked.append(1)
        return len(asked) < 3

    with stop_unless(wanted), pytest.raises(TrainingStopped, match="no longer wanted"):
        fitted.transform(rows)
    assert len(asked) == 3  # asked as clusterings finished, and stopped at the first no
    with stop_unless(lambda: True):  # wanted throughout: the same embedding
        np.testing.assert_array_equal(fitted.transform(rows), fitted.transform(rows))


def test_small_batches_encode_runs_of_clusterings_per_task(rows, fitted):
    assert clusterings_per_task(5_000, 400, 2) == 1  # fit: progress stays per clustering
    assert clusterings_per_task(256, 100, 1) == 16
    assert clusterings_per_task(20, 12, 2) == 6  # never fewer tasks than threads
    assert clusterings_per_task(0, 12, 1) == 12
    # Every column is still its own clustering's codes, whatever the runs.
    X = rows[:40].astype(np.float64)
    with get_backend("local", n_jobs=3) as backend:
        grouped = backend.bottom_codes(fitted.bottom_layer_, X)
    layer = fitted.bottom_layer_
    with get_backend("local", n_jobs=1) as backend:
        alone = [backend.bottom_codes(layer, X[i : i + 1]) for i in range(len(X))]
    np.testing.assert_array_equal(grouped, np.vstack(alone))


def test_an_incomplete_backend_cannot_be_built():
    class BottomOnly(LayerBackend):
        name = "bottom-only"

        def bottom_codes(self, layer, X):
            return np.zeros((X.shape[0], 1), dtype=np.uint8)

    with pytest.raises(TypeError, match="abstract"):
        BottomOnly()  # type: ignore[abstract]


def test_a_backend_for_fitting_only_leaves_transform_to_the_local_backend(rows, fitted):
    class FitOnly(RecordingBackend):
        purposes = frozenset({FIT})

    backends: list[RecordingBackend] = []

    def factory(**options):
        backends.append(FitOnly(**options))
        return backends[-1]

    with use_backend(factory, purposes=FitOnly.purposes):
        assert choose_backend(TRANSFORM).name == "local"
        assert choose_backend(FIT).factory is factory
        embedding = fitted.transform(rows[:100])
        assert backends == []  # never built for new rows
        MBN(**PARAMS, n_jobs=2).fit(rows)
    [fit_backend] = backends
    assert fit_backend.calls[0] == ("bottom_codes", 0) and fit_backend.closed
    np.testing.assert_array_equal(embedding, fitted.transform(rows[:100]))
    with use_backend(FitOnly):  # a backend class says its own purposes
        assert choose_backend(TRANSFORM).name == "local"


def test_every_backend_says_what_it_is():
    entries = {entry.name: entry for entry in backend_entries()}
    assert {"local", "dask", "cuda"} <= set(entries)
    assert entries["local"].device == "cpu" and entries["cuda"].device == "cuda"
    assert entries["dask"].purposes == frozenset({FIT})
    for entry in entries.values():
        assert entry.description and "\n" not in entry.description, entry.name


def test_the_device_chooses_among_the_registered_backends(monkeypatch):
    monkeypatch.setattr(base, "_registry", dict(base._registry))
    assert choose_backend(FIT, "cpu").name == "local"
    # No GPU here (as on CI): "auto" stays on the CPU, "cuda" says what is missing.
    register_backend("gpu-absent", RecordingBackend, device="cuda", available=lambda: False)
    monkeypatch.delitem(base._registry, "cuda")
    assert choose_backend(FIT, "auto").name == "local"
    with pytest.raises(ValueError, match="'gpu-absent' cannot run here"):
        choose_backend(FIT, "cuda")
    # A GPU backend that can run is what "cuda" and "auto" get, for what it serves.
    register_backend(
        "gpu-here", RecordingBackend, device="cuda", description="test", purposes={FIT}
    )
    assert choose_backend(FIT, "cuda").name == "gpu-here"
    assert choose_backend(FIT, "auto").name == "gpu-here"
    monkeypatch.delitem(base._registry, "gpu-absent")
    assert choose_backend(TRANSFORM, "auto").name == "local"
    with pytest.raises(ValueError, match="no backend computes on a GPU for transform"):
        choose_backend(TRANSFORM, "cuda")
    with pytest.raises(ValueError, match="purpose 'predict'"):
        choose_backend("predict")
    with pytest.raises(ValueError, match="device='tpu'"):
        choose_backend(FIT, "tpu")
    with pytest.raises(ValueError, match="device 'tpu'"):
        register_backend("tpu", RecordingBackend, device="tpu")


def test_backends_of_installed_packages_register_through_entry_points(monkeypatch):
    loaded: list[str] = []

    class EntryPoint:
        value = "plugin_backends:register"

        def load(self):
            loaded.append(self.value)
            register_backend("plugged", RecordingBackend, description="a plug-in's")

    class Broken(EntryPoint):
        value = "broken_backends:register"

        def load(self):
            raise ImportError("no such module")

    def entry_points(group):
        assert group == "mbn.backends"
        return [Broken(), EntryPoint()]

    monkeypatch.setattr(base, "_registry", dict(base._registry))
    monkeypatch.setattr(base, "_discovered", False)
    monkeypatch.setattr(base.metadata, "entry_points", entry_points)
    assert "plugged" in backend_names()  # the broken plug-in is logged and passed over
    assert loaded == ["plugin_backends:register"]
    with get_backend("plugged", n_jobs=1) as backend:
        assert isinstance(backend, RecordingBackend)
