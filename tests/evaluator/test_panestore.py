"""The pane store's helpers against NumPy's own answers (the windows themselves: tests/evaluator/test_windows.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from evaluator.panestore import distinct_ids


@given(capacity=st.integers(1, 400), data=st.data())
def test_distinct_ids_are_what_np_unique_gives(capacity: int, data: st.DataObject) -> None:
    """Both ways (a mask when the parts are many, a sort when they are few) give np.unique's sorted ids."""
    parts = data.draw(st.lists(st.lists(st.integers(0, capacity - 1), max_size=60), max_size=6))
    arrays = [np.array(part, dtype=np.int64) for part in parts]
    got = distinct_ids(arrays, capacity)
    expected = np.unique(np.concatenate(arrays)) if arrays else np.empty(0, dtype=np.int64)
    assert got.dtype == np.int64 and got.tolist() == expected.tolist()
