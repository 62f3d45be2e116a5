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
    subtractable: bool


MONOIDS: dict[Agg, Monoid] = {
    Agg.SUM: Monoid(Agg.SUM, 0.0, operator.add, True),
    Agg.COUNT: Monoid(Agg.COUNT, 0.0, operator.add, True),
    Agg.MIN: Monoid(Agg.MIN, float("inf"), min, False),
    Agg.MAX: Monoid(Agg.MAX, float("-inf"), max, False),
}


def monoid(agg: Agg | str) -> Monoid:
    return MONOIDS[Agg(agg)]
