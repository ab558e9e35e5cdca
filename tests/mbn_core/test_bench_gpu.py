"""benchmarks/bench_gpu.py runs on the CPU (the GPU backend's code with numpy) on small data,
and its bit-identity checks hold there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mbn_core import MBN

# Slow: runs benchmarks/bench_gpu.py in a subprocess.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_bench_gpu_runs_on_the_cpu(tmp_path):
    out = tmp_path / "figures.json"
    command = [
        sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--device", "cpu",
        "--data", "digits", "--rows", "300", "--clusterings", "4", "--k1", "40",
        "--sample", "100", "--transform-rows", "100", "--cpu-clusterings", "2",
        "--subset-rows", "200", "--n-init", "2", "--json", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(command, check=True, env=env, cwd=tmp_path, capture_output=True, timeout=600)
    figures = json.loads(out.read_text())
    assert all(figures["codes_identical"])
    assert figures["embedding_identical"]
    assert figures["subset_model_identical"]
    assert figures["transform_identical_first_100"]
    assert figures["fit_s"] > 0 and figures["transform_rows"] == 100
    # The fit's time by phase, the host steps' beside the layers'.
    assert set(figures["phases_s"]) >= {"auto", "draws", "bottom", "upper", "output"}


@pytest.fixture
def tiny_bundle_dir(tmp_path, digits):
    """A model directory holding one small digits bundle."""
    from small_models import small_student

    from mbn_core.bundle import save_bundle

    model = small_student(
        MBN(n_clusterings=10, random_state=0, n_jobs=1), digits.X.astype(np.float32)
    )
    (tmp_path / "models").mkdir()
    save_bundle(model, tmp_path / "models" / "m-digits", name="digits")
    return tmp_path / "models"


def test_bench_gpu_http_runs_on_the_cpu(tmp_path, tiny_bundle_dir):
    """The prepared command for a card (exact rows/s over HTTP), run with the CPU only."""
    command = [
        sys.executable, str(ROOT / "benchmarks" / "bench_gpu_http.py"), "--model-dir",
        str(tiny_bundle_dir), "--devices", "cpu", "auto", "--data", "digits", "--rows", "50",
        "--clients", "2", "--seconds", "2", "--warmup", "1",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        command, check=True, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert "answers equal on every device, bit for bit: True" in result.stdout
    assert "| cpu | running (process" in result.stdout
    assert "MBN_EXACT_DEVICE=auto found no usable GPU" in result.stdout or "cuda" in result.stdout
