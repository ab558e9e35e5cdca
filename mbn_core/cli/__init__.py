"""The ``mbn`` command: train bundles offline, embed with them, inspect them.

``train``, ``embed`` and ``info`` need only the library, one module each. Other commands are
plug-ins: an installed package adds them through the ``mbn.commands`` entry-point group (the
service adds ``serve`` and ``worker`` with the ``service`` extra). A plug-in whose
dependencies are missing still shows up, and says which extra to install.

User errors (a missing file, an unreadable format, a dimension mismatch, a bad option) end
with one line on stderr and exit status 2; Ctrl-C ends with status 130 and no partial output.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from typing import Any

from mbn_core.bundle import BundleError
from mbn_core.cli import embed, info, train
from mbn_core.cli.common import UserError, os_message
from mbn_core.distribution import install_hint, version
from mbn_core.exceptions import MissingDependency, TrainingStopped
from mbn_core.methods import DEFAULT_METHOD

log = logging.getLogger(__name__)

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
COMMAND_GROUP = "mbn.commands"

# A plug-in command: adds its sub-parser (with a ``handler``) to the ``mbn`` sub-parsers.
Command = Callable[[Any], None]

__all__ = [
    "COMMAND_GROUP",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "Command",
    "UserError",
    "build_parser",
    "load_command",
    "main",
    "plugin_commands",
]


def build_parser(
    method: str = DEFAULT_METHOD, commands: Mapping[str, Command] | None = None
) -> argparse.ArgumentParser:
    """The argument parser of ``mbn``.

    Parameters
    ----------
    method : str, default="mbn"
        Whose options ``mbn train`` offers.
    commands : mapping, default=None
        Plug-in commands by name; None means those of the ``mbn.commands`` entry points.
    """
    parser = argparse.ArgumentParser(
        prog="mbn",
        description="Multilayer Bootstrap Network embeddings: train, embed, inspect.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    parser.add_argument("--version", action="version", version=f"mbn {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train.add_parser(subparsers, method)
    embed.add_parser(subparsers)
    info.add_parser(subparsers)
    for add_command in (plugin_commands() if commands is None else commands).values():
        add_command(subparsers)
    return parser


def plugin_commands() -> dict[str, Command]:
    """The commands of the ``mbn.commands`` entry points, by name.

    A plug-in that cannot be imported (its optional dependencies are not installed) becomes
    a command that says which extra to install.
    """
    entries = sorted(metadata.entry_points(group=COMMAND_GROUP), key=lambda e: e.name)
    return {entry.name: load_command(entry) for entry in entries}


def load_command(entry: metadata.EntryPoint) -> Command:
    """The command an entry point names, or one saying which extra it needs."""
    try:
        command: Command = entry.load()
    except ImportError as error:
        return _missing_command(entry.name, entry.extras, error)
    return command


def _missing_command(name: str, extras: list[str], error: ImportError) -> Command:
    extra = f"the {', '.join(extras)} extra" if extras else "this project"
    hint = install_hint(*extras)
    missing = getattr(error, "name", None) or str(error)

    def add(subparsers: Any) -> None:
        command = subparsers.add_parser(
            name,
            help=f"(needs {extra}: {hint})",
            add_help=False,
            prefix_chars="\0",  # take any arguments: the answer is the same
        )
        command.add_argument("rest", nargs=argparse.REMAINDER)

        def handler(args: argparse.Namespace) -> None:
            raise UserError(
                f"this command needs the optional dependencies of {extra} "
                f"({missing} is not installed): {hint}"
            )

        command.set_defaults(handler=handler)

    return add


def main(argv: Sequence[str] | None = None, commands: Mapping[str, Command] | None = None) -> int:
    """Entry point of the ``mbn`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(train.method_in(argv), commands)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        args.handler(args)
    except KeyboardInterrupt:
        print("mbn: interrupted; nothing was written", file=sys.stderr)  # noqa: T201
        return EXIT_INTERRUPTED
    except (
        UserError,
        BundleError,
        ValueError,
        OSError,
        TrainingStopped,
        MissingDependency,
    ) as error:
        message = str(error) if not isinstance(error, OSError) else os_message(error)
        print(f"mbn {args.command}: error: {message}", file=sys.stderr)  # noqa: T201
        return EXIT_USAGE
    except MemoryError as error:  # sizes this machine cannot hold (numpy names the array)
        detail = f": {error}" if str(error) else ""
        print(  # noqa: T201
            f"mbn {args.command}: error: out of memory{detail}; use fewer rows or smaller "
            "sizes (n_clusterings, k_max, hidden_layer_sizes, ...)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return 0


def _version() -> str:
    return version() or "(not installed)"
