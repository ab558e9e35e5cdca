"""Seeds for the steps of a job, drawn from its one generator."""

from __future__ import annotations

import numpy as np


def draw_seed(rng) -> int:
    """A seed for one step (k-means, an MLP, a fold split) drawn from the job's generator."""
    return int(rng.randint(np.iinfo(np.int32).max))
