"""Every comparison a condition may end with, each declared once as the value ranges it accepts.

A comparator is its syntax (words and symbols, ``{}`` for each threshold), its plain
words, and the union of intervals its thresholds accept. The parser, the canonical
text, the preview's description, the form's help and the shard read this table; the
shard answers any comparator through its ranges (a collective index answers one
range; a union is a union of range queries). A new comparator (``NOT BETWEEN``,
``!=``) is one entry here; the oracle tests pick comparators from this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Range:
    """Values between ``low`` and ``high``; an absent bound (None) is unbounded on that side."""

    low: float | None = None
    high: float | None = None
    low_inclusive: bool = False
    high_inclusive: bool = False

    def holds(self, value: float) -> bool:
        if self.low is not None and (value < self.low or (value == self.low and not self.low_inclusive)):
            return False
        return not (self.high is not None and (value > self.high or (value == self.high and not self.high_inclusive)))


@dataclass(frozen=True)
class Comparator:
    syntax: str  # "BETWEEN {} AND {}": words (case-insensitive) and symbols, one {} per threshold
    words: str  # "is between {} and {}", for the preview
    ranges: Callable[..., tuple[Range, ...]]  # the thresholds, ascending -> the values accepted

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(self.syntax.split())

    @property
    def arity(self) -> int:
        return self.syntax.count("{}")

    def thresholds_of(self, ranges: tuple[Range, ...]) -> tuple[float, ...] | None:
        """The thresholds for which this comparator accepts exactly ``ranges`` (None: it never does)."""
        ends = [e for r in ranges for e in (r.low, r.high) if e is not None]
        for thresholds in (tuple(ends), tuple(dict.fromkeys(ends))):
            if len(thresholds) == self.arity and self.ranges(*thresholds) == ranges:
                return thresholds
        return None


COMPARATORS: tuple[Comparator, ...] = (
    Comparator("> {}", "is above {}", lambda t: (Range(low=t),)),
    Comparator(">= {}", "is at least {}", lambda t: (Range(low=t, low_inclusive=True),)),
    Comparator("< {}", "is below {}", lambda t: (Range(high=t),)),
    Comparator("<= {}", "is at most {}", lambda t: (Range(high=t, high_inclusive=True),)),
    Comparator("BETWEEN {} AND {}", "is between {} and {}", lambda a, b: (Range(a, b, True, True),)),
)


def comparator_of(ranges: tuple[Range, ...]) -> tuple[Comparator, tuple[float, ...]]:
    """The comparator and thresholds that write ``ranges`` (ValueError when none does)."""
    for comparator in COMPARATORS:
        thresholds = comparator.thresholds_of(ranges)
        if thresholds is not None:
            return comparator, thresholds
    raise ValueError(f"no comparator accepts exactly {ranges}")


@dataclass(frozen=True)
class Crossing:
    """A crossing (evaluator/lifecycle.py): an event when the value moves onto ``side(threshold)``.

    ``either`` crosses up or down: its raw truth is the upper side, plus an internal member for the lower one.
    """

    direction: str  # "above", "below" or "either"
    syntax: str  # "CROSSES ABOVE {}"
    words: str  # "crosses above {}"
    side: Callable[[float], Range]  # the range the condition's raw truth is


CROSSINGS: tuple[Crossing, ...] = (
    Crossing("above", "CROSSES ABOVE {}", "crosses above {}", lambda t: Range(low=t)),
    Crossing("below", "CROSSES BELOW {}", "crosses below {}", lambda t: Range(high=t)),
    Crossing("either", "CROSSES {}", "crosses {}", lambda t: Range(low=t)),
)


def crossing_of(direction: str) -> Crossing:
    return next(c for c in CROSSINGS if c.direction == direction)
