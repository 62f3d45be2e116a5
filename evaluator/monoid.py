"""The aggregates the shared structures combine: associative operators with identities.

SUM and COUNT are also *subtractable* (they have inverses), which R-INT exploits;
MIN and MAX are not, which is why B-INT and L-INT exist. AVG is SUM and COUNT kept
side by side.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np


class Agg(StrEnum):
    SUM = "SUM"
    COUNT = "COUNT"
    MIN = "MIN"
    MAX = "MAX"


@dataclass(frozen=True)
class Monoid:
    agg: Agg
    identity: float
    combine: Callable[[float, float], float]
    reduce: Callable[[np.ndarray], float]
    pairwise: Callable[[np.ndarray, np.ndarray], np.ndarray]  # vectorised combine of two arrays
    subtractable: bool

    def lift(self, value: float) -> float:
        """What one stream element contributes: COUNT counts it, the others take its value."""
        return 1.0 if self.agg is Agg.COUNT else value


MONOIDS: dict[Agg, Monoid] = {
    Agg.SUM: Monoid(Agg.SUM, 0.0, operator.add, lambda a: float(np.sum(a)), np.add, True),
    Agg.COUNT: Monoid(Agg.COUNT, 0.0, operator.add, lambda a: float(np.sum(a)), np.add, True),
    Agg.MIN: Monoid(Agg.MIN, float("inf"), min, lambda a: float(np.min(a)) if len(a) else float("inf"), np.minimum, False),
    Agg.MAX: Monoid(Agg.MAX, float("-inf"), max, lambda a: float(np.max(a)) if len(a) else float("-inf"), np.maximum, False),
}


def monoid(agg: Agg | str) -> Monoid:
    return MONOIDS[Agg(agg)]
