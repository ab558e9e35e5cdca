"""Two small methods registered only by the tests, to show that a method plugs in with no
change to the trainer, the bundle code, the CLI or the service.

``toy-exported`` exports its own map to ONNX (as a kernel PCA would); ``toy-distilled`` has
no export and is distilled into an MLP (as MBN is). Both are a PCA projection: simple enough
to check exactly, real enough to train, save, load and serve. Importing this module
registers them (``MBN_METHODS=toy_method`` does it in another process).
"""

from __future__ import annotations

from numbers import Integral
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.decomposition import PCA
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_is_fitted, validate_data

from mbn_core.methods import Method, register
from mbn_core.params import CheckedParams


class ToyProjection(CheckedParams, TransformerMixin, BaseEstimator):
    """A linear projection onto the leading principal axes.

    Parameters
    ----------
    n_components : int, default=2
        Dimension of the embedding.
    whiten : bool, default=False
        Scale each axis to unit variance.
    random_state : int or None, default=None
        Seed of the randomised solver.
    """

    _parameter_constraints: dict[str, list[Any]] = {
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "whiten": ["boolean"],
        "random_state": ["random_state"],
    }

    def __init__(self, n_components: int = 2, whiten: bool = False, random_state=None) -> None:
        self.n_components = n_components
        self.whiten = whiten
        self.random_state = random_state

    def fit(self, X, y=None):
        self._validate_params()
        X = validate_data(self, X, dtype=np.float64)
        pca = PCA(self.n_components, whiten=self.whiten, random_state=self.random_state).fit(X)
        scale = np.sqrt(pca.explained_variance_) if self.whiten else np.ones(self.n_components)
        self.components_ = (pca.components_ / scale[:, None]).astype(np.float64)
        self.mean_ = pca.mean_.astype(np.float64)
        self.n_components_ = self.n_components
        return self

    def transform(self, X):
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return (X - self.mean_) @ self.components_.T


class ToyDistilled(ToyProjection):
    """The same projection, registered without an export: the pipeline distils it."""


def save(estimator: ToyProjection) -> dict[str, np.ndarray]:
    return {"components": estimator.components_, "mean": estimator.mean_}


def load(cls: type[ToyProjection]):
    def load_arrays(arrays: dict[str, np.ndarray], params: dict[str, Any]) -> ToyProjection:
        if set(arrays) != {"components", "mean"}:
            raise ValueError(f"expected arrays components and mean, got {sorted(arrays)}")
        estimator = cls(**params)
        estimator.components_ = np.asarray(arrays["components"], dtype=np.float64)
        estimator.mean_ = np.asarray(arrays["mean"], dtype=np.float64)
        estimator.n_features_in_ = estimator.mean_.shape[0]
        estimator.n_components_ = estimator.components_.shape[0]
        return estimator

    return load_arrays


def export(estimator: ToyProjection) -> onnx.ModelProto:
    d, c = estimator.mean_.shape[0], estimator.components_.shape[0]
    graph = helper.make_graph(
        [
            helper.make_node("Sub", ["input", "mean"], ["centred"]),
            helper.make_node("MatMul", ["centred", "projection"], ["embedding"]),
        ],
        "toy_projection",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, d])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [None, c])],
        [
            numpy_helper.from_array(estimator.mean_.astype(np.float32), "mean"),
            numpy_helper.from_array(estimator.components_.T.astype(np.float32), "projection"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


EXPORTED = register(
    Method(
        name="toy-exported",
        estimator=ToyProjection,
        summary="PCA projection exported to ONNX (tests only)",
        save=save,
        load=load(ToyProjection),
        export=export,
        facts=lambda estimator: {"toy_axes": int(estimator.n_components_)},
    ),
    replace=True,
)
DISTILLED = register(
    Method(
        name="toy-distilled",
        estimator=ToyDistilled,
        summary="PCA projection distilled into an MLP (tests only)",
        save=save,
        load=load(ToyDistilled),
        defaults={"n_components": 3},
    ),
    replace=True,
)
