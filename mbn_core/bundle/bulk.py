"""Embedding inputs larger than memory, chunk by chunk, with ``dask.array``.

``embed_file`` reads rows from a ``.npy`` file (through a memory map opened per chunk) or a Zarr
array, embeds each chunk of rows with a bundle, and writes each chunk of embeddings as soon as
it is computed, to ``.npy`` or Zarr. Memory holds a few chunks at a time, whatever the size of
the input. It runs on local threads, or on a Dask cluster (``client=``) whose workers can read
the input, the output and the bundle at the same paths (a shared volume).

Embeddings are row-wise: the fast path (ONNX) and the exact MBN give each row the same
embedding whatever chunk it arrives in, so the result equals ``Bundle.embed`` of the whole input.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mbn_core.bundle.load import Bundle, OutOfRangeInput, load_bundle
from mbn_core.distribution import install_hint

if TYPE_CHECKING:
    from distributed import Client

INSTALL_HINT = install_hint("distributed")
# Rows per chunk: for MNIST-sized rows some tens of MB as uint8 and four times that as float32
# inside the model, large enough that per-chunk overhead is negligible, small enough for a few
# in flight.
DEFAULT_CHUNK_ROWS = 32_768
INPUT_SUFFIXES = (".npy", ".zarr")
OUTPUT_SUFFIXES = (".npy", ".zarr")


def import_dask_array() -> Any:
    """``dask.array``, or ImportError saying which extra to install."""
    try:
        import dask.array as da
    except ImportError as error:
        raise ImportError(
            f"embedding inputs larger than memory needs Dask, which is not installed: "
            f"{INSTALL_HINT}"
        ) from error
    return da


@dataclass(frozen=True)
class BulkResult:
    """What ``embed_file`` did."""

    n_rows: int
    output_dim: int
    n_chunks: int
    seconds: float

    @property
    def rows_per_second(self) -> float:
        return self.n_rows / self.seconds if self.seconds > 0 else float("inf")


def embed_file(
    bundle: str | os.PathLike[str],
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    mode: str = "fast",
    clusters_out: str | os.PathLike[str] | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    client: Client | None = None,
    threads: int = 1,
) -> BulkResult:
    """Embed the rows of ``source`` with the bundle and write them to ``out``, chunk by chunk.

    Parameters
    ----------
    bundle : path
        The bundle directory (on a cluster: a path every worker can read).
    source : path
        ``.npy`` (any real dtype; read through a memory map, one chunk at a time) or a Zarr
        array directory (``.zarr``), of shape (n_rows, bundle.input_dim).
    out : path
        ``.npy`` or ``.zarr``: float32 embeddings of shape (n_rows, output_dim). Written
        atomically for ``.npy`` (a temporary file renamed at the end).
    mode : {"fast", "exact"}, default="fast"
    clusters_out : path, default=None
        Also write the cluster id (int64) of each row, ``.npy`` or ``.zarr``; the bundle needs
        a clustering head.
    chunk_rows : int, default=DEFAULT_CHUNK_ROWS
        Rows per chunk.
    client : distributed.Client, default=None
        Run the chunks on this cluster (one chunk per worker thread at a time); None runs
        them on ``threads`` local threads.
    threads : int, default=1
        Local threads, each embedding one chunk at a time with a single-threaded model.

    Returns
    -------
    BulkResult

    Raises
    ------
    ValueError
        Naming the file: unsupported format, wrong number of columns, non-numeric values,
        NaN or infinity (with the rows where they are).
    """
    da = import_dask_array()
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise ValueError(f"chunk_rows must be a positive integer, got {chunk_rows!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    bundle_dir = str(Path(bundle).resolve())
    loaded = _bundle(bundle_dir)
    if clusters_out is not None and loaded.n_clusters is None:
        raise ValueError(f"bundle {loaded.id!r} has no clustering head: no cluster ids to write")
    X = open_rows(source, chunk_rows)
    if X.shape[1] != loaded.input_dim:
        raise ValueError(
            f"{source}: has {X.shape[1]} columns but bundle {loaded.id!r} expects "
            f"{loaded.input_dim}"
        )
    width = loaded.output_dim + (1 if clusters_out is not None else 0)
    result = X.map_blocks(
        _embed_block,
        bundle_dir,
        mode,
        clusters_out is not None,
        str(source),
        dtype=np.float32,
        chunks=(X.chunks[0], (width,)),
        meta=np.empty((0, width), dtype=np.float32),
    )
    outputs: list[tuple[Any, Path, type[np.number]]] = [
        (result[:, : loaded.output_dim], Path(out), np.float32)
    ]
    if clusters_out is not None:
        clusters = result[:, loaded.output_dim].astype(np.int64)
        outputs.append((clusters, Path(clusters_out), np.int64))
    for _, path, _ in outputs:
        _check_output(path)

    started = time.perf_counter()
    writers = [_Output(path, array.shape, dtype) for array, path, dtype in outputs]
    try:
        stores = [
            writer.store(da, array) for writer, (array, _, _) in zip(writers, outputs, strict=True)
        ]
        delayed = da.store(
            [array for array, _ in stores], [target for _, target in stores], lock=False,
            compute=False,
        )  # fmt: skip
        if client is not None:
            client.gather(client.compute(delayed))
        else:
            import dask

            dask.compute(delayed, scheduler="threads", num_workers=threads)
        for writer in writers:
            writer.commit()
    except BaseException:
        for writer in writers:
            writer.abort()
        raise
    seconds = time.perf_counter() - started
    return BulkResult(X.shape[0], loaded.output_dim, len(X.chunks[0]), seconds)


def open_rows(source: str | os.PathLike[str], chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Any:
    """A dask array over the rows of ``source`` (``.npy`` or ``.zarr``), chunked by rows."""
    da = import_dask_array()
    path = Path(source)
    suffix = path.suffix.lower()
    if suffix not in INPUT_SUFFIXES:
        raise ValueError(
            f"{path}: unsupported format {suffix or '(no suffix)'!r} for bulk embedding; "
            f"use {' or '.join(INPUT_SUFFIXES)}"
        )
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    if suffix == ".npy":
        reader = NpyRows(str(path))
        _check_rows(path, reader.shape, reader.dtype)
        return da.from_array(reader, chunks=(chunk_rows, reader.shape[1]), lock=False)
    array = _open_zarr(da, path)
    _check_rows(path, array.shape, array.dtype)
    return array.rechunk((chunk_rows, array.shape[1]))


def _check_rows(path: Path, shape: tuple[int, ...], dtype: np.dtype) -> None:
    """Before chunking by rows, which assumes a 2-D shape (a 1-D file was an IndexError)."""
    if len(shape) != 2 or shape[0] < 1:
        raise ValueError(f"{path}: expected a 2-D matrix with at least one row, got {shape}")
    if dtype.kind not in "biuf":
        raise ValueError(f"{path}: expected numbers, got dtype {dtype}")


def _open_zarr(da: Any, path: Path) -> Any:
    try:
        return da.from_zarr(str(path))
    except ImportError as error:
        raise ImportError(f"reading Zarr needs the zarr package: {INSTALL_HINT}") from error
    except Exception as error:  # zarr raises its own types for a directory that is not an array
        raise ValueError(f"{path}: not a readable Zarr array: {error}") from None


class NpyRows:
    """Rows of an ``.npy`` file, read through a memory map opened for each access.

    The map is closed after every read, so pages of a file larger than memory do not pile up
    in the process; and only the path travels to a Dask worker, not the data.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as handle:
            if handle.read(6) != b"\x93NUMPY":
                raise ValueError(f"{path}: not a NumPy .npy file")
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as error:
            raise ValueError(f"{path}: unreadable .npy file: {error}") from None
        self.shape: tuple[int, ...] = array.shape
        self.dtype = array.dtype
        self.ndim = array.ndim
        stat = os.stat(path)
        self._token = (path, stat.st_size, stat.st_mtime_ns)
        del array

    def __getitem__(self, key: Any) -> np.ndarray:
        mapped = np.load(self.path, mmap_mode="r", allow_pickle=False)
        try:
            return np.array(mapped[key])
        finally:
            del mapped

    def __dask_tokenize__(self) -> tuple[str, int, int]:
        return self._token


