"""service.json_object: JSON bodies read in bounded memory. Unknown, repeated and oversized
members are refused before anything is built from the body, and the large members become
arrays without the body ever becoming Python objects as a whole."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import threading
import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest

from service import json_object
from service.domain import InvalidInput, PayloadTooLarge
from service.json_members import array_chunks
from service.json_object import (
    parse_base64,
    parse_integers,
    parse_rows,
    split_object,
)
from service.routes import embed, jobs

ROW = [0] * 64


def peak_bytes(func: Callable[[], object]) -> int:
    """The most memory Python and NumPy allocated at once while ``func`` ran (numpy reports
    its arrays to tracemalloc), the body excluded: it was made before."""
    tracemalloc.start()
    try:
        with contextlib.suppress(InvalidInput, PayloadTooLarge):
            func()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def small_arrays(n: int) -> bytes:
    return b"[" + b",".join([b"[0]"] * n) + b"]"


def test_an_unknown_member_is_refused_before_anything_is_built() -> None:
    # 1.5 million small arrays beside valid rows: the whole-body check built them all.
    body = b'{"inputs": [' + json.dumps(ROW).encode() + b'], "junk": ' + small_arrays(1_500_000)
    body += b"}"
    with pytest.raises(InvalidInput, match="unknown member 'junk'"):
        embed._parse(body, 8192)
    assert peak_bytes(lambda: embed._parse(body, 8192)) < 64 << 10
    train = b'{"data": [[0],[1]], "junk": ' + small_arrays(1_500_000) + b"}"
    with pytest.raises(InvalidInput, match="unknown member 'junk'"):
        jobs._parse_train(train, 1000)
    assert peak_bytes(lambda: jobs._parse_train(train, 1000)) < 64 << 10


def test_a_large_small_member_is_refused_unparsed() -> None:
    body = b'{"inputs": [[1]], "model": "' + b"x" * (1 << 20) + b'"}'
    with pytest.raises(InvalidInput, match="'model' is 1048578 bytes of JSON; at most 65536"):
        embed._parse(body, 10)
    params = b'{"data": [[0],[1]], "params": {"hidden_layer_sizes": ' + small_arrays(1 << 17)
    with pytest.raises(InvalidInput, match=r"'params' is \d+ bytes of JSON"):
        jobs._parse_train(params + b"}}", 1000)


@pytest.mark.parametrize(
    ("rows", "kind"),
    [
        ([[0] * 64] * 20_000, "the rows kernel"),
        # 20 significant digits: left to the general path, a run of rows at a time.
        ([[0.12345678901234567891] + [0] * 63] * 20_000, "the general path"),
    ],
)
def test_a_valid_batch_takes_at_most_twice_its_body(rows: list, kind: str) -> None:
    body = json.dumps({"inputs": rows}).encode()
    if kind == "the general path":
        body = body.replace(b"0.12345678901234568", b"0.12345678901234567891")
    _, matrix = embed._parse(body, 100_000)
    assert isinstance(matrix, np.ndarray) and matrix.shape == (20_000, 64)
    assert peak_bytes(lambda: embed._parse(body, 100_000)) <= 2 * len(body) + (8 << 20), kind


def test_a_training_body_takes_at_most_twice_its_body() -> None:
    rng = np.random.default_rng(0)
    data = rng.integers(0, 10, (30_000, 8)).tolist()
    body = json.dumps({"data": data, "labels": [int(row[0]) for row in data]}).encode()
    _, x, y = jobs._parse_train(body, 100_000)
    np.testing.assert_array_equal(x, np.asarray(data, dtype=np.float32))
    assert y is not None and y.dtype == np.int64 and y.tolist() == [row[0] for row in data]
    assert peak_bytes(lambda: jobs._parse_train(body, 100_000)) <= 2 * len(body) + (8 << 20)


def test_a_json_training_body_is_parsed_beside_the_event_loop(
    api, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_loop = []
    parse = jobs._parse_train

    def spy(*args):
        try:
            asyncio.get_running_loop()
            on_loop.append(threading.current_thread().name)
        except RuntimeError:
            pass
        return parse(*args)

    monkeypatch.setattr(jobs, "_parse_train", spy)
    client = api()
    response = client.post("/train", json={"data": [[0, 1], [1, 0]] * 4})
    assert response.status_code in (202, 422), response.text
    assert on_loop == []


def test_repeated_keys_and_structure_are_refused_with_their_reason() -> None:
    known = ("inputs", "mode", "params")
    cases = {
        b'{"mode": "fast", "mode": "exact"}': "'mode' twice",
        b'{"params": {"a": 1, "a": 2}}': None,  # inside a small member: check_small's
        b"[1, 2]": "must be a JSON object",
        b"": "is empty",
        b'{"inputs": [[1]}': "not valid JSON",
        b'{"inputs": ' + b"[" * 600 + b"]" * 600 + b"}": "nested too deeply",
        b"{" + b",".join(b'"k%d": 1' % i for i in range(70)) + b"}": "more than 64 members",
    }
    for body, message in cases.items():
        if message is None:
            split = split_object(body, known=known)
            with pytest.raises(InvalidInput, match="'a' twice"):
                json_object.check_small(split.small)
            continue
        with pytest.raises(InvalidInput, match=message):
            split_object(body, known=known, large=("inputs",))


def test_unknown_members_get_the_nearest_known_one() -> None:
    with pytest.raises(InvalidInput, match=r"'retrun_novelty' \(did you mean 'return_novelty'\?\)"):
        embed._parse(b'{"inputs": [[1]], "retrun_novelty": true}', 10)
    with pytest.raises(InvalidInput, match=r"unknown member 'zzz'; expected model, inputs"):
        embed._parse(b'{"inputs": [[1]], "zzz": 1}', 10)


def test_a_large_member_given_as_null_is_not_given() -> None:
    request, rows = embed._parse(b'{"inputs": null, "inputs_b64": "AACAPw==", "dim": 1}', 10)
    assert rows == np.float32(1.0).tobytes() and request.inputs is None


@pytest.mark.parametrize("run_bytes", [8, 64, 1 << 20])
def test_general_path_errors_name_the_row_and_column(
    monkeypatch: pytest.MonkeyPatch, run_bytes: int
) -> None:
    monkeypatch.setattr(json_object, "RUN_BYTES", run_bytes)
    rows = [[1.5, 2], [3, 4], [5, 6], [7, 8], [9, 10]]
    text = json.dumps(rows).replace("[9, 10]", '[9, "x"]').encode()
    with pytest.raises(InvalidInput, match=r"^inputs\.4\.1: should be a number, got a string$"):
        parse_rows(memoryview(text), what="inputs", max_rows=10)
    ragged = json.dumps(rows).replace("[7, 8]", "[7]").encode()
    with pytest.raises(InvalidInput, match=r"at row 3\): ragged rows"):
        parse_rows(memoryview(ragged), what="inputs", max_rows=10)
    with pytest.raises(InvalidInput, match=r"^inputs\.2: a row should have at least 1 item$"):
        parse_rows(memoryview(b"[[1],[2],[],[3]]"), what="inputs", max_rows=10)
    with pytest.raises(PayloadTooLarge, match="has 5 rows; at most 4 per request"):
        parse_rows(memoryview(json.dumps(rows).encode()), what="inputs", max_rows=4)
    # 20 digits: the general path, in runs, the same float32 as parsing whole.
    text = json.dumps(rows).replace("1.5", "1.50000000000000000001").encode()
    parsed = parse_rows(memoryview(text), what="inputs", max_rows=10)
    np.testing.assert_array_equal(parsed, np.asarray(rows, dtype=np.float32))


def test_a_first_row_longer_than_the_body_allows_is_refused_unallocated() -> None:
    text = b"[[" + b",".join([b"0"] * 1000) + b"]" + b",[0]" * 1000 + b", [0.00000000000000000001]]"
    with pytest.raises(InvalidInput, match="ragged"):
        parse_rows(memoryview(text), what="inputs", max_rows=10_000)
    assert peak_bytes(lambda: parse_rows(memoryview(text), what="inputs", max_rows=10_000)) < (
        1 << 20
    )


def test_rows_that_are_not_rows() -> None:
    for text, message in (
        (b'"abc"', "must be an array of rows"),
        (b"[]", "at least 1 item"),
        (b"[1, 2]", r"inputs\.0: should be an array, got an integer"),
        (b"[[NaN]]", "no NaN or Infinity"),
        (b"[[true]]", r"inputs\.0\.0: should be a number, got a boolean"),
        (b"[[null]]", r"inputs\.0\.0: should be a number, got null"),
    ):
        with pytest.raises(InvalidInput, match=message):
            parse_rows(memoryview(text), what="inputs", max_rows=10)
    with pytest.raises(InvalidInput, match="at least 2 items"):
        parse_rows(memoryview(b"[[1]]"), what="data", max_rows=10, min_rows=2)
    beyond = parse_rows(memoryview(b"[[1e39, -1e39]]"), what="x", max_rows=1)
    assert np.isinf(beyond).all()  # refused by the finiteness check, as every input form
    with pytest.raises(InvalidInput, match=r"x\.0\.1: a number beyond the float64 range"):
        parse_rows(memoryview(b"[[1e39, 1e400]]"), what="x", max_rows=1)


def test_integers() -> None:
    assert parse_integers(memoryview(b"[1, -2, 3]"), what="labels", count=3).tolist() == [1, -2, 3]
    for text, message in (
        (b"[1, 2]", "labels has 2 entries for 3 rows"),
        (b"[1, 2.5, 3]", r"labels\.1: should be an integer, got a number with a fraction"),
        (b"[1, true, 3]", r"labels\.1: should be an integer, got a boolean"),
        (b"[1, 2, 100000000000000000000]", r"labels\.2: an integer beyond 64 bits"),
        (b"{}", "must be an array of integers"),
    ):
        with pytest.raises(InvalidInput, match=message):
            parse_integers(memoryview(text), what="labels", count=3)


def test_base64() -> None:
    data = np.arange(6, dtype="<f4").tobytes()
    for text in (
        base64.b64encode(data),
        base64.urlsafe_b64encode(b"\xfb\xff\xfe"),
        base64.b64encode(b"\x01").rstrip(b"="),
        base64.b64encode(data).replace(b"A", b"\\u0041"),
    ):
        decoded = base64.b64decode(text.replace(b"\\u0041", b"A") + b"==", altchars=b"-_")
        assert parse_base64(memoryview(b'"' + text + b'"'), what="b") == decoded
    assert parse_base64(memoryview(b'""'), what="b") == b""
    for text in (b'"AB=="', b'"AA-/"', b'"AA AA"', b'"!!!!"', b"12", b'"\\u00ff"'):
        with pytest.raises(InvalidInput, match="base64"):
            parse_base64(memoryview(text), what="b")


def test_array_chunks_cut_between_whole_elements() -> None:
    text = b' [ [1, 2] , "a,]" ,{"b": [3]}, 4 ] '
    count, offsets = array_chunks(text, 0, len(text), 1)
    runs = [text[a:b].strip().rstrip(b",").strip() for a, b in itertools.pairwise(offsets)]
    assert count == 4 and runs == [b"[1, 2]", b'"a,]"', b'{"b": [3]}', b"4"]
    count, offsets = array_chunks(text, 0, len(text), 1 << 20)
    assert count == 4 and len(offsets) == 2
    assert array_chunks(b"[]", 0, 2, 8) == (0, pytest.approx([1]))
    for bad in (b"[1,]", b"[1", b"{}", b"[1] x", b"[[1}]"):
        assert array_chunks(bad, 0, len(bad), 4) is None, bad
