"""The training process: ``python -m service.trainproc``, started by the worker per job.

A separate interpreter (not a fork: the parent has threads; not multiprocessing's spawn: it
re-imports the parent's ``__main__``, which may be anything). Protocol:

- the spec (``TrainSpec`` as JSON) arrives as one line on stdin;
- messages go out as JSON lines on the file descriptor the spec names: ``["progress", phase,
  fraction]`` while training, then exactly one of ``["done", bundle_path]``,
  ``["stopped", ""]``, ``["error", message]``;
- SIGTERM asks it to stop: the training callback returns True at its next call and nothing
  is written; the worker kills it if that takes too long;
- it gets SIGKILL when its worker dies (Linux ``PR_SET_PDEATHSIG``), so no training
  outlives the worker that owns the job.

Logs go to stderr, which is the worker's.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

log = logging.getLogger("service.trainproc")

_PROGRESS_EVERY_SECONDS = 0.25


@dataclass(frozen=True)
class TrainSpec:
    """Everything the training process needs, as plain JSON-able values."""

    job_id: str
    name: str
    params: dict[str, Any]
    data_path: str
    out_dir: str
    model_id: str
    threads: int
    message_fd: int

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TrainSpec:
        return cls(**json.loads(text))


def main() -> int:
    _die_with_parent()
    stop_requested = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal reaches the worker
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s trainproc: %(message)s"
    )
    spec = TrainSpec.from_json(sys.stdin.readline())
    with os.fdopen(spec.message_fd, "wb", buffering=0) as out:
        return _train(spec, out, lambda: stop_requested)


def _train(spec: TrainSpec, out: BinaryIO, stopped: Any) -> int:
    def send(*message: object) -> None:
        out.write(json.dumps(message).encode() + b"\n")

    # Heavy imports after the spec is read: the worker sees a start-up failure as an error.
    from threadpoolctl import threadpool_limits

    from mbn_core import TrainingStopped
    from mbn_core.training import TrainingParams, load_training_data, train_bundle

    parent = os.getppid()
    last_sent = 0.0

    def progress(phase: str, fraction: float) -> bool:
        nonlocal last_sent
        now = time.monotonic()
        if now - last_sent >= _PROGRESS_EVERY_SECONDS or fraction >= 1.0:
            last_sent = now
            send("progress", phase, float(fraction))
        return bool(stopped()) or os.getppid() != parent

    try:
        with threadpool_limits(spec.threads):
            x, y = load_training_data(Path(spec.data_path))
            path = train_bundle(
                x,
                Path(spec.out_dir),
                name=spec.name,
                params=TrainingParams.from_dict(spec.params),
                y=y,
                model_id=spec.model_id,
                progress=progress,
            )
    except TrainingStopped:
        send("stopped", "")
        return 0
    except Exception as exc:  # becomes the job's error; the traceback goes to the log
        log.exception("job %s: training failed", spec.job_id)
        send("error", f"{type(exc).__name__}: {exc}")
        return 1
    send("done", str(path))
    return 0


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
