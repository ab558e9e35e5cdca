"""The exact models a runtime holds (``service.exact.models``): mapped, bounded, verified, and
refused with messages that name the model and no server path."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from mbn_core.bundle import load as bundle_load
from mbn_core.bundle import load_bundle
from mbn_core.bundle.manifest import exact_file
from service.exact.models import ModelCache, ModelFailure, ModelKey


def _key(path: Path) -> ModelKey:
    manifest = load_bundle(path).manifest
    return ModelKey(path.name, manifest["files"][exact_file(manifest)]["sha256"])


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return tmp_path / "models"


def test_models_are_mapped_bounded_and_eviction_reads_nothing(
    model_dir: Path,
    write_bundle: Callable[..., Path],
    digits: tuple[np.ndarray, np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x = digits[0][:5]
    paths = [write_bundle(model_dir, f"m-{i}", f"model-{i}") for i in range(3)]
    keys = [_key(path) for path in paths]
    cache = ModelCache(model_dir, capacity=2, threads=1, device="cpu")
    # Count the exact files read and hashed (the real function, called through).
    reads: list[str] = []
    verify = bundle_load._verified_file
    monkeypatch.setattr(
        bundle_load,
        "_verified_file",
        lambda path, manifest, name, chunks=None: (
            reads.append(name) or verify(path, manifest, name, chunks)
        ),
    )
    for key in keys:
        first = cache.get(key)
        assert cache.get(key) is first  # a hit: nothing read again
    assert reads.count("exact.npz") == 3 and len(cache) == 2
    held = cache.get(keys[0])  # the least recently used was dropped: read again
    assert reads.count("exact.npz") == 4
    expected = load_bundle(paths[0]).embed_with_clusters(x, mode="exact")
    embedding, clusters = held.exact.finish(held.exact.embed_raw(x.astype(np.float32)))
    np.testing.assert_array_equal(embedding, expected[0])
    np.testing.assert_array_equal(clusters, expected[1])
    assert held.batch_independent and held.device == "cpu" and cache.nbytes > 0


def test_a_bundle_replaced_since_the_api_verified_it_is_refused(
    model_dir: Path, write_bundle: Callable[..., Path]
) -> None:
    path = write_bundle(model_dir, "m-1", "one")
    cache = ModelCache(model_dir, capacity=2, threads=1, device="cpu")
    stale = ModelKey("m-1", "0" * 64)
    with pytest.raises(ModelFailure) as info:
        cache.get(stale)
    assert info.value.kind == "damaged" and "replaced since the model was verified" in str(
        info.value
    )
    assert str(model_dir) not in info.value.message
    assert cache.get(_key(path)).key.id == "m-1"


def test_a_model_changed_on_disk_while_held_is_verified_again(
    model_dir: Path, write_bundle: Callable[..., Path]
) -> None:
    path = write_bundle(model_dir, "m-1", "one")
    cache = ModelCache(model_dir, capacity=2, threads=1, device="cpu")
    key = _key(path)
    cache.get(key)
    exact = path / "exact.npz"
    data = bytearray(exact.read_bytes())
    data[len(data) // 2] ^= 0xFF  # tampered with in place
    exact.write_bytes(bytes(data))
    with pytest.raises(ModelFailure) as info:
        cache.get(key)
    assert info.value.kind == "damaged"
    assert info.value.message.startswith("exact.npz: SHA-256 does not match the manifest")
    assert len(cache) == 0


def test_a_deleted_or_unknown_model_is_refused_without_server_paths(
    model_dir: Path, write_bundle: Callable[..., Path]
) -> None:
    path = write_bundle(model_dir, "m-1", "one")
    key = _key(path)
    cache = ModelCache(model_dir, capacity=2, threads=1, device="cpu")
    (path / "exact.npz").unlink()
    with pytest.raises(ModelFailure) as info:
        cache.get(key)
    assert (info.value.kind, info.value.message) == ("damaged", "exact.npz: missing")
    shutil.rmtree(path)
    with pytest.raises(ModelFailure) as info:
        cache.get(key)
    assert (info.value.kind, info.value.message) == ("not_found", "model 'm-1' was deleted")
    with pytest.raises(ModelFailure) as info:
        cache.get(ModelKey("../etc", "0" * 64))
    assert info.value.kind == "not_found" and str(model_dir) not in info.value.message


_SHORT_OF_MEMORY = """
import resource, sys
from pathlib import Path
from service.exact.models import ModelCache, ModelFailure, ModelKey

model_dir, model_id, sha256 = sys.argv[1:]
cache = ModelCache(Path(model_dir), capacity=1, threads=1, device="cpu")
with open("/proc/self/status") as status:
    size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
# No room to map or build anything more.
resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 20), resource.RLIM_INFINITY))
try:
    cache.get(ModelKey(model_id, sha256))
except ModelFailure as failure:
    print(failure.kind, failure.message, sep="|")
else:
    print("loaded")
"""


@pytest.mark.slow  # starts the exact runtime (a process): seconds; the full suite runs it
def test_a_model_that_does_not_fit_in_memory_is_unavailable_not_damaged(
    model_dir: Path, write_bundle: Callable[..., Path]
) -> None:
    """A runtime short of memory (its address space capped) cannot load the model: refused
    as unavailable for now (503), naming the model, and never marked damaged (409)."""
    import subprocess
    import sys

    path = write_bundle(model_dir, "m-1", "one")
    key = _key(path)
    result = subprocess.run(
        [sys.executable, "-c", _SHORT_OF_MEMORY, str(model_dir), key.id, key.sha256],
        capture_output=True,
        text=True,
        timeout=300,
    )
    kind, message = result.stdout.strip().split("|")
    assert kind == "unavailable", result.stdout + result.stderr
    assert message == "model 'm-1' cannot be loaded now (not enough memory?)"
