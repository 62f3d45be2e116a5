"""Per-key event values (QUANTILE, LAST) against brute force, in any arrival order, across expiry and snapshots."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluator.aggregates import AGGREGATES, quantile_rank
from evaluator.expr import Term
from evaluator.panerows import PaneRows
from evaluator.values import KeyValues
from tests.evaluator.oracle import term_of

ATTRS = ("price", "volume")


def rows_of(events: list[tuple[str, int, float, float]]) -> PaneRows:
    """One row per event is enough here: KeyValues reads only keys and events."""
    n = len(events)
    empty = np.zeros((2, n))
    return PaneRows(np.array([e[0] for e in events], dtype=object), np.array([e[1] for e in events], dtype=np.int64),
                    np.ones(n, dtype=np.int64), empty, empty, empty, np.arange(n + 1, dtype=np.int64),
                    np.array([e[1] for e in events], dtype=np.int64),
                    np.array([[e[2] for e in events], [e[3] for e in events]], dtype=np.float64).reshape(2, n))


def event_value(store: KeyValues, term: Term, key: str, window: int, boundary: int) -> float | None:
    """As a shard computes it from its retained events (``now`` is the boundary's last pane stamp)."""
    return AGGREGATES[term.aggregate].value_of(SimpleNamespace(values=store), term, window, key, boundary - 1)


events = st.lists(st.tuples(st.sampled_from("AB"), st.integers(0, 50), st.integers(-5, 5).map(float),
                            st.integers(0, 9).map(float)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(events, st.lists(st.integers(0, 60), max_size=4), st.integers(1, 40), st.integers(1, 60),
       st.sampled_from([0.1, 0.25, 0.5, 0.95, 1.0]), st.booleans())
def test_quantile_and_last_equal_brute_force(stream, cuts, window, boundary, q, snapshot) -> None:
    retention, horizon = 40, 60
    stream = [e for e in stream if e[1] < boundary]  # a shard holds the panes before the boundary it evaluates
    store = KeyValues(ATTRS, retention)
    cuts = sorted(set(cuts))
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=False):
        store.add(rows_of(stream[a:b]))  # batches arrive in any time order
    store.expire(boundary, horizon)
    if snapshot:
        store = KeyValues.from_bytes(store.to_bytes(), ATTRS, retention)
    for key in "AB":
        window_events = [e for e in stream if e[0] == key and boundary - window <= e[1] < boundary]
        for attribute in ATTRS:
            quantile = Term("QUANTILE", attribute, q)
            assert event_value(store, quantile, key, window, boundary) == term_of(quantile, window_events)
        newest = max((e[1] for e in stream if e[0] == key), default=None)
        if newest is not None and newest >= boundary - horizon:  # LAST outlives the retention
            last = Term("LAST", "price")
            assert event_value(store, last, key, horizon, boundary) == term_of(last, [e for e in stream if e[0] == key])


def test_quantile_rank_is_not_fooled_by_rounding() -> None:
    assert quantile_rank(0.1, 30) == 3 and quantile_rank(0.95, 20) == 19 and quantile_rank(1e-9, 5) == 1
