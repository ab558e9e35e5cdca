"""The documentation agrees with the code and stands alone.

Tables derived from the code (training options from the estimators' parameter constraints,
settings from ``Settings``) are what ``scripts/gen_docs.py`` writes; no document points outside
the repository; figures that several documents quote come from one place.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts" / "gen_docs.py")
assert _spec is not None and _spec.loader is not None
gen_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_docs)

DOCUMENTS = sorted(
    path
    for path in REPO.rglob("*.md")
    if not any(part.startswith(".") or part in ("node_modules", "build") for part in path.parts)
)


@pytest.mark.slow
@pytest.mark.parametrize("section", sorted(gen_docs.SECTIONS))
def test_generated_tables_match_the_code(section):
    path, current, expected = gen_docs.expected(section)
    assert current == expected, (
        f"{path.name}: the {section} table differs from the code; run python scripts/gen_docs.py"
    )


def test_every_training_option_and_setting_is_documented():
    from mbn_core.methods import get_method
    from mbn_core.pipeline.options import options
    from service.config import Settings

    guide = (REPO / "docs" / "GUIDE.md").read_text()
    for param in options(get_method("mbn")):
        assert f"| `{param.name}` |" in guide, param.name
    deployment = (REPO / "docs" / "DEPLOYMENT.md").read_text()
    for name in Settings.model_fields:
        assert f"| `MBN_{name.upper()}` |" in deployment, name


# The README's "Layout" section is a table with one row per package directory:
# | `<directory>/` | <what it holds> | `<module>` `<module>` ... |
# The third cell names every module of that directory, without ".py", each in backticks; the
# second is free text. Every module of these packages but ``__init__.py`` files and Alembic's
# revision scripts must be named exactly once, and every name must be a module that exists.
LAYOUT_PACKAGES = ("mbn_core", "service")
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def modules_on_disk() -> set[str]:
    """Every module of the packages but ``__init__.py`` files and Alembic's revision scripts
    (``service/migrations/versions/``: the README names that folder, not each revision)."""
    found = set()
    for package in LAYOUT_PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            relative = path.relative_to(REPO).as_posix()
            if path.name == "__init__.py" or "/migrations/versions/" in relative:
                continue
            found.add(relative)
    return found


def modules_in_readme_layout() -> dict[str, int]:
    """The modules the table of the README's layout section names, with each one's line."""
    listed: dict[str, int] = {}
    directories: dict[str, int] = {}
    in_section = False
    for number, line in enumerate((REPO / "README.md").read_text().splitlines(), start=1):
        if line.startswith("## "):
            in_section = line == "## Layout"
            continue
        if not in_section or not line.startswith("|"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0] == "package" or set(cells[0]) <= set("-: "):
            continue  # the header row and the rule under it
        where = f"README.md line {number}"
        assert len(cells) == 3, f"{where}: a layout row has three cells, not {len(cells)}"
        match = re.fullmatch(r"`([A-Za-z0-9_/]+)/`", cells[0])
        assert match, f"{where}: the first cell must be a directory in backticks: `mbn_core/mbn/`"
        directory = match.group(1)
        assert directory.split("/")[0] in LAYOUT_PACKAGES, f"{where}: {directory}/ is no package"
        assert directory not in directories, (
            f"README.md lines {directories[directory]} and {number} both list {directory}/"
        )
        directories[directory] = number
        names = re.findall(r"`([^`]*)`", cells[2])
        assert names, f"{where}: {directory}/ names no module"
        for module in names:
            assert _MODULE_NAME.fullmatch(module), (
                f"{where}: `{module}` is not a module name (write `name`, without .py)"
            )
            name = f"{directory}/{module}.py"
            assert name not in listed, (
                f"README.md lines {listed[name]} and {number} both list {name}: remove one"
            )
            listed[name] = number
    assert listed, "README.md has no '## Layout' table of packages and their modules"
    return listed


def test_readme_layout_lists_every_module():
    on_disk = modules_on_disk()
    listed = modules_in_readme_layout()
    rows = {Path(name).parent.as_posix() for name in listed}
    problems = [
        f"add `{Path(name).stem}` to the row of {Path(name).parent.as_posix()}/"
        if Path(name).parent.as_posix() in rows
        else f"add a row for {Path(name).parent.as_posix()}/ naming `{Path(name).stem}`"
        for name in sorted(on_disk - listed.keys())
    ] + [
        f"remove `{Path(name).stem}` from line {listed[name]}: {name} does not exist"
        for name in sorted(listed.keys() - on_disk)
    ]
    assert not problems, "README.md's '## Layout' table is out of date:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_documents_cite_only_files_of_the_repository(path):
    text = path.read_text()
    assert "../shared" not in text and "/work/" not in text, f"{path}: a path outside the repo"
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (path.parent / target).exists(), f"{path.name} links to missing {target}"
    for name in re.findall(r"`([A-Za-z_/.-]+\.md)`", text):
        candidates = [REPO / name, path.parent / name, REPO / "docs" / name]
        assert any(c.exists() for c in candidates), f"{path.name} cites {name}, not in the repo"
