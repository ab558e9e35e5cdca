"""The model registry: verified loading, lookup by id and name, swaps, deletion."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from service.errors import Conflict, NotFound, Unavailable
from service.registry import ModelRegistry


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


def test_scan_loads_models_by_id_and_first_version_by_name(
    model_dir: Path, write_bundle: Callable[..., Path]
) -> None:
    write_bundle(model_dir, "m-old", "digits", created="2024-01-01T00:00:00Z")
    write_bundle(model_dir, "m-new", "digits", created="2025-01-01T00:00:00Z")
    write_bundle(model_dir, "m-other", "other", created="2024-06-01T00:00:00Z")
    registry = ModelRegistry(model_dir)
    registry.rescan()
    assert len(registry) == 3
    assert registry.get("m-new").id == "m-new"
    # Until an operator promotes one, a name means the version first seen, the default the
    # first model: recorded, so that nothing later moves them.
    assert registry.get("digits").id == "m-old"
    assert registry.get(None).id == "m-old"
    assert registry.snapshot.default_source == "auto"
    assert [b.id for b in registry.models()] == ["m-new", "m-other", "m-old"]


def test_configured_default(model_dir: Path, write_bundle: Callable[..., Path]) -> None:
    write_bundle(model_dir, "m-a", "a", created="2024-01-01T00:00:00Z")
    write_bundle(model_dir, "m-b", "b", created="2025-01-01T00:00:00Z")
    registry = ModelRegistry(model_dir, default_ref="a")
    registry.rescan()
    assert registry.get(None).id == "m-a"


def test_unknown_models(model_dir: Path, write_bundle: Callable[..., Path]) -> None:
    registry = ModelRegistry(model_dir)
    registry.rescan()
    with pytest.raises(Unavailable):
        registry.get(None)
    for ref in ("nope", "..", "../models", "/etc", "a/b"):
        with pytest.raises(NotFound):
            registry.get(ref)


def test_broken_bundles_are_skipped(model_dir: Path, write_bundle: Callable[..., Path]) -> None:
    write_bundle(model_dir, "m-good", "good")
    tampered = write_bundle(model_dir, "m-tampered", "bad")
    with (tampered / "compressor.onnx").open("ab") as handle:
        handle.write(b"\0")
    misnamed = write_bundle(model_dir, "m-misnamed", "bad")
    misnamed.rename(model_dir / "m-renamed")
    (model_dir / "not-a-bundle").mkdir()
    (model_dir / ".m-hidden.tmp-123").mkdir()  # a write in progress
    (model_dir / "stray-file").write_text("x")
    registry = ModelRegistry(model_dir)
    registry.rescan()
    assert [b.id for b in registry.models()] == ["m-good"]


def test_rescan_picks_up_new_and_drops_removed_bundles(
    model_dir: Path, write_bundle: Callable[..., Path]
) -> None:
    registry = ModelRegistry(model_dir, min_rescan_seconds=0.0)
    registry.rescan()
    before = registry.snapshot
    write_bundle(model_dir, "m-late", "late")  # e.g. by another replica's worker
    assert registry.get("late").id == "m-late"  # a miss triggers a rescan
    assert before.by_id == {}  # swapped, never mutated: old readers keep their view
    (model_dir / "m-late").rename(model_dir / ".gone")
    registry.rescan()
    with pytest.raises(NotFound):
        registry.get("m-late", rescan=False)


def test_an_id_is_found_at_once_even_between_rescans(
    model_dir: Path, write_bundle: Callable[..., Path]
) -> None:
    registry = ModelRegistry(model_dir, min_rescan_seconds=3600)
    registry.rescan()
    write_bundle(model_dir, "m-new", "fresh")  # a job another replica's worker just finished
    assert registry.get("m-new").id == "m-new"
    with pytest.raises(NotFound):
        registry.get("fresh-but-unscanned-name")


def test_a_new_version_moves_nothing_until_promoted(
    model_dir: Path, write_bundle: Callable[..., Path]
) -> None:
    write_bundle(model_dir, "m-1", "digits", created="2024-01-01T00:00:00Z")
    registry = ModelRegistry(model_dir)
    registry.rescan()
    snapshot = registry.snapshot
    path = write_bundle(model_dir, "m-2", "digits", created="2025-01-01T00:00:00Z")
    assert registry.add(path).id == "m-2"  # e.g. a training job finished
    assert registry.get("digits").id == "m-1" and registry.get(None).id == "m-1"
    registry.promote("m-2", default=False)
    assert registry.get("digits").id == "m-2" and registry.get(None).id == "m-1"
    registry.promote("m-2")
    assert registry.get(None).id == "m-2"
    assert registry.snapshot.default_source == "promoted"
    assert snapshot.resolve("digits") is not None and snapshot.resolve("digits").id == "m-1"
    # Choices live beside the bundles: another replica (a new registry) sees them.
    other = ModelRegistry(model_dir)
    other.rescan()
    assert other.get("digits").id == "m-2" and other.get(None).id == "m-2"


def test_promoted_default_wins_over_the_configured_one(
    model_dir: Path, write_bundle: Callable[..., Path]
) -> None:
    write_bundle(model_dir, "m-a", "a", created="2024-01-01T00:00:00Z")
    write_bundle(model_dir, "m-b", "b", created="2025-01-01T00:00:00Z")
    registry = ModelRegistry(model_dir, default_ref="b")
    registry.rescan()
    assert registry.get(None).id == "m-b" and registry.snapshot.default_source == "configured"
    registry.promote("m-a")
    assert registry.get(None).id == "m-a" and registry.snapshot.default_source == "promoted"


def test_deleting_the_default_or_a_chosen_version_needs_force(
    model_dir: Path, write_bundle: Callable[..., Path]
) -> None:
    write_bundle(model_dir, "m-1", "digits", created="2024-01-01T00:00:00Z")
    write_bundle(model_dir, "m-2", "digits", created="2025-01-01T00:00:00Z")
    write_bundle(model_dir, "m-3", "other", created="2026-01-01T00:00:00Z")
    registry = ModelRegistry(model_dir)
    registry.rescan()
    with pytest.raises(Conflict, match="default model"):
        registry.delete("m-1")
    registry.promote("m-3")
    with pytest.raises(Conflict, match="name 'digits' resolves to"):
        registry.delete("m-1")  # no longer the default, still what "digits" means
    registry.delete("m-2")  # another version: free to go
    registry.delete("m-3", force=True)
    assert registry.snapshot.default is not None  # the first model, recorded again
    assert registry.get("digits").id == "m-1"


def test_a_damaged_default_is_refused_not_replaced(
    model_dir: Path, write_bundle: Callable[..., Path]
) -> None:
    first = write_bundle(model_dir, "m-1", "digits", created="2024-01-01T00:00:00Z")
    write_bundle(model_dir, "m-2", "digits", created="2025-01-01T00:00:00Z")
    registry = ModelRegistry(model_dir)
    registry.rescan()
    good = (first / "compressor.onnx").read_bytes()
    (first / "compressor.onnx").write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    registry.rescan()
    for ref in (None, "digits", "m-1"):
        with pytest.raises((Conflict, Unavailable), match="m-1"):
            registry.get(ref)
    [damaged] = registry.damaged()
    assert damaged.id == "m-1" and "compressor.onnx: SHA-256 does not match" in damaged.problem
    assert str(model_dir) not in damaged.problem
    # Repaired in place (same directory, same inode): served again at the next scan.
    with (first / "compressor.onnx").open("r+b") as handle:
        handle.write(good)
    registry.rescan()
    assert registry.get(None).id == "m-1" and registry.damaged() == []


def test_delete_removes_the_directory(model_dir: Path, write_bundle: Callable[..., Path]) -> None:
    write_bundle(model_dir, "m-1", "a")
    registry = ModelRegistry(model_dir)
    registry.rescan()
    registry.delete("m-1", force=True)  # the default: only when forced
    assert not (model_dir / "m-1").exists()
    assert [p.name for p in model_dir.iterdir() if not p.name.startswith(".")] == []
    with pytest.raises(NotFound):
        registry.delete("m-1")


@pytest.mark.parametrize("ref", ["..", ".", "../models", "a/../../b", "/tmp", "", "a" * 65])
def test_delete_never_leaves_the_model_dir(
    tmp_path: Path, model_dir: Path, write_bundle: Callable[..., Path], ref: str
) -> None:
    sentinel = tmp_path / "keep"
    sentinel.mkdir()
    write_bundle(model_dir, "m-1", "a")
    registry = ModelRegistry(model_dir)
    registry.rescan()
    with pytest.raises(NotFound):
        registry.delete(ref)
    assert sentinel.exists() and (model_dir / "m-1").exists()


def test_delete_by_name_is_refused(model_dir: Path, write_bundle: Callable[..., Path]) -> None:
    write_bundle(model_dir, "m-1", "named")
    registry = ModelRegistry(model_dir)
    registry.rescan()
    with pytest.raises(NotFound):
        registry.delete("named")
