"""The ``mbn`` command: train bundles offline, embed with them, inspect them, run the service.

User errors (a missing file, an unreadable format, a dimension mismatch, a bad option) end
with one line on stderr and exit status 2; Ctrl-C ends with status 130 and no partial output.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import logging
import os
import sys
import types
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mbn_core import bulk
from mbn_core.bundle import BundleError, check_target, load_bundle
from mbn_core.compress import fidelity_report
from mbn_core.network import TrainingStopped
from mbn_core.quality import quality_summary
from mbn_core.training import (
    COMPRESSOR_FIELDS,
    TrainingEvent,
    TrainingParams,
    load_training_data,
    train_bundle,
)

log = logging.getLogger(__name__)

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """An error in what the user asked for: reported in one line, no traceback."""


# ---------------------------------------------------------------------- option parsing


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _optional_int(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'none', got {text!r}") from None


def _number_or_auto(text: str) -> int | float | str:
    """'auto', an integer, or a fraction: for ``k1`` and ``feature_fraction``."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None


_PARSERS: dict[str, Callable[[str], Any]] = {
    "n_components": _optional_int,
    "feature_fraction": _number_or_auto,
    "k1": _number_or_auto,
    "ks": _int_list,
    "k_max": _optional_int,
    "random_state": _optional_int,
    "n_jobs": _optional_int,
    "hidden_layer_sizes": _int_list,
    "n_clusters": _optional_int,
}

_METAVARS: dict[Callable[[str], Any], str] = {
    int: "N",
    float: "X",
    str: "NAME",
    _optional_int: "N|none",
    _number_or_auto: "X|auto",
    _int_list: "N,N,...",
}


def _add_training_options(parser: argparse.ArgumentParser) -> None:
    """One option per ``TrainingParams`` field, so the CLI and the service share them."""
    mbn_group = parser.add_argument_group("MBN options")
    compressor_group = parser.add_argument_group("compressor options")
    for item in dataclasses.fields(TrainingParams):
        group = compressor_group if item.name in COMPRESSOR_FIELDS else mbn_group
        default = item.default
        if isinstance(default, tuple):
            default = ",".join(str(value) for value in default)
        parse = _PARSERS.get(item.name) or type(item.default)
        metavar = _METAVARS.get(parse, "VALUE")
        group.add_argument(
            f"--{item.name.replace('_', '-')}",
            dest=item.name,
            type=parse,
            default=argparse.SUPPRESS,
            metavar=metavar,
            help=f"{item.metadata.get('help', '')} (default: {default})",
        )


def _add_scheduler_options(parser: argparse.ArgumentParser, purpose: str) -> None:
    parser.add_argument(
        "--scheduler",
        metavar="tcp://HOST:8786",
        help=f"{purpose} (needs the 'distributed' extra)",
    )
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds to wait for the scheduler (default: 10)",
    )


