"""What the evaluator is asked: conditions over sliding-window aggregates of substreams.

A subscription asks, for every key in its key filter, whether
``aggregate(attribute over the last window_ms of that key's events)`` (or an
expression over such aggregates, evaluator/expr.py) lies in the ranges its
comparison accepts (evaluator/comparators.py). The aggregates are those declared
in evaluator/aggregates.py. These are plain frozen values so they cross process
boundaries (Spark workers, Redis snapshots) as JSON.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from enum import EnumMeta, StrEnum
from typing import TYPE_CHECKING, Any

from core.stream_names import TRADES
from evaluator.aggregates import AGGREGATES, check_term
from evaluator.comparators import Range
from evaluator.expr import (
    EXPR_TYPES,
    OPERATORS,
    BinOp,
    Expr,
    Num,
    Term,
    combine,
    expr_from_json,
    expr_terms,
    term_windows,
)
from evaluator.lifecycle import Lifecycle, contains
from evaluator.rank import Rank

__all__ = ["OPERATORS", "Aggregate", "BinOp", "Condition", "Expr", "Num", "Range", "SubscriptionSpec", "Term",
           "combine", "expr_terms"]

if TYPE_CHECKING:
    class _Members(EnumMeta):
        def __getattr__(cls, name: str) -> Aggregate: ...

    class Aggregate(StrEnum, metaclass=_Members):
        """What a condition compares: a declared aggregate, or ``EXPR`` (``Condition.expression``)."""
else:
    # The members are the registry's names (evaluator/aggregates.py), plus EXPR: declaring an aggregate there
    # is enough. For the type checker, above, any member name is an Aggregate.
    Aggregate = StrEnum("Aggregate", [(name, name) for name in (*AGGREGATES, "EXPR")])


@dataclass(frozen=True, slots=True)
class Condition:
    """``aggregate(attribute) OVER window_ms`` in the range (low, high), or in one of ``ranges``.

    Either bound may be absent (``None``); each may be inclusive. A comparator that accepts
    more than one range (evaluator/comparators.py) gives ``ranges`` instead of bounds; one
    range given that way is kept as the bounds, so equal conditions compare equal. An
    aggregate with no value (AVG/MIN/MAX of an empty window) satisfies no condition.
    ``q`` is the aggregate's argument (QUANTILE's fraction); ``EXPR`` computes ``expression``
    and, with ``percent_of``, compares it as a percentage of that attribute's last value.
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
    events: int | None = None  # a tuple window: the key's last ``events`` events (window_ms is then 0)
    no_data: bool = False  # written NO DATA FOR window: COUNT(*) OVER window <= 0, formatted as written
    ranges: tuple[Range, ...] = ()  # two or more; empty: the one range (low, high)
    # Pending, keep-firing, hysteresis, damping, crossing (evaluator/lifecycle.py); None: plain edges. Not part of
    # the value asked, so subscriptions differing only in it share one group in the shard.
    lifecycle: Lifecycle | None = None
    # Which substream the value is over (issue 15): the stream's name, dimension filters ``((dimension, values),
    # …)`` (each dimension IN its values, all of them ANDed; sorted, so equal filters compare equal) and a key
    # prefix. Part of the value asked: subscriptions on different streams or filters never share a group.
    stream: str = TRADES
    where: tuple[tuple[str, tuple[str, ...]], ...] = ()
    key_prefix: str | None = None
    # IN TOP k / IN BOTTOM k (evaluator/rank.py): a key's place among the view's keys by the value, instead of ranges.
    rank: Rank | None = None
    computes: Expr = field(init=False, compare=False, repr=False)  # the expression, or the one term: built once


    def __post_init__(self) -> None:
        self._check_window()
        self._check_substream()
        if not isinstance(self.aggregate, Aggregate):
            object.__setattr__(self, "aggregate", Aggregate(self.aggregate))
        if self.expression is not None and not isinstance(self.expression, EXPR_TYPES):
            object.__setattr__(self, "expression", expr_from_json(self.expression))  # the wire form, or a tuple
        if len(self.ranges) == 1:
            [r] = self.ranges
            for name in ("low", "high", "low_inclusive", "high_inclusive"):
                object.__setattr__(self, name, getattr(r, name))
            object.__setattr__(self, "ranges", ())
        if self.ranges and (self.low is not None or self.high is not None):
            raise ValueError("give bounds or ranges, not both")
        if isinstance(self.rank, dict):
            object.__setattr__(self, "rank", Rank.from_dict(self.rank))
        if self.rank is not None:
            self._check_rank()
        elif self.low is None and self.high is None and not self.ranges:
            raise ValueError("a condition needs at least one bound")
        if self.aggregate is Aggregate.EXPR:
            terms = expr_terms(self.expression) if self.expression is not None else []
            if not terms:
                raise ValueError("an expression needs at least one aggregate")
        else:
            terms = [Term(self.aggregate.value, self.attribute, self.q)]
        for term in terms:
            check_term(term)
        object.__setattr__(self, "computes", self.expression if self.aggregate is Aggregate.EXPR else terms[0])
        self._check_term_windows(terms)
        self._check_lifecycle()
        self.check_tuple_window()

    def _check_lifecycle(self) -> None:
        life = self.lifecycle
        if isinstance(life, dict):
            life = Lifecycle.from_dict(life)
        if life is not None and life.trivial:
            life = None
        object.__setattr__(self, "lifecycle", life)
        if life is None:
            return
        if life.crossing is not None and (self.ranges or (self.low is None) == (self.high is None)
                                          or self.low_inclusive or self.high_inclusive):
            raise ValueError("a crossing's raw truth is one open half-line")
        if life.crossing == "either" and self.low is None:
            raise ValueError("a two-way crossing is above its threshold (and, internally, below)")
        if life.resolve is not None and not all(contains(life.resolve, r) for r in self.accepted):
            raise ValueError("the resolve range must contain the firing range")

    def _check_rank(self) -> None:
        """A rank takes the place of the ranges, over a time window, without lifecycle clauses."""
        if self.low is not None or self.high is not None or self.ranges or self.no_data:
            raise ValueError("a rank condition has no thresholds")
        if self.events is not None:
            raise ValueError("a rank is over a time window, not over LAST n EVENTS")
        if self.lifecycle is not None:
            raise ValueError("a rank condition takes no FOR, KEEP FIRING, RESOLVE, DAMPEN or crossing")

    def _check_substream(self) -> None:
        """Normalise ``where`` (sorted, values sorted and distinct; also from its JSON lists) and check it."""
        if self.where:  # most conditions have none: a catalog's decode skips the sorting
            where = tuple(sorted((str(dimension), tuple(sorted({str(v) for v in values})))
                                 for dimension, values in self.where))
            dimensions = [dimension for dimension, _ in where]
            if len(set(dimensions)) != len(dimensions):
                raise ValueError("a dimension is filtered at most once (list its values: dim IN ('a', 'b'))")
            if any(not values for _, values in where):
                raise ValueError("a dimension filter needs at least one value")
            object.__setattr__(self, "where", where)
        else:
            object.__setattr__(self, "where", ())
        if self.key_prefix is not None and not self.key_prefix:
            raise ValueError("a key prefix is not empty")

    @property
    def view(self) -> str:
        """The substream's filters as one canonical string ("" for the whole stream): equal filters, equal views."""
        return json.dumps(self.where, separators=(",", ":")) if self.where else ""

    def _check_window(self) -> None:
        """A time window is positive; a tuple window has no duration (window_ms 0) and holds at least one event."""
        if self.events is None:
            if self.window_ms <= 0:
                raise ValueError("window must be positive")
        elif self.window_ms != 0 or self.events < 1:
            raise ValueError("a tuple window has window_ms 0 and at least one event")

    def _check_term_windows(self, terms: list[Term]) -> None:
        """A key against its own baseline: either no term has its own window (every one is over ``window_ms``), or
        every one has, over two lengths or more, and ``window_ms`` is the longest (what the condition looks at: its
        transitions' window). One canonical form, so equal conditions compare equal and share a group."""
        own = [t.window_ms for t in terms if t.window_ms is not None]
        if not own:
            return
        if self.events is not None:
            raise ValueError("a condition over a tuple window has no term with a time window of its own")
        if len(own) != len(terms) or len(set(own)) < 2:
            raise ValueError("give every term its own window, over two lengths or more (one length: the condition's "
                             "window)")
        if any(ms <= 0 for ms in own):
            raise ValueError("window must be positive")
        if self.window_ms != max(own):
            raise ValueError("a condition's window is the longest of its terms'")

    @property
    def windows(self) -> frozenset[int]:
        """Every window length it reads (a tuple window: 0): its terms', or its one window."""
        return frozenset(term_windows(self.computes) or {self.window_ms})

    def check_tuple_window(self) -> None:
        """Raise ValueError if a tuple window uses an aggregate that has none, or NO DATA is not COUNT(*) <= 0 over
        a time window (after the fields are normalised)."""
        if self.no_data and (self.events is not None or self.aggregate.value != "COUNT" or self.low is not None
                             or self.high != 0 or not self.high_inclusive or self.ranges):
            raise ValueError("NO DATA is COUNT(*) <= 0 over a time window")
        for term in self.terms if self.events is not None else ():
            if not AGGREGATES[term.aggregate].tuple_windows:
                raise ValueError(f"{term.aggregate} is over a time window only, not over LAST n EVENTS")

    @property
    def terms(self) -> list[Term]:
        """The window aggregates this condition needs per key."""
        return expr_terms(self.computes)

    @property
    def accepted(self) -> tuple[Range, ...]:
        """The ranges of values that satisfy the condition."""
        return self.ranges or (Range(self.low, self.high, self.low_inclusive, self.high_inclusive),)

    def holds(self, value: float | None) -> bool:
        """Whether ``value`` satisfies the ranges (a rank condition's ranges accept every value: its rank decides)."""
        if value is None or math.isnan(value):
            return False
        if self.ranges:
            return any(r.holds(value) for r in self.ranges)
        if self.low is not None and (value < self.low or (value == self.low and not self.low_inclusive)):
            return False
        return not (self.high is not None and (value > self.high or (value == self.high and not self.high_inclusive)))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; ``ranges`` only when there are several, so one-range conditions read as they always did."""
        data = {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("ranges", "computes", "lifecycle")}
        for name, default in (("events", None), ("no_data", False), ("stream", TRADES), ("where", ()),
                              ("key_prefix", None)):  # written only when used: older readers, and ids, unchanged
            if data[name] == default:
                del data[name]
        data["aggregate"] = self.aggregate.value
        data["expression"] = self.expression.to_json() if self.expression is not None else None
        if self.ranges:
            data["ranges"] = [[r.low, r.high, r.low_inclusive, r.high_inclusive] for r in self.ranges]
        if self.lifecycle is not None:  # absent otherwise: a plain condition reads as it always did
            data["lifecycle"] = self.lifecycle.to_dict()
        del data["rank"]
        if self.rank is not None:
            data["rank"] = self.rank.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Condition:
        kwargs = {**data, "aggregate": Aggregate(data["aggregate"])}
        if data.get("expression"):
            kwargs["expression"] = expr_from_json(data["expression"])
        if data.get("where"):
            kwargs["where"] = tuple((d, tuple(values)) for d, values in data["where"])
        if data.get("ranges"):
            kwargs["ranges"] = tuple(Range(*r) for r in data["ranges"])
        if data.get("lifecycle"):
            kwargs["lifecycle"] = Lifecycle.from_dict(data["lifecycle"])
        if data.get("rank"):
            kwargs["rank"] = Rank.from_dict(data["rank"])
        return cls(**kwargs)


@dataclass(frozen=True, slots=True)
class SubscriptionSpec:
    """One active subscription as the evaluator sees it. ``keys`` of ``None`` means every key."""

    id: int
    condition: Condition
    keys: frozenset[str] | None = None
    text: str = field(default="", compare=False)

    def applies_to(self, key: str) -> bool:
        prefix = self.condition.key_prefix
        return (self.keys is None or key in self.keys) and (prefix is None or key.startswith(prefix))

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
