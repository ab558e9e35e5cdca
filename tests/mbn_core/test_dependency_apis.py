"""The private APIs of our dependencies that the code relies on, checked where they are.

pyproject.toml bounds each of these dependencies below its next release; when a release
moves one of these names, a test here fails naming it, and the bound is raised only once the
code follows (or a public API replaces it).
"""

from __future__ import annotations

import importlib
import inspect
import warnings

import numpy as np
import pytest


def test_scikit_learns_parameter_validation():
    # mbn_core/params.py is the one importer of sklearn.utils._param_validation.
    from sklearn.utils import _param_validation as validation

    for name in ("HasMethods", "Interval", "InvalidParameterError", "RealNotInt",
                 "StrOptions", "validate_parameter_constraints"):  # fmt: skip
        assert hasattr(validation, name), f"sklearn.utils._param_validation.{name} moved"
    from numbers import Integral

    constraints = {"k": [validation.Interval(Integral, 1, None, closed="left")]}
    validation.validate_parameter_constraints(constraints, {"k": 2}, caller_name="T")
    with pytest.raises(validation.InvalidParameterError, match="'k' parameter of T"):
        validation.validate_parameter_constraints(constraints, {"k": 0}, caller_name="T")


def test_scikit_learns_fit_context():
    # mbn_core/multilevel/embedding.py and mbn_core/layouts wrap their fits in it.
    from sklearn.base import _fit_context

    assert "prefer_skip_nested_validation" in inspect.signature(_fit_context).parameters


def test_the_mlps_optimizer_reads_its_step_at_each_update():
    # mbn_core/distill/student.py sets the step of each epoch on MLPRegressor's _optimizer.
    from sklearn.neural_network import MLPRegressor

    from mbn_core.distill.student import _set_step

    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(64, 3)), rng.normal(size=(64, 2))
    mlp = MLPRegressor(hidden_layer_sizes=(4,), random_state=0, learning_rate_init=0.1)
    mlp.partial_fit(X, Y)
    assert hasattr(mlp, "_optimizer"), "MLPRegressor._optimizer moved"
    assert mlp._optimizer.learning_rate_init == 0.1
    _set_step(mlp, 1e-9)
    before = [weights.copy() for weights in mlp.coefs_]
    mlp.partial_fit(X, Y)
    moved = max(float(np.abs(w - b).max()) for w, b in zip(mlp.coefs_, before, strict=True))
    assert moved < 1e-6, "the optimizer no longer reads learning_rate_init at each update"


def test_the_mlp_still_swallows_ctrl_c_with_the_warning_we_match():
    # sklearn's MLP turns a KeyboardInterrupt inside partial_fit into this warning;
    # mbn_core/distill/student.py raises it again when it sees the text.
    from sklearn.neural_network import MLPRegressor
    from sklearn.neural_network import _multilayer_perceptron as mlp_module

    from mbn_core.distill.student import _MLP_INTERRUPTED

    assert _MLP_INTERRUPTED in inspect.getsource(mlp_module), "the Ctrl-C warning changed"
    mlp = MLPRegressor(hidden_layer_sizes=(4,), random_state=0)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    mlp._update_no_improvement_count = interrupted  # called inside the guarded loop
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            mlp.partial_fit(np.zeros((8, 2)), np.zeros(8))
        except KeyboardInterrupt:
            pytest.fail("partial_fit now raises KeyboardInterrupt: drop the warning match")
    assert _MLP_INTERRUPTED in [str(w.message) for w in caught]


def test_umap_learns_internals():
    pytest.importorskip("umap")
    from mbn_core.mbn.outputs import umap as umap_output

    # The functions the UMAP output precompiles, and its layout's epoch loop over ``tqdm``.
    for module, name in umap_output._UNCACHED_KERNELS:
        assert hasattr(importlib.import_module(module), name), f"{module}.{name} moved"
    layouts = importlib.import_module("umap.layouts")
    assert "tqdm" in vars(layouts), "umap.layouts no longer loops over its imported tqdm"
    # What the UMAP layout restores of a fitted reducer (mbn_core/layouts/umap.py).
    from umap import UMAP, distances
    from umap.umap_ import DISCONNECTION_DISTANCES

    assert isinstance(DISCONNECTION_DISTANCES, dict)
    assert "euclidean" in distances.named_distances_with_gradients
    source = inspect.getsource(UMAP)
    for name in ("_raw_data", "_small_data", "_sparse_data", "_knn_search_index",
                 "_input_hash", "_n_neighbors", "_disconnection_distance", "_a", "_b",
                 "_initial_alpha", "_output_distance_func"):  # fmt: skip
        assert f"self.{name}" in source, f"UMAP no longer keeps self.{name}"


def test_starlettes_multipart_parser_state():
    pytest.importorskip("starlette")
    from starlette.formparsers import MultiPartParser

    # service/routes/_multipart.py spools uploads from on_headers_finished, through the
    # parser's current part, its spool size and its list of files to close on an error.
    assert callable(MultiPartParser.on_headers_finished)
    source = inspect.getsource(MultiPartParser)
    for name in ("self._current_part", "self.spool_max_size", "self._files_to_close_on_error"):
        assert name in source, f"starlette's MultiPartParser no longer has {name}"


def test_cupys_compute_type_switch():
    cupy = pytest.importorskip("cupy", reason="CuPy (the gpu extra) is not installed here")
    from mbn_core.mbn.backends.cuda import tf32

    linalg = tf32.compute_type_switch()
    assert linalg.__name__ == tf32.LINALG_MODULE
    assert cupy.__version__
