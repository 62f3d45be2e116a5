"""What the evaluator is asked: conditions over sliding-window aggregates of substreams.

A subscription asks, for every key in its key filter, whether
``aggregate(attribute over the last window_ms of that key's events)`` lies in a
range. These are plain frozen values so they cross process boundaries (Spark
workers, Redis snapshots) as JSON.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Aggregate(StrEnum):
    COUNT = "COUNT"
    SUM = "SUM"
    AVG = "AVG"
    MIN = "MIN"
    MAX = "MAX"
    QUANTILE = "QUANTILE"  # the q-quantile: the smallest value with at least q of the window's values at or below it
    LAST = "LAST"  # the value of the newest event in the window
    EXPR = "EXPR"  # arithmetic over window aggregates (``Condition.expression``)


#: What a subscription asks per key, as nested tuples (JSON arrays on the wire):
#: ``("agg", aggregate, attribute | None, q | None)``, ``("num", value)``, or
#: ``(op, left, right)`` with ``op`` one of ``+ - * /``.
Expr = tuple

OPERATORS = ("+", "-", "*", "/")


def expr_terms(expr: Expr) -> list[Expr]:
    """The aggregate terms of an expression, left to right."""
    if expr[0] == "agg":
        return [expr]
    if expr[0] == "num":
        return []
    return expr_terms(expr[1]) + expr_terms(expr[2])


def combine(op: str, left: float, right: float) -> float | None:
    """``left op right``; None where it has no finite value (division by zero, overflow)."""
    if op == "+":
        value = left + right
    elif op == "-":
        value = left - right
    elif op == "*":
        value = left * right
    else:
        if right == 0:
            return None
        value = left / right
    return value if math.isfinite(value) else None


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list | tuple) else value


@dataclass(frozen=True, slots=True)
class Condition:
    """``aggregate(attribute) OVER window_ms`` in the range (low, high).

    Either bound may be absent (``None``); each may be inclusive. An aggregate
    with no value (AVG/MIN/MAX of an empty window) satisfies no condition.
    ``QUANTILE`` takes its fraction ``q``; ``EXPR`` computes ``expression`` and, with
    ``percent_of``, compares it as a percentage of that attribute's last value.
    """

    aggregate: Aggregate
    attribute: str | None
    window_ms: int
    low: float | None = None
    high: float | None = None
    low_inclusive: bool = False
    high_inclusive: bool = False
    q: float | None = None
    expression: Expr | None = None
    percent_of: str | None = None

    def __post_init__(self) -> None:
        if self.window_ms <= 0:
            raise ValueError("window must be positive")
        if self.low is None and self.high is None:
            raise ValueError("a condition needs at least one bound")
        if self.aggregate is Aggregate.EXPR:
            if not self.expression or not expr_terms(self.expression):
                raise ValueError("an expression needs at least one aggregate")
        elif self.aggregate is not Aggregate.COUNT and not self.attribute:
            raise ValueError(f"{self.aggregate} needs an attribute")
        if (self.aggregate is Aggregate.QUANTILE) != (self.q is not None):
            raise ValueError("QUANTILE, and only QUANTILE, takes a fraction q")
        if self.q is not None and not 0 < self.q <= 1:
            raise ValueError("a quantile's fraction is in (0, 1]")

    @property
    def terms(self) -> list[Expr]:
        """The window aggregates this condition needs per key."""
        if self.aggregate is Aggregate.EXPR:
            return expr_terms(self.expression)  # type: ignore[arg-type]
        return [("agg", self.aggregate.value, self.attribute, self.q)]

    def holds(self, value: float | None) -> bool:
        if value is None or math.isnan(value):
            return False
        if self.low is not None and (value < self.low or (value == self.low and not self.low_inclusive)):
            return False
        if self.high is not None and (value > self.high or (value == self.high and not self.high_inclusive)):
            return False
        return True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Condition:
        return cls(**{**data, "aggregate": Aggregate(data["aggregate"]),
                      "expression": _tuples(data.get("expression"))})


@dataclass(frozen=True, slots=True)
class SubscriptionSpec:
    """One active subscription as the evaluator sees it. ``keys`` of ``None`` means every key."""

    id: int
    condition: Condition
    keys: frozenset[str] | None = None
    text: str = field(default="", compare=False)

    def applies_to(self, key: str) -> bool:
        return self.keys is None or key in self.keys

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "condition": self.condition.to_dict(),
            "keys": sorted(self.keys) if self.keys is not None else None,
            "text": self.text,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SubscriptionSpec:
        keys = data.get("keys")
        return cls(
            id=int(data["id"]),
            condition=Condition.from_dict(data["condition"]),
            keys=frozenset(keys) if keys is not None else None,
            text=data.get("text", ""),
        )
