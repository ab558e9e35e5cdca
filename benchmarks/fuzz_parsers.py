"""Mutation fuzzing of every parser a client's bytes reach: data files (``.npy``, ``.npz``,
scipy sparse ``.npz``, ``.csv``) and request bodies (multipart, JSON rows, base64 rows; the
``/embed`` bodies also in exact mode, answered by the exact runtime: ``json-exact``,
``base64-exact``).

    python benchmarks/fuzz_parsers.py --cases 10000            # every format
    python benchmarks/fuzz_parsers.py --cases 2000 --formats npz csv --http-share 0.05

Each case starts from a valid seed and mutates it: flipped bytes, truncations, inserted and
repeated runs (lengths), overwritten integers, and format-aware changes (``.npy`` header fields;
zip flag bits, compression methods, sizes, member names renamed, duplicated, shadowed or
dropped, and the deflate streams' bytes; CSV cells, quotes, line breaks and very long lines;
multipart boundaries, part headers and repeated fields; JSON tokens and base64 characters).

Files go through the code the API and the trainer run (``peek_data_file`` and ``check_rows``, then
``load_training_data`` when the header check accepts them) in this process; a share of them
(``--http-share``), and every body case, also through a real ``mbn serve`` (uvicorn) as
``POST /train`` uploads and ``POST /embed`` bodies. A case passes when it is accepted or
refused with a ``ValueError`` (files) or a 4xx (HTTP); anything else (another exception, a
5xx, a dropped connection) is a defect and the exit status is 1. The server's peak resident
memory (``VmHWM``) is reported at the end.

``tests/service/test_parser_fuzz.py`` runs a few hundred cases per format from the same seeds.
"""

from __future__ import annotations

import argparse
import base64
import collections
import io
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FILE_FORMATS = ("npy", "npz", "sparse", "csv")
# The /embed bodies also in exact mode: the same rows sent to the exact runtime.
EXACT_FORMATS = ("json-exact", "base64-exact")
BODY_FORMATS = ("multipart", "json", "base64", "train-json", "routes", *EXACT_FORMATS)
FORMATS = FILE_FORMATS + BODY_FORMATS
DIM = 64  # the fuzz server's model takes 64 features
# The job limits of the fuzz server (MBN_MAX_TRAIN_ROWS, MBN_MAX_TRAIN_BYTES), which the direct
# runs apply as submission does before anything is loaded.
LIMITS = {"rows": 200_000, "bytes": 64 << 20}


# ---------------------------------------------------------------------- seeds


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _zip(members: list[tuple[str, bytes]], method: int) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=method) as archive:
        for name, data in members:
            archive.writestr(name, data)
    return buffer.getvalue()


def seed_arrays(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    x = rng.normal(size=(24, 5)).astype(rng.choice([np.float32, np.float64]))
    return x, rng.integers(0, 3, size=24)


def npz_members(rng: np.random.Generator) -> list[tuple[str, bytes]]:
    x, y = seed_arrays(rng)
    return [("x.npy", _npy(x)), ("y.npy", _npy(y))]


def sparse_members(rng: np.random.Generator) -> list[tuple[str, bytes]]:
    import scipy.sparse as sp

    layout = str(rng.choice(["csr", "csc", "coo"]))
    matrix = sp.random(30, 8, density=0.3, format=layout, random_state=int(rng.integers(1000)))
    buffer = io.BytesIO()
    sp.save_npz(buffer, matrix, compressed=bool(rng.integers(2)))
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as archive:
        return [(name, archive.read(name)) for name in archive.namelist()]


def csv_seed(rng: np.random.Generator) -> bytes:
    x, _ = seed_arrays(rng)
    lines = [",".join(f"c{i}" for i in range(x.shape[1]))] if rng.integers(2) else []
    lines += [",".join(repr(float(v)) for v in row) for row in x]
    return ("\n".join(lines) + "\n").encode()


def embed_rows(rng: np.random.Generator, n: int = 3) -> list[list[float]]:
    return rng.normal(size=(n, DIM)).round(3).tolist()


# ---------------------------------------------------------------------- generic mutations

_INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 2**31 - 1, 2**31, 2**32 - 1, 2**63]


