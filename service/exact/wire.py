"""What the API processes and the exact runtime say to each other over the runtime's socket.

A frame is a fixed prefix (the header's length, the payload's length), a msgpack header (one of
the message structs below, tagged by type) and a payload of raw bytes: the rows of a request,
or the embeddings and cluster ids of an answer. Large rows and answers do not travel in the
payload: they are written to a shared memory segment the API process owns
(``service.exact.segments``) and the header names it.

Every message that concerns a request carries its ``id``, unique within one connection.
"""

from __future__ import annotations

import socket
import struct
from typing import Literal

import msgspec

# Request priorities, most urgent first: clients' requests, then the live monitor's rows.
CLIENT = 0
BACKGROUND = 1
PRIORITIES = (CLIENT, BACKGROUND)

# Why a request failed, as the API process answers it.
FailureKind = Literal[
    "overloaded",  # the queue is full: 429
    "unavailable",  # shutting down, cannot read the rows, no memory: 503
    "timeout",  # past its deadline before it was computed: 503
    "damaged",  # the model failed verification or cannot be loaded: 409
    "not_found",  # the model's directory is gone: 404
    "out_of_range",  # rows whose embedding overflowed: 422
    "invalid",  # rows the model refuses: 422
]


class Submit(msgspec.Struct, tag="submit"):
    """Embed ``n`` rows of ``dim`` float32 values (the payload, or the segment ``segment``)
    with the exact model of bundle ``model`` whose exact file has digest ``sha256``."""

    id: int
    model: str
    sha256: str
    priority: int
    deadline: float  # time.monotonic() of the host (one clock for every process)
    n: int
    dim: int
    segment: str | None = None
    # Whether the rows may be computed with other requests' (the method's transform is
    # batch independent).
    mergeable: bool = True


class Cancel(msgspec.Struct, tag="cancel"):
    """The request ``id`` is no longer wanted: its rows are dropped."""

    id: int


class Hello(msgspec.Struct, tag="hello"):
    """The runtime's first message on a connection: it is ready to take requests."""

    pid: int
    generation: int  # 1 for the first process the supervisor started, then one per restart
    device: str  # where it computes: "cpu" or "cuda"
    device_note: str  # why, when it is not what was asked for ("" otherwise)


class Done(msgspec.Struct, tag="done"):
    """The request ``id``'s answer: ``n`` x ``dim`` float32 embeddings, then (``clusters``)
    ``n`` int64 cluster ids, in the payload or (``in_segment``) in the request's segment."""

    id: int
    n: int
    dim: int
    clusters: bool
    in_segment: bool
    wait_ms: float  # from arrival to its first rows computed
    compute_ms: float  # in the model, summed over the steps its rows were in


class Failed(msgspec.Struct, tag="failed"):
    id: int
    kind: str  # a FailureKind
    message: str  # for the client: names the model, never a server path


class Stats(msgspec.Struct, tag="stats"):
    """The runtime's figures, sent on every connection about once a second: gauges as of
    now, counters and histogram buckets since the process started (``generation`` tells a
    restart from a reset)."""

    generation: int
    device: str
    queued_requests: int
    queued_rows: int
    running_rows: int
    models_loaded: int
    model_bytes: int  # of the loaded models' arrays (mapped pages included)
    requests: int
    rows: int
    batches: int
    cancelled: int
    abandoned: int  # steps stopped mid-computation: nobody waited for their rows any more
    timed_out: int
    rejected: int
    batch_rows_buckets: list[int]  # counts, per bound of BATCH_ROWS_BOUNDS (+Inf last)
    batch_rows_sum: int
    wait_buckets: list[int]  # per bound of SECONDS_BOUNDS
    wait_sum: float
    compute_buckets: list[int]
    compute_sum: float


# Histogram bounds of the runtime's metrics (Prometheus "le" labels; +Inf is implied).
BATCH_ROWS_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
SECONDS_BOUNDS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0
)  # fmt: skip

ToRuntime = Submit | Cancel
FromRuntime = Hello | Done | Failed | Stats

_PREFIX = struct.Struct("!IQ")  # header bytes, payload bytes
# A header is a few hundred bytes; anything near this is not one of ours.
MAX_HEADER_BYTES = 1 << 16
_encoder = msgspec.msgpack.Encoder()
_to_runtime = msgspec.msgpack.Decoder(ToRuntime)
_from_runtime = msgspec.msgpack.Decoder(FromRuntime)


class ProtocolError(Exception):
    """The other side sent something that is not a frame of this protocol."""


def frame(message: msgspec.Struct, payload: bytes | memoryview = b"") -> list[bytes | memoryview]:
    """The pieces of one frame, to be written in order."""
    header = _encoder.encode(message)
    return [_PREFIX.pack(len(header), len(payload)), header, payload]


def prefix_size() -> int:
    return _PREFIX.size


def parse_prefix(data: bytes, max_payload: int) -> tuple[int, int]:
    """(header bytes, payload bytes) of a frame's prefix; ProtocolError past the bounds."""
    header, payload = _PREFIX.unpack(data)
    if header > MAX_HEADER_BYTES or payload > max_payload:
        raise ProtocolError(f"a frame of {header} + {payload} bytes is over the bounds")
    return header, payload


def decode_to_runtime(header: bytes) -> ToRuntime:
    try:
        return _to_runtime.decode(header)
    except msgspec.DecodeError as error:
        raise ProtocolError(f"not a message to the runtime: {error}") from None


def decode_from_runtime(header: bytes) -> FromRuntime:
    try:
        return _from_runtime.decode(header)
    except msgspec.DecodeError as error:
        raise ProtocolError(f"not a message from the runtime: {error}") from None


def receive_exactly(sock: socket.socket, size: int) -> bytearray:
    """``size`` bytes from a blocking socket; EOFError when it closes first."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise EOFError("the connection closed")
        got += n
    return buffer
