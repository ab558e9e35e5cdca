"""The service's commands of ``mbn``: ``serve`` and ``worker``.

``mbn_core``'s command line knows nothing of the service: this package adds its commands
through the ``mbn.commands`` entry points (pyproject.toml), installed with the ``service``
extra.
``python -m service`` runs the same command line with these commands, whatever is installed.
"""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

# Without the service extra this module must not load, so that `mbn` offers these commands
# only as "install the service extra"; finding the modules costs nothing, importing them would
# cost every `mbn` command a second.
for _module in ("fastapi", "uvicorn", "sqlalchemy", "msgspec"):
    if importlib.util.find_spec(_module) is None:
        raise ModuleNotFoundError(f"No module named {_module!r}", name=_module)


def serve_command(subparsers: Any) -> None:
    """Add ``mbn serve``."""
    serve = subparsers.add_parser(
        "serve",
        help="run the HTTP service",
        description="Run the HTTP service (settings: MBN_* environment variables).",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8000, help="port (default: 8000)")
    serve.add_argument("--workers", type=_positive, default=1, help="server processes (default: 1)")
    serve.set_defaults(handler=_serve)


def worker_command(subparsers: Any) -> None:
    """Add ``mbn worker``."""
    worker = subparsers.add_parser(
        "worker",
        help="run a training worker for the service",
        description="Claim and run training jobs from the service's job store.",
    )
    worker.set_defaults(handler=_worker)


COMMANDS = {"serve": serve_command, "worker": worker_command}


def _port(text: str) -> int:
    # Checked here: the socket layer would take 99999 modulo 65,536 and listen elsewhere.
    port = _integer(text)
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1 to 65535, got {port}")
    return port


def _positive(text: str) -> int:
    number = _integer(text)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def _serve(args: argparse.Namespace) -> None:
    from service.main import serve

    serve(args.host, args.port, args.workers)


def _worker(args: argparse.Namespace) -> None:
    from service.main import run_worker

    run_worker()