def flip(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def insert(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data) + 1)
    if data and rng.random() < 0.5:  # a run repeated: lengths that disagree
        start = rng.randrange(len(data))
        piece = data[start : start + rng.randint(1, 64)] * rng.randint(2, 200)
    else:
        piece = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    return data[:at] + piece + data[at:]


def overwrite_int(data: bytes, rng: random.Random) -> bytes:
    if len(data) < 8:
        return flip(data, rng)
    size = rng.choice([1, 2, 4, 8])
    at = rng.randrange(len(data) - size + 1)
    value = rng.choice(_INTERESTING) % (1 << (8 * size))
    return data[:at] + value.to_bytes(size, "little") + data[at + size :]


GENERIC = (flip, truncate, insert, overwrite_int)


def generic(data: bytes, rng: random.Random) -> bytes:
    return rng.choice(GENERIC)(data, rng)


# ---------------------------------------------------------------------- format-aware mutations

_NPY_HEADER_EDITS = [
    (b"(24, 5)", [b"(1000000000, 5)", b"(24,)", b"(24, 5, 2)", b"(-1, 5)", b"()", b"(24, 0)",
                  b"(0, 5)", b"(2**64, 5)", b"(24, 5"]),
    (b"'<f4'", [b"'|O'", b"'<U8'", b"'>f4'", b"'<c8'", b"'<f2'", b"'|b1'", b"'<M8'", b"'V4'",
                b"[('a', '<f4')]", b"'<f16'"]),
    (b"'<f8'", [b"'|O'", b"'<U8'", b"'<i8'", b"'|S3'"]),
    (b"False", [b"True", b"None", b"1"]),
    (b"\x01\x00", [b"\x02\x00", b"\x03\x00", b"\x09\x00"]),
]  # fmt: skip


def mutate_npy(data: bytes, rng: random.Random) -> bytes:
    if rng.random() < 0.4:
        old, choices = rng.choice(_NPY_HEADER_EDITS)
        if old in data[:256]:
            data = data.replace(old, rng.choice(choices), 1)
            return data if rng.random() < 0.7 else generic(data, rng)
    return generic(data, rng)


def _zip_entries(data: bytes) -> Iterator[tuple[int, int, int, int, int]]:
    """(offset, flag, method, sizes, name) positions of local and central headers."""
    for signature, flag, method, sizes, name in (
        (b"PK\x03\x04", 6, 8, 18, 26),
        (b"PK\x01\x02", 8, 10, 20, 28),
    ):
        start = 0
        while (start := data.find(signature, start)) >= 0:
            yield start, start + flag, start + method, start + sizes, start + name
            start += 4


def _patch_headers(data: bytes, rng: random.Random) -> bytes:
    entries = list(_zip_entries(data))
    if not entries:
        return generic(data, rng)
    out = bytearray(data)
    _, flag, method, sizes, _ = rng.choice(entries)
    field_choice = rng.randrange(3)
    if field_choice == 0:  # flag bits: encrypted, data descriptor, strong encryption, utf-8
        bits = rng.choice([0x1, 0x8, 0x40, 0x800, 0x1 | 0x8, rng.randrange(1 << 16)])
        out[flag : flag + 2] = bits.to_bytes(2, "little")
    elif field_choice == 1:  # compression methods: shrunk, imploded, bzip2, lzma, unknown
        value = rng.choice([1, 2, 6, 9, 12, 14, 95, 98, 99, 0xFFFF])
        out[method : method + 2] = value.to_bytes(2, "little")
    else:  # CRC, compressed or uncompressed size
        which = rng.choice([-4, 0, 4])
        at = sizes + which
        out[at : at + 4] = rng.choice(_INTERESTING[:10]).to_bytes(4, "little")
    return bytes(out)


def _corrupt_stream(data: bytes, rng: random.Random) -> bytes:
    """Bytes of a member's (deflate) stream, after its local header."""
    entries = [e for e in _zip_entries(data) if data[e[0] : e[0] + 4] == b"PK\x03\x04"]
    if not entries:
        return flip(data, rng)
    start, *_ = rng.choice(entries)
    name_len, extra_len = struct.unpack("<HH", data[start + 26 : start + 30])
    begin = start + 30 + name_len + extra_len
    if begin >= len(data):
        return flip(data, rng)
    out = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        at = min(len(out) - 1, begin + rng.randrange(256))
        out[at] = rng.randrange(256)
    return bytes(out)