@contextlib.contextmanager
def _dask_client(args: argparse.Namespace, *, for_fit: bool) -> Iterator[Any]:
    """The Dask client of ``--scheduler`` (None without it), connected before any work."""
    if not args.scheduler:
        yield None
        return
    try:
        from mbn_core import distributed
    except ImportError as error:  # pragma: no cover - the module itself imports no Dask
        raise UserError(str(error)) from None
    try:
        context: contextlib.AbstractContextManager[Any]
        if for_fit:
            context = distributed.use_dask(args.scheduler, timeout=args.connect_timeout)
        else:
            context = contextlib.closing(
                distributed.connect(args.scheduler, timeout=args.connect_timeout)
            )
    except ImportError as error:
        raise UserError(str(error)) from None
    with context as client:
        yield client


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``mbn``."""
    parser = argparse.ArgumentParser(
        prog="mbn",
        description="Multilayer Bootstrap Network embeddings: train, embed, inspect, serve.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = commands.add_parser(
        "train",
        help="train MBN and its compressor, write a model bundle",
        description="Train MBN on DATA, distil it into a fast MLP, and write the bundle "
        "directory DIR (manifest.json, mbn.npz, compressor.onnx). DATA is .npy, .npz "
        "(array 'x', optional labels 'y' used only for the fidelity report), a scipy sparse "
        ".npz, or .csv.",
    )
    train.add_argument("data", metavar="DATA", help="training data file")
    train.add_argument("--out", required=True, metavar="DIR", help="bundle directory to create")
    train.add_argument("--name", help="model name (default: the data file's name)")
    train.add_argument("--model-id", help="model id (default: DIR's name)")
    train.add_argument("--force", action="store_true", help="replace an existing bundle at DIR")
    train.add_argument("--quiet", action="store_true", help="no progress bars")
    _add_scheduler_options(train, "run each layer's clusterings on this Dask cluster")
    _add_training_options(train)
    train.set_defaults(handler=_train)

    embed = commands.add_parser(
        "embed",
        help="embed data with a bundle",
        description="Embed DATA with BUNDLE. A .npy or Zarr (.zarr) DATA is read and "
        "written chunk by chunk (dask.array), so it may be larger than memory; .npz and .csv "
        "are read whole.",
    )
    embed.add_argument("bundle", metavar="BUNDLE", help="bundle directory")
    embed.add_argument("data", metavar="DATA", help="data file (.npy, .zarr, .npz, .csv)")
    embed.add_argument(
        "--out", required=True, metavar="OUT", help="embeddings, float32 (.npy or .zarr)"
    )
    embed.add_argument("--exact", action="store_true", help="use the exact MBN (slow)")
    embed.add_argument("--clusters", metavar="CLUSTERS.npy", help="also write cluster ids")
    embed.add_argument("--threads", type=int, default=1, help="threads (default: 1)")
    embed.add_argument(
        "--chunk-rows",
        type=int,
        default=bulk.DEFAULT_CHUNK_ROWS,
        metavar="N",
        help=f"rows per chunk of a .npy or .zarr DATA (default: {bulk.DEFAULT_CHUNK_ROWS})",
    )
    _add_scheduler_options(
        embed, "embed the chunks on this Dask cluster (its workers must see the same paths)"
    )
    embed.set_defaults(handler=_embed)

    info = commands.add_parser(
        "info", help="show a bundle's manifest", description="Verify BUNDLE and describe it."
    )
    info.add_argument("bundle", metavar="BUNDLE", help="bundle directory")
    info.add_argument("--json", action="store_true", help="print the raw manifest")
    info.set_defaults(handler=_info)

    serve = commands.add_parser("serve", help="run the HTTP service")
    serve.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    serve.add_argument("--workers", type=int, default=1, help="server processes (default: 1)")
    serve.set_defaults(handler=_serve)

    worker = commands.add_parser("worker", help="run a training worker for the service")
    worker.set_defaults(handler=_worker)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mbn`` console script; returns the exit status."""
    parser = build_parser()
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
    except (UserError, BundleError, ValueError, OSError, TrainingStopped) as error:
        message = str(error) if not isinstance(error, OSError) else _os_message(error)
        print(f"mbn {args.command}: error: {message}", file=sys.stderr)  # noqa: T201
        return EXIT_USAGE
    return 0


# ---------------------------------------------------------------------- commands


def _train(args: argparse.Namespace) -> None:
    options = {
        item.name: getattr(args, item.name)
        for item in dataclasses.fields(TrainingParams)
        if hasattr(args, item.name)
    }
    params = TrainingParams.from_dict(options)
    out = Path(args.out)
    if out.exists() and not args.force:
        raise UserError(f"{out}: already exists (use --force to replace it)")
    check_target(out, overwrite=args.force)
    # Connects first: an unreachable scheduler is reported before the data is even read.
    with _dask_client(args, for_fit=True) as client:
        X, y = load_training_data(args.data)
        name = args.name or Path(args.data).stem
        where = f" on the Dask cluster at {args.scheduler}" if client is not None else ""
        _say(f"Training on {X.shape[0]} x {X.shape[1]} points from {args.data}{where}")
        _train_with_progress(args, X, y, out, params, name)


