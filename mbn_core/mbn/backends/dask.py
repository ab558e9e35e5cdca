"""The Dask backend: each layer's clusterings run as tasks on the workers of a Dask cluster.

``use_dask`` is a context manager: every ``MBN.fit`` inside it (also the one inside
``CompressiveMBN.fit`` and ``mbn_core.pipeline.training.train_bundle``) maps its layers'
clusterings onto a ``dask.distributed`` cluster instead of local threads. ``transform`` stays
on local threads (``DaskBackend.purposes`` is fitting alone): scattering each layer's input to
every worker pays off over a fit, not for the batches a fit's reports embed; files larger
than memory are embedded chunk by chunk with ``dask.array`` (``mbn_core.bundle.bulk``)::

    from mbn_core import MBN
    from mbn_core.mbn.backends.dask import use_dask

    with use_dask("tcp://scheduler:8786"):          # or a distributed.Client
        model = MBN(random_state=0).fit(X)          # bit-identical to a local fit

How a layer is run:

- The driver (the process calling ``fit``) makes every random choice, exactly as a local fit
  does, so the model does not depend on where the clusterings ran.
- The layer's input is scattered once with ``broadcast=True``: Dask sends it to one worker and
  replicates it worker to worker, so each worker receives it once, not once per task. The
  bottom layer ships the input in its compact exact form (MNIST's float pixels as uint8) plus
  the float64 row norms; upper layers ship the previous layer's (n, V) codes (and, for new
  rows, the fitted layer).
- Each task encodes a contiguous range of clusterings with the same kernels as a local fit
  (``mbn_core.mbn.encoders``). What all clusterings of a layer
  share on a worker (the float32 working copy with its ones column, the posting lists of the
  previous codes) is built by the first task there and kept in a per-process cache until the
  layer ends.
- Tasks return their codes in the smallest unsigned dtype (n bytes per clustering for k <= 256,
  2 n up to 65,536). The driver collects them as they complete, reports each clustering to the
  progress callback (which may stop the fit: the layer's tasks are cancelled), and assembles
  the layer. While no task finishes, the callback is called again every ``POLL_SECONDS`` with
  the same count, so that stopping does not wait for the end of a long task.

Fault tolerance is Dask's: a task lost with its worker is rerun on another, whose copy of the
layer's input came from the broadcast. Each clustering's codes are a pure function of the data
and the driver's choices, so the rerun returns the same codes and the model is unchanged.

Dask's messages between the driver, the scheduler and the workers are pickled: run the cluster
on a network only trusted machines can reach (docs/DEPLOYMENT.md).
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from mbn_core.distribution import install_hint
from mbn_core.mbn.backends.base import (
    FIT,
    LayerBackend,
    ProgressCallback,
    register_backend,
    use_backend,
)
from mbn_core.mbn.bottom import BottomLayer, input_row_norms
from mbn_core.mbn.dtypes import compact_values, smallest_uint
from mbn_core.mbn.encoders import (
    Encoder,
    UpperClusterings,
    bottom_encoder,
    float32_csr,
    upper_encoder,
)
from mbn_core.mbn.upper import UpperLayer

if TYPE_CHECKING:
    from distributed import Client

INSTALL_HINT = install_hint("distributed")
# Seconds to wait for the scheduler before saying it cannot be reached.
CONNECT_TIMEOUT = 10.0
# Tasks per worker thread and layer: enough that a worker slower than the others (a busier
# machine) leaves little idle time at the end of a layer, and that a dead worker loses little
# work; few enough that Dask's per-task overhead (milliseconds) stays negligible.
TASKS_PER_THREAD = 16
# ... and at most this many clusterings per task, so progress reports stay frequent with a
# large V on a small cluster.
MAX_CLUSTERINGS_PER_TASK = 50
# While a layer's tasks run, the progress callback is called at least this often (with an
# unchanged count when no task finished), so a stop request does not wait for a long task.
POLL_SECONDS = 0.5


class SchedulerUnreachable(ConnectionError):
    """The Dask scheduler could not be reached (raised before any work starts)."""


def import_distributed() -> Any:
    """The ``distributed`` module, or ImportError saying which extra to install."""
    try:
        import distributed
    except ImportError as error:
        raise ImportError(
            f"distributed training needs Dask, which is not installed: {INSTALL_HINT}"
        ) from error
    return distributed


def connect(scheduler: str, timeout: float = CONNECT_TIMEOUT) -> Client:
    """A ``distributed.Client`` connected to ``scheduler`` (e.g. ``tcp://host:8786``).

    Raises
    ------
    SchedulerUnreachable
        When no scheduler answers at that address within ``timeout`` seconds, the address is
        malformed, or no worker joins the scheduler within that time.
    ImportError
        When Dask is not installed (naming the extra to install).
    """
    distributed = import_distributed()
    try:
        client = distributed.Client(scheduler, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError, ValueError, TypeError) as error:
        raise SchedulerUnreachable(
            f"cannot reach the Dask scheduler at {scheduler!r} within {timeout:g} s: "
            f"{error or type(error).__name__}"
        ) from None
    try:
        # A cluster still starting (workers not yet connected) gets the same grace period.
        client.wait_for_workers(1, timeout=timeout)
    except (OSError, TimeoutError) as error:
        client.close()
        raise SchedulerUnreachable(
            f"the Dask scheduler at {scheduler!r} has no workers (waited {timeout:g} s)"
        ) from error
    return client


@contextlib.contextmanager
def use_dask(
    scheduler: str | Client,
    *,
    clusterings_per_task: int | None = None,
    timeout: float = CONNECT_TIMEOUT,
) -> Iterator[Client]:
    """Run the layers of every ``MBN.fit`` in this context on a Dask cluster.

    Parameters
    ----------
    scheduler : str or distributed.Client
        The scheduler's address (a client is connected here and closed on exit), or a
        connected client (left open).
    clusterings_per_task : int, default=None
        Clusterings each task encodes. None means about ``TASKS_PER_THREAD`` tasks per worker
        thread and layer, with at most ``MAX_CLUSTERINGS_PER_TASK`` clusterings each.
    timeout : float, default=CONNECT_TIMEOUT
        Seconds to wait for the scheduler when ``scheduler`` is an address.

    Yields
    ------
    client : distributed.Client

    Raises
    ------
    SchedulerUnreachable
        At once, before any work, when the scheduler does not answer.
    ImportError
        When Dask is not installed.
    """
    if clusterings_per_task is not None and (
        not isinstance(clusterings_per_task, int) or clusterings_per_task < 1
    ):
        raise ValueError(
            f"clusterings_per_task must be a positive integer, got {clusterings_per_task!r}"
        )
    owned = isinstance(scheduler, str)
    client = connect(scheduler, timeout) if isinstance(scheduler, str) else scheduler

    def factory(
        *, n_jobs: int | None = None, callback: ProgressCallback | None = None
    ) -> DaskBackend:
        return DaskBackend(
            client, n_jobs=n_jobs, callback=callback, clusterings_per_task=clusterings_per_task
        )

    try:
        with use_backend(factory, purposes=DaskBackend.purposes):
            yield client
    finally:
        if owned:
            client.close()


# ---------------------------------------------------------------------- the driver's side


@dataclass
class LayerTransfer:
    """Bytes one layer moved: its input to the workers, its codes back."""

    layer: int
    scattered_bytes: int  # one copy of the layer's input
    n_workers: int  # the copies the broadcast made
    gathered_bytes: int  # the codes returned to the driver
    n_tasks: int

    @property
    def total_bytes(self) -> int:
        return self.scattered_bytes * self.n_workers + self.gathered_bytes


class DaskBackend(LayerBackend):
    """Maps each layer's clusterings onto a Dask cluster (see the module docstring).

    ``transfers`` records the bytes each layer moved (a benchmark reads it on the backend
    its own factory built, through ``use_backend``).
    """

    name = "dask"
    device = "cpu"
    purposes = frozenset({FIT})

    def __init__(
        self,
        client: Client,
        *,
        n_jobs: int | None = None,
        callback: ProgressCallback | None = None,
        clusterings_per_task: int | None = None,
    ) -> None:
        super().__init__(n_jobs=n_jobs, callback=callback)
        self.client = client
        self.clusterings_per_task = clusterings_per_task
        self.transfers: list[LayerTransfer] = []

    @classmethod
    def on_default_client(
        cls, *, n_jobs: int | None = None, callback: ProgressCallback | None = None
    ) -> DaskBackend:
        """The backend on the Dask client of this process (``distributed.default_client``):
        what ``get_backend("dask")`` gives outside ``use_dask``."""
        distributed = import_distributed()
        try:
            client = distributed.default_client()
        except ValueError:
            raise ValueError(
                'backend "dask" needs a Dask client: connect one (distributed.Client) or run '
                "inside mbn_core.mbn.backends.dask.use_dask(scheduler)"
            ) from None
        return cls(client, n_jobs=n_jobs, callback=callback)

    def bottom_codes(self, layer: BottomLayer, X) -> np.ndarray:
        shipped = _BottomInput(_cache_key(), _compact_input(X), input_row_norms(X), layer)
        return self._map_layer(0, shipped, len(layer.centers), X.shape[0], layer.n_centers)

    def fit_upper_codes(
        self, index: int, codes: np.ndarray, clusterings: UpperClusterings
    ) -> np.ndarray:
        shipped = _UpperInput(_cache_key(), codes, clusterings)
        n_clusterings = len(clusterings.centers)
        return self._map_layer(index, shipped, n_clusterings, codes.shape[0], clusterings.n_centers)

    def upper_codes(self, index: int, codes: np.ndarray, layer: UpperLayer) -> np.ndarray:
        shipped = _FittedUpperInput(_cache_key(), codes, layer)
        return self._map_layer(index, shipped, len(layer.centers), codes.shape[0], layer.n_centers)

    def _map_layer(
        self,
        layer: int,
        shipped: _Shipped,
        n_clusterings: int,
        n_rows: int,
        n_centers: int,
    ) -> np.ndarray:
        client = self.client
        code_dtype = smallest_uint(n_centers - 1)
        n_workers = len(client.nthreads())
        if n_workers == 0:
            raise SchedulerUnreachable("the Dask cluster has no workers")
        ranges = self._task_ranges(n_clusterings)
        [data] = client.scatter([shipped], broadcast=True, hash=False)
        futures = [
            client.submit(
                _encode_clusterings,
                data,
                start,
                stop,
                code_dtype,
                key=f"mbn-layer{layer}-{shipped.key}-{start}",
                pure=False,
            )
            for start, stop in ranges
        ]
        starts = {future.key: start for future, (start, _) in zip(futures, ranges, strict=True)}
        codes = np.empty((n_rows, n_clusterings), dtype=code_dtype)
        done = gathered = 0
        # Futures land here as they finish (done callbacks run on the client's thread).
        finished: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for future in futures:
            future.add_done_callback(finished.put)
        try:
            for _ in futures:
                while True:
                    try:
                        future = finished.get(timeout=POLL_SECONDS)
                        break
                    except queue.Empty:
                        # Nothing finished: ask the callback anyway, so that a stop request
                        # is honoured now rather than when the next task ends.
                        self.report(layer, done, n_clusterings)
                block = future.result()
                start = starts[future.key]
                codes[:, start : start + block.shape[1]] = block
                gathered += block.nbytes
                future.release()
                for _ in range(block.shape[1]):
                    done += 1
                    self.report(layer, done, n_clusterings)
        finally:
            client.cancel([*futures, data])
            # Workers drop the layer's shared arrays; a worker that died has none to drop.
            client.run(_forget, shipped.key, on_error="ignore")
        self.transfers.append(
            LayerTransfer(layer, _shipped_bytes(shipped), n_workers, gathered, len(ranges))
        )
        return codes

    def _task_ranges(self, n_clusterings: int) -> list[tuple[int, int]]:
        per_task = self.clusterings_per_task
        if per_task is None:
            threads = sum(self.client.nthreads().values()) or 1
            per_task = math.ceil(n_clusterings / (TASKS_PER_THREAD * threads))
            per_task = min(per_task, MAX_CLUSTERINGS_PER_TASK)
        return [
            (start, min(start + per_task, n_clusterings))
            for start in range(0, n_clusterings, per_task)
        ]


def _cache_key() -> str:
    return uuid.uuid4().hex


def _compact_input(X):
    """X as the workers need it: float32 CSR, or dense in the smallest exact dtype.

    ``with_ones_column`` of the result equals that of X bit for bit (both are X in float32).
    """
    return float32_csr(X) if sp.issparse(X) else compact_values(X)


def _shipped_bytes(shipped: _Shipped) -> int:
    if isinstance(shipped, _UpperInput):
        clusterings = shipped.clusterings
        return shipped.codes.nbytes + clusterings.centers.nbytes + clusterings.seeds.nbytes
    if isinstance(shipped, _FittedUpperInput):
        return shipped.codes.nbytes + shipped.layer.nbytes
    X = shipped.X
    data_bytes = X.data.nbytes + X.indices.nbytes + X.indptr.nbytes if sp.issparse(X) else X.nbytes
    return data_bytes + shipped.norms.nbytes + shipped.layer.nbytes


# ---------------------------------------------------------------------- the workers' side


@dataclass(frozen=True)
class _BottomInput:
    """What every worker needs for the bottom layer (scattered once per worker)."""

    key: str
    X: Any  # ndarray (compact dtype) or CSR float32
    norms: np.ndarray
    layer: BottomLayer


@dataclass(frozen=True)
class _UpperInput:
    """What every worker needs for an upper layer (scattered once per worker)."""

    key: str
    codes: np.ndarray
    clusterings: UpperClusterings


@dataclass(frozen=True)
class _FittedUpperInput:
    """What every worker needs to encode new rows in a fitted upper layer."""

    key: str
    codes: np.ndarray
    layer: UpperLayer


_Shipped = _BottomInput | _UpperInput | _FittedUpperInput


# Per-process cache of each layer's encoder (working copy, norms or posting lists), shared by
# the layer's tasks on this worker. A few entries at most: the driver drops each at the end
# of its layer, and the bound covers a driver that died before it could.
_CACHE_SIZE = 2
_cache: OrderedDict[str, Encoder] = OrderedDict()
_cache_lock = threading.Lock()


def _encoder(shipped: _Shipped) -> Encoder:
    with _cache_lock:
        encode = _cache.get(shipped.key)
        if encode is None:
            encode = _cache[shipped.key] = _build_encoder(shipped)
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
        return encode


def _build_encoder(shipped: _Shipped) -> Encoder:
    """What a layer's tasks on this worker share: built by the first, once per layer."""
    if isinstance(shipped, _BottomInput):
        return bottom_encoder(shipped.layer, shipped.X, shipped.norms)
    if isinstance(shipped, _UpperInput):
        return shipped.clusterings.encoder(shipped.codes)
    return upper_encoder(shipped.layer, shipped.codes)


def _encode_clusterings(shipped: _Shipped, start: int, stop: int, code_dtype: type) -> np.ndarray:
    """The task: codes of every training point for clusterings [start, stop)."""
    encode = _encoder(shipped)
    n_rows = shipped.X.shape[0] if isinstance(shipped, _BottomInput) else shipped.codes.shape[0]
    codes = np.empty((n_rows, stop - start), dtype=code_dtype)
    for v in range(start, stop):
        codes[:, v - start] = encode(v)
    return codes


def _forget(key: str) -> None:
    with _cache_lock:
        _cache.pop(key, None)


register_backend(
    DaskBackend.name,
    DaskBackend.on_default_client,
    device="cpu",
    description="the workers of a Dask cluster (this process's client), for fits",
    purposes=DaskBackend.purposes,
)
