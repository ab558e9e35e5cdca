"""Work over contiguous ranges of rows, one range per thread of a pool: how the layers' compiled
loops (which release the interpreter lock and write only their own rows) share the cores."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor

import numpy as np


def in_parts(
    fill: Callable[[tuple[int, int]], None], n_rows: int, pool: Executor | None, n_threads: int
) -> None:
    """``fill((first, last))`` over ``n_threads`` contiguous ranges of ``range(n_rows)``, on
    ``pool`` when there is one (else over the whole range on this thread)."""
    parts = max(1, min(n_threads if pool is not None else 1, n_rows))
    cuts = np.linspace(0, n_rows, parts + 1).astype(int)
    ranges = list(zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True))
    if pool is None or parts == 1:
        for part in ranges:
            fill(part)
    else:
        list(pool.map(fill, ranges))
