"""Property-based fuzzing of the whole HTTP API from its own OpenAPI document (schemathesis):
no 5xx for anything a client sends, every response matches the documented schema, status and
content type, and invalid data is rejected. Bounded: a few dozen examples per operation."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error, positive_data_acceptance
from servicetest import make_settings

from service.app import create_app

# Slow: schemathesis generates dozens of requests for every operation of the API.
pytestmark = pytest.mark.slow

# The schema must exist when the module is collected (schemathesis' fixture-based loading does
# not work with this pytest), so the app does too; its model is written before the first test.
_DATA_DIR = Path(tempfile.mkdtemp(prefix="mbn-fuzz-"))
_SETTINGS = make_settings(
    _DATA_DIR,
    embedded_worker=False,  # generated training jobs just queue
    max_queued_jobs=100_000,
    max_rows_per_request=1000,
)
_APP = create_app(_SETTINGS)
schema = schemathesis.openapi.from_asgi("/openapi.json", _APP)


@pytest.fixture(scope="module", autouse=True)
def model(write_bundle: Callable[..., Path]) -> Iterator[None]:
    write_bundle(_SETTINGS.models_path, "m-digits", "digits")
    yield
    shutil.rmtree(_DATA_DIR, ignore_errors=True)


def _conformance_test(operation_schema: schemathesis.BaseSchema) -> Callable[..., None]:
    @operation_schema.parametrize()
    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    def test(case: schemathesis.Case) -> None:
        # Left out: "schema-valid data is accepted". Much valid-looking data is rightly refused
        # with a documented 422: rows of the wrong dimension for the model, values beyond the
        # float32 range, ragged rows, parameters TrainingParams refuses, files that do not
        # parse.
        excluded = [positive_data_acceptance]
        response = case.call()
        if response.status_code == 503 and response.json()["error"]["type"] == "unavailable":
            # The documented "starting" answer: the lifespan restarts for every operation, and
            # the model directory's first scan runs beside the traffic (so readiness says 503).
            excluded.append(not_a_server_error)
        case.validate_response(response, excluded_checks=excluded)

    return test


# One test function per operation, each with its own name and node id: schemathesis gives the
# operations of one parametrized function a single node id, and pytest-xdist's file and scope
# schedulers (--dist loadfile) key tests by it, so all but one would silently not run.
for _result in schema.get_all_operations():
    _operation = _result.ok()
    _name = re.sub(r"\W+", "_", f"{_operation.method} {_operation.path}").strip("_").lower()
    _only_this = schema.include(method=_operation.method, path=_operation.path)
    assert len(list(_only_this.get_all_operations())) == 1, _name
    globals()[f"test_{_name}_conforms_to_the_schema"] = _conformance_test(_only_this)
