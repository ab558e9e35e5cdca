"""An MBN saved as named arrays (``np.savez``, no pickle) and rebuilt from them.

The hyperparameters are not among the arrays: a bundle stores ``get_params()`` beside them
and passes them back to ``model_from_arrays``.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn.utils.validation import check_is_fitted

from mbn_core.mbn.backends.base import DEVICES
from mbn_core.mbn.bottom import BottomLayer
from mbn_core.mbn.estimator import MBN, FittedState, set_fitted_state
from mbn_core.mbn.outputs import AUTO, StoredArrays, get_output, output_of_arrays
from mbn_core.mbn.outputs.base import expect_index, expect_shape
from mbn_core.mbn.upper import UpperLayer


def model_to_arrays(model: MBN) -> dict[str, np.ndarray]:
    """Every array exact prediction needs, keyed by name (for ``np.savez``, no pickle).

    The hyperparameters are not included: store ``model.get_params()`` (minus ``callback``)
    beside the arrays and pass them back to ``model_from_arrays``.
    """
    check_is_fitted(model)
    arrays: dict[str, np.ndarray] = {
        "ks": np.asarray(model.ks_, dtype=np.int64),
        "n_features_in": np.asarray(model.n_features_in_, dtype=np.int64),
        # Where the fit ran: not needed to embed (every device gives the same codes), kept so
        # that the loaded model says what the fitted one did.
        "fit.device": np.asarray(model.device_),
        "fit.fallbacks": np.asarray(model.fallbacks_, dtype=str),
    }
    bottom = model.bottom_layer_
    arrays["layer0.feature_masks"] = bottom.feature_masks
    arrays["layer0.centers"] = bottom.centers
    if bottom.shift_masks is not None:
        arrays["layer0.shift_masks"] = bottom.shift_masks
    data = bottom.center_data
    if isinstance(data, sp.csr_matrix):
        arrays["layer0.center_data.data"] = data.data
        arrays["layer0.center_data.indices"] = data.indices
        arrays["layer0.center_data.indptr"] = data.indptr
        arrays["layer0.center_data.shape"] = np.asarray(data.shape, dtype=np.int64)
    else:
        arrays["layer0.center_data"] = data
    for index, layer in enumerate(model.upper_layers_, start=1):
        arrays[f"layer{index}.centers"] = layer.centers
        arrays[f"layer{index}.center_codes"] = layer.center_codes
        arrays[f"layer{index}.seeds"] = layer.seeds
        arrays[f"layer{index}.feature_fraction"] = np.asarray(layer.feature_fraction)
    arrays.update(model.top_.to_arrays())
    return arrays


def model_from_arrays(arrays: dict[str, np.ndarray], params: dict) -> MBN:
    """Rebuild a fitted MBN from ``model_to_arrays`` output and its hyperparameters.

    Raises ``ValueError`` naming the array when one is missing or inconsistent.
    """

    stored = StoredArrays(arrays)
    get = stored.get
    if params.get("output") == "spectral" or any(name.startswith("spectral.") for name in arrays):
        raise ValueError(
            'output="spectral" was removed from MBN; retrain the model with output "auto", '
            '"pca" or "umap"'
        )
    model = MBN(**{key: value for key, value in params.items() if key != "callback"})
    model.check_params()
    network = model.network()
    ks = [int(k) for k in get("ks")]
    n_features = int(get("n_features_in"))
    if not ks or min(ks) < 2:
        raise ValueError(f"model array 'ks' holds invalid layer sizes {ks}")
    V = model.n_clusterings
    if "layer0.center_data" in arrays:
        center_data: np.ndarray | sp.csr_matrix = get("layer0.center_data")
    else:
        shape = tuple(int(s) for s in get("layer0.center_data.shape"))
        center_data = sp.csr_matrix(
            (
                get("layer0.center_data.data"),
                get("layer0.center_data.indices"),
                get("layer0.center_data.indptr"),
            ),
            shape=shape,
        )
    bottom = BottomLayer(
        feature_masks=get("layer0.feature_masks"),
        shift_masks=get("layer0.shift_masks") if "layer0.shift_masks" in arrays else None,
        centers=get("layer0.centers"),
        center_data=center_data,
        metric=model.metric,
    )
    expect_shape("layer0.centers", bottom.centers, (V, ks[0]))
    expect_shape("layer0.feature_masks", bottom.feature_masks, (V, (n_features + 7) // 8))
    if center_data.ndim != 2 or center_data.shape[1] != n_features:
        raise ValueError(f"model array 'layer0.center_data' has shape {center_data.shape}")
    expect_index("layer0.centers", bottom.centers, center_data.shape[0])
    upper: list[UpperLayer] = []
    for index in range(1, len(ks)):
        centers = get(f"layer{index}.centers")
        center_codes = get(f"layer{index}.center_codes")
        seeds = get(f"layer{index}.seeds").astype(np.uint64)
        expect_shape(f"layer{index}.centers", centers, (V, ks[index]))
        expect_shape(f"layer{index}.seeds", seeds, (V,))
        if center_codes.ndim != 2 or center_codes.shape[1] != V:
            raise ValueError(
                f"model array 'layer{index}.center_codes' has shape {center_codes.shape}"
            )
        expect_index(f"layer{index}.centers", centers, center_codes.shape[0])
        expect_index(f"layer{index}.center_codes", center_codes, ks[index - 1])
        layer = UpperLayer.create(
            centers=centers,
            center_codes=center_codes,
            seeds=seeds,
            n_values=ks[index - 1],
            feature_fraction=float(get(f"layer{index}.feature_fraction")),
        )
        upper.append(layer)
    # An "auto" fit's choice is told by the arrays it left.
    output = output_of_arrays(stored, ks) if model.output == AUTO else get_output(model.output)
    top = output.from_arrays(stored, ks, V)
    device, fallbacks = _fit_record(stored)
    state = FittedState(
        ks=ks,
        n_features_in=n_features,
        delta=network.fitted_delta(ks, output.name),
        output=output.name,
        device=device,
        fallbacks=fallbacks,
        bottom_layer=bottom,
        upper_layers=upper,
        top=top,
    )
    set_fitted_state(model, state)
    return model


def _fit_record(stored: StoredArrays) -> tuple[str, tuple[str, ...]]:
    """Where the saved fit ran and what it computed elsewhere (models saved before the
    record was kept ran on the CPU: the GPU backend came later)."""
    device = str(stored.get("fit.device")) if "fit.device" in stored else "cpu"
    if device not in DEVICES:
        raise ValueError(f"model array 'fit.device' holds {device!r}, not one of {DEVICES}")
    if "fit.fallbacks" not in stored:
        return device, ()
    fallbacks = stored.get("fit.fallbacks")
    if fallbacks.dtype.kind != "U" or fallbacks.ndim != 1:
        raise ValueError("model array 'fit.fallbacks' is not a list of sentences")
    return device, tuple(str(line) for line in fallbacks)
