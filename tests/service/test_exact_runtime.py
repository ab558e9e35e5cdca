"""The exact runtime as API processes use it: a real runtime process started by its
supervisor, asked through ``ExactFrontend`` (``service.exact``).

Every answer must be bit for bit what ``transform`` of that request alone gives, however the
runtime merged and split the requests; refusals carry the service's domain errors."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from digits_data import Digits
from servicetest import BUSY_MACHINE_SECONDS

from mbn_core.bundle import Bundle, load_bundle
from service.domain import ClientGone, Conflict, NotFound, Overloaded, Unavailable
from service.exact import segments
from service.exact.frontend import ExactFrontend, runtime_config
from service.registry import ModelRegistry


def frontend(model_dir: Path, **overrides: Any) -> tuple[ExactFrontend, ModelRegistry]:
    registry = ModelRegistry(model_dir)
    registry.rescan()
    values: dict[str, Any] = {
        "model_dir": model_dir,
        "lanes": 2,
        "device": "cpu",
        "cache_size": 2,
        "max_requests": 64,
        "max_rows": 100_000,
        "batch_rows": 64,
        "max_wait": 0.005,
        "max_payload": 256 << 20,
        "log_level": "info",
    }
    timeout = overrides.pop("timeout", 120.0)
    values.update(overrides)
    exact = ExactFrontend(
        socket_path=None,
        config=runtime_config(**values),
        mark_damaged=registry.mark_damaged,
        timeout=timeout,
        retry_after=1,
    )
    return exact, registry


def run(
    model_dir: Path, scenario: Callable[[ExactFrontend, ModelRegistry], Awaitable[Any]], **config
) -> Any:
    """``scenario(exact, registry)`` with a runtime of its own, stopped afterwards."""

    async def main() -> Any:
        exact, registry = frontend(model_dir, **config)
        await exact.start()
        try:
            return await scenario(exact, registry)
        finally:
            await exact.close()

    return asyncio.run(main())


async def stats_after(exact: ExactFrontend, condition: Callable[[Any], bool]) -> Any:
    """The runtime's figures once ``condition`` holds (they arrive about once a second; the
    deadline only detects a hang, so it allows a busy machine)."""
    deadline = time.monotonic() + BUSY_MACHINE_SECONDS
    while time.monotonic() < deadline:
        state = exact.state
        if state is not None and state.stats is not None and condition(state.stats):
            return state.stats
        await asyncio.sleep(0.05)
    raise AssertionError("the runtime's figures never got there")


def _segments() -> set[str]:
    """The runtime's segments in /dev/shm (other programs of the host keep files there too)."""
    return {n for n in os.listdir(segments.DEFAULT_DIRECTORY) if n.startswith("mbn-exact-")}


