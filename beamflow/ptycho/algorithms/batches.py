"""Batch selection: which positions are updated together.

* ``random``: a random partition into near-equal batches (each spans the whole scan);
* ``compact``: runs of a Z-order curve over the scan, so each batch touches a small box of
  the object;
* ``sparse``: sets of mutually non-overlapping windows, so a PIE update of the set is exactly
  the sequential one (ePIE's semantics with one stacked FFT per set);
* ``all``: one batch (DM).

Every function takes the iteration's generator, so a batch partition is reproducible.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["random_batches", "compact_batches", "overlap_neighbours", "sparse_batches"]

# Colours the sparse sets' colouring tracks per window in a table (more are found the slow
# way): greedy colouring of a ptychographic scan needs a few hundred at most.
COLOUR_COLUMNS = 256


def random_batches(rng: np.random.Generator, n: int, size: int) -> list[np.ndarray]:
    """A random partition of range(n) into ceil(n/size) batches of near-equal size."""
    perm = rng.permutation(n)
    k = max(1, math.ceil(n / max(size, 1)))
    return [b for b in np.array_split(perm, k) if len(b)]


def _spread_bits(v: np.ndarray) -> np.ndarray:
    """Spread the low 16 bits of v to the even bit positions (for a Morton key)."""
    v = v.astype(np.uint64) & np.uint64(0xFFFF)
    for shift, mask in ((8, 0x00FF00FF), (4, 0x0F0F0F0F), (2, 0x33333333), (1, 0x55555555)):
        v = (v | (v << np.uint64(shift))) & np.uint64(mask)
    return v


def compact_batches(rng: np.random.Generator, corner: np.ndarray, m: int,
                    size: int) -> list[np.ndarray]:
    """Spatially compact batches: positions in Z-order of (m/2)-pixel cells, cut into runs
    of ``size`` starting at a random offset, in random order.

    A compact batch touches a small box of the object, so the per-batch object update costs
    little even on a large object (random batches each span the whole field of view).
    """
    n = len(corner)
    cell = np.maximum(corner, 0) // max(1, m // 2)
    key = _spread_bits(cell[:, 0]) << np.uint64(1) | _spread_bits(cell[:, 1])
    order = np.lexsort((rng.random(n), key))
    offset = int(rng.integers(0, max(1, min(size, n))))
    cuts = list(range(offset, n, max(1, size)))
    batches = [b for b in np.split(order, cuts) if len(b)]
    return [batches[i] for i in rng.permutation(len(batches))]


def overlap_neighbours(corner: np.ndarray, m: int) -> list[np.ndarray]:
    """For each window, the indices of the other windows it overlaps (|Δy| < m and |Δx| < m).

    A grid hash with cell size m limits candidates to the 3x3 neighbouring cells.
    """
    n = len(corner)
    cells = corner // m
    buckets: dict[tuple[int, int], list[int]] = {}
    for j, (cy, cx) in enumerate(cells.tolist()):
        buckets.setdefault((cy, cx), []).append(j)
    arrays = {k: np.asarray(v, np.int64) for k, v in buckets.items()}
    out: list[np.ndarray] = []
    empty = np.zeros(0, np.int64)
    for j in range(n):
        cy, cx = int(cells[j, 0]), int(cells[j, 1])
        cand = [arrays[k] for k in ((cy + a, cx + b) for a in (-1, 0, 1) for b in (-1, 0, 1))
                if k in arrays]
        c = np.concatenate(cand) if cand else empty
        d = np.abs(corner[c] - corner[j])
        out.append(c[(d[:, 0] < m) & (d[:, 1] < m) & (c != j)])
    return out


def sparse_batches(rng: np.random.Generator, neighbours: list[np.ndarray],
                   max_size: int | None) -> list[np.ndarray]:
    """Random sets of mutually non-overlapping windows (greedy colouring in random order).

    Updating a set whose windows do not overlap at once is exactly the same as updating its
    positions one after another, so PIE keeps its sequential semantics while the set's
    FFTs run as one stack. Sets larger than ``max_size`` are split.
    """
    n = len(neighbours)
    colour = np.full(n, -1, np.int64)
    # taken[j, c]: a neighbour of j has colour c. A window's colour is the first free column
    # of its row, and colouring it marks its neighbours' rows: two numpy calls a window,
    # where gathering and sifting its neighbours' colours took five (4000 windows of 314
    # neighbours: 12 ms an iteration instead of 33, the same colours). A window with every
    # column taken is coloured from its neighbours' colours.
    width = min(max((len(v) for v in neighbours), default=0) + 1, COLOUR_COLUMNS)
    taken = np.zeros((n, width), bool)
    for j in rng.permutation(n).tolist():
        c = int(taken[j].argmin())
        if taken[j, c]:  # every column taken
            used = colour[neighbours[j]]
            free = np.ones(len(used) + 1, bool)  # the first free colour is at most len(used)
            free[used[(used >= 0) & (used <= len(used))]] = False
            c = int(np.argmax(free))
        colour[j] = c
        if c < width:
            taken[neighbours[j], c] = True
    classes = [np.flatnonzero(colour == c) for c in range(int(colour.max()) + 1)]
    batches: list[np.ndarray] = []
    for cls in classes:
        cls = rng.permutation(cls)
        k = 1 if not max_size else max(1, math.ceil(len(cls) / max_size))
        batches.extend(b for b in np.array_split(cls, k) if len(b))
    order = rng.permutation(len(batches))
    return [batches[i] for i in order]
