"""Aligned versions: Procrustes on reference rows, both paths mapped, bundle round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.metrics import r2_score
from small_models import FOLLOWING_PARAMS

from mbn_core.bundle import REFERENCE_FILE, BundleError, load_bundle
from mbn_core.pipeline.alignment import (
    Alignment,
    compare_embeddings,
    load_reference,
    matched_agreement,
)
from mbn_core.pipeline.training import train_bundle


def test_procrustes_recovers_a_similarity() -> None:
    rng = np.random.default_rng(0)
    source = rng.normal(size=(200, 6))
    rotation, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    target = 2.5 * source @ rotation + np.arange(6)
    alignment = Alignment.fit(source, target)
    np.testing.assert_allclose(alignment.rotation, rotation, atol=1e-10)
    assert alignment.scale == pytest.approx(2.5)
    np.testing.assert_allclose(alignment.apply(source), target, atol=1e-9)
    assert alignment.residual(source, target) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="same rows"):
        Alignment.fit(source, target[:10])


def test_matched_agreement_ignores_label_names() -> None:
    a = np.array([0, 0, 1, 1, 2, 2])
    assert matched_agreement(a, np.array([5, 5, 3, 3, 4, 4])) == 1.0
    assert matched_agreement(a, np.array([5, 5, 3, 4, 4, 4])) == pytest.approx(5 / 6)
    report = compare_embeddings(np.eye(3), np.eye(3))
    assert report["cosine_median"] == pytest.approx(1.0) and report["knn_overlap"] is None


@pytest.fixture(scope="module")
def versions(tmp_path_factory, digits):
    X, _ = digits
    X = X.astype(np.float32)
    train, held_out = X[:1500], X[1500:]
    root = tmp_path_factory.mktemp("versions")
    old = train_bundle(
        train, root / "old", name="d", params={**FOLLOWING_PARAMS, "random_state": 0}
    )
    new = train_bundle(
        train, root / "new", name="d", params={**FOLLOWING_PARAMS, "random_state": 1}, align_to=old
    )
    plain = train_bundle(
        train, root / "plain", name="d", params={**FOLLOWING_PARAMS, "random_state": 1}
    )
    return load_bundle(old), load_bundle(new), load_bundle(plain), held_out


@pytest.mark.slow
def test_aligned_version_is_comparable_and_survives_the_round_trip(versions) -> None:
    old, new, plain, held_out = versions
    section = new.manifest["alignment"]
    assert section["reference_model"] == old.id
    assert section["residual"] < section["unaligned_residual"]
    assert REFERENCE_FILE in new.manifest["files"]
    # Both paths of the aligned model land in the old model's space.
    for mode in ("exact", "fast"):
        aligned = compare_embeddings(old.embed(held_out, mode), new.embed(held_out, mode))
        unaligned = compare_embeddings(old.embed(held_out, mode), plain.embed(held_out, mode))
        assert aligned["cosine_median"] > 0.8 > unaligned["cosine_median"], (mode, aligned)
        assert aligned["cosine_median"] > unaligned["cosine_median"] + 0.3
    # Fast and exact stay aligned with each other: R^2 of fast against exact (unchanged by
    # a similarity) is the unaligned twin's, the same model before its map.
    weighting = "variance_weighted"
    r2 = [
        r2_score(b.embed(held_out, "exact"), b.embed(held_out, "fast"), multioutput=weighting)
        for b in (new, plain)
    ]
    assert r2[0] == pytest.approx(r2[1], abs=1e-3)
    np.testing.assert_allclose(
        np.asarray(new.embed(held_out, "fast"), dtype=np.float64),
        plain.embed(held_out, "fast").astype(np.float64) @ np.asarray(section["matrix"])
        + np.asarray(section["shift"]),
        atol=1e-3,
    )
    # The reference rows are the old model's, with the new model's (aligned) exact embedding.
    reference, old_reference = load_reference(new), load_reference(old)
    assert reference is not None and old_reference is not None
    np.testing.assert_array_equal(reference.rows, old_reference.rows)
    np.testing.assert_allclose(reference.embedding, new.embed(reference.rows, "exact"), atol=1e-4)
    # The clustering head was mapped too: the same clusters as the unaligned twin.
    np.testing.assert_array_equal(
        new.predict_clusters(held_out, "exact"), plain.predict_clusters(held_out, "exact")
    )


@pytest.mark.slow
def test_incompatible_models_are_refused_before_training(versions, tmp_path) -> None:
    old = versions[0]
    with pytest.raises(ValueError, match="takes 64 features"):
        train_bundle(np.ones((50, 3)) * np.arange(50)[:, None], tmp_path / "x", name="x",
                     params=FOLLOWING_PARAMS, align_to=old)  # fmt: skip
    with pytest.raises(ValueError, match="dimensions"):
        train_bundle(versions[3], tmp_path / "y", name="y",
                     params={**FOLLOWING_PARAMS, "n_components": 3}, align_to=old)  # fmt: skip
    # Sparse input keeps no reference rows: refused before the fit, not after it.
    sparse = sp.random(300, 64, density=0.2, random_state=0, format="csr", dtype=np.float32)
    with pytest.raises(ValueError, match="sparse input is not supported"):
        train_bundle(sparse, tmp_path / "z", name="z", params=FOLLOWING_PARAMS, align_to=old,
                     progress=lambda phase, fraction: pytest.fail("the fit started"))  # fmt: skip
    assert not any((tmp_path / name).exists() for name in ("x", "y", "z"))


@pytest.mark.slow
def test_a_malformed_alignment_is_refused(versions, tmp_path) -> None:
    import shutil

    from mbn_core.bundle import write_manifest

    new = versions[1]
    copy = shutil.copytree(new.path, tmp_path / new.id)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["alignment"]["matrix"] = [[1.0]]
    write_manifest(copy, manifest)
    with pytest.raises(BundleError, match="alignment"):
        load_bundle(copy).load_exact()
