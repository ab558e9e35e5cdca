"""The exact runtime process: owns the replica's exact models, queues and batches requests.

Started by ``service.exact.supervisor`` as ``python -m service.exact.process CONFIG`` with the
listening socket inherited (file descriptor ``listen_fd``): connections made while it restarts
wait in the socket's backlog. It imports no web framework and no job store. Threads:

- the main thread accepts connections (one per API process) and sends each a ``Hello``;
- one reader and one writer thread per connection: the reader decodes ``Submit`` and
  ``Cancel`` and puts jobs in the queue, the writer sends answers in order;
- a loader thread reads, verifies and warms models (their derived arrays built and their
  kernels loaded by one row) for the lanes, at the API processes' priority: a lane doing it
  at its own lower priority took tens of seconds on a busy replica, which a restarted runtime
  pays before it answers again;
- ``lanes`` compute threads each take steps from the queue (``service.exact.batching``), so
  that as many steps run side by side (the rows of one large request too, and the merged
  requests of many clients, split among the idle lanes), compute them with
  the model (``service.exact.models``) on their own thread and answer each request once all its
  rows are in. BLAS is held at one thread for the whole process: the lanes are the
  parallelism. Only the lanes run at the lower CPU priority (``niceness``): the threads that
  take requests in and send answers out keep the API processes' priority, or on a busy host
  requests would reach the queue one at a time and no batch would form;
- a stats thread sends the runtime's figures to every connection once a second and exits the
  process when its parent is gone.

Nothing a request carries can stop the process: a bad frame closes that connection (its
requests are dropped), a failing model fails the requests that need it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import mmap
import os
import queue
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType

import msgspec
import numpy as np

from mbn_core.exceptions import TrainingStopped
from mbn_core.mbn.backends import stop_unless
from mbn_core.utils.priority import lower_thread_priority
from service.exact import segments, wire
from service.exact.batching import ExactQueue, Job, QueueFull, Step
from service.exact.models import HeldModel, ModelCache, ModelFailure, ModelKey

log = logging.getLogger("service.exact.process")

_PR_SET_PDEATHSIG = 1
# How often the stats go out (and the parent is checked).
STATS_SECONDS = 1.0


@dataclass(frozen=True)
class RuntimeConfig:
    """What the supervisor tells the process (JSON on its command line)."""

    listen_fd: int
    model_dir: str
    generation: int
    parent_pid: int
    lanes: int  # steps computed at once, each on one thread
    device: str  # as asked: "cpu", "cuda" or "auto"
    cache_size: int
    max_requests: int
    max_rows: int
    batch_rows: int
    max_wait: float
    max_payload: int  # bytes of one frame's payload
    segment_dir: str | None
    log_level: str = "info"
    niceness: int = 0  # added to each compute lane's nice value (its thread's only)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RuntimeConfig:
        return cls(**json.loads(text))


def resolve_device(asked: str) -> tuple[str, str]:
    """Where the runtime computes, chosen as a fit's device is (the backends' own choice for
    transforms), and a note when it is not what was asked: "cpu" or "cuda"; "none" when
    "cuda" was asked and no backend can compute there (exact requests are then refused,
    saying why)."""
    if asked == "cpu":
        return "cpu", ""
    from mbn_core.mbn.backends import TRANSFORM, choose_backend

    try:
        entry = choose_backend(TRANSFORM, asked)
    except ValueError as error:  # "cuda" without CuPy, or without a GPU
        return "none", f"MBN_EXACT_DEVICE=cuda but {error}"
    if asked == "auto" and entry.device == "cpu":
        return "cpu", "MBN_EXACT_DEVICE=auto found no usable GPU; computing on the CPU"
    return entry.device, ""


class Connection:
    """One API process's connection: its reader and writer threads."""

    def __init__(self, runtime: Runtime, sock: socket.socket) -> None:
        self.runtime = runtime
        self.sock = sock
        self._out: queue.SimpleQueue[list[bytes | memoryview] | None] = queue.SimpleQueue()
        self._segments: dict[int, mmap.mmap] = {}  # request id -> its mapped segment
        self._lock = threading.Lock()
        self.closed = False

    def start(self) -> None:
        threading.Thread(target=self._read, name="exact-read", daemon=True).start()
        threading.Thread(target=self._write, name="exact-write", daemon=True).start()

    def send(self, message: msgspec.Struct, payload: bytes | memoryview = b"") -> None:
        if not self.closed:
            self._out.put(wire.frame(message, payload))

    def fail(self, request_id: int, kind: str, message: str) -> None:
        self.release(request_id)
        self.send(wire.Failed(request_id, kind, message))

    def segment(self, request_id: int) -> mmap.mmap | None:
        with self._lock:
            return self._segments.get(request_id)

    def release(self, request_id: int) -> None:
        with self._lock:
            memory = self._segments.pop(request_id, None)
        if memory is not None:
            with contextlib.suppress(BufferError):
                memory.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._out.put(None)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.runtime.forget(self)
        with self._lock:
            memories, self._segments = list(self._segments.values()), {}
        for memory in memories:
            with contextlib.suppress(BufferError):
                memory.close()

    def _read(self) -> None:
        try:
            while True:
                prefix = wire.receive_exactly(self.sock, wire.prefix_size())
                size, payload_size = wire.parse_prefix(bytes(prefix), self.runtime.max_payload)
                message = wire.decode_to_runtime(bytes(wire.receive_exactly(self.sock, size)))
                payload = wire.receive_exactly(self.sock, payload_size) if payload_size else None
                if isinstance(message, wire.Cancel):
                    if self.runtime.queue.cancel(self, message.id) is not None:
                        self.runtime.count("cancelled")
                    self.release(message.id)
                else:
                    self._submit(message, payload)
        except (EOFError, OSError):
            pass  # the API process closed the connection or is gone
        except wire.ProtocolError as error:
            log.error("closing a connection that sent a malformed frame: %s", error)
        finally:
            self.close()

    def _submit(self, message: wire.Submit, payload: bytearray | None) -> None:
        if self.runtime.device == "none":
            self.send(wire.Failed(message.id, "unavailable", self.runtime.device_note))
            return
        rows = self._rows(message, payload)
        if rows is None:
            return
        now = time.monotonic()
        job = Job(
            owner=self,
            request_id=message.id,
            model=ModelKey(message.model, message.sha256),
            priority=message.priority,
            rows=rows,
            deadline=message.deadline,
            arrived=now,
            mergeable=message.mergeable,
        )
        try:
            self.runtime.queue.submit(job)
        except QueueFull as error:
            self.runtime.count("rejected")
            self.fail(message.id, "overloaded", f"{error}; retry later or use mode 'fast'")

    def _rows(self, message: wire.Submit, payload: bytearray | None) -> np.ndarray | None:
        n, dim = message.n, message.dim
        if n < 1 or dim < 1 or message.priority not in wire.PRIORITIES:
            self.fail(message.id, "invalid", "an exact request needs at least one row")
            return None
        size = n * dim * 4
        if message.segment is None:
            if payload is None or len(payload) != size:
                self.fail(message.id, "invalid", "the request's rows do not match its shape")
                return None
            return np.frombuffer(payload, dtype=np.float32).reshape(n, dim)
        where = self.runtime.segment_dir
        try:
            if where is None:
                raise OSError("no segment directory")
            memory = segments.attach(where, message.segment, size)
        except (OSError, ValueError) as error:
            log.warning("request %d: its segment cannot be read: %s", message.id, error)
            self.fail(message.id, "unavailable", "the request's rows could not be read; retry")
            return None
        with self._lock:
            self._segments[message.id] = memory
        # A copy: the step's rows are gathered from several requests anyway.
        return np.frombuffer(memory, dtype=np.float32, count=n * dim).reshape(n, dim).copy()

    def _write(self) -> None:
        try:
            while True:
                pieces = self._out.get()
                if pieces is None:
                    return
                self.sock.sendmsg(pieces)
        except OSError:
            self.close()


