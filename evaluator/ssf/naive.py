"""The naive per-key approach to substream filters: visit every key at every lookup.

Each key keeps its timestamps and values; a key's window SUM is ``math.fsum`` of
the window's values (exact, like the collective indexes' sums, and computed
independently of them) and its MAX/MIN a scan of the window; a lookup costs
O(keys). This is the baseline the collective indexes are measured against and an
independent oracle for their tests.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from evaluator.spec import Condition
from evaluator.ssf.base import SubstreamIndex


@dataclass
class _Series:
    ts: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


class NaiveSubstreams(SubstreamIndex):
    def __init__(self, agg: str) -> None:
        if agg not in ("SUM", "COUNT", "MAX", "MIN"):
            raise ValueError(f"unsupported aggregate {agg}")
        self.agg = agg
        self.series: dict[str, _Series] = {}

    def add(self, key: str, ts: int, value: float) -> None:
        s = self.series.setdefault(key, _Series())
        s.ts.append(ts)
        s.values.append(value)

    def expire(self, before_ts: int) -> None:
        for s in self.series.values():
            i = bisect.bisect_right(s.ts, before_ts)
            if i:
                del s.ts[:i], s.values[:i]

    def value(self, key: str, duration: int, now: int) -> float | None:
        s = self.series.get(key)
        if s is None:
            return None if self.agg in ("MAX", "MIN") else 0.0
        i = bisect.bisect_right(s.ts, now - duration)
        j = bisect.bisect_right(s.ts, now)
        window = s.values[i:j]
        if self.agg in ("SUM", "COUNT"):
            return math.fsum(window)
        if not window:
            return None
        return max(window) if self.agg == "MAX" else min(window)

    def query(self, condition: Condition, now: int) -> dict[str, float]:
        found = {}
        for key in self.series:
            value = self.value(key, condition.window_ms, now)
            if value is not None and condition.holds(value):
                found[key] = value
        return found
