"""The exact runtime's state and figures, as this API process last heard them."""

from __future__ import annotations

from dataclasses import dataclass

from service.exact import wire
from service.exact.client import totals
from service.exact.frontend import ExactFrontend


@dataclass(frozen=True)
class Histogram:
    """Counts per bucket: ``counts[i]`` values were at most ``bounds[i]`` (and above the bound
    before); the last count is above every bound."""

    bounds: tuple[float, ...]
    counts: list[int]


@dataclass(frozen=True)
class RuntimeReport:
    """The replica's exact runtime, for ``GET /exact/runtime`` and the console.

    Attributes
    ----------
    state : {"running", "down", "starting", "not started"}
    description : str
        The state in words (what readiness reports).
    pid, generation, restarts, device, device_note :
        The running process, its start number (1 for the first), restarts since the replica
        started, where it computes and why when that is not what was asked.
    queued_requests, queued_rows, running_rows, models_loaded, model_bytes : int
        As of its last figures (about once a second).
    requests, rows, batches, cancelled, abandoned, timed_out, rejected : int
        Since the replica started, every generation included.
    mean_batch_rows, mean_wait_ms, mean_compute_ms : float or None
        Rows per step, wait of a request before its first step, compute time of a step.
    batch_rows, wait_seconds, compute_seconds : Histogram or None
    """

    state: str
    description: str
    pid: int | None
    generation: int
    restarts: int
    device: str
    device_note: str
    queued_requests: int
    queued_rows: int
    running_rows: int
    models_loaded: int
    model_bytes: int
    requests: int
    rows: int
    batches: int
    cancelled: int
    abandoned: int
    timed_out: int
    rejected: int
    mean_batch_rows: float | None
    mean_wait_ms: float | None
    mean_compute_ms: float | None
    batch_rows: Histogram | None
    wait_seconds: Histogram | None
    compute_seconds: Histogram | None


class RuntimeHandler:
    """Reports the exact runtime (never blocks: everything comes from memory)."""

    def __init__(self, exact: ExactFrontend) -> None:
        self.exact = exact

    def report(self) -> RuntimeReport:
        state = self.exact.state
        if state is None:
            name = "not started"
        elif state.connected:
            name = "running"
        else:
            name = "starting" if state.generation == 0 else "down"
        stats = None if state is None else state.stats
        total = totals(state) if state is not None else {}

        def count(field: str) -> int:
            return int(total.get(field, 0))

        def mean(field: str, over: str, scale: float = 1.0) -> float | None:
            return total[field] * scale / count(over) if count(over) else None

        def histogram(field: str, bounds: tuple[float, ...]) -> Histogram | None:
            counts = total.get(f"{field}_buckets")
            return None if counts is None else Histogram(bounds, list(counts))

        return RuntimeReport(
            state=name,
            description=self.exact.describe(),
            pid=None if state is None or not state.connected else state.pid,
            generation=0 if state is None else state.generation,
            restarts=0 if state is None else max(0, state.generation - 1),
            device="" if state is None else state.device,
            device_note="" if state is None else state.device_note,
            queued_requests=0 if stats is None else stats.queued_requests,
            queued_rows=0 if stats is None else stats.queued_rows,
            running_rows=0 if stats is None else stats.running_rows,
            models_loaded=0 if stats is None else stats.models_loaded,
            model_bytes=0 if stats is None else stats.model_bytes,
            requests=count("requests"),
            rows=count("rows"),
            batches=count("batches"),
            cancelled=count("cancelled"),
            abandoned=count("abandoned"),
            timed_out=count("timed_out"),
            rejected=count("rejected"),
            mean_batch_rows=mean("batch_rows_sum", "batches"),
            mean_wait_ms=mean("wait_sum", "requests", 1000.0),
            mean_compute_ms=mean("compute_sum", "batches", 1000.0),
            batch_rows=histogram("batch_rows", tuple(map(float, wire.BATCH_ROWS_BOUNDS))),
            wait_seconds=histogram("wait", wire.SECONDS_BOUNDS),
            compute_seconds=histogram("compute", wire.SECONDS_BOUNDS),
        )