def _train_with_progress(args, X, y, out: Path, params: TrainingParams, name: str) -> None:
    with _ProgressBars(disable=True if args.quiet else None) as bars:
        path = train_bundle(
            X, out, name=name, params=params, y=y, model_id=args.model_id,
            events=bars.update, overwrite=args.force,
        )  # fmt: skip
    bundle = load_bundle(path)
    _say(f"Wrote bundle {bundle.id!r} ({bundle.name}) to {path}")
    for line in _describe(bundle.manifest, brief=True):
        _say(f"  {line}")


def _embed(args: argparse.Namespace) -> None:
    if _chunked(args):
        _embed_chunked(args)
        return
    bundle = load_bundle(args.bundle, threads=max(1, args.threads))
    X, _ = load_training_data(args.data)
    if X.shape[1] != bundle.input_dim:
        raise UserError(
            f"{args.data}: has {X.shape[1]} columns but bundle {bundle.id!r} expects "
            f"{bundle.input_dim}"
        )
    mode = "exact" if args.exact else "fast"
    if args.clusters and bundle.n_clusters is None:
        raise UserError(f"bundle {bundle.id!r} has no clustering head; drop --clusters")
    embedding = bundle.embed(X, mode=mode)
    _save_npy(Path(args.out), embedding)
    if args.clusters:
        _save_npy(Path(args.clusters), bundle.predict_clusters(X, mode=mode))
    _say(f"Wrote {embedding.shape[0]} x {embedding.shape[1]} {mode} embeddings to {args.out}")


def _chunked(args: argparse.Namespace) -> bool:
    """Whether ``mbn embed`` streams chunks through dask.array (else: reads DATA whole)."""
    if args.scheduler or Path(args.out).suffix.lower() == ".zarr":
        return True
    suffix = Path(args.data).suffix.lower()
    if suffix == ".zarr":
        return True
    # Without Dask a .npy is read whole, as before the chunked path existed.
    return suffix == ".npy" and importlib.util.find_spec("dask") is not None


def _embed_chunked(args: argparse.Namespace) -> None:
    if args.threads < 1 or args.chunk_rows < 1:
        raise UserError("--threads and --chunk-rows must be positive")
    mode = "exact" if args.exact else "fast"
    with _dask_client(args, for_fit=False) as client:
        try:
            result = bulk.embed_file(
                args.bundle, args.data, args.out, mode=mode, clusters_out=args.clusters,
                chunk_rows=args.chunk_rows, client=client, threads=args.threads,
            )  # fmt: skip
        except ImportError as error:
            raise UserError(str(error)) from None
    _say(
        f"Wrote {result.n_rows} x {result.output_dim} {mode} embeddings to {args.out} "
        f"({result.n_chunks} chunks, {result.rows_per_second:,.0f} rows/s)"
    )


def _info(args: argparse.Namespace) -> None:
    bundle = load_bundle(args.bundle)
    if args.json:
        import json

        _say(json.dumps(bundle.manifest, indent=2))
        return
    for line in _describe(bundle.manifest, brief=False):
        _say(line)
    _say(f"verified:    every file matches its SHA-256 ({bundle.path})")


def _serve(args: argparse.Namespace) -> None:
    _service_main().serve(args.host, args.port, args.workers)


def _worker(args: argparse.Namespace) -> None:
    _service_main().run_worker()


def _service_main() -> types.ModuleType:
    # Imported lazily: the library and the trainer must not need the web stack.
    try:
        import service.main as service_main
    except ModuleNotFoundError as error:
        if error.name in ("service", "service.main"):
            raise UserError("the service is not installed (package 'service' missing)") from None
        raise
    return service_main


# ---------------------------------------------------------------------- output


def _say(line: str) -> None:
    print(line)  # noqa: T201 - the command's output


