"""Settings: environment parsing, derived defaults, refusal of unsafe values."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from mbn_core import cli
from service.config import Settings


def test_defaults_derive_from_the_data_dir(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    assert settings.models_path == tmp_path / "models"
    assert settings.db_url == f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    assert settings.jobs_path == tmp_path / "jobs"
    assert settings.api_keys == ()


def test_environment_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MBN_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("MBN_MODEL_DIR", str(tmp_path / "shared-models"))
    monkeypatch.setenv("MBN_API_KEYS", "key-number-one-123456, key-number-two-123456 ,")
    monkeypatch.setenv("MBN_EXACT_QUEUE_REQUESTS", "3")
    monkeypatch.setenv("MBN_EXACT_DEVICE", "auto")
    monkeypatch.setenv("MBN_DATABASE_URL", "postgresql://u:p@db/mbn")
    settings = Settings()
    assert settings.models_path == tmp_path / "shared-models"
    assert [k.get_secret_value() for k in settings.api_keys] == [
        "key-number-one-123456",
        "key-number-two-123456",
    ]
    assert settings.exact_queue_requests == 3 and settings.exact_device == "auto"
    # Plain PostgreSQL URLs get the psycopg 3 driver the package ships with.
    assert settings.db_url == "postgresql+psycopg://u:p@db/mbn"


def test_a_removed_variable_stops_the_start_saying_what_replaced_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MBN_MAX_CONCURRENT_EXACT", "2")
    with pytest.raises(ValueError, match=r"MBN_MAX_CONCURRENT_EXACT was removed.*MBN_EXACT_QUEUE"):
        Settings(data_dir=tmp_path)


def test_keys_are_never_shown(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, api_keys="a-secret-key-0123456789")
    assert "a-secret-key" not in repr(settings)
    assert "a-secret-key" not in str(settings.model_dump())


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("api_keys", "short", "API key #1"),
        ("api_keys", "has space in the key 12345", "API key #1"),
        ("max_body_bytes", 0, "greater than or equal"),
        ("max_rows_per_request", -1, "greater than or equal"),
        ("exact_queue_requests", 0, "greater than or equal"),
        ("exact_device", "tpu", "'cpu', 'cuda' or 'auto'"),
        ("max_queued_jobs", 0, "greater than or equal"),
        ("onnx_threads", 1000, "less than or equal"),
        ("max_upload_bytes", 10**12, "less than or equal"),
        ("database_url", "mysql://x/y", "scheme"),
        ("database_url", "jobs.sqlite3", "scheme"),
        ("data_dir", "/", "root"),
        ("model_dir", "/", "root"),
        ("heartbeat_seconds", 20.0, "stale_after_seconds must exceed"),
        ("log_level", "loud", "log_level"),
        ("not_a_setting", 1, "Extra inputs"),
    ],
)
def test_unsafe_values_are_refused(tmp_path: Path, field: str, value: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(**{"data_dir": tmp_path, field: value})


@pytest.mark.parametrize(
    ("field", "secret"),
    [("api_keys", "tiny-secret"), ("database_url", "mysql://user:pw-secret@db/x")],
)
def test_errors_do_not_echo_secrets(tmp_path: Path, field: str, secret: str) -> None:
    with pytest.raises(ValidationError) as info:
        Settings(**{"data_dir": tmp_path, field: secret})
    assert "secret" not in str(info.value)


def test_upload_limit_not_below_body_limit(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"MBN_MAX_UPLOAD_BYTES \(1000000\) must be at least"):
        Settings(data_dir=tmp_path, max_body_bytes=10_000_000, max_upload_bytes=1_000_000)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--port", "99999"], "a port is 1 to 65535, got 99999"),
        (["--port", "0"], "a port is 1 to 65535"),
        (["--port", "http"], "not an integer: 'http'"),
        (["--workers", "0"], "must be at least 1"),
    ],
)
def test_serve_refuses_bad_arguments(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The socket layer would take port 99999 modulo 65,536 and listen on another port.
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_serve_with_a_data_dir_it_cannot_make_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("MBN_DATA_DIR", str(blocker / "data"))
    # Refused before uvicorn starts (a traceback and "Application startup failed" before).
    assert cli.main(["serve", "--port", "18999"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err.startswith("mbn serve: error: ") and len(err.splitlines()) == 1
    assert "Not a directory" in err
