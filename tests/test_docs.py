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

    readme = (REPO / "README.md").read_text()
    for param in get_method("mbn").options():
        assert f"| `{param.name}` |" in readme, param.name
    for name in Settings.model_fields:
        assert f"| `MBN_{name.upper()}` |" in readme, name


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
