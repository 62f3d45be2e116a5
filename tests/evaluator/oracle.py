"""A brute-force oracle for alert transitions, computed from raw events."""

from __future__ import annotations

from collections import defaultdict

from evaluator.spec import Aggregate, Condition, SubscriptionSpec

Event = tuple[str, int, float, float]  # key, ts, price, volume


def value_of(c: Condition, window: list[Event]) -> float | None:
    prices, volumes = [e[2] for e in window], [e[3] for e in window]
    series = {"price": prices, "volume": volumes}.get(c.attribute or "", [])
    if c.aggregate is Aggregate.COUNT:
        return float(len(window))
    if c.aggregate is Aggregate.SUM:
        return float(sum(series))
    if not series:
        return None
    return {Aggregate.AVG: sum(series) / len(series), Aggregate.MIN: min(series), Aggregate.MAX: max(series)}[c.aggregate]


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
