"""The incremental plan's member tests against each condition's own ``holds`` (the plans themselves are checked
against the oracle in tests/evaluator/test_windows.py)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from evaluator.comparators import Range
from evaluator.incremental import Members
from evaluator.spec import Aggregate, Condition, SubscriptionSpec

bound = st.none() | st.integers(-5, 5).map(float)
ranges = st.tuples(bound, bound, st.booleans(), st.booleans()).filter(
    lambda r: (r[0] is not None or r[1] is not None) and (r[0] is None or r[1] is None or r[0] < r[1])).map(
    lambda r: Range(*r))


@given(st.lists(st.lists(ranges, min_size=1, max_size=3), min_size=1, max_size=8),
       st.lists(st.integers(-6, 6).map(float) | st.just(math.nan), max_size=30))
def test_one_member_over_many_values_is_what_its_condition_holds(accepted, values) -> None:
    """``Members.holds`` of one member (an int, broadcast over the values, for a full evaluation) equals the member's
    condition value by value, and the pairwise form, and ``Members.accepts`` (every value against every member, in
    slices of values, here of one or two)."""
    specs = [SubscriptionSpec(i + 1, Condition(Aggregate.SUM, "volume", 60_000, ranges=tuple(rs)) if len(rs) > 1 else
                              Condition(Aggregate.SUM, "volume", 60_000, rs[0].low, rs[0].high, rs[0].low_inclusive,
                                        rs[0].high_inclusive))
             for i, rs in enumerate(accepted)]
    members = Members(specs)
    array = np.array(values, dtype=np.float64)
    for m, spec in enumerate(members.specs):
        expected = [not math.isnan(v) and any(r.holds(v) for r in spec.condition.accepted) for v in values]
        assert members.holds(m, array).tolist() == expected
        assert members.holds(np.full(array.size, m, dtype=np.int64), array).tolist() == expected
        assert members.accepts(array)[:, m].tolist() == expected
    members.ACCEPTS_CELLS = 2 * members.low.size
    assert members.accepts(array).tolist() == [[members.holds(m, array)[i] for m in range(len(members))]
                                               for i in range(array.size)]


@given(st.lists(st.lists(ranges, min_size=1, max_size=3), min_size=1, max_size=8),
       st.lists(st.tuples(st.integers(-6, 6).map(float) | st.sampled_from([math.nan, math.inf, -math.inf]),
                          st.booleans()), max_size=30),
       st.data())
def test_the_keys_a_member_accepts_found_by_search_are_those_it_holds(accepted, cells, data) -> None:
    """``Members.accepting`` (binary search over the sorted values, a first evaluation's way) gives each member
    exactly the indices where ``holds`` is true and the mask is set: bounds inclusive or not, NaN, infinities,
    repeated values, overlapping ranges, members asked in any order and more than once."""
    specs = [SubscriptionSpec(i + 1, Condition(Aggregate.SUM, "volume", 60_000, ranges=tuple(rs)) if len(rs) > 1 else
                              Condition(Aggregate.SUM, "volume", 60_000, rs[0].low, rs[0].high, rs[0].low_inclusive,
                                        rs[0].high_inclusive))
             for i, rs in enumerate(accepted)]
    members = Members(specs)
    values = np.array([v for v, _ in cells], dtype=np.float64)
    where = np.array([w for _, w in cells], dtype=bool)
    asked = data.draw(st.lists(st.integers(0, len(members) - 1), min_size=1, max_size=10))
    found = members.accepting(np.array(asked, dtype=np.int64), values, where)
    assert len(found) == len(asked)
    for m, got in zip(asked, found, strict=True):
        expected = np.flatnonzero(members.holds(m, values) & where).tolist()
        assert sorted(got.tolist()) == expected
        assert len(set(got.tolist())) == len(expected)  # each index once
