"""Fixtures of the service tests: small real models, settings, servers, PostgreSQL.

Nothing here stands in for the code under test: models are trained by mbn_core, servers are
``mbn serve`` processes, the PostgreSQL is a real server (``MBN_TEST_POSTGRES_URL``, or the
one ``scripts/postgres.sh start`` provides; the tests fail, never skip, without it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import digits_data
import numpy as np
import pytest
import sqlalchemy as sa
from digits_data import Digits
from servicetest import MAP_POINTS, REPO, Process, make_settings, running_app
from small_models import small_student

from mbn_core import MBN, CompressiveMBN
from mbn_core.bundle import save_bundle, write_manifest
from mbn_core.bundle.embedding_map import EmbeddingMap, build_map
from service.config import Settings

with warnings.catch_warnings():
    # Starlette's TestClient announces a future switch to another httpx package.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient


@pytest.fixture(scope="session")
def digits() -> Digits:
    """The digits (``tests/digits_data.py``) as float32 rows, as the service's clients send
    them."""
    return digits_data.digits(np.float32)


@pytest.fixture(scope="session")
def tiny_model(digits: tuple[np.ndarray, np.ndarray]) -> CompressiveMBN:
    """A fitted compressive MBN with a clustering head (64 -> 10 dimensions)."""
    x, y = digits
    mbn = MBN(n_clusterings=10, random_state=0, n_jobs=1)
    return CompressiveMBN(
        mbn, hidden_layer_sizes=(16,), max_epochs=3, n_clusters=10, random_state=0, n_jobs=1
    ).fit(x, y)


@pytest.fixture(scope="session")
def digits_map(tiny_model: CompressiveMBN, digits: tuple[np.ndarray, np.ndarray]) -> EmbeddingMap:
    """A 2-D map of ``MAP_POINTS`` of ``tiny_model``'s training rows, coloured by label."""
    _, y = digits
    clusters = np.argmin(
        np.linalg.norm(tiny_model.embedding_[:, None] - tiny_model.cluster_centers_[None], axis=2),
        axis=1,
    )
    # The teacher's embedding covers the rows outside the held-out ones.
    rows = np.setdiff1d(np.arange(len(y)), tiny_model.holdout_)
    built = build_map(
        tiny_model.embedding_,
        clusters=clusters,
        labels=y[rows],
        max_points=MAP_POINTS,
        random_state=0,
    )
    return dataclasses.replace(built, row=rows[built.row])


@pytest.fixture(scope="session")
def write_bundle(tiny_model: CompressiveMBN) -> Callable[..., Path]:
    """Write ``tiny_model`` as bundle ``model_id`` (optionally back-dating its creation)."""

    def write(model_dir: Path, model_id: str, name: str, created: str | None = None) -> Path:
        model_dir.mkdir(parents=True, exist_ok=True)
        path = save_bundle(tiny_model, model_dir / model_id, name=name)
        if created is not None:
            manifest = json.loads((path / "manifest.json").read_text())
            manifest["created"] = created
            write_manifest(path, manifest)  # with a fresh self-digest
        return path

    return write


@pytest.fixture(scope="session")
def digits_data_dir(
    tmp_path_factory: pytest.TempPathFactory, write_bundle: Callable[..., Path]
) -> Callable[[str], Path]:
    """``digits_data_dir(prefix)``: a new data directory for a server, holding ``tiny_model``
    as ``m-digits`` (named "digits")."""

    def make(prefix: str) -> Path:
        data_dir = tmp_path_factory.mktemp(prefix)
        write_bundle(data_dir / "models", "m-digits", "digits")
        return data_dir

    return make


@pytest.fixture(scope="session")
def slow_bundle(digits: tuple[np.ndarray, np.ndarray]) -> Callable[[Path], Path]:
    """Write a digits model whose exact mode is slow enough to be caught computing, as
    ``m-slow``: V = 300 clusterings (the tiny model has 10), so 8,192 rows of exact MBN take
    seconds however fast the machine (with V = 100 they took 0.8 s once the bottom layer's
    kernels got faster, within a test's one-second shutdown grace)."""
    x, y = digits
    slow = small_student(
        MBN(n_clusterings=300, random_state=0, n_jobs=1), x, y, hidden_layer_sizes=(16,)
    )

    def write(model_dir: Path) -> Path:
        model_dir.mkdir(parents=True, exist_ok=True)
        return save_bundle(slow, model_dir / "m-slow", name="slow")

    return write


@pytest.fixture
def settings_for(tmp_path: Path) -> Callable[..., Settings]:
    return lambda **overrides: make_settings(tmp_path / "data", **overrides)


@pytest.fixture
def api(tmp_path: Path, write_bundle: Callable[..., Path]) -> Iterator[Callable[..., TestClient]]:
    """A factory of in-process apps (see ``running_app``): ``api(models=False, **settings)``.
    No embedded worker unless asked for."""
    with contextlib.ExitStack() as stack:
        count = 0

        def start(models: bool = True, **overrides: Any) -> TestClient:
            nonlocal count
            count += 1
            overrides.setdefault("embedded_worker", False)
            data_dir = tmp_path / f"data{count}"
            settings = make_settings(data_dir, **overrides)
            return stack.enter_context(running_app(settings, write_bundle if models else None))

        yield start


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    """Processes started by a test; whatever is still running at the end is killed."""
    started: list[Process] = []
    yield started
    for process in started:
        with contextlib.suppress(Exception):
            process.stop(signal.SIGKILL, timeout=10)


@pytest.fixture(scope="session")
def postgres_server_url() -> str:
    """A PostgreSQL URL: MBN_TEST_POSTGRES_URL, else the server of scripts/postgres.sh."""
    url = os.environ.get("MBN_TEST_POSTGRES_URL")
    if url:
        return url
    script = REPO / "scripts" / "postgres.sh"
    if not script.exists():
        pytest.fail("no PostgreSQL: set MBN_TEST_POSTGRES_URL or provide scripts/postgres.sh")
    result = subprocess.run(
        [str(script), "start"], capture_output=True, text=True, timeout=600, check=False
    )
    if result.returncode != 0:
        pytest.fail(f"scripts/postgres.sh start failed:\n{result.stderr[-3000:]}")
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture
def postgres_url(postgres_server_url: str) -> Iterator[str]:
    """A URL whose connections live in a fresh schema of their own (dropped afterwards), so
    tests, and test runs of several people, never see each other's jobs."""
    schema = f"test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(postgres_server_url)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    separator = "&" if "?" in postgres_server_url else "?"
    yield f"{postgres_server_url}{separator}options=-csearch_path%3D{schema}"
    with admin.begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()
