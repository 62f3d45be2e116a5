"""Edge-triggered transitions with deterministic ids."""

from __future__ import annotations

import numpy as np

from evaluator.catalog import Catalog
from evaluator.naive import alert_id, evaluate_key
from evaluator.panes import PaneStore
from evaluator.spec import Aggregate, Condition, SubscriptionSpec

ATTRS = ("price", "volume")


def store_with(panes: dict[int, tuple[int, float, float]]) -> PaneStore:
    """panes: start -> (count, price sum/min/max (same), volume sum)."""
    store = PaneStore(2)
    starts = np.array(list(panes), dtype=np.int64)
    counts = np.array([v[0] for v in panes.values()])
    price = np.array([v[1] for v in panes.values()])
    volume = np.array([v[2] for v in panes.values()])
    matrix = np.vstack([price, volume])
    store.merge(starts, counts, matrix, matrix, matrix)
    return store


def test_fires_once_then_resolves_when_window_drains() -> None:
    spec = SubscriptionSpec(1, Condition(Aggregate.SUM, "volume", 3_000, low=100), frozenset({"A"}))
    store = store_with({0: (1, 10.0, 150.0)})
    firing: set[int] = set()
    out, firing = evaluate_key("A", store, [spec], firing, 1_000, ATTRS)
    assert [(t.state, t.value, t.window_start, t.window_end) for t in out] == [("firing", 150.0, -2_000, 1_000)]
    out, firing = evaluate_key("A", store, [spec], firing, 2_000, ATTRS)
    assert out == [] and firing == {1}, "still firing: no new transition"
    out, firing = evaluate_key("A", store, [spec], firing, 4_000, ATTRS)
    assert [t.state for t in out] == ["resolved"] and firing == set()
    assert out[0].alert_id == alert_id(1, "A", "resolved", 4_000)


def test_key_filter_empty_windows_and_removed_subscriptions() -> None:
    count_low = SubscriptionSpec(2, Condition(Aggregate.COUNT, None, 1_000, high=1))
    avg = SubscriptionSpec(3, Condition(Aggregate.AVG, "price", 1_000, low=0))
    only_b = SubscriptionSpec(4, Condition(Aggregate.MAX, "price", 1_000, low=0), frozenset({"B"}))
    catalog = Catalog(1, (count_low, avg, only_b))
    empty = PaneStore(2)
    out, firing = evaluate_key("A", empty, catalog.for_key("A"), {99}, 5_000, ATTRS)
    # COUNT of an empty window is 0 (< 1 fires); AVG has no value (never fires); 99 no longer exists
    assert [(t.subscription_id, t.state, t.value) for t in out] == [(2, "firing", 0.0)]
    assert firing == {2}
    assert [s.id for s in catalog.for_key("B")] == [2, 3, 4]


def test_ids_are_deterministic_and_distinct() -> None:
    assert alert_id(1, "A", "firing", 10) == alert_id(1, "A", "firing", 10)
    assert len({alert_id(1, "A", "firing", 10), alert_id(1, "A", "resolved", 10), alert_id(1, "B", "firing", 10),
                alert_id(2, "A", "firing", 10), alert_id(1, "A", "firing", 11)}) == 5
