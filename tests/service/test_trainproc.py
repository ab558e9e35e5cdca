"""The training process's answers when its data is removed or unreadable (run in process)."""

from __future__ import annotations

import logging
import multiprocessing as mp
from pathlib import Path

import pytest

from service import trainproc
from service.trainproc import DATA_REMOVED, TrainSpec


def _spec(tmp_path: Path, data_path: Path) -> TrainSpec:
    return TrainSpec(
        job_id="0" * 32,
        name="test",
        params={},
        data_path=str(data_path),
        out_dir=str(tmp_path / "out"),
        model_id="m-test",
        threads=1,
    )


def _train(spec: TrainSpec) -> tuple[str, str]:
    receiver, sender = mp.Pipe(duplex=False)
    try:
        return trainproc._train(spec, sender, lambda: False)
    finally:
        receiver.close()
        sender.close()


def test_removed_data_ends_the_attempt_without_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A cancel removes the job's data; an attempt starting at that instant finds none.
    data = tmp_path / "jobs" / "data.npz"
    with caplog.at_level(logging.INFO, logger=trainproc.__name__):
        kind, message = _train(_spec(tmp_path, data))
    assert (kind, message) == ("error", DATA_REMOVED)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert str(tmp_path) not in message
    assert not (tmp_path / "out").exists()


def test_unreadable_data_is_an_error_naming_no_server_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data.npz"
    data.write_bytes(b"not an npz file")
    with caplog.at_level(logging.INFO, logger=trainproc.__name__):
        kind, message = _train(_spec(tmp_path, data))
    assert kind == "error"
    # Users read what went wrong, not the exception's class.
    assert message.startswith("the training data") and "Error" not in message.split(":")[0]
    assert str(tmp_path) not in message
    # A real fault keeps its traceback in the log, for the operator.
    assert [r for r in caplog.records if r.levelno == logging.ERROR and r.exc_info]
