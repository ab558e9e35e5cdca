"""The base install is the library and the offline CLI, without the web stack.

A real ``pip install`` of this project's wheel into a fresh virtual environment, without
extras: it trains, embeds and describes a bundle, has none of the service's dependencies, and
``mbn serve`` there says which extra to install. Packages come from a wheel cache
(``MBN_WHEELHOUSE``, default ``~/.cache/mbn-test/wheelhouse``), filled from the package index
the first time; without network and cache the test is skipped, saying so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SERVICE_ONLY = ["fastapi", "uvicorn", "sqlalchemy", "psycopg", "msgspec", "pybase64"]
# Prints which of the modules named on its command line can be imported.
FOUND_MODULES = (
    "import importlib.util, sys; print([m for m in sys.argv[1:] if importlib.util.find_spec(m)])"
)

pytestmark = pytest.mark.slow


def run(args: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)


def _wheelhouse(requirements: list[str]) -> Path:
    default = Path.home() / ".cache" / "mbn-test" / "wheelhouse"
    wheelhouse = Path(os.environ.get("MBN_WHEELHOUSE", default))
    wheelhouse.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q"]
    offline = run([*pip, "--no-index", "--find-links", str(wheelhouse), "--dest",
                   str(wheelhouse), *requirements])  # fmt: skip
    if offline.returncode != 0:
        online = run([*pip, "--dest", str(wheelhouse), *requirements])
        if online.returncode != 0:
            pytest.skip(f"no package index and no cached wheels: {online.stderr[-300:]}")
    return wheelhouse


@pytest.fixture(scope="module")
def base_env(tmp_path_factory: pytest.TempPathFactory, digits) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("install")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    requirements = [*project["build-system"]["requires"], *project["project"]["dependencies"]]
    wheelhouse = _wheelhouse(requirements)
    # Build from a copy: a build in the repository would leave an .egg-info there, which
    # every process importing from the repository would then take for the installed metadata.
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in ("mbn_core", "service"):
        shutil.copytree(
            REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    built = run([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "-q",
                 "--no-deps", "--no-index", "--find-links", str(wheelhouse),
                 "--wheel-dir", str(root / "dist"), str(source)])  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (root / "dist").glob("mbn_embeddings-*.whl")
    venv = root / "venv"
    created = run([sys.executable, "-m", "venv", str(venv)])
    assert created.returncode == 0, created.stderr
    # --no-compile: byte-compiling every module of SciPy and the rest took two thirds of the
    # install (24.7 s against 8.8 s here). What the tests import compiles when imported, so
    # the module as a whole gains less: 67.7 s against 73.4 s, one run each.
    installed = run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                     "--disable-pip-version-check", "--no-compile", "--no-index",
                     "--find-links", str(wheelhouse), str(wheel)])  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    work = root / "work"
    work.mkdir()
    X, y = digits
    np.savez(work / "digits.npz", x=X, y=y)
    np.save(work / "queries.npy", X[:7])
    return {"venv": venv, "work": work}


def mbn(base_env: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
    # Nothing from this repository or the test's environment: only what pip installed.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    return run([str(base_env["venv"] / "bin" / "mbn"), *args], cwd=base_env["work"], env=env)


def test_base_install(base_env, subtests):
    # One test, so that one xdist worker builds the environment (a module-scoped fixture is
    # built once per worker that runs a test of the module); subtests report each check.
    with subtests.test("it has no web stack"):
        python = str(base_env["venv"] / "bin" / "python")
        result = run([python, "-c", FOUND_MODULES, *SERVICE_ONLY], cwd=base_env["work"])
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "[]"

    with subtests.test("it trains, embeds and describes"):
        trained = mbn(base_env, "train", "digits.npz", "--out", "model", "--quiet",
                      "--n-clusterings", "20", "--k1", "0.1", "--hidden-layer-sizes", "32",
                      "--max-epochs", "4")  # fmt: skip
        assert trained.returncode == 0, trained.stderr
        assert "Wrote bundle 'model'" in trained.stdout
        embedded = mbn(base_env, "embed", "model", "queries.npy", "--out", "e.npy", "--exact")
        assert embedded.returncode == 0, embedded.stderr
        assert np.load(base_env["work"] / "e.npy").shape == (7, 10)
        described = mbn(base_env, "info", "model")
        assert described.returncode == 0, described.stderr
        assert "method:      mbn (fast path: distilled)" in described.stdout

    with subtests.test("it ships the CUDA kernels' source as package data"):
        shipped = "from mbn_core.mbn.backends.cuda import kernels; print(kernels.kernel_source())"
        result = run([python, "-c", shipped], cwd=base_env["work"])
        assert result.returncode == 0, result.stderr
        for name in ("count_kept_shared", "centred_first_best", "first_max_per_segment"):
            assert f'extern "C" __global__ void {name}(' in result.stdout, name

    with subtests.test("it brings umap-learn, which MBN's UMAP output trains with"):
        trained = mbn(base_env, "train", "digits.npz", "--out", "umap-model", "--quiet",
                      "--n-clusterings", "20", "--k1", "0.1", "--output", "umap",
                      "--hidden-layer-sizes", "32", "--max-epochs", "4")  # fmt: skip
        assert trained.returncode == 0, trained.stderr
        described = mbn(base_env, "info", "umap-model")
        assert "umap output" in described.stdout, described.stderr

    for command in ("serve", "worker"):
        with subtests.test("the service's commands say which extra to install", command=command):
            result = mbn(base_env, command, "--port", "8000")
            assert result.returncode == 2
            assert "Traceback" not in result.stderr
            assert (
                f"mbn {command}: error: this command needs the optional dependencies of "
                "the service extra" in result.stderr
            )
            assert "pip install 'mbn-embeddings[service]'" in result.stderr
            assert "pip install '.[service]'" in result.stderr
