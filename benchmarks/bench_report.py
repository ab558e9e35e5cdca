"""How the benchmarks print their figures: the command that reproduces a run, and a
two-column table of its measures; and the ``--option KEY=JSON`` flag of those that train."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import Any


def add_training_option(parser: argparse.ArgumentParser, example: str) -> None:
    """``--option KEY=JSON`` (repeatable): another training option; ``args.option`` is a dict."""
    parser.add_argument(
        "--option",
        action=_OptionAction,
        default={},
        metavar="KEY=JSON",
        help=f"another training option, e.g. --option {example} (repeatable)",
    )


class _OptionAction(argparse.Action):
    def __call__(self, parser, namespace, value, option_string=None) -> None:
        key, separator, text = str(value).partition("=")
        try:
            parsed: Any = json.loads(text)
        except json.JSONDecodeError:
            separator = ""
        if not key or not separator:
            parser.error(f"--option {value!r}: expected KEY=JSON, e.g. input_components=null")
        setattr(namespace, self.dest, {**getattr(namespace, self.dest), key: parsed})


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
