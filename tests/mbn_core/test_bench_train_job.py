"""benchmarks/bench_train_job.py times a whole training job by step, on small data as CI
runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Slow: trains a bundle in a subprocess.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_bench_train_job_times_every_step(tmp_path):
    command = [
        sys.executable, str(ROOT / "benchmarks" / "bench_train_job.py"), "--rows", "400",
        "--repeats", "1", "--n-jobs", "1", "--option", "n_clusterings=10",
        "--option", "max_epochs=2", "--option", "map_points=100",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        command, check=True, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    out = done.stdout
    for step in ("teacher", "mlp", "report", "map wait", "map layout", "rest", "total", "cpu"):
        assert f"| {step} (median of 1), s | " in out, step
    assert "| report / fit | " in out and "| whole job / fit | " in out
    assert "bench_train_job.py --rows 400" in out  # the command that reproduces it
