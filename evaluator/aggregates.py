"""Every aggregate a condition may use, each declared once, as one small class.

A declaration says everything the rest of Tocsin needs to know: its name and arguments
(the parser, :func:`format_term`), what answers it, its value function, its value for an
empty window, and its description in plain words (the preview, the form's help, the
the table in docs/conditions.md). The hypothesis tests iterate over :data:`AGGREGATES`, so a new aggregate
is this file plus its brute-force definition in ``tests/evaluator/oracle.py``.

Two things can answer an aggregate of one key's window ``[b - T, b)``:

- :class:`PaneAggregate` — the shard's collective indexes over pane summaries (each pane's
  count, and sum, min and max per attribute: CI-COUNT, CI-SUM, the MAX and MIN staircases).
  When ``index`` returns one of them, a range query over every key at once finds the
  candidates with their exact values; otherwise every watched key is computed.
- :class:`EventAggregate` — each key's retained events (:mod:`evaluator.values`): the
  window's values in time order, for what no pane summary answers (QUANTILE, LAST, CHANGE).

Every aggregate also has :meth:`Aggregation.of_events`, its value over a list of values: it
answers tuple windows (``OVER LAST 100 EVENTS``, :func:`tuple_value`), whose values are each
key's newest retained events, whatever the aggregate.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np
from typing_extensions import override

from evaluator.expr import Term

if TYPE_CHECKING:
    from evaluator.collective import CollectiveIndexes
    from evaluator.spec import Condition
    from evaluator.ssf.ci_extreme import CollectiveExtreme
    from evaluator.ssf.ci_sum import CollectiveSum
    from evaluator.values import KeyValues


class Columns(Protocol):
    """What answers aggregates of many keys' windows at once, by key id (a shard's running windows, see
    :mod:`evaluator.panestore`): float arrays, NaN where there is no value."""

    def count(self, window_ms: int, ids: np.ndarray) -> np.ndarray: ...

    def sum(self, window_ms: int, attribute: str, ids: np.ndarray) -> np.ndarray: ...

    def extreme(self, window_ms: int, side: str, attribute: str, ids: np.ndarray) -> np.ndarray: ...

    def events(self, window_ms: int, attribute: str, ids: np.ndarray) -> list[np.ndarray | None]: ...

    def tuples(self, condition: Condition, ids: np.ndarray) -> np.ndarray:
        """A tuple-window condition's values (``OVER LAST n EVENTS``) for the keys ``ids``, NaN: no value."""
        ...


class Sources(Protocol):
    """What answers aggregates of one key's window: a shard's collective indexes and retained events."""

    @property
    def indexes(self) -> CollectiveIndexes: ...

    @property
    def values(self) -> KeyValues: ...


def number_text(value: float) -> str:
    """Shortest text that parses back to exactly ``value``."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


@dataclass(frozen=True)
class Param:
    """An aggregate's extra numeric argument, after the attribute: ``QUANTILE(price, 0.95)``."""

    name: str  # in the syntax help: QUANTILE(attribute, q)
    expected: str  # what the parser says is missing
    valid: Callable[[float], bool]
    invalid: str  # why a value is refused; ``{value}`` is the value given
    examples: tuple[float, ...]  # valid values, edge cases included: the property tests draw from them


class Aggregation(ABC):
    name: ClassVar[str]
    summary: ClassVar[str]  # one line for the form's help and docs/conditions.md's table
    words: ClassVar[str]  # the preview's "fires for each key whose <words> ..."; {attribute}
    takes_attribute: ClassVar[bool] = True  # False: written NAME(*) or NAME()
    param: ClassVar[Param | None] = None
    aliases: ClassVar[Mapping[str, float]] = {}  # other names, each fixing the param: MEDIAN is QUANTILE(a, 0.5)
    empty: ClassVar[float | None] = None  # the value of an empty window; None: no value, no condition holds
    tuple_windows: ClassVar[bool] = True  # False: time windows only (OVER LAST n EVENTS is refused)

    def describe(self, term: Term) -> str:
        return self.words.format(attribute=term.attribute)

    @abstractmethod
    def value_of(self, sources: Sources, term: Term, window_ms: int, key: str, now: int) -> float | None:
        """The exact value of ``key``'s window of ``window_ms`` ending at ``now`` (the last pane stamp it holds)."""

    @abstractmethod
    def column(self, columns: Columns, term: Term, window_ms: int, ids: np.ndarray) -> np.ndarray:
        """The values of the keys ``ids`` at once (NaN: no value), equal to :meth:`value_of` bit for bit."""

    @abstractmethod
    def of_events(self, values: np.ndarray, param: float | None) -> float:
        """The value of a non-empty window's values, oldest first (among equal times, in arrival order); NaN: no
        value. Event aggregates are answered this way; every aggregate is, over a tuple window."""

    @property
    def syntax(self) -> str:
        args = [*(["attribute"] if self.takes_attribute else ["*"]), *([self.param.name] if self.param else [])]
        return f"{self.name}({', '.join(args)})"


