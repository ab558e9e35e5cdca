"""The training process, one per job attempt, started by the worker.

Processes come from a multiprocessing *forkserver*: a clean single-threaded process, started
once, that has already imported the training code (several seconds of imports: scikit-learn,
numba, onnx) and forks a child per job in milliseconds. Not a fork of the worker itself, which
has threads (uvicorn, onnxruntime, the worker's own) that a fork would copy mid-flight; and the
forkserver does not re-import the parent's ``__main__``, which may be anything.

Protocol, over a one-way pipe: ``("progress", phase, fraction)`` while training, then exactly
one of ``("done", bundle_path)``, ``("stopped", "")``, ``("error", message)``. SIGTERM asks the
process to stop: the training callback returns True at its next call and nothing is written
(the worker kills it if that takes too long). It gets SIGKILL when its parent goes away (Linux
``PR_SET_PDEATHSIG``; the forkserver itself exits with the worker), so no training outlives
the worker that owns the job.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_PROGRESS_EVERY_SECONDS = 0.25
DATA_REMOVED = "the job's training data was removed (the job was cancelled or deleted)"
# What the forkserver imports once, before forking any training process.
_PRELOAD = ["service.trainproc", "mbn_core.pipeline.training"]


@dataclass(frozen=True)
class TrainSpec:
    """Everything the training process needs, as plain picklable values."""

    job_id: str
    name: str
    params: dict[str, Any]
    data_path: str
    out_dir: str
    model_id: str
    threads: int
    # A Dask scheduler's address: the MBN layers' clusterings run on its workers.
    scheduler: str | None = None
    connect_timeout: float = 10.0
    # The bundle of the model the new one is aligned to (mbn_core.pipeline.alignment).
    align_dir: str | None = None


def context() -> BaseContext:
    """The multiprocessing context training processes are started from."""
    if "forkserver" not in mp.get_all_start_methods():  # pragma: no cover - not Linux
        return mp.get_context("spawn")
    from mbn_core.methods import registered_modules

    ctx = mp.get_context("forkserver")
    # The modules that registered the methods: a training process knows every method the
    # API accepted (plug-ins included) without naming any.
    ctx.set_forkserver_preload([*_PRELOAD, *registered_modules()])
    return ctx


def warm_up(ctx: BaseContext) -> None:
    """Start the forkserver (and its imports) now, so the first job starts in milliseconds
    rather than after seconds without heartbeats."""
    proc = ctx.Process(target=_nothing)  # type: ignore[attr-defined]
    proc.start()
    proc.join()


def _nothing() -> None:
    pass


def run(spec: TrainSpec, conn: Connection) -> None:
    """Entry point of the training process."""
    _die_with_parent()
    stop_requested = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal is the worker's
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s trainproc: %(message)s"
        )
    try:
        conn.send(_train(spec, conn, lambda: stop_requested))
    except OSError:
        pass  # the worker is gone: nobody to tell
    finally:
        conn.close()


def _train(spec: TrainSpec, conn: Connection, stopped: Any) -> tuple[str, str]:
    from mbn_core import TrainingStopped
    from mbn_core.data.readers import load_training_data
    from mbn_core.pipeline.training import TrainingParams, train_bundle
    from mbn_core.utils.blas import limited_threads

    parent = os.getppid()
    last_sent = 0.0

    def progress(phase: str, fraction: float) -> bool:
        nonlocal last_sent
        now = time.monotonic()
        if now - last_sent >= _PROGRESS_EVERY_SECONDS or fraction >= 1.0:
            last_sent = now
            try:
                conn.send(("progress", phase, float(fraction)))
            except OSError:  # the worker is gone: stop
                return True
        return bool(stopped()) or os.getppid() != parent

    try:
        with limited_threads(spec.threads), _cluster(spec):
            x, y = load_training_data(Path(spec.data_path))
            align_to = _align_target(spec)
            path = train_bundle(
                x,
                Path(spec.out_dir),
                name=spec.name,
                params=TrainingParams.from_dict(spec.params),
                y=y,
                model_id=spec.model_id,
                progress=progress,
                align_to=align_to,
            )
    except TrainingStopped:
        return ("stopped", "")
    except ClusterUnavailable as exc:
        log.error("job %s: %s", spec.job_id, exc.detail)
        return ("error", str(exc))
    except Exception as exc:  # becomes the job's error; the traceback goes to the log
        if not Path(spec.data_path).exists():
            # Cancelling or deleting a job removes its data, which can happen just as an
            # attempt starts: an expected end, not a fault with a traceback.
            log.info("job %s: its training data was removed; not training", spec.job_id)
            return ("error", DATA_REMOVED)
        log.exception("job %s: training failed", spec.job_id)
        # Clients see the error: name their data, not where the server keeps it.
        message = str(exc).replace(spec.data_path, "the training data")
        # The message says what went wrong; the exception's class is for the log, not users.
        return ("error", message or "training failed; the server log has the details")
    return ("done", str(path))


def _align_target(spec: TrainSpec) -> Any:
    """The loaded bundle to align to, or None; a ValueError without server paths when it
    is gone or damaged since the job was submitted."""
    if spec.align_dir is None:
        return None
    from mbn_core.bundle import BundleError, load_bundle

    try:
        return load_bundle(spec.align_dir)
    except BundleError:
        model_id = Path(spec.align_dir).name
        raise ValueError(
            f"the model to align to, {model_id!r}, was deleted or damaged after the job was "
            "submitted"
        ) from None


class ClusterUnavailable(RuntimeError):
    """The configured Dask cluster cannot be used; the message is safe to show clients."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


@contextlib.contextmanager
def _cluster(spec: TrainSpec) -> Iterator[None]:
    """Fits inside run on the Dask cluster of ``spec.scheduler`` (nothing without one).

    Connects before the data is read: a cluster that cannot be reached fails the job at once.
    Clients see that the training cluster is unreachable, not its address (the log has it).
    """
    if spec.scheduler is None:
        yield
        return
    from mbn_core.mbn.backends.dask import SchedulerUnreachable, use_dask

    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(use_dask(spec.scheduler, timeout=spec.connect_timeout))
        except (SchedulerUnreachable, ImportError) as error:
            raise ClusterUnavailable(
                "the training cluster (Dask scheduler) cannot be reached; ask the operator "
                "to check MBN_DASK_SCHEDULER",
                str(error),
            ) from None
        yield


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
