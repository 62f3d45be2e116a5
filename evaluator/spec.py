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


@dataclass(frozen=True, slots=True)
class Condition:
    """``aggregate(attribute) OVER window_ms`` in the range (low, high).

    Either bound may be absent (``None``); each may be inclusive. An aggregate
    with no value (AVG/MIN/MAX of an empty window) satisfies no condition.
    """

    aggregate: Aggregate
    attribute: str | None
    window_ms: int
    low: float | None = None
    high: float | None = None
    low_inclusive: bool = False
    high_inclusive: bool = False

    def __post_init__(self) -> None:
        if self.window_ms <= 0:
            raise ValueError("window must be positive")
        if self.low is None and self.high is None:
            raise ValueError("a condition needs at least one bound")
        if self.aggregate is not Aggregate.COUNT and not self.attribute:
            raise ValueError(f"{self.aggregate} needs an attribute")

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
        return cls(**{**data, "aggregate": Aggregate(data["aggregate"])})


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
