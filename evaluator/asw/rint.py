"""R-INT: running prefix aggregates, for subtractable aggregates (SUM, COUNT; AVG from both).

A window's SUM is the difference of two prefix sums: O(1) update and lookup. To
keep floating-point error tied to the values *in* the retained window rather than
to the whole stream's history, every ``capacity`` appends the prefixes are re-based
so that they start from zero again near the oldest retained position.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evaluator.asw.base import WindowStructure
from evaluator.monoid import Agg


class RunningIntervals(WindowStructure):
    def __init__(self, agg: Agg | str, capacity: int, **options: Any) -> None:
        super().__init__(agg, capacity, **options)
        if not self.monoid.subtractable:
            raise ValueError(f"R-INT needs a subtractable aggregate (SUM, COUNT), not {self.monoid.agg}")
        self.prefix: list[float] = [0.0] * (2 * self.capacity)  # prefix[p] = sum of [base, p)
        self.pmask = 2 * self.capacity - 1
        self.total = 0.0

    def _skip_to(self, position: int) -> None:
        super()._skip_to(position)
        self.prefix[position & self.pmask] = self.total

    def append(self, value: float) -> None:
        p = self.n
        self.values[p & self.mask] = value
        self.total += value
        self.prefix[(p + 1) & self.pmask] = self.total
        self.n = p + 1
        if not (p + 1) & self.mask:
            self._rebase()

    def extend(self, values: np.ndarray | list[float]) -> None:
        """Vectorised append of a batch (e.g. a micro-batch of panes)."""
        array = np.asarray(values, dtype=float)
        while array.size:
            room = self.capacity - (self.n & self.mask)  # up to the next re-base
            chunk, array = array[:room], array[room:]
            start, k = self.n, len(chunk)
            sums = (self.total + np.cumsum(chunk)).tolist()
            slot = start & self.mask  # the chunk does not wrap the value ring
            self.values[slot : slot + k] = chunk.tolist()
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
        return self.prefix[end & self.pmask] - self.prefix[start & self.pmask]
