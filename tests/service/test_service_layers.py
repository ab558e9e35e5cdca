"""Where the service chooses HTTP statuses: only in ``service/errors.py``.

The service's import rules (routes -> handlers -> domain, no web framework beneath the
routes) are import-linter contracts (``.importlinter``), which ``scripts/test`` runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import service

ROOT = Path(service.__file__).parent


def chosen_error_statuses(path: Path) -> list[str]:
    """Places in ``path`` that raise HTTPException or give a response an error status."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        name = getattr(node, "id", None) or getattr(node, "attr", None)
        if name == "HTTPException":
            found.append(f"line {node.lineno}: HTTPException")
        if isinstance(node, ast.keyword) and node.arg == "status_code":
            value = node.value
            if not (isinstance(value, ast.Constant) and isinstance(value.value, int)):
                found.append(f"line {value.lineno}: status_code not a literal success code")
            elif value.value >= 400:
                found.append(f"line {value.lineno}: status_code={value.value}")
    return found


@pytest.mark.parametrize(
    "path",
    [p for p in sorted(ROOT.rglob("*.py")) if p != ROOT / "errors.py"],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_only_errors_py_chooses_error_statuses(path: Path) -> None:
    assert not chosen_error_statuses(path)


def test_the_status_check_sees_statuses() -> None:
    assert chosen_error_statuses(ROOT / "errors.py")  # where they are chosen
    assert chosen_error_statuses(ROOT / "routes" / "models.py") == []  # 204 is a success
