"""``mbn embed``: embed a data file with a bundle, whole or chunk by chunk."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

from mbn_core.bundle import bulk, load_bundle
from mbn_core.cli.common import (
    OUTPUT_SUFFIXES,
    UserError,
    add_scheduler_options,
    dask_client,
    save_rows,
    say,
)
from mbn_core.data.readers import load_training_data
from mbn_core.distribution import install_hint


def add_parser(subparsers: Any) -> None:
    """The ``embed`` command."""
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
    add_scheduler_options(
        embed, "embed the chunks on this Dask cluster (its workers must see the same paths)"
    )
    embed.set_defaults(handler=embed_command)


def embed_command(args: argparse.Namespace) -> None:
    """Run ``mbn embed``."""
    for output in (args.out, args.clusters):
        suffix = Path(output).suffix.lower() if output else ".npy"
        if suffix not in OUTPUT_SUFFIXES:
            raise UserError(
                f"{output}: unknown output format {suffix or '(no suffix)'!r}; use "
                f"{', '.join(OUTPUT_SUFFIXES)}"
            )
        if suffix == ".zarr" and importlib.util.find_spec("zarr") is None:
            raise UserError(
                f"{output}: writing Zarr needs the 'distributed' extra: "
                f"{install_hint('distributed')}; or write .npy or .csv"
            )
    if Path(args.data).suffix.lower() == ".zarr" and importlib.util.find_spec("zarr") is None:
        raise UserError(
            f"{args.data}: reading Zarr needs the 'distributed' extra: "
            f"{install_hint('distributed')}"
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
    save_rows(Path(args.out), embedding)
    if args.clusters:
        save_rows(Path(args.clusters), bundle.predict_clusters(X, mode=mode))
    say(f"Wrote {embedding.shape[0]} x {embedding.shape[1]} {mode} embeddings to {args.out}")


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
    with dask_client(args, for_fit=False) as client:
        try:
            result = bulk.embed_file(
                args.bundle, args.data, args.out, mode=mode, clusters_out=args.clusters,
                chunk_rows=args.chunk_rows, client=client, threads=args.threads,
            )  # fmt: skip
        except ImportError as error:
            raise UserError(str(error)) from None
    say(
        f"Wrote {result.n_rows} x {result.output_dim} {mode} embeddings to {args.out} "
        f"({result.n_chunks} chunk{'s' if result.n_chunks != 1 else ''}, "
        f"{result.rows_per_second:,.0f} rows/s)"
    )
