"""MBN's outputs behind one protocol (mbn_core/mbn/outputs/): registry, layers, arrays."""

import numpy as np
import pytest

from mbn_core import MBN
from mbn_core.mbn.outputs import (
    PcaOutput,
    StoredArrays,
    UmapOutput,
    get_output,
    output_names,
    output_of_arrays,
)
from mbn_core.mbn.outputs.base import FittedOutput


@pytest.fixture(scope="module")
def codes(digits):
    """(bottom codes, top codes, ks) of the digits' training rows in a small network."""
    X = digits.X[:300]
    model = MBN(n_clusterings=20, delta=0.5, random_state=0).fit(X)
    return model.encode(X, 0), model.encode(X, -1), model.ks_


def test_outputs_are_found_by_name():
    assert output_names() == ("pca", "umap", "umap-bottom")
    assert isinstance(get_output("pca"), PcaOutput)
    with pytest.raises(ValueError, match=r"unknown output 'tsne'; valid outputs are 'pca'"):
        get_output("tsne")


def test_umap_and_umap_bottom_are_one_output_with_a_layers_choice():
    layered, bottom = get_output("umap"), get_output("umap-bottom")
    assert type(layered) is type(bottom) is UmapOutput
    assert (layered.layers, bottom.layers) == ("bottom+top", "bottom")
    assert not layered.bottom_only and bottom.bottom_only
    assert UmapOutput(layers="bottom").name == "umap-bottom"
    assert bottom.network_sizes([300, 150, 75]) == [300]
    assert layered.network_sizes([300, 150, 75]) == [300, 150, 75]
    with pytest.raises(ValueError, match="layers='top'"):
        UmapOutput(layers="top")
    with pytest.raises(ValueError, match="bottom layer alone"):
        bottom.check_layers(upper_layers_given=True)
    layered.check_layers(upper_layers_given=True)


@pytest.mark.parametrize("name", ["pca", "umap", "umap-bottom"])
def test_a_fitted_output_saved_as_arrays_embeds_identically(codes, name):
    bottom_codes, top_codes, ks = codes
    output = get_output(name)
    ks = output.network_sizes(ks)
    if output.bottom_only:
        top_codes = bottom_codes
    fitted, embedding = output.fit(bottom_codes, top_codes, ks, 3, np.random.RandomState(0))
    assert isinstance(fitted, FittedOutput) and fitted.n_components == 3
    assert embedding.shape == (300, 3) and embedding.dtype == np.float64
    np.testing.assert_array_equal(fitted.embed(bottom_codes, top_codes), embedding)
    stored = StoredArrays(fitted.to_arrays())
    assert output_of_arrays(stored, ks) is output
    restored = output.from_arrays(stored, ks, n_clusterings=20)
    np.testing.assert_array_equal(restored.embed(bottom_codes[:40], top_codes[:40]), embedding[:40])
    variance = fitted.explained_variance_ratio
    assert (variance is not None) == (name == "pca")


def test_restoring_names_the_array_at_fault(codes):
    bottom_codes, top_codes, ks = codes
    fitted, _ = PcaOutput().fit(bottom_codes, top_codes, ks, 3, np.random.RandomState(0))
    arrays = fitted.to_arrays()
    del arrays["top.offset"]
    with pytest.raises(ValueError, match=r"'top\.offset' is missing"):
        PcaOutput().from_arrays(StoredArrays(arrays), ks, 20)
    with pytest.raises(ValueError, match=r"'top\.table' has shape"):
        PcaOutput().from_arrays(StoredArrays(fitted.to_arrays()), ks[:-1], 20)
