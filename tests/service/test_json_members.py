"""service.json_members places an /embed body's members without the interpreter lock; the
fast path built on it must treat every body exactly as the msgspec split it replaced did."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from pydantic import ValidationError
from servicetest import fuzz_parsers

from service.domain import InvalidInput, PayloadTooLarge
from service.json_members import MAX_DEPTH, MAX_MEMBERS, member_spans
from service.routes import embed
from service.schemas import EmbedRequest

fuzz = fuzz_parsers()


def reference_parse(body: bytes) -> tuple:
    """What the whole-body parse this reader replaced made of ``body``: duplicate keys
    refused by ``json.loads``, then pydantic over the whole body, then the rows' matrix."""

    def no_duplicates(pairs):
        keys = [key for key, _ in pairs]
        if len(keys) != len(set(keys)):
            raise KeyError("duplicate")

    try:
        json.loads(body, object_pairs_hook=no_duplicates)
    except (KeyError, RecursionError):
        return ("refused",)
    except ValueError:
        pass  # left to pydantic
    try:
        request = EmbedRequest.model_validate_json(body)
    except (ValidationError, RecursionError):
        return ("refused",)
    if request.inputs is not None:
        if len({len(row) for row in request.inputs}) != 1:
            return ("refused",)
        with np.errstate(over="ignore"):
            rows = np.array(request.inputs, dtype=np.float32)
    else:
        assert request.inputs_b64 is not None
        rows = request.inputs_b64
    return accepted(request, rows)


def accepted(request: EmbedRequest, rows: np.ndarray | bytes) -> tuple:
    if isinstance(rows, np.ndarray):
        if not np.isfinite(rows).all():  # refused by the route's finiteness check
            return ("refused",)
        rows = rows.tobytes()
    fields = request.model_dump(exclude={"inputs", "inputs_b64"})
    return ("accepted", json.dumps(fields, sort_keys=True), rows)


def members_of(body: bytes) -> list[tuple[bytes, bytes]] | None:
    spans = member_spans(body)
    if spans is None:
        return None
    return [(body[a:b], body[c:d]) for a, b, c, d in spans.tolist()]


def test_members_are_placed_with_their_raw_json() -> None:
    body = b' {"mode" : "fast", "inputs":[[1, 2], [3,4]] ,"x":{"a":[1,{"b":"}]"}]},"n":-1.5e3}\n'
    assert members_of(body) == [
        (b'"mode"', b'"fast"'),
        (b'"inputs"', b"[[1, 2], [3,4]]"),
        (b'"x"', b'{"a":[1,{"b":"}]"}]}'),
        (b'"n"', b"-1.5e3"),
    ]
    assert members_of(b"{}") == [] and members_of(b" { } ") == []
    assert members_of(b'{"k\\"ey": "v\\\\"}') == [(b'"k\\"ey"', b'"v\\\\"')]


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[1]",
        b'"s"',
        b"{",
        b'{"a"}',
        b'{"a":}',
        b'{"a":1,}',
        b'{"a":1 "b":2}',
        b'{"a":[1}',
        b'{"a":{1]}',
        b'{"a":[1]]}',
        b'{"a":1} x',
        b'{"a":"\x01"}',  # a raw control character in a string
        b'{"a":"open}',
        b"{a:1}",
        b'{"a":tr"ue}',
    ],
)
def test_bodies_it_cannot_place_are_left_whole(body: bytes) -> None:
    assert member_spans(body) is None


def test_limits_leave_the_body_whole() -> None:
    many = "{" + ",".join(f'"k{i}":{i}' for i in range(MAX_MEMBERS + 1)) + "}"
    assert member_spans(many.encode()) is None
    most = "{" + ",".join(f'"k{i}":{i}' for i in range(MAX_MEMBERS)) + "}"
    placed = member_spans(most.encode())
    assert placed is not None and len(placed) == MAX_MEMBERS
    deep = b'{"a":' + b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1) + b"}"
    assert member_spans(deep) is None
    assert member_spans(b'{"a":' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}") is not None


def outcome(body: bytes) -> tuple:
    """What /embed's parsing makes of ``body``: the request and its rows, or a refusal."""
    try:
        request, parsed = embed._parse(body, max_rows=1_000_000)
    except (InvalidInput, PayloadTooLarge):
        return ("refused",)
    return accepted(request, parsed)


def corpus() -> list[bytes]:
    bodies = [case.data for case in fuzz.cases("json", 400, seed=7)]
    bodies += [case.data for case in fuzz.cases("base64", 200, seed=7)]
    rng = random.Random(0)
    rows = [[rng.randint(0, 255) for _ in range(4)] for _ in range(3)]
    for extra in (
        {"mode": "exact"},
        {"model": "m", "mode": "fast", "return_clusters": True},
        {"inputs": [[9, 9, 9, 9]]},  # a duplicate key
        {"model": "\u00e9\ud83d\ude00", "nested": {"deep": [[{"x": None}]]}},
    ):
        bodies.append(json.dumps({"inputs": rows, **extra}).encode())
        bodies.append(json.dumps({**extra, "inputs": rows}, indent=2).encode())
    bodies.append(b'{"inputs": [[1, 2]], "inputs": [[3, 4]]}')
    bodies.append(b'{"inputs": [[1, 2]], "mode": tru}')  # invalid outside the rows
    bodies.append(b'{"inputs": [[1, 2]], "mode": "fa\xffst"}')  # not UTF-8 outside them
    bodies.append(b'{"inputs": [[1, 2\xff]]}')  # not UTF-8 inside them
    return bodies


def test_the_bounded_reader_treats_every_body_as_the_whole_body_parse_did() -> None:
    bodies = corpus()
    kinds = set()
    for body in bodies:
        got = outcome(body)
        assert got == reference_parse(body), body[:200]
        kinds.add(got[0])
    assert kinds == {"accepted", "refused"}  # the corpus reaches both
