"""B-INT-QNT: quantiles over shared windows from sorted base-interval arrays.

Each dyadic base interval keeps its elements sorted (a parent is the merge of its
two children, so every element is copied once per level: O(log N) amortised per
update, O(N log N) space). A window is O(log W) sorted arrays; its k-th smallest
element is found by pivoting on array medians and counting ranks by binary search,
without merging the arrays.

Reference implementation of the paper (see the package docstring): production does not import
it; ``benchmarks/evaluator.py`` measures it and ``tests/evaluator/asw`` checks it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from evaluator.asw.base import WindowStructure, dyadic_cover

_EMPTY = np.empty(0)


def kth_smallest(arrays: list[np.ndarray], k: int) -> float:
    """The k-th smallest (0-based) element of the union of sorted arrays."""
    lo = [0] * len(arrays)
    hi = [len(a) for a in arrays]
    while True:
        widest = max(range(len(arrays)), key=lambda i: hi[i] - lo[i])
        pivot = arrays[widest][(lo[widest] + hi[widest]) // 2]
        below = [int(np.searchsorted(a, pivot, "left")) for a in arrays]
        upto = [int(np.searchsorted(a, pivot, "right")) for a in arrays]
        if sum(below) <= k < sum(upto):
            return float(pivot)
        if k < sum(below):
            hi = [min(h, b) for h, b in zip(hi, below, strict=True)]
        else:
            lo = [max(low, u) for low, u in zip(lo, upto, strict=True)]


def rank_of(phi: float, count: int) -> int:
    """0-based rank of the φ-quantile: the ceil(φ n)-th smallest (the minimum for φ = 0)."""
    if not 0 <= phi <= 1:
        raise ValueError("φ must be in [0, 1]")
    return max(math.ceil(phi * count) - 1, 0)


class QuantileIntervals(WindowStructure):
    def __init__(self, agg: str = "MIN", capacity: int = 1024, **options: Any) -> None:
        super().__init__(agg, capacity, **options)
        self.top = self.capacity.bit_length() - 1
        self.nodes: list[list[np.ndarray]] = [[_EMPTY] * (self.capacity >> level) for level in range(self.top + 1)]

    def append(self, value: float) -> None:
        p = self.n
        self.values[p & self.mask] = value
        self.nodes[0][p & self.mask] = np.array([value])
        level = 1
        while level <= self.top and (p >> (level - 1)) & 1:
            node, child = self.nodes[level], self.nodes[level - 1]
            i = p >> level
            merged = np.concatenate([child[(2 * i) & (len(child) - 1)], child[(2 * i + 1) & (len(child) - 1)]])
            merged.sort(kind="mergesort")  # two sorted runs: a linear merge
            node[i & (len(node) - 1)] = merged
            level += 1
        self.n = p + 1

    def sorted_runs(self, start: int, end: int) -> list[np.ndarray]:
        if not self._check(start, end):
            return []
        return [self.nodes[level][i & ((self.capacity >> level) - 1)] for level, i in dyadic_cover(start, end, self.top)]

    def quantile_range(self, start: int, end: int, phi: float) -> float | None:
        runs = self.sorted_runs(start, end)
        count = sum(len(r) for r in runs)
        return kth_smallest(runs, rank_of(phi, count)) if count else None

    def quantile(self, width: int, phi: float) -> float | None:
        return self.quantile_range(max(self.n - width, self.oldest), self.n, phi)

    def range(self, start: int, end: int) -> float:
        """The minimum (φ = 0), so the structure also serves plain MIN lookups."""
        value = self.quantile_range(start, end, 0.0)
        return self.monoid.identity if value is None else value
