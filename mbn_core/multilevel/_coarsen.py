"""Graph coarsening kernels of multilevel manifold learning (pure functions over CSR arrays).

Fang, Sakellaridi and Saad, "Multilevel nonlinear dimensionality reduction for manifold
learning", Algorithm 1: a maximal independent set chosen in an order that keeps the coarse
graph connected, and the coarse graph of 2-hop pairs with approximate geodesic lengths (eq. 5).
Prior validation is assumed: the graph is symmetric, has no self loops and sorted indices.
"""

from __future__ import annotations

import numba
import numpy as np

FREE = 0
COARSE = 1
FINE = 2


@numba.njit(cache=True)
def independent_set_fixed(indptr, indices):
    """Algorithm 1 in fixed order: start at vertex 0 and expand S first in, first out.

    S is a queue: vertices are expanded in the order they were found, so the coarse set grows
    as a breadth-first wavefront from vertex 0, each new coarse vertex two hops from an
    earlier one. (Expanding the smallest queued index instead visits the frontier in the
    data's arbitrary order; docs/MULTILEVEL.md gives the measurements that chose the queue.)
    A graph with several components is restarted at the smallest vertex still free, so every
    vertex ends COARSE or FINE.
    """
    n = len(indptr) - 1
    state = np.zeros(n, dtype=np.int8)
    queued = np.zeros(n, dtype=np.bool_)
    for start in range(n):
        if state[start] != FREE:
            continue
        queue = [start]
        queued[start] = True
        head = 0  # the queue is read from the front and never shrinks: first in, first out
        while head < len(queue):
            i = queue[head]
            head += 1
            if state[i] != FREE:
                continue
            _make_coarse(i, indptr, indices, state, queued, queue)
    return state


@numba.njit(cache=True)
def independent_set_random(indptr, indices, uniforms):
    """Algorithm 1 in random order: start and every expansion drawn uniformly from the queue.

    ``uniforms`` holds 2n numbers in [0, 1): the first n pick queue elements (each vertex
    enters the queue at most once, so n pops suffice), the last n pick the start vertices.
    """
    n = len(indptr) - 1
    state = np.zeros(n, dtype=np.int8)
    queued = np.zeros(n, dtype=np.bool_)
    order = np.argsort(uniforms[n:])  # start vertices in a random order
    pops = 0
    for start in order:
        if state[start] != FREE:
            continue
        queue = [start]
        queued[start] = True
        while len(queue) > 0:
            pick = min(int(uniforms[pops] * len(queue)), len(queue) - 1)
            pops += 1
            i = queue[pick]
            queue[pick] = queue[len(queue) - 1]
            queue.pop()
            if state[i] != FREE:
                continue
            _make_coarse(i, indptr, indices, state, queued, queue)
    return state


@numba.njit(cache=True)
def _make_coarse(i, indptr, indices, state, queued, queue):
    state[i] = COARSE
    for a in range(indptr[i], indptr[i + 1]):
        j = indices[a]
        if state[j] == FINE:
            continue
        # j is FREE here: a COARSE neighbour of i would contradict independence.
        state[j] = FINE
        for b in range(indptr[j], indptr[j + 1]):
            k = indices[b]
            if state[k] == FREE and not queued[k]:
                queued[k] = True
                queue.append(k)


@numba.njit(cache=True)
def coarse_graph(indptr, indices, lengths, state):
    """The coarse graph: coarse pairs two hops apart, with length min_j d(i,j) + d(j,k).

    Returns CSR arrays ``(indptr, indices, lengths)`` over the coarse vertices numbered in
    increasing original order, rows sorted by column.
    """
    n = len(indptr) - 1
    new_index = np.full(n, -1, dtype=np.int64)
    n_coarse = 0
    for v in range(n):
        if state[v] == COARSE:
            new_index[v] = n_coarse
            n_coarse += 1
    seen = np.full(n_coarse, -1, dtype=np.int64)
    # Pass 1 counts each coarse row's distinct 2-hop coarse neighbours, so the output is
    # allocated once at its exact size (coarse degrees grow level by level).
    counts = np.zeros(n_coarse + 1, dtype=np.int64)
    for i in range(n):
        if state[i] != COARSE:
            continue
        row = new_index[i]
        for a in range(indptr[i], indptr[i + 1]):
            j = indices[a]
            for b in range(indptr[j], indptr[j + 1]):
                k = indices[b]
                if k != i and state[k] == COARSE and seen[new_index[k]] != row:
                    seen[new_index[k]] = row
                    counts[row + 1] += 1
    out_indptr = np.cumsum(counts)
    out_indices = np.empty(out_indptr[-1], dtype=np.int64)
    out_lengths = np.empty(out_indptr[-1], dtype=np.float64)
    slot = np.full(n_coarse, -1, dtype=np.int64)
    for i in range(n):
        if state[i] != COARSE:
            continue
        row = new_index[i]
        fill = out_indptr[row]
        for a in range(indptr[i], indptr[i + 1]):
            j = indices[a]
            via = lengths[a]
            for b in range(indptr[j], indptr[j + 1]):
                k = indices[b]
                if k == i or state[k] != COARSE:
                    continue
                col = new_index[k]
                length = via + lengths[b]
                if slot[col] < out_indptr[row]:
                    slot[col] = fill
                    out_indices[fill] = col
                    out_lengths[fill] = length
                    fill += 1
                elif length < out_lengths[slot[col]]:
                    out_lengths[slot[col]] = length
        start = out_indptr[row]
        order = np.argsort(out_indices[start:fill])
        out_indices[start:fill] = out_indices[start:fill][order]
        out_lengths[start:fill] = out_lengths[start:fill][order]
    return out_indptr, out_indices, out_lengths
