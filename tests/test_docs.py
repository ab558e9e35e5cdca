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
    from service.config import Settings

    guide = (REPO / "docs" / "GUIDE.md").read_text()
    for param in get_method("mbn").options():
        assert f"| `{param.name}` |" in guide, param.name
    deployment = (REPO / "docs" / "DEPLOYMENT.md").read_text()
    for name in Settings.model_fields:
        assert f"| `MBN_{name.upper()}` |" in deployment, name


# The README's "Layout" section lists every module of these packages, one line each: a line
# without indentation ending in "/" names a package root, and an indented line starting with a
# path ending in ".py" names a module relative to the last root.
LAYOUT_PACKAGES = ("mbn_core", "service")


def modules_on_disk() -> set[str]:
    """Every module of the packages but ``__init__.py`` files and Alembic's revision scripts
    (``service/migrations/versions/``: listed as that folder, not one line per revision)."""
    found = set()
    for package in LAYOUT_PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            relative = path.relative_to(REPO).as_posix()
            if path.name == "__init__.py" or "/migrations/versions/" in relative:
                continue
            found.add(relative)
    return found


def modules_in_readme_layout() -> dict[str, int]:
    """The modules the code block of the README's layout section names, with each one's line."""
    listed: dict[str, int] = {}
    in_section = in_block = False
    root = None
    for number, line in enumerate((REPO / "README.md").read_text().splitlines(), start=1):
        if line.startswith("## "):
            in_section = line == "## Layout"
        elif in_section and line.startswith("```"):
            in_block = not in_block
        elif in_block and line and not line[0].isspace():
            root = line.split()[0].rstrip("/")
        elif in_block and line.strip() and line.split()[0].endswith(".py"):
            assert root is not None, f"README.md line {number}: a module before any package"
            listed[f"{root}/{line.split()[0]}"] = number
    assert listed, "README.md has no '## Layout' section with a code block of modules"
    return listed


def test_readme_layout_lists_every_module():
    on_disk = modules_on_disk()
    listed = modules_in_readme_layout()
    problems = [
        f"add the line '  {name.split('/', 1)[1]}  <what it does>' under {name.split('/')[0]}/"
        for name in sorted(on_disk - listed.keys())
    ] + [
        f"remove line {listed[name]} ('{name.split('/', 1)[1]}'): {name} does not exist"
        for name in sorted(listed.keys() - on_disk)
    ]
    assert not problems, "README.md's '## Layout' block is out of date:\n" + "\n".join(problems)


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
