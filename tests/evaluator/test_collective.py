"""Pane aggregates feed the collective indexes; answers equal the per-key pane evaluator's."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluator.collective import CollectiveIndexes
from evaluator.naive import aggregate_value
from evaluator.panes import PaneStore
from evaluator.spec import Aggregate, Condition

ATTRS = ("price", "volume")
PANE = 1_000


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("ABCDE"), st.integers(0, 3), st.integers(1, 5),
                       st.integers(0, 1_000), st.integers(0, 10**6)), max_size=80),
    st.sampled_from([Aggregate.COUNT, Aggregate.SUM, Aggregate.MAX, Aggregate.MIN]),
    st.integers(1, 20),
    st.integers(0, 2_000),
    st.booleans(),
)
def test_pane_fed_indexes_match_per_key_panes(steps, aggregate, panes_wide, threshold, above) -> None:  # noqa: ANN001
    indexes = CollectiveIndexes(ATTRS, p=2)
    stores: dict[str, PaneStore] = {}
    pane = 0
    batch: list[tuple] = []
    for key, advance, count, price, volume in steps:
        pane += advance
        batch.append((key, pane * PANE, count, price, volume))
    for key, start, count, price, volume in batch:  # panes already in order
        sums = np.array([[price * count], [volume * count]], dtype=float)
        extremes = np.array([[price], [volume]], dtype=float)
        indexes.add_panes([key], np.array([start]), np.array([count]), sums, extremes, extremes)
        stores.setdefault(key, PaneStore(2)).merge(np.array([start]), np.array([count]), sums, extremes, extremes)
    window = panes_wide * PANE
    attribute = None if aggregate is Aggregate.COUNT else "volume"
    bound = dict(low=float(threshold)) if above else dict(high=float(threshold))
    condition = Condition(aggregate, attribute, window, **bound)
    now = pane * PANE + PANE - 1  # just before the next pane boundary: panes start <= now
    want = {
        key for key, store in stores.items()
        if condition.holds(aggregate_value(store.window(now + 1 - window, now + 1), condition, ATTRS))
    }
    assert indexes.matching(condition, now) == want
