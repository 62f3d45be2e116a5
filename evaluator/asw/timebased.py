"""Time-based windows over any position-based structure.

Elements carry non-decreasing timestamps. The window of duration ``T`` at time
``now`` holds the elements with ``now - T < ts <= now``; binary search over the
retained timestamps turns it into a position range. The structure grows whenever
the elements of the longest window would no longer fit, so a burst never
truncates a window.

Reference implementation of the paper (see the package docstring): production does not import
it; ``tests/evaluator/asw`` checks it.
"""

from __future__ import annotations

from evaluator.asw.base import WindowStructure


class TimeWindows:
    def __init__(self, structure: WindowStructure, max_duration: float) -> None:
        self.structure = structure
        self.max_duration = max_duration
        self.stamps: list[float] = [0.0] * structure.capacity
        self.live = structure.n  # oldest position some window may still need

    def _stamp(self, position: int) -> float:
        return self.stamps[position & (len(self.stamps) - 1)]

    def append(self, ts: float, value: float) -> None:
        s = self.structure
        if s.n > s.start and ts < self._stamp(s.n - 1):
            raise ValueError(f"timestamps must not decrease: {ts} after {self._stamp(s.n - 1)}")
        while self.live < s.n and self._stamp(self.live) <= ts - self.max_duration:
            self.live += 1
        if s.n - self.live >= s.capacity:
            old = {p: self._stamp(p) for p in range(self.live, s.n)}
            s.grow(2 * s.capacity)
            self.stamps = [0.0] * s.capacity
            for p, stamp in old.items():
                self.stamps[p & (s.capacity - 1)] = stamp
        self.stamps[s.n & (len(self.stamps) - 1)] = ts
        s.append(value)

    def _first_after(self, t: float) -> int:
        """First retained position whose timestamp exceeds ``t``."""
        lo, hi = max(self.live, self.structure.oldest), self.structure.n
        while lo < hi:
            mid = (lo + hi) // 2
            if self._stamp(mid) <= t:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def positions(self, duration: float, now: float) -> tuple[int, int]:
        """Positions ``[a, b)`` of the window ``(now - duration, now]``."""
        if duration > self.max_duration:
            raise ValueError(f"duration {duration} exceeds the retained {self.max_duration}")
        return self._first_after(now - duration), self._first_after(now)

    def historical(self, start: float, end: float) -> tuple[int, int]:
        """Positions of the historical window ``(start, end]``."""
        return self._first_after(start), self._first_after(end)

    def lookup(self, duration: float, now: float) -> float:
        return self.structure.range(*self.positions(duration, now))