class _NpyTarget:
    """A ``da.store`` target writing rows into an ``.npy`` file through a fresh memory map."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __setitem__(self, key: Any, value: np.ndarray) -> None:
        mapped = np.load(self.path, mmap_mode="r+", allow_pickle=False)
        try:
            mapped[key] = value
            mapped.flush()
        finally:
            del mapped


class _Output:
    """One output file: ``.npy`` written to a temporary file then renamed, or a Zarr array."""

    def __init__(self, path: Path, shape: tuple[int, ...], dtype: Any) -> None:
        self.path = path
        self.shape = shape
        self.dtype = dtype
        self.temporary = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"

    def store(self, da: Any, array: Any) -> tuple[Any, Any]:
        """(source, target) for ``da.store``."""
        if self.path.suffix.lower() == ".npy":
            # Allocates the file (sparse) and writes its header; chunks fill it in place.
            np.lib.format.open_memmap(self.temporary, mode="w+", dtype=self.dtype, shape=self.shape)
            return array, _NpyTarget(str(self.temporary))
        zarr = _import_zarr()
        target = zarr.open_array(
            str(self.temporary), mode="w", shape=self.shape, dtype=self.dtype,
            chunks=(array.chunks[0][0], *self.shape[1:]),
        )  # fmt: skip
        return array.rechunk((array.chunks[0][0], *self.shape[1:])), target

    def commit(self) -> None:
        if self.path.suffix.lower() == ".zarr" and self.path.exists():
            import shutil

            shutil.rmtree(self.path)
        os.replace(self.temporary, self.path)

    def abort(self) -> None:
        if self.temporary.is_dir():
            import shutil

            shutil.rmtree(self.temporary, ignore_errors=True)
        else:
            self.temporary.unlink(missing_ok=True)


def _import_zarr() -> Any:
    try:
        import zarr
    except ImportError as error:
        raise ImportError(f"writing Zarr needs the zarr package: {INSTALL_HINT}") from error
    return zarr


def _check_output(path: Path) -> None:
    if path.suffix.lower() not in OUTPUT_SUFFIXES:
        raise ValueError(
            f"{path}: unsupported output format {path.suffix or '(no suffix)'!r}; "
            f"use {' or '.join(OUTPUT_SUFFIXES)}"
        )
    if not path.parent.is_dir():
        raise ValueError(f"{path.parent}: no such directory")


# ---------------------------------------------------------------------- per chunk (workers)

# Bundles loaded in this process, by directory: a worker loads each bundle once (verifying its
# hashes), not once per chunk. Single-threaded models: the parallelism is one chunk per thread.
_bundles: dict[str, Bundle] = {}
_bundles_lock = threading.Lock()


def _bundle(directory: str) -> Bundle:
    with _bundles_lock:
        bundle = _bundles.get(directory)
        if bundle is None:
            bundle = load_bundle(directory, threads=1)
            _bundles[directory] = bundle
        return bundle


def _embed_block(
    block: np.ndarray,
    bundle_dir: str,
    mode: str,
    with_clusters: bool,
    source: str,
    block_info: dict | None = None,
) -> np.ndarray:
    """One chunk: embeddings (and the cluster id as a last float32 column)."""
    first = block_info[0]["array-location"][0][0] if block_info else 0
    with np.errstate(over="ignore"):  # beyond float32's range: refused just below, by row
        values = np.asarray(block, dtype=np.float32)
    if block.dtype.kind == "f":  # integers are always finite (and convert to finite floats)
        bad = ~np.isfinite(values).all(axis=1)
        if bad.any():
            row = first + int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"{source}: row {row} contains NaN, infinity or a value beyond the float32 range"
            )
    bundle = _bundle(bundle_dir)
    try:
        embedding, clusters = bundle.embed_with_clusters(values, mode)
    except OutOfRangeInput as exc:
        row = first + int(exc.rows[0])
        raise ValueError(
            f"{source}: row {row} embeds to NaN or infinity in {mode} mode: its values are "
            "too far outside the range the model was trained on"
        ) from None
    if not with_clusters:
        return embedding
    assert clusters is not None
    # Cluster ids are small integers: exact in float32, split off again before writing.
    return np.hstack([embedding, clusters[:, None].astype(np.float32)])
