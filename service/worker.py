"""The training worker: claims queued jobs and runs each in a child process.

Why a child process: a cancel must stop training promptly (the training callback asks it to
stop; a process that does not listen is terminated), and a crash in training (a segfault, the
kernel's OOM killer) must not take the API down. How the processes are made:
``service.trainproc``.

The child writes its bundle into a private staging directory. Only the parent, while it still
owns the job, moves the bundle into the model directory and records success, so a child
left behind by a dead worker can never publish a model. Each attempt of a job has its own
model id (``<job id>-<attempt>``); a new attempt removes what earlier attempts of the same
job may have left in the model directory, so a job yields exactly one model.

Policy (see ``service.jobs`` for the store side):

- cancelled, or the job was taken away (recovered after a missed heartbeat): stop the
  child, publish nothing;
- worker shutting down: stop the child and put the job back in the queue at once;
- the database is unreachable for half of ``stale_after_seconds``: stop the child (another
  worker will soon take the job over; two must never run it at once);
- the child dies without an answer, raises, or runs past ``job_timeout_seconds``: failed,
  with the reason, never retried (a deterministic crash would loop);
- succeeded, and the job asked to ``promote``: its model becomes the default and its name's
  version (``service.aliases``); a job that did not ask moves neither.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from mbn_core.bundle import bundle_path
from service import leftovers, trainproc
from service.aliases import AliasFile
from service.alignment import ALIGN_TO
from service.config import Settings
from service.domain import Unavailable
from service.jobs import STARTING_PHASE, Job, JobFiles, JobStore
from service.submission import server_params
from service.trainproc import TrainSpec

log = logging.getLogger(__name__)

# Seconds a training process gets to stop on its own (its training callback returns True)
# before it is killed.
STOP_GRACE_SECONDS = 2.0


def model_id_for(job_id: str, attempt: int) -> str:
    """The id of the model an attempt of a job makes (stable, so leftovers can be found)."""
    return f"{job_id}-{attempt}"


@dataclass
class _Run:
    """What supervising one child found out."""

    result: tuple[str, str] | None = None  # ("done", path) | ("stopped", "") | ("error", msg)
    stop_reason: str | None = None  # why the parent stopped it
    exitcode: int | None = None


class Worker:
    """Claims and runs training jobs until ``stop()``.

    Parameters
    ----------
    settings : Settings
    store : JobStore
    on_model : callable, optional
        Called with the path of each published bundle (the embedded worker swaps it into
        the API's registry at once; stand-alone workers leave it to the replicas' rescans).
    """

    def __init__(
        self,
        settings: Settings,
        store: JobStore,
        *,
        on_model: Callable[[Path], object] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.files = JobFiles(settings.jobs_path)
        self.on_model = on_model
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stopping = threading.Event()
        self._waiting = threading.Event()  # set while waiting for work (idle or full)
        self._wake = threading.Event()
        self._active: dict[str, threading.Thread] = {}
        self._thread: threading.Thread | None = None
        self._last_recovery = 0.0
        self._ctx = trainproc.context()
        self._pids: dict[str, int | None] = {}

    # --- control -----------------------------------------------------------------------------
    def start(self) -> None:
        """Run the loop in a background thread (the API's embedded worker)."""
        self._thread = threading.Thread(target=self.run, name="mbn-worker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop claiming, stop running children, give their jobs back; wait for that."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wake(self) -> None:
        """A job was queued: look now rather than at the next poll."""
        self._wake.set()

    @property
    def waiting(self) -> bool:
        """Whether the worker is waiting for a wake-up or its next poll."""
        return self._waiting.is_set()

    @property
    def running_jobs(self) -> list[str]:
        return list(self._active)

    @property
    def training_pids(self) -> dict[str, int | None]:
        """Process id of the training process of each running job."""
        return dict(self._pids)

    # --- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        log.info(
            "worker %s started (concurrency %d)", self.worker_id, self.settings.worker_concurrency
        )
        # On PostgreSQL a job entering the queue wakes this worker at once (LISTEN/NOTIFY);
        # the poll below stays as the fallback (and is all there is on SQLite).
        listener = threading.Thread(
            target=self.store.listen,
            args=(self.wake, self._stopping),
            name="mbn-worker-listen",
            daemon=True,
        )
        listener.start()
        try:
            trainproc.warm_up(self._ctx)
            log.info("worker %s ready", self.worker_id)
            while not self._stopping.is_set():
                self._wake.clear()  # before looking: a wake-up from now on is not lost
                self._reap()
                self._recover_if_due()
                if len(self._active) < self.settings.worker_concurrency and self._claim_one():
                    continue
                self._waiting.set()
                self._wake.wait(self.settings.poll_interval_seconds)
                self._waiting.clear()
        finally:
            for thread in list(self._active.values()):
                thread.join()
            self._reap()
            listener.join()
            log.info("worker %s stopped", self.worker_id)

    def _claim_one(self) -> bool:
        try:
            job = self.store.claim(self.worker_id)
        except Unavailable:
            return False
        except Exception:
            log.exception("claiming a job failed")
            return False
        if job is None:
            return False
        thread = threading.Thread(
            target=self._run_job_logged, args=(job,), name=f"mbn-job-{job.id[:8]}", daemon=True
        )
        self._active[job.id] = thread
        thread.start()
        return True

    def _reap(self) -> None:
        for job_id, thread in list(self._active.items()):
            if not thread.is_alive():
                del self._active[job_id]

    def _recover_if_due(self) -> None:
        now = time.monotonic()
        if now - self._last_recovery < self.settings.heartbeat_seconds:
            return
        self._last_recovery = now
        try:
            recovered = self.store.recover_stale(
                stale_after=self.settings.stale_after_seconds,
                max_attempts=self.settings.max_attempts,
            )
        except Unavailable:
            return
        except Exception:
            log.exception("recovering stale jobs failed")
            return
        for job_id, status in recovered:
            if status == "failed":
                self.files.remove(job_id)
        try:
            leftovers.sweep(self.settings, self.store)
        except Unavailable:
            return
        except Exception:
            log.exception("removing leftovers failed")

    # --- one job -----------------------------------------------------------------------------
    def _run_job_logged(self, job: Job) -> None:
        try:
            self._run_job(job)
        except Exception:
            # The store may be down; the job is then recovered by the stale-heartbeat rule.
            log.exception("job %s: supervising failed", job.id)

    def _run_job(self, job: Job) -> None:
        log.info("job %s: attempt %d started by %s", job.id, job.attempts, self.worker_id)
        model_id = model_id_for(job.id, job.attempts)
        self._remove_earlier_attempts(job)
        staging = self.settings.data_dir / "staging" / model_id
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            try:
                data_path = self.files.path(job.id, job.data_file)
            except ValueError as exc:
                self._fail(job, str(exc))
                return
            # Threads and the device are the server's to give (clients may set neither).
            params = server_params(job.params, self.settings)
            # The model to align to, checked at submission (service.alignment).
            align_to = params.pop(ALIGN_TO, None)
            spec = TrainSpec(
                job_id=job.id,
                name=job.name,
                params=params,
                data_path=str(data_path),
                out_dir=str(staging / model_id),
                model_id=model_id,
                threads=self.settings.train_threads,
                scheduler=self.settings.dask_scheduler,
                connect_timeout=self.settings.dask_connect_timeout_seconds,
                align_dir=None
                if align_to is None
                else str(bundle_path(self.settings.models_path, align_to)),
            )
            run = self._supervise(job, spec)
            self._conclude(job, run, model_id)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _supervise(self, job: Job, spec: TrainSpec) -> _Run:
        receiver, sender = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(  # type: ignore[attr-defined]
            target=trainproc.run, args=(spec, sender), name=f"mbn-train-{job.id[:8]}"
        )
        proc.start()
        sender.close()
        self._pids[job.id] = proc.pid
        try:
            return self._watch(job, proc, receiver)
        finally:
            self._pids.pop(job.id, None)
            if proc.is_alive():
                _terminate(proc)
            receiver.close()

    def _watch(self, job: Job, proc: Any, receiver: Connection) -> _Run:
        settings = self.settings
        run = _Run()
        progress, phase = 0.0, STARTING_PHASE
        started = last_ok = time.monotonic()
        last_beat = 0.0  # beat at once: starting the process may have taken a while
        stop_deadline = 0.0
        while True:
            try:
                if receiver.poll(0.2):
                    message = receiver.recv()
                    if message[0] == "progress":
                        phase, progress = message[1], message[2]
                    else:
                        run.result = (message[0], message[1])
                        break
            except (EOFError, OSError):
                break  # the process is gone without an answer
            now = time.monotonic()
            if run.stop_reason is None:
                if self._stopping.is_set():
                    run.stop_reason = "shutdown"
                elif now - started > settings.job_timeout_seconds:
                    run.stop_reason = "timeout"
                elif now - last_beat >= settings.heartbeat_seconds:
                    last_beat = now
                    try:
                        if not self.store.heartbeat(
                            job.id, self.worker_id, progress=progress, phase=phase
                        ):
                            run.stop_reason = self._why_not_ours(job.id)
                        last_ok = now
                    except Unavailable:
                        if now - last_ok > settings.stale_after_seconds / 2:
                            run.stop_reason = "fenced"
                if run.stop_reason is not None:
                    log.info("job %s: stopping training (%s)", job.id, run.stop_reason)
                    proc.terminate()  # SIGTERM: the training callback stops it cleanly
                    stop_deadline = now + STOP_GRACE_SECONDS
            elif now > stop_deadline:
                proc.kill()
                break
        proc.join(STOP_GRACE_SECONDS)
        if proc.is_alive():
            _terminate(proc)
        run.exitcode = proc.exitcode
        return run

    def _why_not_ours(self, job_id: str) -> str:
        """Why a heartbeat found the job no longer ours: a user's cancel, or lost (another
        worker took it over, or it is gone)."""
        try:
            current = self.store.get(job_id)
        except Unavailable:
            return "lost"
        return "cancelled" if current is not None and current.status == "cancelled" else "lost"

    def _conclude(self, job: Job, run: _Run, model_id: str) -> None:
        if run.stop_reason == "shutdown":
            if self.store.release(job.id, self.worker_id):
                log.info("job %s: given back to the queue (shutdown)", job.id)
            return
        if run.stop_reason in ("cancelled", "lost", "fenced"):
            current = self.store.get(job.id)
            if current is not None and current.finished:
                self.files.remove(job.id)
            log.info("job %s: no longer ours (%s)", job.id, current.status if current else "gone")
            return
        if run.stop_reason == "timeout":
            self._fail(job, f"training ran longer than {self.settings.job_timeout_seconds:g} s")
            return
        kind, value = run.result or ("crashed", "")
        if kind == "done":
            self._publish(job, Path(value), model_id)
        elif kind == "error":
            # The training process hid the data's path; the bundle's directory may be named too
            # (e.g. a models directory that cannot be written).
            self._fail(job, self._hide_paths(value))
        elif kind == "stopped":  # it stopped without being asked: its parent looked gone
            self._fail(job, "training stopped unexpectedly")
        else:
            code = run.exitcode
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            # A compiled library crashing (a segfault in a method's own code) ends here too:
            # the message names the method, as a raised error's does.
            self._fail(
                job,
                f"the training process of method {job.method!r} died ({how}), e.g. out of "
                "memory or a crash in the method's library",
            )

    def _publish(self, job: Job, built: Path, model_id: str) -> None:
        from mbn_core.bundle import BundleError, load_bundle

        try:
            bundle = load_bundle(built)  # verify before anyone can see it
        except (BundleError, OSError, ValueError) as exc:
            self._fail(job, f"the trained bundle does not verify: {self._hide_paths(exc)}")
            return
        target = self.settings.models_path / model_id
        try:
            _move_dir(built, target)
        except OSError as exc:
            self._fail(job, f"cannot store the model: {self._hide_paths(exc)}")
            return
        if not self.store.finish(job.id, self.worker_id, status="succeeded", model_id=model_id):
            # Cancelled (or taken over) in the last instant: the model must not exist.
            shutil.rmtree(target, ignore_errors=True)
            log.info("job %s: finished but no longer ours; model discarded", job.id)
            current = self.store.get(job.id)
            if current is not None and current.finished:
                self.files.remove(job.id)
            return
        self.files.remove(job.id)
        log.info("job %s: succeeded, model %s", job.id, model_id)
        if job.promote:
            self._promote(job, model_id, bundle.name)
        if self.on_model is not None:
            try:
                self.on_model(target)
            except Exception:
                log.exception("job %s: loading model %s into the registry failed", job.id, model_id)

    def _promote(self, job: Job, model_id: str, name: str) -> None:
        """The job asked for it: its model becomes the default and the version its name
        means. Through the alias file (as ``POST /models/{id}/promote``), not a registry:
        a stand-alone worker has none, and every replica reads the file at its next rescan.
        Only after the job is recorded as succeeded, so a model that is discarded (the job
        cancelled at the last instant) is never chosen."""
        try:
            AliasFile(self.settings.models_path).promote(model_id, name)
        except OSError:
            # The model stands and the job succeeded; an operator can still promote it.
            log.exception("job %s: promoting model %s failed", job.id, model_id)
            return
        log.info("job %s: model %s promoted (default and name %r)", job.id, model_id, name)

    def _hide_paths(self, error: Exception | str) -> str:
        """The message without the server's directories (clients read job errors)."""
        message = str(error)
        for path, name in (
            (self.settings.models_path, "<model dir>"),
            (self.settings.data_dir, "<data dir>"),
        ):
            message = message.replace(str(path), name)
        return message

    def _fail(self, job: Job, error: str) -> None:
        if self.store.finish(job.id, self.worker_id, status="failed", error=error):
            log.warning("job %s: failed: %s", job.id, error)
            self.files.remove(job.id)
        else:  # cancelled, deleted or taken over meanwhile: its new owner decides
            log.info("job %s: no longer ours, not marked failed (%s)", job.id, error)

    def _remove_earlier_attempts(self, job: Job) -> None:
        # An earlier attempt may have published its bundle and died before recording it.
        for attempt in range(1, job.attempts):
            leftover = self.settings.models_path / model_id_for(job.id, attempt)
            if leftover.is_dir():
                log.warning("job %s: removing model %s of a lost attempt", job.id, leftover.name)
                shutil.rmtree(leftover, ignore_errors=True)


def _terminate(proc: Any) -> None:
    proc.terminate()
    proc.join(STOP_GRACE_SECONDS)
    if proc.is_alive():
        proc.kill()
        proc.join()


def _move_dir(source: Path, target: Path) -> None:
    """Rename ``source`` to ``target`` atomically, also across file systems (copy to a
    hidden sibling of the target, then rename)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        raise FileExistsError(errno.EEXIST, "model directory exists", str(target))
    try:
        os.rename(source, target)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    tmp = target.parent / f".incoming-{target.name}-{uuid.uuid4().hex[:8]}"
    try:
        shutil.copytree(source, tmp)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(source, ignore_errors=True)