def alone(bundle: Bundle, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The library's exact answer for these rows alone."""
    return bundle.embed_with_clusters(rows, mode="exact")


@pytest.mark.slow  # starts the exact runtime (a process): seconds; the full suite runs it
def test_concurrent_requests_of_every_size_get_what_transform_alone_gives(
    tmp_path: Path, write_bundle: Callable[..., Path], digits: Digits
) -> None:
    """Twelve requests at once, from 1 to 1,500 rows (the largest through a shared memory
    segment, computed over many steps of 64 rows): merged and split by the runtime, each
    answer equal to the library's transform of that request alone, bit for bit."""
    model_dir = tmp_path / "models"
    bundle = load_bundle(write_bundle(model_dir, "m-digits", "digits"))
    x = np.resize(digits[0], (3000, 64)).astype(np.float32)
    sizes = [1, 2, 1, 5, 17, 3, 1, 64, 1500, 1, 40, 9]
    starts = np.cumsum([0, *sizes[:-1]])
    requests = [x[start : start + size] for start, size in zip(starts, sizes, strict=True)]
    before = _segments()

    async def scenario(exact: ExactFrontend, registry: ModelRegistry) -> Any:
        bundle = registry.get("m-digits")
        await exact.embed(bundle, x[:1])  # starts the runtime and reads the model
        answers = await asyncio.gather(*(exact.embed(bundle, rows) for rows in requests))
        stats = await stats_after(exact, lambda s: s.requests == len(sizes) + 1)
        # Exact work yields the CPU to the API processes: its two compute lanes run at a
        # lower priority; the threads that take requests in and answer them do not.
        assert exact.supervisor is not None and exact.supervisor.pid is not None
        pid, own = exact.supervisor.pid, os.getpriority(os.PRIO_PROCESS, 0)
        nices = [os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(f"/proc/{pid}/task")]
        assert os.getpriority(os.PRIO_PROCESS, pid) == own
        assert set(nices) == {own, min(19, own + 5)}
        assert own > 14 or nices.count(own + 5) == 2  # (a test run at nice 15+ cannot tell)
        return answers, stats

    answers, stats = run(model_dir, scenario, niceness=5)
    for rows, answer in zip(requests, answers, strict=True):
        embedding, clusters = alone(bundle, rows)
        np.testing.assert_array_equal(answer.embedding, embedding)
        np.testing.assert_array_equal(answer.clusters, clusters)
    # Merged: fewer steps than requests, although the large one alone took 24.
    assert stats.batches < len(sizes) + 24 and stats.rows == sum(sizes) + 1
    assert _segments() <= before  # no segment left behind


@pytest.mark.slow
def test_a_batch_dependent_method_computes_each_request_alone(
    tmp_path: Path, digits: Digits
) -> None:
    """umap-learn's transform places a row differently beside other rows
    (``Method.batch_independent_exact`` is False for ``umap``): the runtime never merges its
    requests nor splits one over steps, so every answer is, bit for bit, ``transform`` of
    that request alone, and the steps are as many as the requests."""
    from small_models import small_student

    from mbn_core.bundle import save_bundle
    from mbn_core.layouts import UMAP
    from mbn_core.methods import get_method

    assert not get_method("umap").batch_independent_exact
    x, y = digits
    teacher = UMAP(n_epochs=30, n_neighbors=10, random_state=0)
    model = small_student(teacher, x[:400], y[:400], hidden_layer_sizes=(16,))
    model_dir = tmp_path / "models"
    model_dir.mkdir()
    bundle = load_bundle(save_bundle(model, model_dir / "m-umap", name="umap"))
    sizes = [1, 7, 3, 90, 30, 1]  # 90: more than a step's 64 rows, computed whole
    starts = np.cumsum([0, *sizes[:-1]]) + 500
    requests = [x[start : start + size] for start, size in zip(starts, sizes, strict=True)]

    async def scenario(exact: ExactFrontend, registry: ModelRegistry) -> Any:
        served = registry.get("m-umap")
        await exact.embed(served, x[:1])  # starts the runtime and reads the model
        answers = await asyncio.gather(*(exact.embed(served, rows) for rows in requests))
        stats = await stats_after(exact, lambda s: s.requests == len(sizes) + 1)
        return answers, stats

    # umap-learn compiles its transform in the runtime's first call: minutes on a busy machine.
    answers, stats = run(model_dir, scenario, timeout=900.0)
    for rows, answer in zip(requests, answers, strict=True):
        np.testing.assert_array_equal(answer.embedding, alone(bundle, rows)[0])
    assert stats.batches == len(sizes) + 1 and stats.rows == sum(sizes) + 1
    # Merged, they would not have been: transform of the rows together places them apart.
    together = bundle.embed(np.concatenate(requests[:3]), mode="exact")
    assert not np.array_equal(together[:1], answers[0].embedding)


@pytest.mark.slow  # starts the exact runtime (a process): seconds; the full suite runs it
def test_refusals_name_the_model_and_never_a_server_path(
    tmp_path: Path, write_bundle: Callable[..., Path], digits: Digits
) -> None:
    model_dir = tmp_path / "models"
    for name in ("m-full", "m-damaged", "m-deleted", "m-ok"):
        write_bundle(model_dir, name, name)
    rows = digits[0][:3].astype(np.float32)

    async def scenario(exact: ExactFrontend, registry: ModelRegistry) -> list[Exception]:
        bundles = {name: registry.get(name) for name in ("m-damaged", "m-deleted", "m-ok")}
        exact_file = bundles["m-damaged"].path / "exact.npz"
        data = bytearray(exact_file.read_bytes())
        data[len(data) // 2] ^= 0xFF
        exact_file.write_bytes(bytes(data))
        shutil.rmtree(bundles["m-deleted"].path)
        errors: list[Exception] = []
        for name in ("m-damaged", "m-deleted"):
            try:
                await exact.embed(bundles[name], rows)
            except Exception as error:  # the test reads what each one is
                errors.append(error)
        # The damaged model is out of service; the others still answer.
        assert registry.snapshot.resolve("m-damaged") is None
        answer = await exact.embed(bundles["m-ok"], rows)
        np.testing.assert_array_equal(answer.embedding, alone(bundles["m-ok"], rows)[0])
        try:  # rows the model cannot take: a 422, never a crash of the runtime
            await exact.embed(bundles["m-ok"], np.zeros((2, 5), np.float32))
        except Exception as error:
            errors.append(error)
        return errors

    damaged, deleted, invalid = run(model_dir, scenario)
    assert isinstance(damaged, Conflict) and "m-damaged" in damaged.message
    assert "SHA-256 does not match" in damaged.message
    assert isinstance(deleted, NotFound) and deleted.message == "model 'm-deleted' was deleted"
    assert "takes rows of 64 values" in invalid.message
    for error in (damaged, deleted, invalid):
        assert str(tmp_path) not in str(error)


@pytest.mark.slow
def test_a_full_queue_refuses_at_once_and_a_client_that_leaves_frees_its_place(
    tmp_path: Path, slow_bundle: Callable[[Path], Path], digits: Digits
) -> None:
    """One request in the queue at most: the next is refused (429) while it computes; once
    its client leaves, its rows are dropped and the next request is taken."""
    model_dir = tmp_path / "models"
    slow_bundle(model_dir)
    # Seconds of work on any machine: it is still computing when the figures say so.
    big = np.resize(digits[0], (40_000, 64)).astype(np.float32)

    async def scenario(exact: ExactFrontend, registry: ModelRegistry) -> Any:
        bundle = registry.get("m-slow")
        await exact.embed(bundle, big[:1])  # the runtime started and the model read
        left = asyncio.Event()
        waiting = asyncio.create_task(exact.embed(bundle, big, gone=left.wait))
        # Rows only the large request has (a figure from the one-row request's step may
        # arrive after its answer).
        await stats_after(exact, lambda s: s.queued_rows > 1000 and s.running_rows > 1)
        with pytest.raises(Overloaded) as refused:
            await exact.embed(bundle, big[:1])
        left.set()  # the client goes away
        with pytest.raises(ClientGone):
            await waiting
        await stats_after(exact, lambda s: s.cancelled == 1 and s.queued_requests == 0)
        started = time.monotonic()
        answer = await exact.embed(bundle, big[:1])
        return refused.value, answer, time.monotonic() - started

    refused, answer, _ = run(model_dir, scenario, max_requests=1, batch_rows=256)
    assert refused.retry_after == 1 and "1 exact-mode requests are queued" in refused.message
    assert answer.embedding.shape == (1, 10)


@pytest.mark.slow
def test_a_killed_runtime_fails_its_requests_with_503_and_is_started_again(
    tmp_path: Path, slow_bundle: Callable[[Path], Path], digits: Digits
) -> None:
    model_dir = tmp_path / "models"
    slow_bundle(model_dir)
    big = np.resize(digits[0], (8192, 64)).astype(np.float32)

    async def scenario(exact: ExactFrontend, registry: ModelRegistry) -> Any:
        bundle = registry.get("m-slow")
        first = await exact.embed(bundle, big[:1])
        assert exact.supervisor is not None
        pid = exact.supervisor.pid
        assert pid is not None
        in_flight = asyncio.create_task(exact.embed(bundle, big))
        await stats_after(exact, lambda s: s.running_rows > 1)  # the large one's, not the row's
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(Unavailable) as lost:
            await in_flight
        # Meanwhile: refused at once (a load balancer retries elsewhere), never kept waiting.
        assert exact.state is not None
        while exact.state.connected:  # the closed connection is noticed on the loop
            await asyncio.sleep(0.01)
        with pytest.raises(Unavailable) as down:
            await exact.embed(bundle, big[:1])
        while not exact.state.connected:
            await asyncio.sleep(0.05)
        again = await exact.embed(bundle, big[:1])
        np.testing.assert_array_equal(again.embedding, first.embedding)
        assert exact.supervisor.pid not in (None, pid) and exact.supervisor.restarts == 1
        assert exact.state.generation == 2
        return lost.value, down.value

    lost, down = run(model_dir, scenario, batch_rows=8192)
    assert lost.retry_after == down.retry_after == 1
    assert "restarted while computing this request" in lost.message
    assert "m-slow" in down.message and "down" in down.message


@pytest.mark.slow  # starts the exact runtime (a process): seconds; the full suite runs it
def test_a_gpu_that_is_not_there_is_reported_and_refused(
    tmp_path: Path, write_bundle: Callable[..., Path], digits: Digits
) -> None:
    from mbn_core.mbn.backends.cuda import gpu_count

    if gpu_count():
        pytest.skip("this machine has a GPU")
    model_dir = tmp_path / "models"
    write_bundle(model_dir, "m-digits", "digits")
    rows = digits[0][:2].astype(np.float32)

    async def scenario(exact: ExactFrontend, registry: ModelRegistry) -> Any:
        bundle = registry.get("m-digits")
        try:
            await exact.embed(bundle, rows)
        except Unavailable as error:
            return error, exact.state
        raise AssertionError("computed without a GPU")

    error, state = run(model_dir, scenario, device="cuda")
    assert state.device == "none" and "MBN_EXACT_DEVICE=cuda" in state.device_note
    assert "m-digits" in error.message and "MBN_EXACT_DEVICE=cuda" in error.message

    async def automatic(exact: ExactFrontend, registry: ModelRegistry) -> Any:
        answer = await exact.embed(registry.get("m-digits"), rows)
        return answer, exact.state

    answer, state = run(model_dir, automatic, device="auto")
    assert state.device == "cpu" and "found no usable GPU" in state.device_note
    np.testing.assert_array_equal(
        answer.embedding, alone(load_bundle(model_dir / "m-digits"), rows)[0]
    )


@pytest.mark.slow  # a fresh interpreter per module: seconds; the full suite runs it
@pytest.mark.parametrize(
    "module", ["service.exact.process", "service.exact.frontend", "service.admission"]
)
def test_the_runtime_and_the_admission_logic_import_no_web_framework(module: str) -> None:
    """The runtime process imports what computing needs, not the API's stack nor the fast
    path's ONNX Runtime; what the API processes keep of exact mode and of admission speaks
    domain errors, not HTTP."""
    import subprocess
    import sys

    unwanted = ["fastapi", "starlette", "uvicorn", "sqlalchemy", "prometheus_client"]
    unwanted += ["pydantic", "alembic", "httpx"]
    if module == "service.exact.process":
        unwanted += ["onnxruntime", "onnx"]
    probe = f"import sys, {module}\nprint(sorted(m for m in {unwanted!r} if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300
    )
    assert result.stdout.strip() == "[]", result.stdout
