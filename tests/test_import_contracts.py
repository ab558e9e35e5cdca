"""The dependency order of docs/DESIGN.md, as import-linter contracts (``.importlinter``).

``scripts/test`` runs ``lint-imports`` itself; here the contracts are run too, and shown to
see what they must: an upward import inside a function breaks them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the packages and the contracts under ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_contracts_hold():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.slow  # copies the packages and builds their import graph three times
def test_an_upward_import_inside_a_function_breaks_them(tmp_path):
    ignore = shutil.ignore_patterns("__pycache__", "static", "*.nbi", "*.nbc")
    for package in ("mbn_core", "service"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=ignore)
    shutil.copy(REPO / ".importlinter", tmp_path)
    assert lint_imports(tmp_path).returncode == 0  # the copy holds as the repository does
    with (tmp_path / "mbn_core" / "mbn" / "auto.py").open("a") as module:
        module.write("\n\ndef _upward():\n    from mbn_core.bundle import load_bundle\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "mbn_core.mbn.auto -> mbn_core.bundle" in result.stdout
