"""The unshared alternatives B-INT, L-INT and R-INT are measured against (and checked by).

- materialise-none: keep the raw values, fold the window at every lookup, O(W);
- materialise-all: keep every registered window's answer current, O(#windows) per update;
- aggregate tree (PSoup-style): a balanced tree over the ring, O(log N) update and lookup.

Reference implementation of the paper (see the package docstring): production does not import
it; ``benchmarks/evaluator.py`` measures against it and the tests use it as an oracle.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from evaluator.asw.base import WindowStructure
from evaluator.monoid import Agg


class MaterializeNone(WindowStructure):
    def append(self, value: float) -> None:
        self.values[self.n & self.mask] = value
        self.n += 1

    def range(self, start: int, end: int) -> float:
        if not self._check(start, end):
            return self.monoid.identity
        a, b = start & self.mask, end & self.mask
        window = self.values[a:b] if a < b else self.values[a:] + self.values[:b]
        if self.monoid.agg in (Agg.SUM, Agg.COUNT):
            return float(sum(window))
        return float(min(window) if self.monoid.agg is Agg.MIN else max(window))


class MaterializeAll(WindowStructure):
    """One running answer per registered width; only those suffix windows can be looked up."""

    def __init__(self, agg: Agg | str, capacity: int, **options: Any) -> None:
        super().__init__(agg, capacity, **options)
        self.widths = sorted({int(w) for w in options.get("widths") or [1]})
        if self.widths[-1] > self.capacity:
            raise ValueError("a width exceeds the capacity")
        self.answers = dict.fromkeys(self.widths, self.monoid.identity)
        self.deques: dict[int, deque] = {w: deque() for w in self.widths}  # MIN/MAX: monotone deques

    def append(self, value: float) -> None:
        p = self.n
        if self.monoid.subtractable:
            for w in self.widths:  # read what leaves before the new value may overwrite its slot
                leaving = self.values[(p - w) & self.mask] if p >= w + self.start else 0.0
                self.answers[w] += value - leaving
        else:
            better = (lambda a, b: a <= b) if self.monoid.agg is Agg.MIN else (lambda a, b: a >= b)
            for w, dq in self.deques.items():
                while dq and better(value, dq[-1][1]):
                    dq.pop()
                dq.append((p, value))
                if dq[0][0] <= p - w:
                    dq.popleft()
                self.answers[w] = dq[0][1]
        self.values[p & self.mask] = value
        self.n = p + 1

    def lookup(self, width: int) -> float:
        if self.n == self.start:
            return self.monoid.identity
        return self.answers[width]

    def range(self, start: int, end: int) -> float:
        if end == self.n and end - start in self.answers:
            return self.lookup(end - start)
        raise NotImplementedError("materialise-all answers only its registered suffix windows")


class AggregateTree(WindowStructure):
    """A segment tree over the ring of values (the PSoup-style alternative)."""

    def __init__(self, agg: Agg | str, capacity: int, **options: Any) -> None:
        super().__init__(agg, capacity, **options)
        self.tree = [self.monoid.identity] * (2 * self.capacity)

    def append(self, value: float) -> None:
        slot = self.n & self.mask
        self.values[slot] = value
        tree, combine = self.tree, self.monoid.combine
        i = slot + self.capacity
        tree[i] = value
        i >>= 1
        while i:
            tree[i] = combine(tree[2 * i], tree[2 * i + 1])
            i >>= 1
        self.n += 1

    def _slots(self, lo: int, hi: int) -> float:
        """Aggregate of ring slots [lo, hi)."""
        tree, combine = self.tree, self.monoid.combine
        left = right = self.monoid.identity
        lo += self.capacity
        hi += self.capacity
        while lo < hi:
            if lo & 1:
                left = combine(left, tree[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                right = combine(tree[hi], right)
            lo >>= 1
            hi >>= 1
        return combine(left, right)

    def range(self, start: int, end: int) -> float:
        if not self._check(start, end):
            return self.monoid.identity
        a, b = start & self.mask, end & self.mask
        if a < b:
            return self._slots(a, b)
        return self.monoid.combine(self._slots(a, self.capacity), self._slots(0, b))
