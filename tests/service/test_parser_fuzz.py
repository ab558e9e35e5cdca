"""The seed-corpus run of ``benchmarks/fuzz_parsers.py``: a few hundred mutated cases per
format through the real parsing code, and part of them through a real ``mbn serve``. Every
case is accepted or refused (ValueError, 4xx); anything else is a defect. The long run
(10,000 cases per format) is the benchmark's command; its figures are in docs/BENCHMARKS.md."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from servicetest import Server, fuzz_parsers, serving

from mbn_core.methods import get_method

fuzz = fuzz_parsers()

CASES = 300
HTTP_CASES = 60


@pytest.mark.parametrize(
    "fmt",
    ["npy", "npz", "sparse", "csv", "json", "base64", "train-json", "json-exact", "base64-exact"],
)
def test_parsers_refuse_every_mutated_case_cleanly(tmp_path: Path, fmt: str) -> None:
    tally = fuzz.Tally()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # overflowing casts: refused below
        for case in fuzz.cases(fmt, CASES, seed=1):
            fuzz.run_direct(case, tmp_path, tally)
    assert tally.outcomes["defect"] == 0, "\n\n".join(tally.defects)
    # The mutations reach past the first check: some cases are accepted, most refused.
    assert tally.outcomes["refused"] > CASES // 2
    assert tally.outcomes["accepted"] + tally.outcomes["refused"] == CASES


def test_the_layout_seeds_name_the_methods_own_parameters() -> None:
    # A renamed parameter would leave the seeds fuzzing a name every method refuses as
    # unknown, never reaching the checks of the real one.
    for method, choices in fuzz.LAYOUT_CHOICES.items():
        names = {param.name for param in get_method(method).params()}
        assert set(choices) <= names, (method, sorted(set(choices) - names))


@pytest.fixture(scope="module")
def fuzz_server(digits_data_dir: Callable[[str], Path]) -> Iterator[Server]:
    data = digits_data_dir("fuzz")
    with serving(fuzz.fuzz_server_env(data), data / "server.log") as server:
        yield server


@pytest.mark.slow
@pytest.mark.parametrize("fmt", fuzz.FORMATS)
def test_mutated_uploads_and_bodies_over_http_get_no_5xx(fuzz_server: Server, fmt: str) -> None:
    tally = fuzz.Tally()
    with httpx.Client(base_url=fuzz_server.url, timeout=60) as client:
        for case in fuzz.cases(fmt, HTTP_CASES, seed=2):
            fuzz.run_http(case, client, tally)
    assert tally.outcomes["http defect"] == 0, "\n".join(tally.defects)
    assert sum(tally.outcomes.values()) == HTTP_CASES
    log = fuzz_server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