class PaneAggregate(Aggregation):
    """Answered by the collective indexes over pane summaries (``sources.indexes`` in ``value_of``)."""

    def index(self, indexes: CollectiveIndexes, attribute: str | None) -> CollectiveSum | CollectiveExtreme | None:  # noqa: ARG002  # the default ignores them: no index
        """The index whose range queries find every key with a value in a range (None: none does)."""
        return None


class EventAggregate(Aggregation):
    """Answered by each key's retained events."""

    needs_every_event: ClassVar[bool] = True  # False: the newest event is enough beyond the values' retention

    @override
    def value_of(self, sources: Sources, term: Term, window_ms: int, key: str, now: int) -> float | None:
        values = sources.values.window(key, term.attribute, window_ms, now + 1)  # type: ignore[arg-type]  # takes_attribute
        if values is None:
            return self.empty
        value = self.of_events(values, term.param)
        return None if math.isnan(value) else value

    @override
    def column(self, columns: Columns, term: Term, window_ms: int, ids: np.ndarray) -> np.ndarray:
        # Per key: a window's events are what the value is made of (no summary answers it), so the cost is per
        # changed key only, never per key watched.
        empty = np.nan if self.empty is None else self.empty
        windows = columns.events(window_ms, term.attribute, ids)  # type: ignore[arg-type]  # takes_attribute
        return np.array([empty if v is None else self.of_events(v, term.param) for v in windows], dtype=np.float64)


# -- over pane summaries ----------------------------------------------------------------------------


class Count(PaneAggregate):
    name = "COUNT"
    summary = "the number of events"
    words = "number of events"
    takes_attribute = False
    empty = 0.0

    @override
    def index(self, indexes: CollectiveIndexes, attribute: str | None) -> CollectiveSum:
        return indexes.count

    @override
    def value_of(self, sources: Sources, term: Term, window_ms: int, key: str, now: int) -> float:
        return sources.indexes.count.value(key, window_ms, now)

    @override
    def column(self, columns: Columns, term: Term, window_ms: int, ids: np.ndarray) -> np.ndarray:
        return columns.count(window_ms, ids)

    @override
    def of_events(self, values: np.ndarray, param: float | None) -> float:
        return float(values.size)


class Sum(PaneAggregate):
    name = "SUM"
    summary = "the sum of the attribute's values"
    words = "sum of {attribute}"
    empty = 0.0

    @override
    def index(self, indexes: CollectiveIndexes, attribute: str | None) -> CollectiveSum:
        return indexes.sums[attribute]  # type: ignore[index]  # an attribute is required (takes_attribute)

    @override
    def value_of(self, sources: Sources, term: Term, window_ms: int, key: str, now: int) -> float:
        return sources.indexes.sums[term.attribute].value(key, window_ms, now)  # type: ignore[index]  # as in index()

    @override
    def column(self, columns: Columns, term: Term, window_ms: int, ids: np.ndarray) -> np.ndarray:
        return columns.sum(window_ms, term.attribute, ids)  # type: ignore[arg-type]  # takes_attribute

    @override
    def of_events(self, values: np.ndarray, param: float | None) -> float:
        return math.fsum(values.tolist())  # correctly rounded, as the panes' exact sums are


class Avg(PaneAggregate):
    name = "AVG"
    summary = "the mean of the attribute's values (SUM over COUNT)"
    words = "average {attribute}"

    @override
    def value_of(self, sources: Sources, term: Term, window_ms: int, key: str, now: int) -> float | None:
        count = sources.indexes.count.value(key, window_ms, now)
        if not count:
            return None
        return sources.indexes.sums[term.attribute].value(key, window_ms, now) / count  # type: ignore[index]  # takes_attribute

    @override
    def column(self, columns: Columns, term: Term, window_ms: int, ids: np.ndarray) -> np.ndarray:
        count = columns.count(window_ms, ids)
        total = columns.sum(window_ms, term.attribute, ids)  # type: ignore[arg-type]  # takes_attribute
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(count > 0, total / np.where(count > 0, count, 1.0), np.nan)

    @override
    def of_events(self, values: np.ndarray, param: float | None) -> float:
        return math.fsum(values.tolist()) / values.size


