"""benchmarks/bench_out_of_sample.py runs end to end on a small set over two seeds, scores a
layout on the rows it laid out with the model's own layout, and gives the medians."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# Slow: four trainings (a layout method and MBN, two seeds) in a subprocess.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_bench_out_of_sample_scores_the_models_own_layout(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    command = [
        sys.executable, str(ROOT / "benchmarks" / "bench_out_of_sample.py"),
        "--sets", "breast_cancer", "--methods", "pacmap,mbn", "--seeds", "0,1",
        "--reference", "none", "--threads", "1", "--json", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        command, check=True, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900
    )
    runs = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((run["method"], run["seed"]) for run in runs) == [
        ("mbn", 0), ("mbn", 1), ("pacmap", 0), ("pacmap", 1)
    ]  # fmt: skip
    rows = {run["method"]: run for run in runs if run["seed"] == 1}
    pacmap, mbn = rows["pacmap"], rows["mbn"]
    # PaCMAP fitted again with the model's seed is the model's layout, bit for bit (checked
    # on the bundle's reference rows); MBN's is its exact map, nothing to compare.
    assert pacmap["refit_difference"] == 0.0
    assert mbn["refit_difference"] is None
    for row in runs:
        assert (row["n_fit"], row["n_new"]) == (379, 190)
        for key in ("layout_nmi", "report_layout_nmi", "report_nmi", "student_nmi"):
            assert 0.2 < row[key] <= 1.0, (row["method"], key)
        assert 0.8 < row["layout_trust"] <= 1.0
        assert row["layout_seconds"] > 0
    assert pacmap["transform_nmi"] is not None
    assert "| breast_cancer (379 / 190, seed 1) | pacmap |" in done.stdout
    assert "| same |" in done.stdout
    # The medians' table: one line per method, over both seeds.
    medians = [line for line in done.stdout.splitlines() if line.startswith("| breast_cancer | ")]
    assert [line.split(" | ")[1:3] for line in medians] == [["pacmap", "2"], ["mbn", "2"]]
    gaps = [run["layout_nmi"] - run["student_nmi"] for run in runs if run["method"] == "pacmap"]
    assert f"{np.median(np.array(gaps)):+.3f} (" in medians[0]
