"""B-INT: aggregates of dyadic base intervals, shared by windows of every size.

Level ``l`` keeps the aggregate of each complete interval ``[i 2^l, (i+1) 2^l)``
within the retained positions, in a ring of ``capacity >> l`` slots. An append
completes one interval per trailing one-bit of its position: O(1) amortised. Any
window is a disjoint union of O(log W) base intervals. Works for every monoid.

Reference implementation of the paper (see the package docstring): production does not import
it; ``benchmarks/evaluator.py`` measures it and ``tests/evaluator/asw`` checks it.
"""

from __future__ import annotations

from typing import Any

from evaluator.asw.base import WindowStructure
from evaluator.monoid import Agg


class BaseIntervals(WindowStructure):
    def __init__(self, agg: Agg | str, capacity: int, **options: Any) -> None:
        super().__init__(agg, capacity, **options)
        self.top = self.capacity.bit_length() - 1
        identity = self.monoid.identity
        self.levels: list[list[float]] = [self.values] + [
            [identity] * (self.capacity >> level) for level in range(1, self.top + 1)
        ]

    def append(self, value: float) -> None:
        p = self.n
        levels, combine = self.levels, self.monoid.combine
        levels[0][p & self.mask] = value
        level = 1
        while level <= self.top and (p >> (level - 1)) & 1:
            node, child = levels[level], levels[level - 1]
            i = p >> level
            node[i & (len(node) - 1)] = combine(child[(2 * i) & (len(child) - 1)], child[(2 * i + 1) & (len(child) - 1)])
            level += 1
        self.n = p + 1

    def range(self, start: int, end: int) -> float:
        result = self.monoid.identity
        if not self._check(start, end):
            return result
        combine, levels, top = self.monoid.combine, self.levels, self.top
        a = start
        while a < end:  # dyadic_cover, inlined: this is the hot path of every lookup
            level = min((a & -a).bit_length() - 1 if a else top, top)
            while a + (1 << level) > end:
                level -= 1
            node = levels[level]
            result = combine(result, node[(a >> level) & (len(node) - 1)])
            a += 1 << level
        return result