class _Extreme(PaneAggregate):
    """MAX or MIN: answered by the extreme index of its side (``maxs`` or ``mins``), exactly."""

    side: ClassVar[str]  # the CollectiveIndexes attribute holding this extreme's index per attribute

    @override
    def index(self, indexes: CollectiveIndexes, attribute: str | None) -> CollectiveExtreme:
        return getattr(indexes, self.side)[attribute]  # an attribute is required (takes_attribute)

    @override
    def value_of(self, sources: Sources, term: Term, window_ms: int, key: str, now: int) -> float | None:
        return getattr(sources.indexes, self.side)[term.attribute].value(key, window_ms, now)

    @override
    def column(self, columns: Columns, term: Term, window_ms: int, ids: np.ndarray) -> np.ndarray:
        return columns.extreme(window_ms, self.side, term.attribute, ids)  # type: ignore[arg-type]  # takes_attribute


class Max(_Extreme):
    name = "MAX"
    summary = "the highest value"
    words = "highest {attribute}"
    side = "maxs"

    @override
    def of_events(self, values: np.ndarray, param: float | None) -> float:
        return float(values.max())


class Min(_Extreme):
    name = "MIN"
    summary = "the lowest value"
    words = "lowest {attribute}"
    side = "mins"

    @override
    def of_events(self, values: np.ndarray, param: float | None) -> float:
        return float(values.min())


# -- over each key's events ---------------------------------------------------------------------------


def quantile_rank(q: float, n: int) -> int:
    """1-based rank of the q-quantile of n values: the smallest value with at least q·n values at or below it.

    (``q·n`` is rounded to 9 decimals first, so that 0.1 · 30 is 3 and not 3.0000000000000004.)
    """
    return max(1, math.ceil(round(q * n, 9)))


class Quantile(EventAggregate):
    name = "QUANTILE"
    summary = "the q-quantile: the smallest value with at least q of the window's values at or below it"
    words = "{q}th percentile of {attribute}"
    param = Param("q", "',' and the quantile's fraction, as in QUANTILE(price, 0.95)", lambda q: 0 < q <= 1,
                  "a quantile's fraction is between 0 and 1 (0.95 for the 95th percentile), not {value:g}",
                  (0.1, 0.5, 0.9, 1.0))
    aliases: ClassVar[Mapping[str, float]] = {"MEDIAN": 0.5}

    @override
    def describe(self, term: Term) -> str:
        q = term.param or 0.0
        return f"median {term.attribute}" if q == 0.5 else self.words.format(
            q=number_text(q * 100), attribute=term.attribute)

    @override
    def of_events(self, values: np.ndarray, param: float | None) -> float:
        k = quantile_rank(param or 0.0, values.size) - 1
        return float(np.partition(values, k)[k])


class Last(EventAggregate):
    name = "LAST"
    summary = "the value of the newest event"
    words = "latest {attribute}"
    needs_every_event = False

    @override
    def of_events(self, values: np.ndarray, param: float | None) -> float:
        return float(values[-1])


class Change(EventAggregate):
    """The window's last value minus its first (PromQL ``delta``, without extrapolation).

    From the retained events, like QUANTILE: the first value of a window is no pane summary's (a pane's
    first value would need two more columns per attribute in every pane row, for one aggregate)."""

    name = "CHANGE"
    summary = "the newest value minus the oldest (one event: 0)"
    words = "change of {attribute}"

    @override
    def of_events(self, values: np.ndarray, param: float | None) -> float:
        return float(values[-1] - values[0])


class PctChange(EventAggregate):
    """CHANGE as a percentage of the window's first value: what ``CHANGE(price) OVER 5m > 3%`` compares."""

    name = "PCT_CHANGE"
    summary = ("the newest value minus the oldest, in % of the oldest's magnitude (no value if the oldest is 0); "
               "CHANGE(attribute) ... > x% is written with it")
    words = "change of {attribute} in % of its first value"

    @override
    def of_events(self, values: np.ndarray, param: float | None) -> float:
        first = float(values[0])
        if first == 0:
            return math.nan
        value = 100.0 * (float(values[-1]) - first) / abs(first)
        return value if math.isfinite(value) else math.nan


class Rate(EventAggregate):
    """CHANGE per second of the window's length (PromQL ``delta`` / range): over a time window only, as a tuple
    window has no length."""

    name = "RATE"
    summary = "the newest value minus the oldest, per second of the window (time windows only)"
    words = "change of {attribute} per second"
    tuple_windows = False

    @override
    def of_events(self, values: np.ndarray, param: float | None) -> float:
        return float(values[-1] - values[0])  # per window: value_of and column divide by its length

    @override
    def value_of(self, sources: Sources, term: Term, window_ms: int, key: str, now: int) -> float | None:
        change = super().value_of(sources, term, window_ms, key, now)
        return None if change is None else change / (window_ms / 1000)

    @override
    def column(self, columns: Columns, term: Term, window_ms: int, ids: np.ndarray) -> np.ndarray:
        return super().column(columns, term, window_ms, ids) / (window_ms / 1000)


