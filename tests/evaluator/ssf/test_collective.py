"""Collective indexes give exactly the brute-force answer, and their candidates keep their guarantees."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluator.spec import Aggregate, Condition
from evaluator.ssf.ci_extreme import CollectiveExtreme
from evaluator.ssf.ci_sum import CollectiveSum
from evaluator.ssf.naive import NaiveSubstreams
from tests.examples import examples

KEYS = [f"k{i}" for i in range(12)]

# (key, time gap, value): gaps of 0 give equal timestamps, huge values and zeros included
streams = st.lists(
    st.tuples(
        st.sampled_from(KEYS),
        st.integers(0, 40),
        st.one_of(st.integers(0, 20), st.integers(0, 10**12), st.just(0)).map(float),
    ),
    max_size=300,
)
bound = st.one_of(st.none(), st.integers(0, 200).map(float), st.integers(0, 10**13).map(float))


def conditions(aggregate: Aggregate) -> st.SearchStrategy[Condition]:
    def make(window: int, low, high, li: bool, hi: bool) -> Condition:
        if low is None and high is None:
            low = 0.0
        if low is not None and high is not None and low > high:
            low, high = high, low
        return Condition(aggregate, "volume", window, low, high, li, hi)

    return st.builds(make, st.integers(1, 2_000), bound, bound, st.booleans(), st.booleans())


def brute(events: list[tuple[str, int, float]], cond: Condition, now: int, agg: str,
          expired: int | None = None) -> dict[str, float]:
    """The answer over the keys held: those with an event after the last expiry cut (``expired``)."""
    out = {}
    for key in {k for k, t, _ in events if expired is None or t > expired}:
        window = [v for k, t, v in events if k == key and now - cond.window_ms < t <= now]
        if agg == "SUM":
            value: float | None = math.fsum(window)
        else:
            value = (max(window) if agg == "MAX" else min(window)) if window else None
        if value is not None and cond.holds(value):
            out[key] = value
    return out


def replay(stream) -> list[tuple[str, int, float]]:
    ts, events = 1_000, []
    for key, gap, value in stream:
        ts += gap
        events.append((key, ts, value))
    return events


@settings(max_examples=examples(200), deadline=None)
@given(streams, st.lists(conditions(Aggregate.SUM), min_size=1, max_size=6), st.sampled_from([1, 2, 3, 4, 8]),
       st.integers(0, 50), st.sampled_from([1, 7, 100, 10_000]))
def test_ci_sum_is_exact_and_candidates_are_a_guaranteed_superset(stream, conds, p, later, bucket) -> None:
    events = replay(stream)
    index, naive = CollectiveSum(p=p, bucket_ms=bucket), NaiveSubstreams("SUM")
    for key, ts, value in events:
        index.add(key, ts, value)
        naive.add(key, ts, value)
    now = (events[-1][1] if events else 1_000) + later
    for cond in conds:
        want = brute(events, cond, now, "SUM")
        assert index.query(cond, now) == want
        assert index.matching_keys(cond, now) == set(want)
        assert naive.query(cond, now) == want
        candidates = index.candidates(cond, now)
        assert set(want) <= candidates.keys, "candidates must be a superset"
        if candidates.guaranteed_at_least is not None:
            for key in candidates.keys:
                assert index.value(key, cond.window_ms, now) >= candidates.guaranteed_at_least
            if cond.low >= (p + 1) * index.unit:
                assert candidates.guaranteed_at_least >= (1 - index.epsilon) * cond.low


@settings(max_examples=examples(100), deadline=None)
@given(streams, conditions(Aggregate.SUM), st.integers(0, 3_000), st.sampled_from([1, 4]))
def test_ci_sum_after_expiry_and_restore(stream, cond, horizon, p) -> None:
    events = replay(stream)
    index = CollectiveSum(p=p)
    for key, ts, value in events:
        index.add(key, ts, value)
    now = events[-1][1] if events else 1_000
    cut = now - horizon
    index.expire(cut)
    restored = CollectiveSum.from_bytes(index.to_bytes())
    if now - cond.window_ms >= cut:  # windows inside the horizon are unaffected by expiry
        want = brute(events, cond, now, "SUM", expired=cut)
        assert index.query(cond, now) == want
        assert restored.query(cond, now) == want


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, 40), st.floats(-1e12, 1e12)), max_size=300),
    st.lists(st.tuples(conditions(Aggregate.MAX), st.booleans()), min_size=1, max_size=6),
    st.integers(0, 50),
    st.integers(16, 64),
)
def test_max_and_min_are_exact(stream, conds, later, capacity) -> None:
    events = replay(stream)
    maxi, mini = CollectiveExtreme("MAX", capacity, bucket_ms=7), CollectiveExtreme("MIN", capacity, bucket_ms=7)
    for key, ts, value in events:
        maxi.add(key, ts, value)
        mini.add(key, ts, value)
    now = (events[-1][1] if events else 1_000) + later
    maxi, mini = CollectiveExtreme.from_bytes(maxi.to_bytes()), CollectiveExtreme.from_bytes(mini.to_bytes())
    for cond, negate in conds:
        if negate:  # exercise negative thresholds too
            cond = Condition(cond.aggregate, cond.attribute, cond.window_ms,
                             None if cond.high is None else -cond.high, None if cond.low is None else -cond.low,
                             cond.high_inclusive, cond.low_inclusive)
        assert maxi.query(cond, now) == brute(events, cond, now, "MAX")
        assert mini.query(cond, now) == brute(events, cond, now, "MIN")
        naive = NaiveSubstreams("MAX")
        naive.add_batch(*zip(*events, strict=True)) if events else None
        assert naive.query(cond, now) == brute(events, cond, now, "MAX")


def test_staircases_stay_small_and_compaction_keeps_answers() -> None:
    index = CollectiveExtreme("MAX", capacity=16)
    for t in range(1_000):
        index.add("rising", t, float(t))  # each element dominates all before it
        index.add("falling", t, float(-t))
    assert len(index.stairs["rising"].points) == 1
    cond = Condition(Aggregate.MAX, "price", 10, low=990.5)
    assert index.query(cond, 999) == {"rising": 999.0}
    index.expire(900)
    assert len(index.stairs["falling"].points) == 99
    assert index.query(Condition(Aggregate.MAX, "price", 50, high=-949), 999) == {"falling": -950.0}


signed_values = st.one_of(st.integers(-20, 20), st.integers(-10**12, 10**12), st.just(0)).map(float)
signed_bound = st.one_of(st.none(), st.integers(-200, 200).map(float), st.integers(-10**13, 10**13).map(float))


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.sampled_from(KEYS[:3]), st.integers(0, 40), signed_values, st.booleans()), max_size=200),
       st.lists(st.tuples(st.integers(1, 2_000), signed_bound, signed_bound, st.booleans(), st.booleans()),
                min_size=1, max_size=4),
       st.sampled_from([1, 4]), st.integers(1, 3_000))
def test_ci_sum_is_exact_over_values_of_any_sign_and_stamps_again_once_negatives_expired(stream, bounds, p,
                                                                                         horizon) -> None:
    """Negative elements (an attribute with no ``min``) are held and summed exactly; while one is held every key
    is verified, and once the last has expired the stamps are back and keep their guarantees."""
    index, events, ts = CollectiveSum(p=p, bucket_ms=7), [], 1_000
    for key, gap, value, late in stream:
        ts += gap
        at = ts - gap // 2 if late else ts  # a late element: older than its key's newest, inserted in place
        index.add_late(key, at, value)
        events.append((key, at, value))
        index.expire(ts - horizon)
    cut = ts - horizon
    held = [e for e in events if e[1] > cut]
    assert index.negatives == sum(v < 0 for _, _, v in held)
    assert bool(index.indexes) <= (index.negatives == 0), "no stamps while a negative element is held"
    for window, low, high, li, hi in bounds:
        if low is None and high is None:
            low = 0.0
        low, high = (high, low) if low is not None and high is not None and low > high else (low, high)
        cond = Condition(Aggregate.SUM, "volume", min(window, horizon), low, high, li, hi)
        want = brute(events, cond, ts, "SUM", expired=cut)
        assert index.query(cond, ts) == want
        assert index.matching_keys(cond, ts) == set(want)
        restored = CollectiveSum.from_bytes(index.to_bytes())
        assert restored.query(cond, ts) == want
        candidates = index.candidates(cond, ts)
        assert set(want) <= candidates.keys
        if candidates.guaranteed_at_least is not None:
            assert all(index.value(k, cond.window_ms, ts) >= candidates.guaranteed_at_least for k in candidates.keys)


def test_a_key_whose_negative_element_expired_is_found_by_its_stamps() -> None:
    """Its positions start below 0 after the expiry: the stamps are rebuilt from 0, or they would miss it."""
    index = CollectiveSum(p=1)
    index.add("k", 1, -5.0)
    index.add("k", 2, 3.0)
    index.expire(1)
    assert index.negatives == 0 and index.indexes
    assert index.query(Condition(Aggregate.SUM, "volume", 10, low=2.0), 2) == {"k": 3.0}


def test_invalid_input_is_refused() -> None:
    for value in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError):
            CollectiveSum().add("k", 1, value)
    index = CollectiveSum()
    index.add("k", 5, 1.0)
    with pytest.raises(ValueError):
        index.add("k", 4, 1.0)
    with pytest.raises(ValueError):
        CollectiveExtreme("AVG")
