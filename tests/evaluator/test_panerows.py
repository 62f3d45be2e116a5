"""Pane rows kept in pane-start order and cut by slices (what a shard's pending panes are since a batch may hold
many boundaries' panes): the same complete panes as a mask over the rows in arrival order."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from evaluator.panerows import PaneRows
from tests.evaluator.test_shard import pane_rows

EVENTS = st.lists(st.tuples(st.sampled_from("ABC"), st.integers(0, 9_999), st.integers(0, 9).map(float),
                            st.integers(0, 9).map(float)), max_size=40)


def same(a: PaneRows, b: PaneRows) -> bool:
    return (a.keys.tolist() == b.keys.tolist() and all(np.array_equal(x, y) for x, y in (
        (a.starts, b.starts), (a.counts, b.counts), (a.sums, b.sums), (a.mins, b.mins), (a.maxs, b.maxs),
        (a.event_offsets, b.event_offsets), (a.event_ts, b.event_ts), (a.event_values, b.event_values))))


@given(batches=st.lists(EVENTS, max_size=4), boundary=st.integers(0, 10_000))
def test_a_prefix_of_rows_by_start_combines_to_the_masked_rows(batches, boundary: int) -> None:
    arrival = PaneRows.concat([pane_rows(b) for b in batches], 2)
    ordered = arrival.by_start()
    done = int(np.searchsorted(ordered.starts, boundary, side="left"))
    assert same(ordered.slice(0, done).combined(), arrival.select(arrival.starts < boundary).combined())
    assert same(ordered.slice(done, len(ordered)).combined(), arrival.select(arrival.starts >= boundary).combined())
    assert same(ordered.slice(0, len(ordered)), ordered) and len(ordered.slice(done, done)) == 0
