"""The pane store's helpers against NumPy's own answers (the windows themselves: tests/evaluator/test_windows.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from evaluator.panestore import Panes, RunningWindows, distinct_ids


@given(capacity=st.integers(1, 400), data=st.data())
def test_distinct_ids_are_what_np_unique_gives(capacity: int, data: st.DataObject) -> None:
    """Both ways (a mask when the parts are many, a sort when they are few) give np.unique's sorted ids."""
    parts = data.draw(st.lists(st.lists(st.integers(0, capacity - 1), max_size=60), max_size=6))
    arrays = [np.array(part, dtype=np.int64) for part in parts]
    got = distinct_ids(arrays, capacity)
    expected = np.unique(np.concatenate(arrays)) if arrays else np.empty(0, dtype=np.int64)
    assert got.dtype == np.int64 and got.tolist() == expected.tolist()


PANE, HORIZON, BLOCK = 10, 160, 40  # blocks of 4 panes; windows of 3 to 16 panes
LENGTHS = (30, 70, 120, HORIZON)
pane_rows = st.lists(st.tuples(st.sampled_from("ABCDE"), st.integers(0, 15), st.integers(-9, 9), st.integers(-9, 9)),
                     max_size=12)


def panes_of(running: RunningWindows, rows: list[tuple[str, int, int, int]], lowest: int) -> Panes:
    """Pane rows (key, pane index counted back from ``lowest`` + 15, two attributes' extremes) in start order."""
    rows = sorted(rows, key=lambda r: r[1])
    n = len(rows)
    mins = np.array([[min(r[2], r[3]) for r in rows]] * 2, dtype=np.float64).reshape(2, n)
    maxs = np.array([[max(r[2], r[3]) for r in rows]] * 2, dtype=np.float64).reshape(2, n)
    return Panes(running.ids_of(np.array([r[0] for r in rows], dtype=object)),
                 np.array([lowest + r[1] * PANE for r in rows], dtype=np.int64), np.ones(n, dtype=np.int64),
                 np.zeros((2, n)), mins, maxs)


@given(steps=st.lists(st.tuples(st.integers(1, 20), pane_rows, pane_rows), min_size=1, max_size=25),
       snapshot_at=st.integers(0, 25))
def test_block_summaries_give_every_window_the_extremes_its_panes_give(steps, snapshot_at: int) -> None:
    """MIN and MAX recomputed from block summaries and the panes at a window's ends equal those from every pane,
    through late panes (some in blocks already summarised), jumps past the horizon and a snapshot."""
    plain, blocked = RunningWindows(2, HORIZON), RunningWindows(2, HORIZON, BLOCK)
    for running in (plain, blocked):
        running.use(LENGTHS)
    boundary = 0
    for i, (step, fresh, late) in enumerate(steps):
        previous, boundary = boundary, boundary + step * PANE
        for running in (plain, blocked):
            entering = [(k, j, lo, hi) for k, j, lo, hi in fresh if previous <= boundary - PANE * (16 - j) < boundary]
            running.advance(panes_of(running, entering, boundary - 16 * PANE), boundary)
            running.add_late(panes_of(running, late, boundary - 16 * PANE))  # within the horizon, before `at`
        if i == snapshot_at:
            blocked = RunningWindows.from_parts(2, HORIZON, blocked.to_parts(), BLOCK)
            blocked.use(LENGTHS)
        for ms in LENGTHS[:-1]:
            ours, theirs = blocked.window(ms), plain.window(ms)
            for name in plain.keys.ids:
                k, j = plain.keys.ids[name], blocked.keys.ids[name]
                assert (ours.count[j], ours.mins[:, j].tolist(), ours.maxs[:, j].tolist()) == (
                    theirs.count[k], theirs.mins[:, k].tolist(), theirs.maxs[:, k].tolist()), (ms, name, boundary)
