"""A brute-force oracle for alert transitions, computed from raw events."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from evaluator.expr import expr_from_json
from evaluator.spec import Aggregate, BinOp, Condition, Expr, Num, SubscriptionSpec, Term

Event = tuple[str, int, float, float]  # key, ts, price, volume


def _quantile(window: list[Event], series: list[float], q: float | None) -> float | None:
    """The smallest value with at least q of the values at or below it."""
    ordered = sorted(series)
    return next((v for v in ordered if sum(x <= v for x in ordered) >= round((q or 0) * len(ordered), 9)), None)


def _last(window: list[Event], series: list[float], q: float | None) -> float | None:
    """The newest event's value; among equal times, the last to arrive."""
    if not window:
        return None
    newest = max(range(len(window)), key=lambda i: (window[i][1], i))
    return series[newest]


def _ordered(window: list[Event]) -> list[int]:
    """Indexes of the window's events by time, among equal times in arrival order."""
    return sorted(range(len(window)), key=lambda i: (window[i][1], i))


def _change(window: list[Event], series: list[float], q: float | None) -> float | None:
    """Newest value minus oldest."""
    if not window:
        return None
    order = _ordered(window)
    return series[order[-1]] - series[order[0]]


def _pct_change(window: list[Event], series: list[float], q: float | None) -> float | None:
    """Newest minus oldest, in percent of the oldest's magnitude; none when the oldest is 0."""
    if not window:
        return None
    order = _ordered(window)
    first, last = series[order[0]], series[order[-1]]
    if first == 0:
        return None
    value = 100.0 * (last - first) / abs(first)
    return value if math.isfinite(value) else None


#: Each aggregate by its definition, independently of evaluator/aggregates.py (a test checks both name the same
#: aggregates): ``(window events in arrival order, the attribute's values, param) -> value``; None: no value.
DEFINITIONS: dict[str, Callable[[list[Event], list[float], float | None], float | None]] = {
    "COUNT": lambda window, series, q: float(len(window)),
    "SUM": lambda window, series, q: math.fsum(series),
    "AVG": lambda window, series, q: math.fsum(series) / len(series) if series else None,
    "MIN": lambda window, series, q: min(series) if series else None,
    "MAX": lambda window, series, q: max(series) if series else None,
    "QUANTILE": _quantile,
    "LAST": _last,
    "CHANGE": _change,
    "PCT_CHANGE": _pct_change,
    "RATE": lambda window, series, q: None,  # per second of the window's length: see WINDOWED
}

#: Aggregates whose value also depends on the window's length (ms): ``(window, series, param, window_ms)``.
WINDOWED: dict[str, Callable[[list[Event], list[float], float | None, int], float | None]] = {
    "RATE": lambda window, series, q, window_ms: (None if (change := _change(window, series, q)) is None
                                                  else change / (window_ms / 1000)),
}


def term_of(term: Term | Any, window: list[Event], window_ms: int = 0) -> float | None:
    """One aggregate of a window of events, given in arrival order, by its definition.

    SUM and AVG are ``math.fsum`` of the raw values (correctly rounded), never a difference of
    running sums as the evaluator's structures keep them: their precision is what is tested.
    """
    term = expr_from_json(term)
    assert isinstance(term, Term)
    series = [e[2] if term.attribute == "price" else e[3] for e in window]
    if term.aggregate in WINDOWED:
        return WINDOWED[term.aggregate](window, series, term.param, window_ms)
    return DEFINITIONS[term.aggregate](window, series, term.param)


def expr_of(expr: Expr, window: list[Event], window_ms: int = 0) -> float | None:
    if isinstance(expr, Num):
        return expr.value
    if isinstance(expr, Term):
        return term_of(expr, window, window_ms)
    assert isinstance(expr, BinOp)
    left, right = expr_of(expr.left, window, window_ms), expr_of(expr.right, window, window_ms)
    if left is None or right is None or (expr.op == "/" and right == 0):
        return None
    value = {"+": left + right, "-": left - right, "*": left * right}.get(expr.op) if expr.op != "/" else left / right
    return value if math.isfinite(value) else None  # type: ignore[arg-type]  # every op gives a value


def value_of(c: Condition, window: list[Event]) -> float | None:
    if c.aggregate is not Aggregate.EXPR:
        return term_of(c.terms[0], window, c.window_ms)
    value = expr_of(c.expression, window, c.window_ms)  # type: ignore[arg-type]  # EXPR conditions have one
    if value is None or c.percent_of is None:
        return value
    last = term_of(Term("LAST", c.percent_of), window)
    return 100.0 * value / last if last else None


def window_of(c: Condition, key_events: list[Event], b: int, pane_ms: int, horizon_ms: int) -> list[Event]:
    """A key's window at boundary ``b``, from its events in arrival order: those whose pane lies in
    ``[b - T, b)``; for a tuple window, the ``n`` newest (by time, then arrival) of those in ``[b - horizon, b)``."""
    if c.events is None:
        return [e for e in key_events if b - c.window_ms <= e[1] // pane_ms * pane_ms < b]
    recent = [e for e in key_events if b - horizon_ms <= e[1] // pane_ms * pane_ms < b]
    return [recent[i] for i in _ordered(recent)][-c.events:]


def oracle(events: list[Event], specs: list[SubscriptionSpec], last_boundary: int, pane_ms: int,
           horizon_ms: int) -> set[tuple[int, str, str, int]]:
    """(subscription, key, state, boundary) of every transition, evaluating every pane boundary from the
    first pane with data: a key is watched while it has an event in the horizon; a key the subscription
    lists, always."""
    first = min(ts for _, ts, *_ in events) // pane_ms * pane_ms + pane_ms
    all_keys = {e[0] for e in events}
    by_key: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        by_key[e[0]].append(e)
    firing: dict[int, set[str]] = defaultdict(set)
    out = set()
    for b in range(first, last_boundary + 1, pane_ms):
        known = {k for k, ts, *_ in events if b - horizon_ms <= ts // pane_ms * pane_ms < b}
        for spec in specs:
            c = spec.condition
            matched = set()
            for key in known & all_keys if spec.keys is None else spec.keys:
                window = window_of(c, by_key[key], b, pane_ms, horizon_ms)
                if c.holds(value_of(c, window)):
                    matched.add(key)
            out |= {(spec.id, k, "firing", b) for k in matched - firing[spec.id]}
            out |= {(spec.id, k, "resolved", b) for k in firing[spec.id] - matched}
            firing[spec.id] = matched
    return out
