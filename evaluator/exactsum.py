"""Exact sums of floats: each float as a whole number of units of ``2**-shift``.

Every finite float is ``m * 2**e`` with integer ``m``, so in units of ``2**-shift``
(``shift`` at least ``-e`` for every value seen) it is an integer, and sums and
differences of integers are exact. A window sum taken as the difference of two such
prefix sums is the exact sum of the window's elements, rounded once when turned back
into a float (``int / int`` is correctly rounded): its error is half an ulp of the
result, whatever the key's history. Float prefix sums lose the small values of a
window once the history before it is large.

``shift`` only grows, to the finest bit seen (55 for 0.1, 0 for counts), so the
integers stay a few machine words for the usual values; a holder multiplies what it
stores by ``2**grow`` when a value needs a finer unit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


class FixedPoint:
    __slots__ = ("one", "shift")

    def __init__(self) -> None:
        self.shift = 0
        self.one = 1  # 2**shift: one float unit in integer units

    def units(self, value: float) -> tuple[int, int]:
        """``(value in units, grow)``: the holder must shift what it stores left by ``grow`` first."""
        n, d = value.as_integer_ratio()  # ValueError / OverflowError for NaN and inf: never summed
        need = d.bit_length() - 1  # d is a power of two
        grow = need - self.shift
        if grow > 0:
            self.shift, self.one = need, d
            return n, grow
        return n << -grow, 0

    def many(self, values: Iterable[float]) -> tuple[list[int], int]:
        """:meth:`units` of several values at once, in the unit of the finest of them."""
        ratios = [v.as_integer_ratio() for v in values]
        need = max((d.bit_length() - 1 for _, d in ratios), default=0)
        grow = max(need - self.shift, 0)
        if grow:
            self.shift, self.one = need, 1 << need
        shift = self.shift
        return [n << (shift - d.bit_length() + 1) for n, d in ratios], grow

    def to_float(self, units: int) -> float:
        """The float nearest to ``units`` (correctly rounded); ±inf beyond the float range."""
        try:
            return units / self.one
        except OverflowError:
            return math.copysign(math.inf, units)
