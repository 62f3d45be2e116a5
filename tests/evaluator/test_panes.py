"""PaneStore answers every window exactly like a scan of the raw events."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluator.panes import PaneStore

PANE = 10
events_strategy = st.lists(
    st.tuples(st.integers(0, 500), st.floats(-1e12, 1e12), st.floats(0, 1e6)), min_size=0, max_size=200
)


def panes_of(events: list[tuple[int, float, float]]) -> tuple[np.ndarray, ...]:
    """Pre-aggregate like Spark does: one row per pane (duplicates allowed across chunks)."""
    starts = np.array([ts // PANE * PANE for ts, _, _ in events], dtype=np.int64)
    values = np.array([[a for _, a, _ in events], [b for _, _, b in events]]).reshape(2, len(events))
    return starts, np.ones(len(events), dtype=np.int64), values, values, values


@settings(max_examples=200, deadline=None)
@given(events_strategy, st.integers(1, 5), st.integers(0, 520), st.integers(0, 300), st.integers(0, 520))
def test_window_matches_brute_force(events, chunks, start, width, expire_before) -> None:  # noqa: ANN001
    store = PaneStore(2)
    for chunk in np.array_split(np.arange(len(events)), chunks):
        store.merge(*panes_of([events[i] for i in chunk]))
    store = PaneStore.from_bytes(store.to_bytes())
    expire_at = expire_before // PANE * PANE
    store.expire(expire_at)
    lo, hi = max(start, expire_at), start + width
    inside = [e for e in events if lo <= e[0] // PANE * PANE < hi]
    got = store.window(start, hi)
    assert got.count == len(inside)
    for a in range(2):
        vals = [e[1 + a] for e in inside]
        assert np.isclose(got.sums[a], sum(vals), rtol=1e-9, atol=1e-3)
        if vals:
            assert got.mins[a] == min(vals) and got.maxs[a] == max(vals)
        else:
            assert np.isnan(got.mins[a]) and np.isnan(got.maxs[a])
    assert list(store.starts) == sorted(set(store.starts)), "one entry per pane, in order"


def test_serialisation_is_compact() -> None:
    store = PaneStore(2)
    store.merge(*panes_of([(t, 1.0, 2.0) for t in range(0, 3600 * PANE, PANE)]))
    assert len(store.to_bytes()) == 8 + len(store) * 8 * (2 + 3 * 2)
