"""AVG as two shared synopses, SUM and COUNT, divided at lookup.

Reference implementation of the paper (see the package docstring): production does not import
it; ``tests/evaluator/asw`` checks it.
"""

from __future__ import annotations

from evaluator.asw.base import WindowStructure
from evaluator.asw.rint import RunningIntervals
from evaluator.monoid import Agg


class SharedAverage:
    """Window averages over any subtractable-or-not structure kind (R-INT by default)."""

    def __init__(self, capacity: int, kind: type[WindowStructure] = RunningIntervals, **options: object) -> None:
        self.sums = kind(Agg.SUM, capacity, **options)
        self.counts = kind(Agg.COUNT, capacity, **options)

    def append(self, value_sum: float, count: float = 1.0) -> None:
        """One element (count 1) or one pane (its sum and count)."""
        self.sums.append(value_sum)
        self.counts.append(count)

    def range(self, start: int, end: int) -> float | None:
        count = self.counts.range(start, end)
        return self.sums.range(start, end) / count if count else None

    def lookup(self, width: int) -> float | None:
        count = self.counts.lookup(width)
        return self.sums.lookup(width) / count if count else None
