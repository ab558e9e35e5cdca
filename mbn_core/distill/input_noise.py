"""How much Gaussian noise the compressor adds to the MLP's input rows (``input_noise="auto"``).

The noise asks the MLP for the invariance the exact embedding has near each training row: it
barely moves within a row's neighbourhood. That holds while the noise stays inside the
neighbourhood. The fixed 0.3 (per dimension, in the MLP's input units) was set on wide data,
where its length stays within the median distance from a training row to its 10th nearest.
On thin manifolds the same 0.3 reaches several times that distance: the noise carries rows
across the gap between two clusters, and the distilled map blurs that gap. So "auto" takes
the 0.3 and caps its length at ``NEIGHBOURHOOD_SHARE`` of that distance, which leaves wide
data at (or just below) 0.3 (docs/decisions/0015-input-noise-auto.md).

Neighbours are distinct rows: on data of many repeated rows (a few binary inputs) the 10th
nearest row would often be a copy at distance 0, which says nothing of how far the embedding
stays the same.
"""

from __future__ import annotations

import numpy as np
from sklearn.neighbors import NearestNeighbors

# The noise's standard deviation per input dimension on wide data, where the cap below does
# not bind (docs/decisions/0010-compressor-defaults.md).
MAX_INPUT_NOISE = 0.3
# The noise's expected length is kept at most this share of the median distance from a
# training row to its ``NEIGHBORS``-th nearest: the largest share among the calibration sets.
NEIGHBOURHOOD_SHARE = 0.6
NEIGHBORS = 10
# Rows whose neighbourhoods are measured, evenly spaced over the distinct rows (sorted, so the
# measurement does not depend on the order the rows came in).
SAMPLE_ROWS = 2000


def auto_input_noise(X: np.ndarray) -> float:
    """The noise's standard deviation for dense MLP input rows ``X`` (n, width).

    0 when no row has another distinct row to measure by.
    """
    distinct = np.unique(X, axis=0)
    n_rows, width = distinct.shape
    n_neighbors = min(NEIGHBORS, n_rows - 1)
    if n_neighbors < 1:
        return 0.0
    sample = distinct[np.linspace(0, n_rows - 1, min(n_rows, SAMPLE_ROWS)).round().astype(int)]
    index = NearestNeighbors(n_neighbors=n_neighbors + 1).fit(distinct)
    # Each sampled row is its own first neighbour, at distance 0.
    distances, _ = index.kneighbors(sample)
    reach = float(np.median(distances[:, n_neighbors]))
    return min(MAX_INPUT_NOISE, NEIGHBOURHOOD_SHARE * reach / np.sqrt(width))