def _describe(manifest: dict[str, Any], *, brief: bool) -> list[str]:
    training = manifest.get("training", {})
    seconds = training.get("seconds", {})
    layers = "-".join(str(k) for k in training.get("ks", []))
    lines = []
    if not brief:
        lines += [
            f"id:          {manifest['id']}",
            f"name:        {manifest['name']}",
            f"created:     {manifest['created']}",
            f"format:      {manifest['format']} version {manifest['format_version']}",
        ]
    clusters = manifest["n_clusters"]
    lines += [
        f"dimensions:  {manifest['input_dim']} -> {manifest['output_dim']} "
        f"(metric {manifest['metric']}"
        + (f", clustering head with {clusters} clusters)" if clusters else ")"),
        f"training:    {training.get('n_samples', '?')} points"
        + (" (sparse)" if training.get("input_sparse") else "")
        + f", layers {layers}, {training.get('n_epochs', '?')} MLP epochs",
        f"time:        MBN {seconds.get('mbn', 0):.1f} s, compressor "
        f"{seconds.get('compressor', 0):.1f} s, total {training.get('total_seconds', 0):.1f} s",
    ]
    fidelity = manifest.get("fidelity")
    if fidelity:
        lines.append(f"fidelity:    {fidelity_report(_nan_for_none(fidelity))}")
    quality = manifest.get("quality")
    if quality:
        lines.append(f"quality:     {quality_summary(quality)}")
    if not brief:
        for part, params in manifest["hyperparameters"].items():
            text = ", ".join(f"{key}={value}" for key, value in sorted(params.items()))
            lines.append(f"{part + ':':<12} {text}")
        versions = manifest.get("library_versions", {})
        lines.append(
            "libraries:   " + ", ".join(f"{key} {value}" for key, value in versions.items())
        )
        for file_name, entry in manifest["files"].items():
            lines.append(
                f"file:        {file_name}  {entry['bytes']:,} bytes  sha256 {entry['sha256']}"
            )
    return lines


def _nan_for_none(fidelity: dict[str, Any]) -> dict[str, Any]:
    # JSON has no NaN: the manifest stores an undefined score (R^2 of one point) as null.
    return {
        key: float("nan") if value is None and key in ("r2", "cosine", "nmi_fast_exact")
        else value
        for key, value in fidelity.items()
    }  # fmt: skip


def _save_npy(path: Path, array: np.ndarray) -> None:
    """Write an .npy file atomically: a temporary file beside it, then rename."""
    if not path.parent.is_dir():
        raise UserError(f"{path.parent}: no such directory")
    temporary = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        with temporary.open("xb") as handle:
            np.save(handle, array, allow_pickle=False)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _os_message(error: OSError) -> str:
    where = f"{error.filename}: " if error.filename else ""
    return f"{where}{error.strerror or error}"


class _ProgressBars:
    """A tqdm bar per training phase, fed by ``train_bundle``'s events."""

    _TOTAL = 1000  # the MBN bar counts per mille: its steps are cost-weighted fractions

    def __init__(self, disable: bool | None) -> None:
        self.disable = disable
        self.phase: str | None = None
        self.bar: Any = None

    def __enter__(self) -> _ProgressBars:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._close()

    def update(self, event: TrainingEvent) -> None:
        from tqdm import tqdm

        if event.phase != self.phase:
            self._close()
            self.phase = event.phase
            if event.phase == "export":
                return
            label = {"mbn": "MBN", "compressor": "MLP"}[event.phase]
            self.bar = tqdm(
                total=self._TOTAL,
                desc=label,
                disable=self.disable,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]{postfix}",
                file=sys.stderr,
            )
        if self.bar is not None:
            self.bar.n = round(event.phase_fraction * self._TOTAL)
            self.bar.set_postfix_str(event.message, refresh=False)
            self.bar.refresh()

    def _close(self) -> None:
        if self.bar is not None:
            if self.phase == "compressor" and self.bar.n < self._TOTAL:
                self.bar.set_postfix_str(f"{self.bar.postfix.lstrip(', ')} (early stopping)")
            self.bar.close()
            self.bar = None


if __name__ == "__main__":
    sys.exit(main())
