"""``mbn train``: train a method and its fast path on a data file, write a bundle."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mbn_core.bundle import check_target, load_bundle
from mbn_core.cli.common import UserError, add_scheduler_options, dask_client, say
from mbn_core.cli.info import describe
from mbn_core.data.csv_scan import ColumnChoice
from mbn_core.data.readers import load_training_data
from mbn_core.methods import DEFAULT_METHOD, get_method, method_names
from mbn_core.params import metavar, parse_flag
from mbn_core.pipeline.options import option_groups, options
from mbn_core.pipeline.training import TrainingEvent, TrainingParams, fit_shape, train_bundle


def method_in(argv: Sequence[str]) -> str:
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


def add_parser(subparsers: Any, method: str) -> None:
    """The ``train`` command, with the training options of ``method``."""
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
    columns = train.add_mutually_exclusive_group()
    columns.add_argument(
        "--columns",
        metavar="COLS",
        help="a .csv file's columns to train on, comma-separated: header names, or numbers "
        "counted from 1 (default: all but a first column without a header name, pandas' index)",
    )
    columns.add_argument(
        "--drop", metavar="COLS", help="a .csv file's columns to leave out (as --columns)"
    )
    train.add_argument(
        "--align-to",
        metavar="BUNDLE",
        help="an earlier model's bundle directory: map the new model's embedding into its "
        "space (same features and output dimension), so vectors of both stay comparable",
    )
    add_scheduler_options(train, "run each layer's clusterings on this Dask cluster")
    if method in names:
        _add_training_options(train, method)
    train.set_defaults(handler=train_command)


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


def train_command(args: argparse.Namespace) -> None:
    """Run ``mbn train``."""
    given = {
        param.name: getattr(args, param.name)
        for param in options(get_method(args.method))
        if hasattr(args, param.name)
    }
    params = TrainingParams.from_dict({"method": args.method, **given})
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
    with dask_client(args, for_fit=True) as client:
        X, y = _training_data(args)
        name = args.name or Path(args.data).stem
        where = f" on the Dask cluster at {args.scheduler}" if client is not None else ""
        say(f"Training on {X.shape[0]} x {X.shape[1]} points from {args.data}{where}")
        _train_with_progress(args, X, y, out, params, name)


def _training_data(args: argparse.Namespace) -> tuple[Any, Any]:
    """``mbn train``'s data, of the columns ``--columns`` or ``--drop`` choose; what was left
    out unasked (a pandas index column) is said."""
    notes: list[str] = []
    choice = ColumnChoice.parse(args.columns, args.drop)
    data = load_training_data(args.data, choice, notes)
    for note in notes:
        say(f"Note: {note}")
    return data


def _print_plan(args: argparse.Namespace, params: TrainingParams) -> None:
    estimator = params.estimator()
    if not hasattr(estimator, "plan"):
        raise UserError(f"train --plan: method {args.method!r} has no plan to show")
    with dask_client(args, for_fit=True):
        X, _ = _training_data(args)
        n_fit = fit_shape(params, X.shape)[0]
        if n_fit < X.shape[0]:
            # The fit sees the rows the held-out split leaves: plan on as many, the first.
            say(f"Planned on the first {n_fit} of {X.shape[0]} rows: training fits on that "
                f"many, leaving {X.shape[0] - n_fit} out at random for its report")  # fmt: skip
            X = X[:n_fit]
        try:
            plan = estimator.plan(X)
        except ValueError as error:
            raise UserError(f"train --plan: {error}") from None
    for line in str(plan).splitlines():
        say(line)


def _train_with_progress(args, X, y, out: Path, params: TrainingParams, name: str) -> None:
    with ProgressBars(disable=True if args.quiet else None) as bars:
        path = train_bundle(
            X, out, name=name, params=params, y=y, model_id=args.model_id,
            events=bars.update, overwrite=args.force, align_to=args.align_to,
        )  # fmt: skip
    bundle = load_bundle(path)
    say(f"Wrote bundle {bundle.id!r} ({bundle.name}) to {path}")
    for line in describe(bundle.manifest, brief=True):
        say(f"  {line}")


class ProgressBars:
    """A tqdm bar per training phase, fed by ``train_bundle``'s events."""

    _TOTAL = 1000  # the MBN bar counts per mille: its steps are cost-weighted fractions

    def __init__(self, disable: bool | None) -> None:
        self.disable = disable
        self.phase: str | None = None
        self.bar: Any = None

    def __enter__(self) -> ProgressBars:
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
