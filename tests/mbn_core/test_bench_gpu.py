"""benchmarks/bench_gpu.py runs on the CPU (the GPU backend's code with numpy) on small data,
and its bit-identity checks hold there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
