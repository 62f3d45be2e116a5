"""The indexes' correction path: elements inserted late answer exactly like elements added in order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from evaluator.spec import Aggregate, Condition
from evaluator.ssf.ci_extreme import CollectiveExtreme
from evaluator.ssf.ci_sum import CollectiveSum
from tests.examples import examples

elements = st.lists(st.tuples(st.sampled_from("ABCDE"), st.integers(0, 50), st.integers(0, 30)), min_size=1,
                    max_size=60)
queries = st.lists(st.tuples(st.integers(1, 60), st.integers(0, 60), st.booleans()), min_size=1, max_size=8)


@settings(max_examples=examples(200), deadline=None)
@given(items=elements, arrival=st.randoms(use_true_random=False), asks=queries, p=st.sampled_from([1, 2, 4]))
def test_ci_sum_with_late_inserts_equals_in_order_build(items, arrival, asks, p: int) -> None:
    in_order = CollectiveSum(p=p, bucket_ms=4)
    for key, ts, value in sorted(items, key=lambda e: e[1]):
        in_order.add(key, ts, float(value))
    late = CollectiveSum(p=p, bucket_ms=4)
    shuffled = list(items)
    arrival.shuffle(shuffled)
    for key, ts, value in shuffled:
        late.add_late(key, ts, float(value))
    for window, threshold, above in asks:
        condition = Condition(Aggregate.SUM, "v", window, low=threshold if above else None,
                              high=None if above else threshold)
        assert late.query(condition, 50) == in_order.query(condition, 50)
        assert late.matching_keys(condition, 50) == in_order.matching_keys(condition, 50)
        assert late.candidates(condition, 50) == in_order.candidates(condition, 50)


@settings(max_examples=examples(200), deadline=None)
@given(items=elements, cut=st.integers(0, 60), asks=queries, agg=st.sampled_from(["MAX", "MIN"]))
def test_extreme_with_late_inserts_equals_in_order_build(items, cut: int, asks, agg: str) -> None:
    ordered = sorted(items, key=lambda e: e[1])
    in_order = CollectiveExtreme(agg, bucket_ms=4)
    for key, ts, value in ordered:
        in_order.add(key, ts, float(value))
    late = CollectiveExtreme(agg, bucket_ms=4)
    on_time, delayed = ordered[cut:], ordered[:cut]  # the oldest elements arrive last
    for key, ts, value in on_time:
        late.add(key, ts, float(value))
    late.add_late([k for k, _, _ in delayed], [t for _, t, _ in delayed], [float(v) for _, _, v in delayed])
    for window, threshold, above in asks:
        condition = Condition(Aggregate[agg], "v", window, low=threshold if above else None,
                              high=None if above else threshold)
        assert late.query(condition, 50) == in_order.query(condition, 50)
    late.add("A", 51, 7.0)  # and it keeps accepting in-order elements
    in_order.add("A", 51, 7.0)
    condition = Condition(Aggregate[agg], "v", 10, low=0, high=None, low_inclusive=True)
    assert late.query(condition, 60) == in_order.query(condition, 60)
