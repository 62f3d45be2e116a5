"""Tuple windows (``AVG(price) OVER LAST 100 EVENTS``): a condition over each key's newest events.

Arasu and Widom's tuple-based windows, over event time: at boundary ``b`` the window of a key
holds its ``n`` newest events with ``b - horizon <= ts < b`` (ties in arrival order), from the
events the shard retains (:mod:`evaluator.values` keeps each key's newest
``TOCSIN_TUPLE_MAX_EVENTS`` besides the quantiles' retention). A late event takes its place by
event time from the next evaluated boundary on, pushing out the oldest if it is among the ``n``
newest; an older one changes nothing. Every declared aggregate answers a list of values
(:meth:`~evaluator.aggregates.Aggregation.of_events`), so every one works over a tuple window
unless it says otherwise (``tuple_windows = False``).

A key's tuple window changes only when the key gets an event (or leaves the horizon), which
is when the shard marks it changed: the incremental plan recomputes it for those keys only
and flips members through the sorted range endpoints, like any other group.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from evaluator.aggregates import tuple_term
from evaluator.expr import BinOp, Expr, Num, Term, combine
from evaluator.spec import Condition

LastEvents = Callable[[str | None], "np.ndarray | None"]  # attribute (None: any) -> the window's values


def _expr(expr: Expr, last_events: LastEvents) -> float | None:
    if isinstance(expr, Term):
        return tuple_term(last_events, expr)
    if isinstance(expr, Num):
        return expr.value
    assert isinstance(expr, BinOp)
    left = _expr(expr.left, last_events)
    right = _expr(expr.right, last_events) if left is not None else None
    if left is None or right is None:
        return None
    return combine(expr.op, left, right)


def tuple_value(condition: Condition, last_events: LastEvents) -> float | None:
    """What ``condition`` (a tuple window) compares for one key, as ``ShardEvaluator.value`` does for time
    windows (a percentage is of the window's last value of ``percent_of``)."""
    value = _expr(condition.computes, last_events)
    if value is None or condition.percent_of is None:
        return value
    last = tuple_term(last_events, Term("LAST", condition.percent_of))
    return combine("/", 100.0 * value, last) if last is not None else None


def tuple_column(condition: Condition, last_events_of: Callable[[int], LastEvents], ids: np.ndarray) -> np.ndarray:
    """:func:`tuple_value` for the key ids ``ids`` (NaN: no value); per key, as only changed keys are asked."""
    out = np.empty(ids.size, dtype=np.float64)
    for i, k in enumerate(ids.tolist()):
        value = tuple_value(condition, last_events_of(k))
        out[i] = np.nan if value is None else value
    return out
