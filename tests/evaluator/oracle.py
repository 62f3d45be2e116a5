"""A brute-force oracle for alert transitions, computed from raw events."""

from __future__ import annotations

import math
from collections import defaultdict

from evaluator.spec import Aggregate, Condition, Expr, SubscriptionSpec

Event = tuple[str, int, float, float]  # key, ts, price, volume


def term_of(term: Expr, window: list[Event]) -> float | None:
    """One aggregate of a window of events, given in arrival order, by its definition.

    SUM and AVG are ``math.fsum`` of the raw values (correctly rounded), never a difference of
    running sums as the evaluator's structures keep them: their precision is what is tested.
    """
    _, aggregate, attribute, q = term
    series = [e[2] if attribute == "price" else e[3] for e in window]
    if aggregate == "COUNT":
        return float(len(window))
    if aggregate == "SUM":
        return math.fsum(series)
    if not series:
        return None
    if aggregate == "QUANTILE":  # the smallest value with at least q of the values at or below it
        ordered = sorted(series)
        return next(v for v in ordered if sum(x <= v for x in ordered) >= round(q * len(ordered), 9))
    if aggregate == "LAST":  # the newest event; among equal times, the last to arrive
        return max(enumerate(window), key=lambda ie: (ie[1][1], ie[0]))[1][2 if attribute == "price" else 3]
    return {"AVG": math.fsum(series) / len(series), "MIN": min(series), "MAX": max(series)}[aggregate]


def expr_of(expr: Expr, window: list[Event]) -> float | None:
    if expr[0] == "num":
        return expr[1]
    if expr[0] == "agg":
        return term_of(expr, window)
    left, right = expr_of(expr[1], window), expr_of(expr[2], window)
    if left is None or right is None or (expr[0] == "/" and right == 0):
        return None
    value = {"+": left + right, "-": left - right, "*": left * right}.get(expr[0]) if expr[0] != "/" else left / right
    return value if math.isfinite(value) else None


def value_of(c: Condition, window: list[Event]) -> float | None:
    if c.aggregate is not Aggregate.EXPR:
        return term_of(c.terms[0], window)
    value = expr_of(c.expression, window)
    if value is None or c.percent_of is None:
        return value
    last = term_of(("agg", "LAST", c.percent_of, None), window)
    return 100.0 * value / last if last else None


def oracle(events: list[Event], specs: list[SubscriptionSpec], last_boundary: int, pane_ms: int,
           horizon_ms: int) -> set[tuple[int, str, str, int]]:
    """(subscription, key, state, boundary) of every transition, evaluating every pane boundary from the
    first pane with data: a key is watched while it has an event in the horizon or is firing."""
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
            for key in (known | firing[spec.id]) & (spec.keys or all_keys):
                window = [e for e in by_key[key] if b - c.window_ms <= e[1] // pane_ms * pane_ms < b]
                if c.holds(value_of(c, window)):
                    matched.add(key)
            out |= {(spec.id, k, "firing", b) for k in matched - firing[spec.id]}
            out |= {(spec.id, k, "resolved", b) for k in firing[spec.id] - matched}
            firing[spec.id] = matched
    return out
