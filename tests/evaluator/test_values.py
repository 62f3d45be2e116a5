"""Per-key event values (QUANTILE, LAST) against brute force, in any arrival order, across expiry and snapshots."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from evaluator.aggregates import AGGREGATES, quantile_rank
from evaluator.expr import Term
from evaluator.panerows import PaneRows
from evaluator.values import KeyValues
from tests.evaluator.oracle import term_of
from tests.examples import examples

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


@settings(max_examples=examples(200), deadline=None)
@given(events, st.lists(st.integers(0, 60), max_size=4), st.integers(1, 40), st.integers(1, 60),
       st.sampled_from([0.1, 0.25, 0.5, 0.95, 1.0]), st.booleans(), st.sampled_from([1, 7, KeyValues.SETTLE_EVENTS]))
def test_quantile_and_last_equal_brute_force(stream, cuts, window, boundary, q, snapshot, settle) -> None:
    """``settle``: queued events are settled into the keys' buffers once that many wait (or at the first read)."""
    retention, horizon = 40, 60
    stream = [e for e in stream if e[1] < boundary]  # a shard holds the panes before the boundary it evaluates
    store = KeyValues(ATTRS, retention)
    store.SETTLE_EVENTS = settle
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



steps = st.lists(st.tuples(st.lists(st.tuples(st.sampled_from("AB"), st.integers(0, 40),
                                              st.integers(-5, 5).map(float), st.integers(0, 9).map(float)),
                                    max_size=30),
                           st.integers(1, 6), st.booleans()), min_size=1, max_size=20)


#: A key gone from the horizon (dropped at boundary 33) has an event again at 34: its event at 0, one of its newest
#: three, is older than any window reads (the property once asked the store to hold it; a fresh clone's run drew it)
GONE_AND_BACK = [([("A", 0, 0.0, 0.0)], 1, False), *[([], 6, False)] * 5, ([], 2, False), ([("A", 0, 0.0, 0.0)], 1, False)]


@settings(max_examples=examples(300), deadline=None)
@given(steps, st.sampled_from([0.25, 0.5, 1.0]), st.booleans(), st.sampled_from([32, 160]))
@example(GONE_AND_BACK, 0.25, False, 32)
def test_expiring_at_every_boundary_or_lazily_answers_as_brute_force(batches, q, snapshot, horizon) -> None:
    """Boundaries move on batch after batch, each batch's events before its boundary (``age`` before it: some
    late, older than the previous boundary); expiry sweeps keys only now and then, and a full buffer trims itself
    as it grows. Quantiles over windows within the retention, LAST over the horizon and the newest events (a tuple
    window of ``keep_last``) equal brute force over every event ever added."""
    retention, keep_last = 20, 3  # a sweep every horizon // 16 = 2 or 10 ms of boundary time
    store, boundary, seen = KeyValues(ATTRS, retention, keep_last), 0, []
    for events, step, late in batches:
        boundary += step  # in order: after the previous boundary (appended); late: up to 40 before this one
        batch = [(k, boundary - 1 - (age if late else age % step), p, v) for k, age, p, v in events
                 if boundary - 1 - age >= 0]
        store.add(rows_of(batch))
        seen += batch
        store.expire(boundary, horizon)
        for key in "AB":  # held: at least the retention's events and those of the newest keep_last in the horizon
            mine = sorted((e for e in seen if e[0] == key), key=lambda e: e[1])
            if mine and mine[-1][1] >= boundary - horizon:
                needed = Counter(e[1:] for e in mine if e[1] >= boundary - retention) | Counter(
                    e[1:] for e in mine[-keep_last:] if e[1] >= boundary - horizon)
                ts, vals = store.keys[key].live()
                held = Counter(zip(ts.tolist(), *vals.tolist(), strict=True))
                assert not needed - held, (key, boundary, needed - held)
    if snapshot:
        store = KeyValues.from_bytes(store.to_bytes(), ATTRS, retention, keep_last)
    for key in "AB":
        mine = [e for e in seen if e[0] == key]
        for window in (1, 7, retention):
            in_window = [e for e in mine if boundary - window <= e[1] < boundary]
            quantile = Term("QUANTILE", "price", q)
            assert event_value(store, quantile, key, window, boundary) == term_of(quantile, in_window), window
        in_horizon = sorted((e for e in mine if boundary - horizon <= e[1] < boundary), key=lambda e: e[1])
        last = Term("LAST", "volume")
        expected_last = term_of(last, mine) if in_horizon else None
        assert event_value(store, last, key, horizon, boundary) == expected_last
        newest = store.last(key, "price", keep_last, boundary, horizon)
        assert (newest.tolist() if newest is not None else []) == [e[2] for e in in_horizon[-keep_last:]]


def test_a_full_buffer_between_sweeps_trims_to_the_retention_and_keeps_the_newest() -> None:
    """Between sweeps a key's buffer that fills up drops what expiry would (memory stays bounded by the
    retention), but never one of its newest ``keep_last`` events (a tuple window reads them)."""
    store = KeyValues(ATTRS, 10, keep_last=3)
    store.add(rows_of([("A", t, float(t), 0.0) for t in range(8)]))  # the buffer's first 8 slots, full
    store.expire(8, 1_600)  # the first expiry sweeps (nothing to drop)
    store.expire(30, 1_600)  # no sweep until 8 + 1_600 // 16: events before 20 are only the newest's now
    store.add(rows_of([("A", 29, 29.0, 0.0)]))
    assert store.last("A", "price", 3, 30, 1_600).tolist() == [6.0, 7.0, 29.0]
    assert len(store.keys["A"]) == 4 and store.keys["A"].ts.size == 8, "trimmed to make room, not grown"
    store.add(rows_of([("B", 29, 1.0, 0.0)]))  # then silent
    for t in range(30, 2_000):
        store.add(rows_of([("A", t, float(t), 0.0)]))
        store.expire(t + 1, 1_600)
        if t + 1 - 1_600 <= 29:
            assert "B" in store.keys, t  # its event is within the horizon
        elif t + 1 - 1_600 > 29 + 1_600 // 16:
            assert "B" not in store.keys, t  # gone within a sweep's time after it left the horizon
    assert len(store.keys["A"]) <= 2 * (10 + 1_600 // 16), "at most the retention and one sweep's worth, twice"
    assert store.window("A", "price", 10, 2_000).tolist() == [float(t) for t in range(1_990, 2_000)]
