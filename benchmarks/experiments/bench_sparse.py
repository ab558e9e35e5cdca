"""Sparse input: one bottom-layer clustering scored two ways, on the same model.

    python benchmarks/experiments/bench_sparse.py --documents 2000 --vocabulary 30000
        --clusterings 16

Fits ``MBN(n_clusterings=C, random_state=0)`` on ``bench_data.topic_corpus`` documents (the
bottom layer's k1 = n / 2 centers, every other layer cut short, since only the bottom is
timed), then codes all documents for each of the C bottom clusterings with
- ``bottom_clustering_codes``, the dense-centers route sparse input took before: each
  clustering's (k1, d_chosen) centers gathered and made dense, the rows sliced by column;
- ``bottom_codes_sparse``, what ``BottomLayer.clustering_codes`` now takes for sparse rows:
  the chosen dimensions as a mask on the sparse centers, float64 products.
The two alternate clustering by clustering, and the codes must be equal. Prints the median
seconds of one clustering for each and their ratio.

Decision record: docs/decisions/0016-sparse-input.md.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared harness

from bench_data import topic_corpus
from bench_report import command_line

from mbn_core import MBN
from mbn_core.mbn.bottom import bottom_clustering_codes, bottom_codes_sparse, input_row_norms


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--vocabulary", type=int, default=30_000)
    parser.add_argument("--clusterings", type=int, default=16)
    args = parser.parse_args(argv)
    print(f"`{command_line('bench_sparse.py', argv)}` ({platform.processor() or 'CPU'})\n")
    X, _ = topic_corpus(args.documents, vocabulary=args.vocabulary)
    k1 = args.documents // 2
    model = MBN(n_clusterings=args.clusterings, ks=[k1, 2], random_state=0).fit(X)
    layer = model.bottom_layer_
    norms = input_row_norms(X)
    dense_route, sparse_route = [], []
    for v in range(args.clusterings):
        started = time.perf_counter()
        before = bottom_clustering_codes(
            X, layer.features(v), layer.center_values(v), layer.metric, norms
        )
        dense_route.append(time.perf_counter() - started)
        started = time.perf_counter()
        after = bottom_codes_sparse(X, layer, v, norms)
        sparse_route.append(time.perf_counter() - started)
        if not np.array_equal(before, after):
            raise SystemExit(f"clustering {v}: the two routes disagree")
    before_s, after_s = float(np.median(dense_route)), float(np.median(sparse_route))
    print(f"{args.documents} documents x {args.vocabulary} words, {X.nnz} nonzeros, k1 = {k1}")
    print("| route | median s per clustering |")
    print("|---|---|")
    print(f"| dense centers (before) | {before_s:.4f} |")
    print(f"| masked sparse centers (now) | {after_s:.4f} |")
    print(f"\nratio {before_s / after_s:.1f}x; codes equal on all {args.clusterings} clusterings")


if __name__ == "__main__":
    main()
