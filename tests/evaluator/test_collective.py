"""Pane aggregates feed the collective indexes; answers equal a scan of the raw events."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluator.collective import CollectiveIndexes
from evaluator.spec import Aggregate, Condition
from tests.evaluator.oracle import value_of
from tests.examples import examples

ATTRS = ("price", "volume")
PANE = 1_000


@settings(max_examples=examples(60), deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("ABCDE"), st.integers(0, 3), st.integers(1, 5),
                       st.integers(0, 1_000), st.integers(0, 10**6)), max_size=80),
    st.sampled_from([Aggregate.COUNT, Aggregate.SUM, Aggregate.MAX, Aggregate.MIN]),
    st.integers(1, 20),
    st.integers(0, 2_000),
    st.booleans(),
)
def test_pane_fed_indexes_match_per_key_panes(steps, aggregate, panes_wide, threshold, above) -> None:
    indexes = CollectiveIndexes(ATTRS, p=2)
    events: list[tuple[str, int, float, float]] = []
    pane = 0
    batch: list[tuple] = []
    for key, advance, count, price, volume in steps:
        pane += advance
        batch.append((key, pane * PANE, count, price, volume))
    for key, start, count, price, volume in batch:  # panes already in order
        sums = np.array([[price * count], [volume * count]], dtype=float)
        extremes = np.array([[price], [volume]], dtype=float)
        indexes.add_panes([key], np.array([start]), np.array([count]), sums, extremes, extremes)
        events += [(key, start, float(price), float(volume))] * count
    window = panes_wide * PANE
    attribute = None if aggregate is Aggregate.COUNT else "volume"
    bound = {"low": float(threshold)} if above else {"high": float(threshold)}
    condition = Condition(aggregate, attribute, window, **bound)
    now = pane * PANE + PANE - 1  # just before the next pane boundary: panes start <= now
    want = {
        key for key in {e[0] for e in events}
        if condition.holds(value_of(condition, [e for e in events if e[0] == key and now + 1 - window <= e[1] <= now]))
    }
    assert indexes.matching(condition, now) == want
