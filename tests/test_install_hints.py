"""Every install line the project shows (its messages and its docs) installs this project's
extras, from a checkout or by its distribution's name, or a third-party package it depends
on. The name `mbn` on the package index is another project's: a hint naming it installed
foreign code."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from mbn_core.distribution import DISTRIBUTION, install_hint

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
EXTRAS = set(PROJECT["optional-dependencies"])
# "pip install X", with optional flags, X quoted or not.
INSTALL = re.compile(r"pip install\s+(?:-[-\w]+\s+)*(['\"`]?)(?P<target>[^\s'\"`),;]+)\1")
REQUIREMENT = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[(?P<extras>[^\]]*)\])?")
# Packages named in install lines that pyproject.toml does not list: the CUDA 13 build of
# CuPy (the gpu extra installs the CUDA 12 one; the line says when to use which).
OTHER_WHEELS = {"cupy-cuda13x"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def depended_on() -> set[str]:
    """Every third-party distribution pyproject.toml names."""
    requirements = [*PROJECT["dependencies"]]
    for extra in PROJECT["optional-dependencies"].values():
        requirements += extra
    names = set()
    for requirement in requirements:
        match = REQUIREMENT.match(requirement)
        assert match, requirement
        names.add(canonical(match["name"]))
    return names


def shown_text() -> dict[str, str]:
    """What users read: the docs, and the string constants of the code (its messages)."""
    texts = {}
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]:
        texts[str(path.relative_to(REPO))] = path.read_text()
    for package in ("mbn_core", "service"):
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            strings = [
                node.value
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and isinstance(node.value, str)
            ]
            texts[str(path.relative_to(REPO))] = "\n".join(strings)
        for path in sorted((REPO / package).rglob("*.md")):
            texts[str(path.relative_to(REPO))] = path.read_text()
    return texts


def problem(target: str) -> str | None:
    """Why ``target`` (what follows "pip install") is not a line of this project's, or
    None."""
    if target.startswith("."):
        extras = re.fullmatch(r"\.(?:\[(?P<extras>[^\]]*)\])?", target)
        if extras is None:
            return "not the checkout with extras"
        unknown = {e.strip() for e in (extras["extras"] or "").split(",") if e.strip()} - EXTRAS
        return f"unknown extras {sorted(unknown)}" if unknown else None
    match = REQUIREMENT.fullmatch(target)
    if match is None:
        return "not a requirement"
    name = canonical(match["name"])
    if name == canonical(DISTRIBUTION):
        unknown = {e.strip() for e in (match["extras"] or "").split(",") if e.strip()} - EXTRAS
        return f"unknown extras {sorted(unknown)}" if unknown else None
    if match["extras"] is not None or name == "mbn":
        return f"{name!r} is not this project ({DISTRIBUTION!r})"
    if name not in depended_on() and name not in OTHER_WHEELS:
        return f"{name!r} is no dependency of this project"
    return None


def test_the_distribution_name_is_pyprojects_and_not_the_foreign_one() -> None:
    assert PROJECT["name"] == DISTRIBUTION != "mbn"
    hint = install_hint("gpu")
    assert [m["target"] for m in INSTALL.finditer(hint)] == [f"{DISTRIBUTION}[gpu]", ".[gpu]"]
    dev = [r for r in PROJECT["optional-dependencies"]["dev"] if r.startswith(DISTRIBUTION)]
    assert dev, "the dev extra names this project by its name"


def test_every_install_line_shown_installs_this_project_or_a_dependency() -> None:
    found = []
    for source, text in shown_text().items():
        for match in INSTALL.finditer(text):
            found.append((source, match["target"], problem(match["target"])))
    assert len(found) > 10, found  # the scan reaches the docs and the messages
    bad = [(source, target, why) for source, target, why in found if why]
    assert not bad, bad


def test_every_install_hint_names_existing_extras() -> None:
    """The messages built by install_hint: its arguments, literal or module constants."""
    calls = 0
    for package in ("mbn_core", "service"):
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            constants = {
                target.id: node.value.value
                for node in tree.body
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                for target in node.targets
                if isinstance(target, ast.Name)
            }
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "install_hint":
                    calls += 1
                    for arg in node.args:
                        if isinstance(arg, ast.Starred):
                            continue  # an entry point's extras: checked below
                        value = arg.value if isinstance(arg, ast.Constant) else None
                        if isinstance(arg, ast.Name):
                            value = constants.get(arg.id)
                        assert value in EXTRAS, (path, ast.dump(arg))
    assert calls >= 6
    # The commands the service adds name the extra they need (mbn_core.cli says it).
    for group in PROJECT["entry-points"].values():
        for value in group.values():
            extras = re.search(r"\[(.*)\]", value)
            assert extras is None or set(extras[1].split(",")) <= EXTRAS, value


@pytest.mark.parametrize(
    ("target", "ok"),
    [
        (".", True),
        (".[service,gpu]", True),
        ("mbn-embeddings[distributed]", True),
        ("umap-learn", True),
        ("mbn[gpu]", False),
        ("mbn", False),
        (".[no-such-extra]", False),
        ("some-unrelated-package", False),
    ],
)
def test_the_check_itself(target: str, ok: bool) -> None:
    assert (problem(target) is None) == ok