@dataclass
class Counters:
    """The runtime's counters and histograms (``wire.Stats``)."""

    requests: int = 0
    rows: int = 0
    batches: int = 0
    cancelled: int = 0
    abandoned: int = 0
    timed_out: int = 0
    rejected: int = 0
    batch_rows_sum: int = 0
    wait_sum: float = 0.0
    compute_sum: float = 0.0

    def __post_init__(self) -> None:
        self.batch_rows = [0] * (len(wire.BATCH_ROWS_BOUNDS) + 1)
        self.waits = [0] * (len(wire.SECONDS_BOUNDS) + 1)
        self.computes = [0] * (len(wire.SECONDS_BOUNDS) + 1)


def _observe(buckets: list[int], bounds: tuple[float, ...], value: float) -> None:
    for index, bound in enumerate(bounds):
        if value <= bound:
            buckets[index] += 1
            return
    buckets[-1] += 1


class Runtime:
    """The process's state: the queue, the models, the connections."""

    def __init__(self, config: RuntimeConfig, device: str, device_note: str) -> None:
        self.config = config
        self.device = device
        self.device_note = device_note
        self.max_payload = config.max_payload
        self.segment_dir = None if config.segment_dir is None else Path(config.segment_dir)
        # One lane on a GPU: a step there takes the card's memory as its budget.
        self.lanes = 1 if device == "cuda" else config.lanes
        self.queue = ExactQueue(
            max_requests=config.max_requests,
            max_rows=config.max_rows,
            batch_rows=config.batch_rows,
            max_wait=config.max_wait,
            lanes=self.lanes,
        )
        self.models = ModelCache(
            Path(config.model_dir),
            capacity=config.cache_size,
            threads=1,  # a step runs on its lane's thread; lanes run side by side
            device=device if device != "none" else "cpu",
        )
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="exact-load")
        self._warmed: dict[ModelKey, int] = {}  # id() of the ExactModel warmed, per model
        self.stats = Counters()
        self._connections: set[Connection] = set()
        self._lock = threading.Lock()
        self.stopping = threading.Event()

    # --- connections ----------------------------------------------------------------------
    def serve(self, listener: socket.socket) -> None:
        self._loader.submit(int).result()  # its thread started here, at this priority
        for lane in range(self.lanes):
            threading.Thread(
                target=self._compute_loop, name=f"exact-compute-{lane}", daemon=True
            ).start()
        threading.Thread(target=self._stats_loop, name="exact-stats", daemon=True).start()
        listener.settimeout(0.5)  # so that a stop is noticed
        log.info(
            "exact runtime %d ready (generation %d, device %s%s)",
            os.getpid(),
            self.config.generation,
            self.device,
            f": {self.device_note}" if self.device_note else "",
        )
        while not self.stopping.is_set():
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError as error:
                if self.stopping.is_set():
                    break
                log.error("accepting a connection failed: %s", error)
                time.sleep(0.1)
                continue
            sock.settimeout(None)
            connection = Connection(self, sock)
            with self._lock:
                self._connections.add(connection)
            connection.send(
                wire.Hello(os.getpid(), self.config.generation, self.device, self.device_note)
            )
            connection.start()

    def forget(self, connection: Connection) -> None:
        with self._lock:
            self._connections.discard(connection)
        # Its requests have nobody to answer to any more.
        for _ in self.queue.cancel_owner(connection):
            self.count("cancelled")

    def count(self, counter: str) -> None:
        """One more of a counter that several threads add to."""
        with self._lock:
            setattr(self.stats, counter, getattr(self.stats, counter) + 1)

    def stop(self) -> None:
        """Answer every held request (503) and close the connections."""
        self.stopping.set()
        for job in self.queue.close():
            self._owner(job).fail(job.request_id, "unavailable", _RESTARTING)
        with self._lock:
            connections = list(self._connections)
        time.sleep(0.05)  # let the writers flush the answers
        for connection in connections:
            connection.close()

    # --- computing --------------------------------------------------------------------------
    def _compute_loop(self) -> None:
        lower_thread_priority(self.config.niceness)
        while not self.stopping.is_set():
            step = self.queue.next_step(timeout=0.5)
            for job in self.queue.take_expired():
                self.count("timed_out")
                self._owner(job).fail(job.request_id, "timeout", _TIMED_OUT)
            if step is not None:
                try:
                    self._compute(step)
                except Exception:  # a bug must fail its requests, not the runtime
                    log.exception("an exact step failed")
                    self._fail_step(step, "unavailable", "the exact computation failed; retry")

    def _compute(self, step: Step) -> None:
        if step.abandoned:  # cancelled between being taken and now
            self.queue.abort(step)
            return
        try:
            held = self._model(step.model)  # type: ignore[arg-type]
        except ModelFailure as failure:
            self._fail_step(step, failure.kind, failure.message)
            for job in self.queue.cancel_model(step.model):
                self._owner(job).fail(job.request_id, failure.kind, failure.message)
            return
        expected = held.exact.estimator.n_features_in_
        if step.rows.shape[1] != expected:
            self._fail_step(
                step, "invalid", f"model {held.key.id!r} takes rows of {expected} values"
            )
            return
        started = time.perf_counter()
        try:
            # A step nobody waits for any more (its clients left, or their deadlines passed)
            # stops as its layers' clusterings finish, and its lane takes the next one.
            with stop_unless(lambda: step.wanted(time.monotonic())):
                raw = held.exact.embed_raw(step.rows)
        except TrainingStopped:
            self.count("abandoned")
            for job in self.queue.abort(step):  # past their deadline, not expired yet
                self._owner(job).fail(job.request_id, "timeout", _TIMED_OUT)
            return
        except MemoryError:
            self._fail_step(step, "unavailable", f"model {held.key.id!r}: out of memory; retry")
            return
        except ValueError as error:  # rows the estimator refuses
            self._fail_step(step, "invalid", str(error)[:300])
            return
        seconds = time.perf_counter() - started
        with self._lock:
            self.stats.batches += 1
            self.stats.batch_rows_sum += len(step.rows)
            self.stats.compute_sum += seconds
            _observe(self.stats.batch_rows, wire.BATCH_ROWS_BOUNDS, len(step.rows))
            _observe(self.stats.computes, wire.SECONDS_BOUNDS, seconds)
        offset = 0
        for job, start, stop in step.parts:
            if job.out is None:
                job.out = np.empty((job.n, raw.shape[1]), dtype=np.float32)
            job.out[start:stop] = raw[offset : offset + stop - start]
            offset += stop - start
        for job in self.queue.finish(step, seconds):
            self._answer(job, held)

    def _model(self, key: ModelKey) -> HeldModel:
        """The model, read and warmed by the loader thread unless it is held and warm."""
        held = self.models.peek(key)
        if held is not None and self._warmed.get(key) == id(held.exact):
            return held
        return self._loader.submit(self._load_and_warm, key).result()

    def _load_and_warm(self, key: ModelKey) -> HeldModel:
        held = self.models.get(key)
        if self._warmed.get(key) != id(held.exact):
            try:
                width = held.exact.estimator.n_features_in_
                held.exact.embed_raw(np.zeros((1, width), dtype=np.float32))
            except Exception as error:  # the step itself reports what is wrong
                log.warning("model %s: warming it up failed: %s", key.id, error)
            self._warmed[key] = id(held.exact)
        return held

    def _answer(self, job: Job, held: HeldModel) -> None:
        connection = self._owner(job)
        assert job.out is not None and job.first_step is not None
        wait = job.first_step - job.arrived
        with self._lock:
            self.stats.requests += 1
            self.stats.rows += job.n
            self.stats.wait_sum += wait
            _observe(self.stats.waits, wire.SECONDS_BOUNDS, wait)
        try:
            embedding, clusters = held.exact.finish(job.out)
        except MemoryError:
            connection.fail(job.request_id, "unavailable", "out of memory; retry")
            return
        bad = ~np.isfinite(embedding).all(axis=1)
        if bad.any():
            rows = np.flatnonzero(bad)
            shown = ", ".join(str(row) for row in rows[:5]) + (", ..." if rows.size > 5 else "")
            connection.fail(
                job.request_id,
                "out_of_range",
                f"{rows.size} row(s) ({shown}) embed to NaN or infinity in exact mode: their "
                "values are too far outside the range the model was trained on",
            )
            return
        answer = np.ascontiguousarray(embedding, dtype=np.float32).tobytes()
        if clusters is not None:
            answer += np.ascontiguousarray(clusters, dtype=np.int64).tobytes()
        done = wire.Done(
            job.request_id,
            job.n,
            int(embedding.shape[1]),
            clusters is not None,
            False,
            wait * 1000.0,
            job.compute * 1000.0,
        )
        memory = connection.segment(job.request_id)
        if memory is not None and len(memory) >= len(answer):
            memory[: len(answer)] = answer
            done.in_segment = True
            connection.release(job.request_id)
            connection.send(done)
        else:
            connection.release(job.request_id)
            connection.send(done, answer)

    def _fail_step(self, step: Step, kind: str, message: str) -> None:
        for job in self.queue.abort(step):
            self._owner(job).fail(job.request_id, kind, message)

    @staticmethod
    def _owner(job: Job) -> Connection:
        assert isinstance(job.owner, Connection)
        return job.owner

    # --- figures ----------------------------------------------------------------------------
    def _stats_loop(self) -> None:
        parent = self.config.parent_pid
        while not self.stopping.wait(STATS_SECONDS):
            if os.getppid() != parent:
                log.error("the supervisor (process %d) is gone; exiting", parent)
                os._exit(1)
            message = self.figures()
            with self._lock:
                connections = list(self._connections)
            for connection in connections:
                connection.send(message)

    def figures(self) -> wire.Stats:
        requests, waiting, running = self.queue.depth()
        with self._lock:
            return self._figures(requests, waiting, running)

    def _figures(self, requests: int, waiting: int, running: int) -> wire.Stats:
        s = self.stats
        return wire.Stats(
            generation=self.config.generation,
            device=self.device,
            queued_requests=requests,
            queued_rows=waiting,
            running_rows=running,
            models_loaded=len(self.models),
            model_bytes=self.models.nbytes,
            requests=s.requests,
            rows=s.rows,
            batches=s.batches,
            cancelled=s.cancelled,
            abandoned=s.abandoned,
            timed_out=s.timed_out,
            rejected=s.rejected,
            batch_rows_buckets=list(s.batch_rows),
            batch_rows_sum=s.batch_rows_sum,
            wait_buckets=list(s.waits),
            wait_sum=s.wait_sum,
            compute_buckets=list(s.computes),
            compute_sum=s.compute_sum,
        )


_RESTARTING = "the exact runtime is restarting; retry (another replica may answer)"
_TIMED_OUT = (
    "the exact-mode request was not computed within its deadline (MBN_EXACT_TIMEOUT_SECONDS); "
    "the queue is busy, retry later"
)


def _die_with_parent(parent: int) -> None:
    """Ask the kernel to kill this process when its parent dies (Linux), and exit now if
    that already happened."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def main(argv: list[str] | None = None) -> None:
    config = RuntimeConfig.from_json((argv or sys.argv[1:])[0])
    _die_with_parent(config.parent_pid)
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
        level=config.log_level.upper(),
    )
    listener = socket.socket(fileno=config.listen_fd)
    device, note = resolve_device(config.device)
    runtime = Runtime(config, device, note)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        runtime.stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        runtime.serve(listener)
    finally:
        runtime.stop()
        log.info("exact runtime %d stopped", os.getpid())
        # The compute thread may be inside a model: it is not waited for.
        os._exit(0)


if __name__ == "__main__":
    main()
