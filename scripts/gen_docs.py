#!/usr/bin/env python3
"""Regenerate the documentation tables that are derived from the code.

- docs/GUIDE.md, "Training options": one table per registered method and part, from the
  estimators' ``_parameter_constraints``, signatures and docstrings (``mbn_core.methods``);
- docs/DEPLOYMENT.md, "Configuration": the settings table, from ``service.config.Settings``.

Each table sits between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``.
``tests/test_docs.py`` fails when a table differs from what this script writes; then run

    python scripts/gen_docs.py
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def training_options() -> str:
    from mbn_core.methods import BUILTIN_MODULES, get_method, method_names
    from mbn_core.params import markdown_table
    from mbn_core.pipeline.options import option_groups

    parts = []
    titles = {
        "compressor": "the distilled compressor's",
        "pipeline": "the pipeline's (every method)",
        "map": "the stored map's (every method)",
        "input": "the input's (every method)",
    }
    shown_shared: set[str] = set()
    # The methods of this repository (not plug-ins a test or a site registered).
    for name in method_names():
        method = get_method(name)
        if method.module not in BUILTIN_MODULES:
            continue
        for group, params in option_groups(method).items():
            if group in ("pipeline", "map", "input"):  # every method's: shown once
                if group in shown_shared:
                    continue
                shown_shared.add(group)
            if group == "compressor" and name != "mbn":
                continue  # the same for every distilled method: shown once, under mbn
            title = titles.get(group, f"`{name}` ({method.summary})")
            parts.append(f"**{title[0].upper() + title[1:]}** options:\n\n{markdown_table(params)}")
    return "\n\n".join(parts)


def settings() -> str:
    from service.config import settings_markdown

    return settings_markdown()


SECTIONS: dict[str, tuple[Path, Callable[[], str]]] = {
    "training-options": (REPO / "docs" / "GUIDE.md", training_options),
    "settings": (REPO / "docs" / "DEPLOYMENT.md", settings),
}


def pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated:{name} -->\n)(.*?)(<!-- /generated:{name} -->)", re.DOTALL)


def expected(name: str) -> tuple[Path, str, str]:
    """(file, current text of the section, generated text)."""
    path, generate = SECTIONS[name]
    match = pattern(name).search(path.read_text())
    if match is None:
        raise SystemExit(f"{path}: no <!-- generated:{name} --> section")
    return path, match.group(2), generate().rstrip("\n") + "\n"


def main() -> None:
    for name in SECTIONS:
        path, current, text = expected(name)
        if current != text:
            match = pattern(name).search(path.read_text())
            assert match is not None
            content = path.read_text()
            content = content[: match.start(2)] + text + content[match.end(2) :]
            path.write_text(content)
            print(f"{path.relative_to(REPO)}: {name} regenerated")  # noqa: T201


if __name__ == "__main__":
    main()
