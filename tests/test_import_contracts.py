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


def _private_imports(root: Path) -> list[str]:
    """``from x import _name`` of a module's private name, and private modules imported from
    outside their package, anywhere under ``root``."""
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or not node.module or node.level:
                continue
            if not node.module.startswith(("mbn_core", "service")):
                continue
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                parts = target.split(".")
                private = [i for i, part in enumerate(parts) if part.startswith("_")]
                for i in private:
                    if parts[i].startswith("__"):
                        continue
                    owner = ".".join(parts[:i])
                    if not (package == owner or package.startswith(owner + ".")):
                        found.append(f"{module}:{node.lineno} imports {target}")
    return found


def test_no_private_name_crosses_a_module_boundary():
    # A private module (``_kernels``) serves its own package; a private name in a module is
    # that module's alone (scikit-learn's rule). What another module needs is public.
    found = [*_private_imports(REPO / "mbn_core"), *_private_imports(REPO / "service")]
    assert found == []


def test_the_private_import_check_sees_them(tmp_path):
    package = tmp_path / "mbn_core"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "a.py").write_text(
        "from mbn_core.sub._kernels import run\nfrom mbn_core.other import _helper\n"
    )
    (package / "b.py").write_text("from mbn_core.sub._kernels import run\n")
    assert _private_imports(package) == [
        "mbn_core.b:1 imports mbn_core.sub._kernels.run",
        "mbn_core.sub.a:2 imports mbn_core.other._helper",
    ]


# A module longer than this does several jobs (STYLE: small modules with one job).
MAX_MODULE_LINES = 600


def test_no_module_is_over_the_line_limit():
    long = {
        str(path.relative_to(REPO)): lines
        for package in ("mbn_core", "service")
        for path in sorted((REPO / package).rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"over {MAX_MODULE_LINES} lines: cut by job"