def _members_changed(members: list[tuple[str, bytes]], rng: random.Random) -> list:
    members = list(members)
    kind = rng.randrange(6)
    index = rng.randrange(len(members))
    name, data = members[index]
    if kind == 0:  # renamed (a raw member, a shadow, another array's name, a path)
        new = rng.choice(["x", "y", "x.npy.npy", "y.npy", "../x.npy", "x.NPY", "-", "shape.npy",
                          "a/x.npy", "x.npy\0"])  # fmt: skip
        members[index] = (new, data)
    elif kind == 1:  # duplicated, with other content
        members.append((name, _npy(np.ones((4000, 5), np.float32))))
    elif kind == 2:  # a raw shadow beside the checked member
        members.append((name.removesuffix(".npy"), _npy(np.ones((40_000, 5), np.float32))))
    elif kind == 3:  # dropped
        del members[index]
        if not members:
            members = [("z.npy", _npy(np.zeros(3)))]
    elif kind == 4:  # a member replaced by a mutated .npy
        members[index] = (name, mutate_npy(data, rng))
    else:  # a member holding objects
        members[index] = (name, _OBJECTS_NPY)
    return members


_OBJECTS_NPY = (
    b"\x93NUMPY\x01\x00v\x00{'descr': '|O', 'fortran_order': False, 'shape': (2,), }"
    + b" " * 60
    + b"\n"
    + b"\x80" * 30
)


