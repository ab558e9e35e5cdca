"""The service's layers, read from its source: routes -> handlers -> store, registry,
submitter; HTTP statuses only in ``service/errors.py``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import service

ROOT = Path(service.__file__).parent
# What the handlers stand in front of: routes never reach these themselves.
BENEATH_HANDLERS = ("service.jobs", "service.registry", "service.submission", "service.aliases")
# What a route or the error mapping knows: the domain never imports these.
HTTP = ("fastapi", "starlette", "service.errors", "service.schemas", "service.deps")
DOMAIN = (
    "domain", "jobs", "registry", "submission", "aliases", "worker", "handlers", "admission",
    "monitor", "exact",
)  # fmt: skip


def python_files(*names: str) -> list[Path]:
    """``service/<name>.py``, or every module of the package ``service/<name>/``."""
    files: list[Path] = []
    for name in names:
        package = ROOT / name
        files += sorted(package.glob("*.py")) if package.is_dir() else [ROOT / f"{name}.py"]
    assert files and all(f.is_file() for f in files), names
    return files


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports (``from a import b`` counts as ``a`` and ``a.b``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, f"{path}: relative import"
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def within(names: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(n == p or n.startswith(p + ".") for p in packages))


def test_the_helpers_see_imports() -> None:
    # The checks below pass vacuously if these do not find what is there.
    assert "service.jobs" in within(imported(ROOT / "handlers" / "jobs.py"), BENEATH_HANDLERS)
    assert "fastapi" in within(imported(ROOT / "routes" / "jobs.py"), HTTP)
    assert len(python_files("routes")) >= 7 and len(python_files("handlers")) >= 6


@pytest.mark.parametrize("path", python_files("routes"), ids=lambda p: p.name)
def test_routes_reach_the_store_and_the_registry_only_through_handlers(path: Path) -> None:
    reached = within(imported(path), BENEATH_HANDLERS)
    assert not reached, f"service/routes/{path.name} imports {reached}; use a handler"


@pytest.mark.parametrize("path", python_files(*DOMAIN), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_domain_knows_nothing_of_http(path: Path) -> None:
    web = within(imported(path), HTTP)
    assert not web, f"service/{path.relative_to(ROOT)} imports {sorted(web)}"


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
