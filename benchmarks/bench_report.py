"""How the benchmarks print what RESULTS.md quotes: the command that reproduces a run, and a
two-column table of its measures."""

from __future__ import annotations

import sys
from collections.abc import Iterable


def command_line(script: str, argv: list[str] | None = None) -> str:
    """``python benchmarks/<script> <arguments>``: the arguments given, or the process's own."""
    arguments = sys.argv[1:] if argv is None else argv
    return " ".join(["python", f"benchmarks/{script}", *arguments])


def print_measures(
    title: str, script: str, rows: Iterable[tuple[str, str]], argv: list[str] | None = None
) -> None:
    """A Markdown table of (measure, value) rows under ``title (`command`)``."""
    print(f"{title} (`{command_line(script, argv)}`)\n")
    print("| measure | value |")
    print("|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