def mean_and_deviation(series: list[float]) -> tuple[float, float]:
    """The mean and the population standard deviation of a non-empty window's values, two-pass over correctly rounded
    sums (``math.fsum``): no cancellation of a sum of squares less a squared sum, so a price of 10,000,000 moving by
    cents keeps its digits."""
    # The exact mean lies within [min, max]; the rounded one may not (three equal values: sum rounded, then /3), and
    # would give equal values a spread. Clamped, equal values give exactly 0.
    n = len(series)
    mean = min(max(math.fsum(series) / n, min(series)), max(series))
    # The corrected two-pass form: the rounded mean is off the exact one by some d, which adds n*d^2 to the sum of
    # squared deviations; the deviations' own sum is -n*d, so its square over n takes it out again. Without it a
    # pair of values near 1e12 that differ by 76 came out 1.3e-12 off (their z-score 0.99999999999871, not 1).
    deviations = [x - mean for x in series]
    drift = math.fsum(deviations)
    variance = (math.fsum(d * d for d in deviations) - drift * drift / n) / n
    return mean, math.sqrt(max(variance, 0.0))


class StdDev(EventAggregate):
    """The population standard deviation, as PromQL's ``stddev_over_time`` and Grafana's StdDev reducer: from the
    retained events, since a pane's sum and sum of squares would give it only by a cancelling difference."""

    name = "STDDEV"
    summary = "the population standard deviation of the values (one event: 0)"
    words = "standard deviation of {attribute}"

    @override
    def of_events(self, values: np.ndarray, param: float | None) -> float:
        value = mean_and_deviation(values.tolist())[1]
        return value if math.isfinite(value) else math.nan


class ZScore(EventAggregate):
    """How unusual the newest value is against its own window: ``ZSCORE(price) OVER 1h > 2`` is "the price is more
    than two standard deviations above its 1-hour mean"."""

    name = "ZSCORE"
    summary = "the newest value minus the mean, in standard deviations (no value when every value is the same)"
    words = "standard score of the latest {attribute}"

    @override
    def of_events(self, values: np.ndarray, param: float | None) -> float:
        series = values.tolist()
        deviation = mean_and_deviation(series)[1]
        if deviation == 0 or not math.isfinite(deviation):
            return math.nan
        # newest - mean as (n * newest - sum) / n, the sum correctly rounded: newest - (rounded mean) would carry the
        # mean's rounding (an ulp of 10,000,000 is 2e-9) into a difference that may be a cent
        newest = series[-1]
        value = math.fsum([newest] * len(series) + [-x for x in series]) / len(series) / deviation
        return value if math.isfinite(value) else math.nan


AGGREGATES: dict[str, Aggregation] = {a.name: a for a in (Count(), Sum(), Avg(), Min(), Max(), Quantile(), Last(),
                                                          Change(), PctChange(), Rate(), StdDev(), ZScore())}

#: Every name the parser accepts, with the aggregate it means and the param an alias fixes.
SPELLINGS: dict[str, tuple[Aggregation, float | None]] = {
    **{name: (a, None) for name, a in AGGREGATES.items()},
    **{alias: (a, param) for a in AGGREGATES.values() for alias, param in a.aliases.items()},
}


def check_term(term: Term) -> None:
    """Raise ValueError unless ``term`` names a declared aggregate with the arguments it takes."""
    aggregate = AGGREGATES.get(term.aggregate)
    if aggregate is None:
        raise ValueError(f"unknown aggregate {term.aggregate!r}")
    if aggregate.takes_attribute and not term.attribute:
        raise ValueError(f"{aggregate.name} needs an attribute")
    if (aggregate.param is None) != (term.param is None):
        raise ValueError(f"{aggregate.name} takes {'no argument' if aggregate.param is None else 'an argument'} "
                         "after the attribute")
    if aggregate.param is not None and term.param is not None and not aggregate.param.valid(term.param):
        raise ValueError(aggregate.param.invalid.format(value=term.param))


def format_term(term: Term) -> str:
    """The canonical text of one aggregate (parses back to ``term``)."""
    aggregate = AGGREGATES[term.aggregate]
    args = [term.attribute if aggregate.takes_attribute else "*"]
    if term.param is not None:
        args.append(number_text(term.param))
    return f"{aggregate.name}({', '.join(a or '' for a in args)})"


# -- tuple windows: the last n events of each key ---------------------------------------------------------


def tuple_term(last_events: Callable[[str | None], np.ndarray | None], term: Term) -> float | None:
    """One aggregate over a tuple window, ``last_events(attribute)`` giving its values (None: no event)."""
    aggregate = AGGREGATES[term.aggregate]
    values = last_events(term.attribute)
    if values is None or not values.size:
        return aggregate.empty
    value = aggregate.of_events(values, term.param)
    return None if math.isnan(value) else value
