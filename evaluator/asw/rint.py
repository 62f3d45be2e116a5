"""R-INT: running prefix aggregates, for subtractable aggregates (SUM, COUNT; AVG from both).

A window's SUM is the difference of two prefix sums: O(1) update and lookup. The
prefixes are exact integers in the units of :class:`~evaluator.exactsum.FixedPoint`, so
that difference is the window's exact sum rounded once, whatever the values before it
(float prefixes lose a window's small values after large ones). Every ``capacity``
appends the prefixes are re-based to start from zero near the oldest retained position,
which keeps the integers as small as the retained values allow.

Reference implementation of the paper (see the package docstring): production does not import
it; ``benchmarks/evaluator.py`` measures it and the tests use it (also as an exact-sum oracle).
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any

import numpy as np

from evaluator.asw.base import WindowStructure
from evaluator.exactsum import FixedPoint
from evaluator.monoid import Agg


class RunningIntervals(WindowStructure):
    def __init__(self, agg: Agg | str, capacity: int, **options: Any) -> None:
        super().__init__(agg, capacity, **options)
        if not self.monoid.subtractable:
            raise ValueError(f"R-INT needs a subtractable aggregate (SUM, COUNT), not {self.monoid.agg}")
        self.fixed = FixedPoint()
        self.prefix: list[int] = [0] * (2 * self.capacity)  # prefix[p] = sum of [base, p), in exact units
        self.pmask = 2 * self.capacity - 1
        self.total = 0

    def _refine(self, grow: int) -> None:
        """Move the stored prefixes to a unit ``2**grow`` times finer."""
        self.prefix = [x << grow for x in self.prefix]
        self.total <<= grow

    def _skip_to(self, position: int) -> None:
        super()._skip_to(position)
        self.prefix[position & self.pmask] = self.total

    def append(self, value: float) -> None:
        units, grow = self.fixed.units(value)
        if grow:
            self._refine(grow)
        p = self.n
        self.values[p & self.mask] = value
        self.total += units
        self.prefix[(p + 1) & self.pmask] = self.total
        self.n = p + 1
        if not (p + 1) & self.mask:
            self._rebase()

    def extend(self, values: np.ndarray | list[float]) -> None:
        """Batch append (e.g. a micro-batch of panes): one unit conversion and C-speed running sums."""
        array = np.asarray(values, dtype=float)
        while array.size:
            room = self.capacity - (self.n & self.mask)  # up to the next re-base
            chunk, array = array[:room].tolist(), array[room:]
            units, grow = self.fixed.many(chunk)
            if grow:
                self._refine(grow)
            start, k = self.n, len(chunk)
            sums = list(accumulate(units, initial=self.total))[1:]
            slot = start & self.mask  # the chunk does not wrap the value ring
            self.values[slot : slot + k] = chunk
            slot = (start + 1) & self.pmask  # it may wrap the prefix ring once
            head = min(k, len(self.prefix) - slot)
            self.prefix[slot : slot + head] = sums[:head]
            self.prefix[: k - head] = sums[head:]
            self.total = sums[-1]
            self.n = start + len(sums)
            if not self.n & self.mask:
                self._rebase()

    def _rebase(self) -> None:
        base = self.prefix[self.oldest & self.pmask]
        if base:
            self.prefix = [x - base for x in self.prefix]
            self.total -= base

    def range(self, start: int, end: int) -> float:
        if not self._check(start, end):
            return 0.0
        return self.fixed.to_float(self.prefix[end & self.pmask] - self.prefix[start & self.pmask])