def mutate_zip(members: list[tuple[str, bytes]], rng: random.Random) -> bytes:
    method = rng.choice([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
    if rng.random() < 0.4:
        members = _members_changed(members, rng)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Duplicate name": what is fuzzed
        data = _zip(members, method)
    roll = rng.random()
    if roll < 0.3:
        return _patch_headers(data, rng)
    if roll < 0.55:
        return _corrupt_stream(data, rng)
    if roll < 0.85:
        return generic(data, rng)
    return data


_CSV_TOKENS = [b"nan", b"inf", b"-inf", b"1e999", b"x", b'"', b'"1,2"', b"\x00", b",", b",,",
               b"\n", b"\r", b"\r\n", b"\xef\xbb\xbf", b"#", b" ", b"\t", b"1" * 400, b"0x1F",
               b"1_000", b"\xff\xfe", b"\xe2\x80\x8b", b"-", b"+", b".", b"e5"]  # fmt: skip


def mutate_csv(data: bytes, rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.45:
        at = rng.randrange(len(data) + 1)
        return data[:at] + rng.choice(_CSV_TOKENS) + data[at:]
    if roll < 0.55:  # a very long line (bounded memory is the point)
        cells = rng.choice([b"10,", b"a,", b"1e5,", b","])
        at = rng.randrange(len(data) + 1)
        return data[:at] + cells * rng.randint(1000, 400_000) + data[at:]
    if roll < 0.65:  # line breaks removed or lines duplicated
        lines = data.split(b"\n")
        if rng.random() < 0.5:
            return b"".join(lines)
        i = rng.randrange(len(lines))
        return b"\n".join(lines[: i + 1] + [lines[i]] * rng.randint(1, 5) + lines[i + 1 :])
    return generic(data, rng)


# The layout methods' own options, with values their checks at submission must refuse
# (out of range, of the wrong type, unknown names) or pass.
LAYOUT_CHOICES: dict[str, dict[str, list]] = {
    "tsne": {
        "perplexity": [5.0, 30.0, 0, -3, 1e12, "5"],
        "early_exaggeration": [12.0, 0, -1],
        "n_iter": [10, 0, -5, 10**12],
        "dof": [1.0, 0, 100],
        "initialization": ["pca", "random", "spectral", "bogus"],
        "neighbors": ["auto", "exact", "annoy", "x"],
    },
    "umap": {
        "n_neighbors": [5, 1, 0, 10**9, 2.5],
        "min_dist": [0.1, 5.0, -1],
        "spread": [1.0, 0, 1e-9],
        "metric": ["euclidean", "cosine", "haversine", "nope"],
        "n_epochs": [10, 0, -1, None],
        "init": ["spectral", "random", "pca", "x"],
    },
    "densmap": {
        "n_neighbors": [5, 1],
        "dens_lambda": [2.0, -1, 1e9],
        "dens_frac": [0.3, 0, 1.5],
        "dens_var_shift": [0.1, -1],
    },
    "pacmap": {
        "n_neighbors": [5, 0, -1, 10**6],
        "MN_ratio": [0.5, -1, 0, 1e9],
        "FP_ratio": [2.0, 0, -2],
        "num_iters": [10, 0, 10**12],
        "distance": ["euclidean", "angular", "manhattan", "bogus"],
    },
    "trimap": {
        "n_inliers": [5, 0, 10**6],
        "n_outliers": [4, 0, -1],
        "n_random": [3, 0],
        "n_iters": [10, 0],
        "opt_method": ["dbd", "sd", "momentum", "x"],
    },
}


def train_method(rng: np.random.Generator) -> tuple[str | None, dict]:
    """A job's method (None: the default, MBN) and its parameters: MBN's some of the time,
    else a layout method's own options (``LAYOUT_CHOICES``), now and then with one of MBN's
    (which that method must refuse by name)."""
    if rng.random() < 0.6:
        return None, train_params(rng)
    method = str(rng.choice(list(LAYOUT_CHOICES)))
    choices = LAYOUT_CHOICES[method]
    params: dict = {"n_components": 2, "hidden_layer_sizes": [4], "max_epochs": 2}
    for key in rng.choice(list(choices), size=int(rng.integers(0, 4)), replace=False):
        options = choices[str(key)]
        params[str(key)] = options[int(rng.integers(len(options)))]
    if rng.random() < 0.1:
        params["n_clusterings"] = 5
    return method, params


def train_params(rng: np.random.Generator) -> dict:
    """MBN's training parameters with some of the options whose checks run at submission:
    the list parameters, the input scaling, the report's folds."""
    params: dict = {"n_clusterings": 5, "n_components": 2, "hidden_layer_sizes": [4]}
    choices = {
        "hidden_layer_sizes": [[4, 4], [1] * 17, [200_000, 200_000], [], [0], ["4"]],
        "ks": [[10, 5], [2] * 300, [1], [10**9]],
        "input_scaling": ["standard", "none", "auto", "minmax", None],
        "report_folds": [5, 2, "auto", None, 1000, -1],
        "delta": [0.999, 0.5, "auto"],
        "n_clusterings": [1, 200_000, 0],
    }
    for key in rng.choice(list(choices), size=int(rng.integers(0, 3)), replace=False):
        options = choices[str(key)]
        params[str(key)] = options[int(rng.integers(len(options)))]
    return params


def multipart_seed(rng: np.random.Generator) -> tuple[bytes, str]:
    boundary = "fuzzboundary" + str(int(rng.integers(1_000_000)))
    method, params = train_method(rng)
    parts = [
        (b'name="params"', json.dumps(params).encode()),
        (b'name="name"', b"fuzz"),
    ]
    if method is not None:
        parts.append((b'name="method"', method.encode()))
    extra = [
        (b'name="columns"', b"c0,c1,c2"),
        (b'name="drop"', b"2"),
        (b'name="align_to"', b"m-fuzz"),
        (b'name="promote"', b"false"),
    ]
    parts += [extra[int(i)] for i in rng.choice(len(extra), size=int(rng.integers(0, 3)),
                                                replace=False)]  # fmt: skip
    parts += [
        (b'name="file"; filename="d.csv"\r\nContent-Type: text/csv', csv_seed(rng)),
    ]
    body = b"".join(
        b"--%s\r\nContent-Disposition: form-data; %s\r\n\r\n%s\r\n" % (boundary.encode(), h, v)
        for h, v in parts
    )
    return body + b"--%s--\r\n" % boundary.encode(), boundary


_MULTIPART_EDITS = [
    (b"form-data", [b"form-dat", b"attachment", b""]),
    (b'filename="d.csv"', [b'filename="d.npy"', b'filename="d.npz"', b'filename=""',
                           b'filename="../../d.csv"', b"filename*=UTF-8''d.csv", b""]),
    (b'name="params"', [b'name="file"', b'name="name"', b'name="x"', b'name=""', b"name"]),
    (b"\r\n\r\n", [b"\r\n", b"\n\n", b"\r\n\r\n\r\n"]),
    (b'"n_clusterings": 5', [b'"n_clusterings": 5000000', b'"n_clusterings": 1' + b"0" * 5000,
                             b'"n_clusterings": "5"', b'"n_clusterings": 5, "n_clusterings": 6']),
    (b"c0,c1,c2", [b"c9", b"0", b"1,1", b",", b"c0" * 5000, b"\xff", b"c0,c1,c2,c3,c4,c5"]),
    (b'name="drop"', [b'name="columns"', b'name="dorp"']),
    (b"m-fuzz", [b"nope", b"fuzz", b"", b"x" * 300, b"../m-fuzz"]),
]  # fmt: skip


def mutate_multipart(data: bytes, boundary: str, rng: random.Random) -> tuple[bytes, str]:
    roll = rng.random()
    if roll < 0.4:
        old, choices = rng.choice(_MULTIPART_EDITS)
        if old in data:
            return data.replace(old, rng.choice(choices), 1), boundary
    if roll < 0.5:  # a part repeated
        first = data.find(b"--" + boundary.encode(), 1)
        return data[:first] + data[:first] + data[first:], boundary
    if roll < 0.6:  # the header's boundary differs from the body's
        return data, rng.choice(["other", boundary[:-1], boundary + "x", '"' + boundary, ""])
    if roll < 0.75:  # the file part's content mutated as a CSV
        start = data.find(b"\r\n\r\n", data.find(b"filename")) + 4
        end = data.find(b"\r\n--" + boundary.encode(), start)
        if 4 <= start < end:
            return data[:start] + mutate_csv(data[start:end], rng) + data[end:], boundary
    return generic(data, rng), boundary


_JSON_EDITS = [b"[", b"]", b"{", b"}", b",", b":", b'"', b"\\", b"-", b"1e999", b"NaN", b"null",
               b"true", b"1" * 5000, b"\xff", b"\x00", b'"inputs":', b'"mode":"exact",',
               b'"dim":', b"[[", b"]]", b"[" * 2000, b"0.5" * 40, b'"\\ud800"']  # fmt: skip


def json_seed(rng: np.random.Generator, mode: str | None = None) -> bytes:
    body: dict = {"inputs": embed_rows(rng)}
    optional = {
        "mode": ["fast", "exact"],
        "return_novelty": [True, False],
        "return_clusters": [True, False],
        "encoding_format": ["float", "base64"],
        "model": ["m-fuzz", "fuzz"],
    }
    for key in rng.choice(list(optional), size=int(rng.integers(0, 4)), replace=False):
        options = optional[str(key)]
        body[str(key)] = options[int(rng.integers(len(options)))]
    if rng.random() < 0.3:  # values far outside the training range
        body["inputs"][0] = [float(rng.choice([1e30, -3e38, 3.4e38, 1e-45]))] * DIM
    if mode is not None:
        body["mode"] = mode
    return json.dumps(body).encode()


def train_json_seed(rng: np.random.Generator) -> bytes:
    x, y = seed_arrays(rng)
    method, params = train_method(rng)
    body: dict = {"name": "fuzz", "data": x.round(4).tolist(), "params": params}
    if method is not None:
        body["method"] = method
    if rng.random() < 0.5:
        body["labels"] = y.tolist()
    if rng.random() < 0.2:
        body["align_to"] = "m-fuzz"
    if rng.random() < 0.2:
        body["promote"] = False
    return json.dumps(body).encode()


_ROUTES = [
    ("GET", "/models/{a}/compare/{b}"), ("GET", "/models/{a}/monitor"), ("GET", "/models/{a}"),
    ("GET", "/models/{a}/map"), ("POST", "/models/{a}/promote"), ("DELETE", "/models/{a}"),
    ("GET", "/jobs/{a}"), ("POST", "/jobs/{a}/cancel"), ("GET", "/jobs?status={a}&limit={b}"),
    ("HEAD", "/health/live"), ("HEAD", "/health/ready"),
]  # fmt: skip
_REFS = ["m-fuzz", "fuzz", "nope", "", "..", "%2e%2e", "%00", "x" * 3000, "\u00e9", "1" * 400,
         "m-fuzz%2F..", "-1", "0", "queued", "99999999999999999999"]  # fmt: skip


def route_case(rng: random.Random) -> bytes:
    """``METHOD path`` of a route with path parameters from ``_REFS`` (or mutated ones)."""
    method, template = rng.choice(_ROUTES)
    refs = [rng.choice(_REFS) for _ in range(2)]
    if rng.random() < 0.3:
        refs[0] = flip(refs[0].encode() or b"a", rng).decode("latin-1")
    return f"{method} {template.format(a=refs[0], b=refs[1])}".encode("utf-8", "replace")


def base64_seed(rng: np.random.Generator, mode: str = "fast") -> bytes:
    rows = np.asarray(embed_rows(rng), dtype="<f4")
    body: dict[str, object] = {"inputs_b64": base64.b64encode(rows.tobytes()).decode(), "dim": DIM}
    if mode == "exact":
        body["mode"] = "exact"
    return json.dumps(body).encode()


def mutate_json(data: bytes, rng: random.Random) -> bytes:
    if rng.random() < 0.6:
        at = rng.randrange(len(data) + 1)
        if rng.random() < 0.3 and data:
            end = min(len(data), at + rng.randint(1, 20))
            return data[:at] + rng.choice(_JSON_EDITS) + data[end:]
        return data[:at] + rng.choice(_JSON_EDITS) + data[at:]
    return generic(data, rng)


_B64_EDITS = [b"=", b"==", b"===", b"-", b"_", b"*", b" ", b"\\n", b"A", b"AAA", b"\\u0041"]


def mutate_base64(data: bytes, rng: random.Random) -> bytes:
    roll = rng.random()
    start = data.find(b'"inputs_b64": "') + 15
    end = data.find(b'"', start)
    if roll < 0.4 and 15 <= start < end:
        at = rng.randrange(start, end + 1)
        return data[:at] + rng.choice(_B64_EDITS) + data[at:]
    if roll < 0.55:  # a dim that disagrees with the bytes
        value = rng.choice([b"0", b"-1", b"63", b"65", b"1", b"1" + b"0" * 30, b"64.5", b'"64"'])
        return data.replace(b'"dim": 64', b'"dim": ' + value)
    if roll < 0.65 and 15 <= start < end:  # truncated to a length not a multiple of 4 or 256
        cut = rng.randrange(start, end)
        return data[:cut] + data[end:]
    return mutate_json(data, rng)


# ---------------------------------------------------------------------- cases


@dataclass
class Case:
    fmt: str
    data: bytes
    name: str = "d"  # the upload's file name (files), or the boundary (multipart)


def cases(fmt: str, count: int, seed: int = 0) -> Iterator[Case]:
    """``count`` mutated cases of ``fmt`` (reproducible from ``seed``)."""
    rng = random.Random(f"{fmt}-{seed}")
    nprng = np.random.default_rng(rng.randrange(1 << 30))
    for _ in range(count):
        if fmt == "npy":
            x, _ = seed_arrays(nprng)
            yield Case(fmt, mutate_npy(_npy(x), rng), "d.npy")
        elif fmt == "npz":
            yield Case(fmt, mutate_zip(npz_members(nprng), rng), "d.npz")
        elif fmt == "sparse":
            yield Case(fmt, mutate_zip(sparse_members(nprng), rng), "d.npz")
        elif fmt == "csv":
            yield Case(fmt, mutate_csv(csv_seed(nprng), rng), "d.csv")
        elif fmt == "multipart":
            body, boundary = multipart_seed(nprng)
            body, boundary = mutate_multipart(body, boundary, rng)
            yield Case(fmt, body, boundary)
        elif fmt == "json":
            yield Case(fmt, mutate_json(json_seed(nprng), rng))
        elif fmt == "base64":
            yield Case(fmt, mutate_base64(base64_seed(nprng), rng))
        elif fmt == "train-json":
            yield Case(fmt, mutate_json(train_json_seed(nprng), rng))
        elif fmt == "routes":
            yield Case(fmt, route_case(rng))
        elif fmt == "json-exact":
            yield Case(fmt, mutate_json(json_seed(nprng, "exact"), rng))
        elif fmt == "base64-exact":
            yield Case(fmt, mutate_base64(base64_seed(nprng, "exact"), rng))
        else:
            raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")


# ---------------------------------------------------------------------- targets


def parse_file(case: Case, directory: Path) -> str:
    """The API's header check and (if it passes) the trainer's loader on the case's file:
    'accepted', 'refused' (ValueError), or a defect raised as is."""
    from mbn_core.data.columns import check_rows
    from mbn_core.data.files import peek_data_file
    from mbn_core.data.readers import load_training_data

    path = directory / case.name
    path.write_bytes(case.data)
    try:
        shape = peek_data_file(path)
        # The trainer only ever loads what submission let through (service.submission).
        if shape.n_rows > LIMITS["rows"] or shape.loaded_bytes > LIMITS["bytes"]:
            return "refused"
        check_rows(path)  # every value, as submission checks them
        load_training_data(path)
    except ValueError:
        return "refused"
    return "accepted"


class _Bundle:
    input_dim = DIM


def parse_body(case: Case) -> str:
    """The route's parsing of a body and the checks that need no server: /embed's rows and
    matrix checks; /train's JSON, its parameters and what they need of the data's shape.
    (Multipart bodies and routes are fuzzed over HTTP only.)"""
    from service.domain import ServiceError
    from service.routes.embed import _matrix, _parse
    from service.routes.jobs import _parse_train
    from service.submission import check_data, check_params

    if case.fmt in ("multipart", "routes"):
        return "accepted"
    try:
        if case.fmt == "train-json":
            options, data, _ = _parse_train(case.data, LIMITS["rows"])
            params = check_params(options.params, options.method, bound=LIMITS["rows"])
            check_data(data.shape, params, memory_limit=LIMITS["bytes"] * 4)
        else:
            req, parsed = _parse(case.data, 8192)
            _matrix(req, parsed, _Bundle(), 8192)  # type: ignore[arg-type]
    except ServiceError:
        return "refused"
    return "accepted"


@dataclass
class Tally:
    """Outcomes of one format's cases."""

    outcomes: collections.Counter = field(default_factory=collections.Counter)
    defects: list[str] = field(default_factory=list)

    def add(self, outcome: str, detail: str | None = None) -> None:
        self.outcomes[outcome] += 1
        if "defect" in outcome and detail is not None and len(self.defects) < 20:
            self.defects.append(detail)


def run_direct(case: Case, directory: Path, tally: Tally) -> None:
    try:
        outcome = parse_file(case, directory) if case.fmt in FILE_FORMATS else parse_body(case)
        tally.add(outcome)
    except Exception as error:  # the defects this tool looks for
        tally.add("defect", f"{type(error).__name__}: {str(error)[:200]}")
        tally.defects[-1:] = [tally.defects[-1] + "\n" + traceback.format_exc(limit=-3)]


def http_request(case: Case, client: object) -> tuple[str, int]:
    """The case through HTTP (an ``httpx.Client`` on the server): ('path', status)."""
    import httpx

    assert isinstance(client, httpx.Client)
    if case.fmt in FILE_FORMATS:
        params = json.dumps({"n_clusterings": 5, "n_components": 2, "hidden_layer_sizes": [4]})
        answer = client.post(
            "/train", files={"file": (case.name, case.data)}, data={"params": params}
        )
        return "/train", answer.status_code
    if case.fmt == "multipart":
        answer = client.post(
            "/train",
            content=case.data,
            headers={"content-type": f"multipart/form-data; boundary={case.name}"},
        )
        return "/train", answer.status_code
    if case.fmt == "routes":
        method, _, path = case.data.decode("utf-8").partition(" ")
        try:
            answer = client.request(method, path)
        except httpx.InvalidURL:  # httpx will not send it: nothing reached the server
            return path[:40], 400
        return path[:40], answer.status_code
    path = "/train" if case.fmt == "train-json" else "/embed"
    answer = client.post(path, content=case.data, headers={"content-type": "application/json"})
    return path, answer.status_code


def run_http(case: Case, client: object, tally: Tally) -> None:
    import httpx

    try:
        path, status = http_request(case, client)
    except httpx.HTTPError as error:
        tally.add("http defect", f"{case.fmt}: {type(error).__name__}: {error}")
        return
    if status >= 500:
        tally.add("http defect", f"{case.fmt} {path}: status {status}: {case.data[:120]!r}")
    else:
        tally.add(f"http {status // 100}xx")


# ---------------------------------------------------------------------- the server


def fuzz_server_env(data_dir: Path) -> dict[str, str]:
    return {
        "MBN_DATA_DIR": str(data_dir),
        "MBN_DEMO_MODEL": "false",
        "MBN_EMBEDDED_WORKER": "false",  # accepted uploads just queue
        "MBN_MAX_QUEUED_JOBS": "100000",
        "MBN_MAX_TRAIN_ROWS": str(LIMITS["rows"]),
        "MBN_MAX_TRAIN_BYTES": str(LIMITS["bytes"]),
        "MBN_LOG_LEVEL": "warning",
    }


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident memory (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def _write_model(model_dir: Path) -> None:
    """A small digits model (64 features), trained here."""
    from sklearn.datasets import load_digits

    from mbn_core import MBN, CompressiveMBN
    from mbn_core.bundle import save_bundle

    x = load_digits().data.astype(np.float32)
    model_dir.mkdir(parents=True, exist_ok=True)
    model = CompressiveMBN(
        MBN(n_clusterings=10, random_state=0, n_jobs=1),
        hidden_layer_sizes=(16,),
        max_epochs=3,
        random_state=0,
        n_jobs=1,
    ).fit(x)
    save_bundle(model, model_dir / "m-fuzz", name="fuzz")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="cases per format")
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    parser.add_argument(
        "--http-share",
        type=float,
        default=0.05,
        help="share of file cases also uploaded over HTTP (bodies: all)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import httpx

    root = Path(tempfile.mkdtemp(prefix="mbn-fuzz-"))
    _write_model(root / "data" / "models")
    log = (root / "server.log").open("wb")
    env = {**os.environ, **fuzz_server_env(root / "data"), "PYTHONPATH": str(REPO)}
    port = 18000 + os.getpid() % 1000
    server = subprocess.Popen(
        [sys.executable, "-m", "service", "serve", "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the fuzz server did not come up; see " + str(log.name))
            time.sleep(0.5)
        start_rss = peak_rss_bytes(server.pid)
        pick = random.Random(args.seed)
        failed = False
        rows = []
        with httpx.Client(base_url=url, timeout=60) as client:
            for fmt in args.formats:
                tally, began = Tally(), time.perf_counter()
                for case in cases(fmt, args.cases, args.seed):
                    direct = ("json", "base64", "train-json", *EXACT_FORMATS)
                    if fmt in FILE_FORMATS or fmt in direct:
                        run_direct(case, root, tally)
                    if fmt not in FILE_FORMATS or pick.random() < args.http_share:
                        run_http(case, client, tally)
                seconds = time.perf_counter() - began
                defects = tally.outcomes["defect"] + tally.outcomes["http defect"]
                failed = failed or defects > 0
                rows.append((fmt, args.cases, dict(tally.outcomes), defects, seconds))
                print(
                    f"{fmt}: {args.cases} cases in {seconds:.0f} s: {dict(tally.outcomes)}; "
                    f"server peak RSS so far {peak_rss_bytes(server.pid) / 2**20:.0f} MiB"
                )
                for detail in tally.defects:
                    print("  DEFECT", detail)
        peak = peak_rss_bytes(server.pid)
        print(
            f"server peak RSS: {peak / 2**20:.0f} MiB (after start-up: {start_rss / 2**20:.0f} MiB)"
        )
        print("| format | cases | parser outcomes | HTTP answers | 500s and crashes | seconds |")
        print("|---|---|---|---|---|---|")
        for fmt, count, outcomes, defects, seconds in rows:
            direct = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()) if "http" not in k)
            http = ", ".join(
                f"{k.removeprefix('http ')} {v}" for k, v in sorted(outcomes.items()) if "http" in k
            )
            print(
                f"| {fmt} | {count} | {direct or '-'} | {http or '-'} | {defects} | {seconds:.0f} |"
            )
        return 1 if failed else 0
    finally:
        server.terminate()
        server.wait(30)
        log.close()


if __name__ == "__main__":
    sys.exit(main())
