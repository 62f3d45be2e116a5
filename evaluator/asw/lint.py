"""L-INT: landmark intervals, O(1) lookups for a set of window sizes.

Landmarks sit every ``D`` positions. For each block between landmarks we keep the
aggregate of the whole block, and per position the aggregate from the block start
up to it (prefix) and from it to the block end (suffix). A window of width
``w >= D`` is then ``suffix ⊕ whole blocks ⊕ prefix`` with at most ``w / D`` whole
blocks. With γ-partitioning the requested widths are split into classes
``[D, γ D)``, each with its own landmark spacing, so every lookup combines at most
``γ + 1`` values: O(1) for a constant γ, at O(1) amortised update per class.

Reference implementation of the paper (see the package docstring): production does not import
it; ``benchmarks/evaluator.py`` measures it and ``tests/evaluator/asw`` checks it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

from evaluator.asw.base import WindowStructure, pow2_at_least
from evaluator.monoid import Agg


def gamma_partition(widths: Iterable[int], gamma: float) -> list[int]:
    """Landmark spacings: the smallest width of each class ``[D, γ D)`` of the sorted widths."""
    if gamma <= 1:
        raise ValueError("γ must exceed 1")
    spacings: list[int] = []
    for w in sorted({int(w) for w in widths}):
        if w <= 0:
            raise ValueError("widths must be positive")
        if not spacings or w >= gamma * spacings[-1]:
            spacings.append(w)
    return spacings


class _Landmarks:
    """One class: landmarks every ``spacing`` positions."""

    __slots__ = ("blocks", "bmask", "prefix", "spacing", "suffix")

    def __init__(self, spacing: int, capacity: int, identity: float) -> None:
        self.spacing = spacing
        self.prefix = [identity] * capacity
        self.suffix = [identity] * capacity
        n_blocks = pow2_at_least(capacity // spacing + 2)
        self.blocks = [identity] * n_blocks
        self.bmask = n_blocks - 1


class LandmarkIntervals(WindowStructure):
    def __init__(self, agg: Agg | str, capacity: int, **options: Any) -> None:
        super().__init__(agg, capacity, **options)
        widths = options.get("widths") or [1]
        self.gamma = float(options.get("gamma", 2.0))
        self.spacings = gamma_partition(widths, self.gamma)
        self.classes = [_Landmarks(d, self.capacity, self.monoid.identity) for d in self.spacings]

    def append(self, value: float) -> None:
        p = self.n
        m = self.mask
        self.values[p & m] = value
        combine = self.monoid.combine
        restart = self.start  # a block cut by a rebuild restarts its prefix at the first element kept
        for lm in self.classes:
            d = lm.spacing
            offset = p % d
            lm.prefix[p & m] = value if offset == 0 or p == restart else combine(lm.prefix[(p - 1) & m], value)
            if offset == d - 1:  # the block [p - d + 1, p] is complete
                lm.blocks[(p // d) & lm.bmask] = lm.prefix[p & m]
                acc = self.monoid.identity
                for q in range(p, max(p - d, restart - 1), -1):
                    acc = combine(self.values[q & m], acc)
                    lm.suffix[q & m] = acc
        self.n = p + 1

    def _class_for(self, width: int) -> _Landmarks | None:
        i = bisect.bisect_right(self.spacings, width) - 1
        return self.classes[i] if i >= 0 else None

    def range(self, start: int, end: int) -> float:
        identity = self.monoid.identity
        if not self._check(start, end):
            return identity
        lm = self._class_for(end - start)
        combine, m = self.monoid.combine, self.mask
        if lm is None:  # narrower than every class: fold the few raw values
            result = identity
            for q in range(start, end):
                result = combine(result, self.values[q & m])
            return result
        d = lm.spacing
        first, last = start // d, (end - 1) // d
        if first == last:
            result = identity
            for q in range(start, min(end, (first + 1) * d)):
                result = combine(result, self.values[q & m])
            if first == last:
                return result
        else:
            result = lm.suffix[start & m]
        for block in range(first + 1, last):
            result = combine(result, lm.blocks[block & lm.bmask])
        return combine(result, lm.prefix[(end - 1) & m])
