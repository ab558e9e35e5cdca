"""benchmarks/bench_peers.py runs end to end on small data, as users would rerun it on MNIST."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Slow: three fits and UMAP's compilation in a subprocess.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_bench_peers_runs_on_small_data(tmp_path):
    out = tmp_path / "figures.json"
    command = [
        sys.executable, str(ROOT / "benchmarks" / "bench_peers.py"), "--data", "digits",
        "--rows", "600", "--repeats", "2", "--n-init", "2", "--json", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        command, check=True, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900
    )
    figures = json.loads(out.read_text())
    assert set(figures["summary"]) == {"umap", "mbn", "mbn-k8000"}
    assert figures["params"] == {"mbn": {"k_max": 2000}, "mbn-k8000": {"k_max": 300}}
    for key, row in figures["summary"].items():
        assert row["seconds"] > 0 and 0.3 < row["nmi"] <= 1.0, key
        assert len(figures["runs"][key]) == 2
    phases = figures["summary"]["mbn"]["phases"]
    assert set(phases) == {"auto", "draws", "bottom", "upper", "output"}
    assert all(seconds > 0 for seconds in phases.values())
    assert figures["summary"]["umap"]["ratio_to_umap"] == 1.0
    assert "| mbn-k8000 |" in done.stdout
