"""The ``mbn`` command: train bundles offline, embed with them, inspect them.

``train``, ``embed`` and ``info`` need only the library. Other commands are plug-ins: an
installed package adds them through the ``mbn.commands`` entry-point group (the service adds
``serve`` and ``worker`` with the ``mbn[service]`` extra). A plug-in whose dependencies are
missing still shows up, and says which extra to install.

User errors (a missing file, an unreadable format, a dimension mismatch, a bad option) end
with one line on stderr and exit status 2; Ctrl-C ends with status 130 and no partial output.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from mbn_core.bundle import BundleError, bulk, check_target, load_bundle
from mbn_core.data.readers import load_training_data
from mbn_core.exceptions import TrainingStopped
from mbn_core.mbn.outputs.umap import UmapNotInstalled
from mbn_core.methods import DEFAULT_METHOD, get_method, method_names
from mbn_core.params import metavar, parse_flag
from mbn_core.pipeline.fidelity import (
    LAYOUT_CROSS_FITTED,
    LAYOUT_HELD_OUT,
    LAYOUT_REPORT_MEANING,
    fidelity_report,
)
from mbn_core.pipeline.options import option_groups
from mbn_core.pipeline.options import options as training_options
from mbn_core.pipeline.quality import quality_summary
from mbn_core.pipeline.training import TrainingEvent, TrainingParams, fit_shape, train_bundle

log = logging.getLogger(__name__)

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
COMMAND_GROUP = "mbn.commands"

# A plug-in command: adds its sub-parser (with a ``handler``) to the ``mbn`` sub-parsers.
Command = Callable[[Any], None]


class UserError(Exception):
    """An error in what the user asked for: reported in one line, no traceback."""


# ---------------------------------------------------------------------- option parsing


def _add_training_options(parser: argparse.ArgumentParser, method_name: str) -> None:
    """One option per training parameter of the method, derived from its estimators'
    parameter constraints (the same options ``POST /train`` takes)."""
    method = get_method(method_name)
    titles = {"compressor": "compressor options", "pipeline": "pipeline options"}
    for group_name, params in option_groups(method).items():
        group = parser.add_argument_group(titles.get(group_name, f"{group_name} options"))
        for param in params:
            default = param.json_default()
            if isinstance(default, list):
                default = ",".join(str(value) for value in default)
            group.add_argument(
                f"--{param.name.replace('_', '-')}",
                dest=param.name,
                type=parse_flag(param),
                default=argparse.SUPPRESS,
                metavar=metavar(param),
                help=f"{param.help} (default: {'none' if default is None else default})",
            )


def _method_in(argv: Sequence[str]) -> str:
    """The ``--method`` given to ``mbn train`` (its options depend on it)."""
    for index, arg in enumerate(argv):
        if arg == "--method" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--method="):
            return arg.split("=", 1)[1]
    return DEFAULT_METHOD


def _unavailable_note(names: list[str]) -> str:
    """The methods this install cannot train, with what to install (none: "")."""
    missing = {name: get_method(name).unavailable for name in names}
    notes = [f"{name} ({reason})" for name, reason in missing.items() if reason]
    return f"; not installed here: {'; '.join(notes)}" if notes else ""


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
        from mbn_core.mbn.backends import dask as distributed
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

    names = method_names()
    train = subparsers.add_parser(
        "train",
        help="train an embedding method and its fast path, write a model bundle",
        description="Train METHOD on DATA, make its fast path (a distilled MLP or the "
        "method's own exported map), and write the bundle directory DIR (manifest.json, "
        "exact.npz, compressor.onnx). DATA is .npy, .npz (array 'x', optional labels 'y' "
        "used only for the fidelity report), a scipy sparse .npz, or .csv. The options "
        "below are those of --method " + method + "; `mbn train --method NAME --help` "
        "lists another's.",
    )
    train.add_argument("data", metavar="DATA", help="training data file")
    train.add_argument("--out", metavar="DIR", help="bundle directory to create (required)")
    train.add_argument(
        "--plan",
        action="store_true",
        help="print what the fit will build (the 'auto' choices settled) and stop; "
        "delta and output 'auto' are measured on the bottom layer, which costs its fit",
    )
    train.add_argument(
        "--method",
        default=DEFAULT_METHOD,
        choices=names,
        help=f"embedding method (default: {DEFAULT_METHOD}; one of {', '.join(names)})"
        + _unavailable_note(names),
    )
    train.add_argument("--name", help="model name (default: the data file's name)")
    train.add_argument("--model-id", help="model id (default: DIR's name)")
    train.add_argument("--force", action="store_true", help="replace an existing bundle at DIR")
    train.add_argument("--quiet", action="store_true", help="no progress bars")
    train.add_argument(
        "--align-to",
        metavar="BUNDLE",
        help="an earlier model's bundle directory: map the new model's embedding into its "
        "space (same features and output dimension), so vectors of both stay comparable",
    )
    _add_scheduler_options(train, "run each layer's clusterings on this Dask cluster")
    if method in names:
        _add_training_options(train, method)
    train.set_defaults(handler=_train)

    embed = subparsers.add_parser(
        "embed",
        help="embed data with a bundle",
        description="Embed DATA with BUNDLE. A .npy or Zarr (.zarr) DATA is read and "
        "written chunk by chunk (dask.array), so it may be larger than memory; .npz and .csv "
        "are read whole.",
    )
    embed.add_argument("bundle", metavar="BUNDLE", help="bundle directory")
    embed.add_argument("data", metavar="DATA", help="data file (.npy, .zarr, .npz, .csv)")
    embed.add_argument(
        "--out",
        required=True,
        metavar="OUT",
        help="embeddings, float32: .npy, .csv, or .zarr (Zarr needs the 'distributed' extra)",
    )
    embed.add_argument("--exact", action="store_true", help="use the exact model (slow)")
    embed.add_argument("--clusters", metavar="CLUSTERS.npy", help="also write cluster ids")
    embed.add_argument(
        "--threads",
        type=int,
        default=1,
        help="threads (default: 1); for a .npy or .zarr DATA, chunks embedded at once",
    )
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

    info = subparsers.add_parser(
        "info", help="show a bundle's manifest", description="Verify BUNDLE and describe it."
    )
    info.add_argument("bundle", metavar="BUNDLE", help="bundle directory")
    info.add_argument("--json", action="store_true", help="print the raw manifest")
    info.set_defaults(handler=_info)

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
    requirement = f"mbn[{','.join(extras)}]" if extras else "mbn"
    missing = getattr(error, "name", None) or str(error)

    def add(subparsers: Any) -> None:
        command = subparsers.add_parser(
            name,
            help=f"(needs {requirement}: pip install '{requirement}')",
            add_help=False,
            prefix_chars="\0",  # take any arguments: the answer is the same
        )
        command.add_argument("rest", nargs=argparse.REMAINDER)

        def handler(args: argparse.Namespace) -> None:
            raise UserError(
                f"this command needs the optional dependencies of {requirement} "
                f"({missing} is not installed): pip install '{requirement}'"
            )

        command.set_defaults(handler=handler)

    return add


def main(argv: Sequence[str] | None = None, commands: Mapping[str, Command] | None = None) -> int:
    """Entry point of the ``mbn`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_method_in(argv), commands)
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
        UmapNotInstalled,
    ) as error:
        message = str(error) if not isinstance(error, OSError) else _os_message(error)
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


# ---------------------------------------------------------------------- commands


def _train(args: argparse.Namespace) -> None:
    options = {
        param.name: getattr(args, param.name)
        for param in training_options(get_method(args.method))
        if hasattr(args, param.name)
    }
    params = TrainingParams.from_dict({"method": args.method, **options})
    if args.plan:
        _print_plan(args, params)
        return
    if not args.out:
        raise UserError("train: --out DIR is required (or --plan to see the plan only)")
    out = Path(args.out)
    if out.exists() and not args.force:
        raise UserError(f"{out}: already exists (use --force to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)  # --out models/mnist without models/
    check_target(out, overwrite=args.force)
    # Connects first: an unreachable scheduler is reported before the data is even read.
    with _dask_client(args, for_fit=True) as client:
        X, y = load_training_data(args.data)
        name = args.name or Path(args.data).stem
        where = f" on the Dask cluster at {args.scheduler}" if client is not None else ""
        _say(f"Training on {X.shape[0]} x {X.shape[1]} points from {args.data}{where}")
        _train_with_progress(args, X, y, out, params, name)


def _print_plan(args: argparse.Namespace, params: TrainingParams) -> None:
    estimator = params.estimator()
    if not hasattr(estimator, "plan"):
        raise UserError(f"train --plan: method {args.method!r} has no plan to show")
    with _dask_client(args, for_fit=True):
        X, _ = load_training_data(args.data)
        n_fit = fit_shape(params, X.shape)[0]
        if n_fit < X.shape[0]:
            # The fit sees the rows the held-out split leaves: plan on as many, the first.
            _say(f"Planned on the first {n_fit} of {X.shape[0]} rows: training fits on that "
                 f"many, leaving {X.shape[0] - n_fit} out at random for its report")  # fmt: skip
            X = X[:n_fit]
        try:
            plan = estimator.plan(X)
        except ValueError as error:
            raise UserError(f"train --plan: {error}") from None
    for line in str(plan).splitlines():
        _say(line)


def _train_with_progress(args, X, y, out: Path, params: TrainingParams, name: str) -> None:
    with _ProgressBars(disable=True if args.quiet else None) as bars:
        path = train_bundle(
            X, out, name=name, params=params, y=y, model_id=args.model_id,
            events=bars.update, overwrite=args.force, align_to=args.align_to,
        )  # fmt: skip
    bundle = load_bundle(path)
    _say(f"Wrote bundle {bundle.id!r} ({bundle.name}) to {path}")
    for line in _describe(bundle.manifest, brief=True):
        _say(f"  {line}")


def _embed(args: argparse.Namespace) -> None:
    for output in (args.out, args.clusters):
        suffix = Path(output).suffix.lower() if output else ".npy"
        if suffix not in _OUTPUT_SUFFIXES:
            raise UserError(
                f"{output}: unknown output format {suffix or '(no suffix)'!r}; use "
                f"{', '.join(_OUTPUT_SUFFIXES)}"
            )
        if suffix == ".zarr" and importlib.util.find_spec("zarr") is None:
            raise UserError(
                f"{output}: writing Zarr needs the 'distributed' extra: "
                "pip install 'mbn[distributed]' (or write .npy or .csv)"
            )
    if Path(args.data).suffix.lower() == ".zarr" and importlib.util.find_spec("zarr") is None:
        raise UserError(
            f"{args.data}: reading Zarr needs the 'distributed' extra: "
            "pip install 'mbn[distributed]'"
        )
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
    _save_rows(Path(args.out), embedding)
    if args.clusters:
        _save_rows(Path(args.clusters), bundle.predict_clusters(X, mode=mode))
    _say(f"Wrote {embedding.shape[0]} x {embedding.shape[1]} {mode} embeddings to {args.out}")


def _chunked(args: argparse.Namespace) -> bool:
    """Whether ``mbn embed`` streams chunks through dask.array (else: reads DATA whole)."""
    if args.scheduler or Path(args.out).suffix.lower() == ".zarr":
        return True
    suffix = Path(args.data).suffix.lower()
    if suffix == ".zarr":
        return True
    # Without Dask a .npy is read whole, as before the chunked path existed; a CSV output is
    # written whole.
    return (
        suffix == ".npy"
        and Path(args.out).suffix.lower() != ".csv"
        and (not args.clusters or Path(args.clusters).suffix.lower() != ".csv")
        and importlib.util.find_spec("dask") is not None
    )


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
        f"({result.n_chunks} chunk{'s' if result.n_chunks != 1 else ''}, "
        f"{result.rows_per_second:,.0f} rows/s)"
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
    details = [f"metric {training['metric']}"] if "metric" in training else []
    if "output" in training:
        details.append(f"{training['output']} output")
    if clusters:
        details.append(f"clustering head with {clusters} clusters")
    fit = [f"{training.get('n_samples', '?')} points"]
    if training.get("input_sparse"):
        fit[0] += " (sparse)"
    if layers:
        fit.append(f"layers {layers}")
    if "device" in training:  # where the layers ran ("auto" chose it)
        fit.append(f"on {training['device']}")
    for fallback in training.get("fallbacks", []):  # what ran elsewhere, never quietly
        fit.append(fallback)
    if "n_epochs" in training:
        fit.append(f"{training['n_epochs']} MLP epochs")
    if "input_noise" in training:
        fit.append(f"input noise {training['input_noise']:.3g}")
    times = [f"{phase} {value:.1f} s" for phase, value in seconds.items()]
    map_seconds = manifest.get("map", {}).get("seconds")
    if isinstance(map_seconds, int | float):
        times.append(f"map {map_seconds:.1f} s")
    times.append(f"total {training.get('total_seconds', 0):.1f} s")
    lines += [
        f"method:      {manifest.get('method', '?')} (fast path: "
        f"{manifest.get('fast_path', 'distilled')})",
        f"dimensions:  {manifest['input_dim']} -> {manifest['output_dim']}"
        + (f" ({', '.join(details)})" if details else ""),
        f"training:    {', '.join(fit)}",
        f"time:        {', '.join(times)}",
    ]
    fidelity = manifest.get("fidelity")
    if fidelity:
        lines.append(f"fidelity:    {fidelity_report(_nan_for_none(fidelity))}")
        if fidelity.get("holdout") in (LAYOUT_CROSS_FITTED, LAYOUT_HELD_OUT):
            lines.append(f"meaning:     {LAYOUT_REPORT_MEANING}")
    quality = manifest.get("quality")
    if quality:
        lines.append(f"quality:     {quality_summary(quality)}")
    alignment = manifest.get("alignment")
    if alignment:
        lines.append(
            f"aligned to:  {alignment['reference_model']} on {alignment['reference_rows']} "
            f"reference rows, residual {alignment['residual']:.4f} "
            f"(unaligned {alignment['unaligned_residual']:.4f})"
        )
    scaling = manifest.get("input_scaling")
    if isinstance(scaling, dict):
        lines.append(f"input:       {_scaling_summary(scaling)}")
    novelty = manifest.get("novelty")
    if novelty and "threshold" in novelty:
        lines.append(
            f"novelty:     threshold {novelty['threshold']:.4g} (the {novelty['quantile']:.0%} "
            f"quantile of {novelty['n_calibration_rows']} training rows)"
        )
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


def _scaling_summary(section: dict) -> str:
    """``standard scaling (auto: feature ranges 64.5x apart)``: what the model does to raw
    rows and why."""
    method, requested = section.get("method"), section.get("requested")
    text = "no scaling" if method == "none" else f"{method} scaling"
    if requested == "auto":
        ratio = section.get("feature_range_ratio")
        why = "" if ratio is None else f": feature ranges {ratio:.3g}x apart"
        text += f" (auto{why})"
    elif requested != method:
        text += f" (requested {requested})"
    return text


def _nan_for_none(fidelity: dict[str, Any]) -> dict[str, Any]:
    # JSON has no NaN: the manifest stores an undefined score (R^2 of one point) as null.
    return {
        key: float("nan") if value is None and key in ("r2", "cosine", "nmi_fast_exact")
        else value
        for key, value in fidelity.items()
    }  # fmt: skip


# What ``mbn embed --out`` writes, by suffix (.zarr through the chunked path).
_OUTPUT_SUFFIXES = (".npy", ".csv", ".zarr")


def _save_rows(path: Path, array: np.ndarray) -> None:
    """Write rows atomically (a temporary file beside it, then rename): CSV for a ``.csv``
    path (numbers in full float32 precision, integers as integers), else ``.npy``."""
    if not path.parent.is_dir():
        raise UserError(f"{path.parent}: no such directory")
    temporary = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        with temporary.open("xb") as handle:
            if path.suffix.lower() == ".csv":
                rows = array.reshape(len(array), -1)
                number = "%d" if array.dtype.kind in "iu" else "%.9g"
                np.savetxt(handle, rows, delimiter=",", fmt=number)
            else:
                np.save(handle, array, allow_pickle=False)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("mbn")
    except metadata.PackageNotFoundError:  # pragma: no cover - not installed
        return "(not installed)"


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
            # The export's first step, the stored map's t-SNE, can be most of a small job:
            # its bar says so, though t-SNE reports no steps of its own.
            label = {"fit": "fit", "compressor": "MLP", "report": "report", "export": "export"}[
                event.phase
            ]
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
