"""Key churn: the collective indexes hold only the keys with an element in the retained horizon.

Keys appear, go quiet for longer than the horizon (and are forgotten) and come back, over
long streams with expiry as the shard does it; answers must stay the brute-force ones and
every structure (substreams, ids, stamps, points) be bounded by the keys held.
"""

from __future__ import annotations

import struct

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluator.collective import CollectiveIndexes
from evaluator.spec import Aggregate, Condition
from evaluator.ssf.ci_extreme import CollectiveExtreme
from evaluator.ssf.ci_sum import CollectiveSum
from tests.evaluator.ssf.test_collective import brute, conditions
from tests.examples import examples

HORIZON = 300

# (key, time gap, value, expire after it): a pool of keys, gaps long enough for keys to leave the horizon
churn = st.lists(
    st.tuples(st.integers(0, 40), st.integers(0, 120),
              st.one_of(st.just(0.0), st.integers(0, 30).map(float), st.floats(1e-3, 1e12)), st.booleans()),
    min_size=1, max_size=250,
)
windows = st.integers(1, HORIZON)


def within_horizon(cond: Condition) -> Condition:
    return Condition(cond.aggregate, cond.attribute, min(cond.window_ms, HORIZON), cond.low, cond.high,
                     cond.low_inclusive, cond.high_inclusive)


def held_keys(events: list[tuple[str, int, float]], cut: int | None) -> set[str]:
    return {k for k, t, _ in events if cut is None or t > cut}


def check_sum_bounded(index: CollectiveSum, held: set[str], peak: int) -> None:
    assert set(index.substreams) == held == set(index.held())
    assert len(index.names) == len(index.by_id) <= peak, "id tables grow only with the most keys held at once"
    live = index.keys.live
    assert len(live) == len(held)
    for stamps in (index.last, index.first, *index.indexes.values()):
        assert set(stamps.stamp) <= live
        assert sum(map(len, stamps.buckets.values())) == len(stamps)
    for (level, j), stamps in index.indexes.items():  # what forgetting relies on: a stamp only where j s <= total
        assert all(j * (index.unit_units << level) <= index.by_id[i].total for i in stamps.stamp)


def check_extreme_bounded(index: CollectiveExtreme, held: set[str], peak: int, retained: int,
                          peak_retained: int) -> None:
    assert set(index.stairs) == held
    assert len(index.names) <= peak
    assert set(index.last.stamp) == index.keys.live
    points = sum(len(s.points) for s in index.stairs.values())
    assert points <= retained
    assert len(index.point_ts) <= index.capacity <= max(1024, 4 * peak_retained), "the point array is compacted"


@settings(max_examples=examples(120), deadline=None)
@given(churn, st.lists(conditions(Aggregate.SUM), min_size=1, max_size=4), st.sampled_from([1, 4]),
       st.sampled_from([1, 50, 1_000]))
def test_sum_forgets_quiet_keys_and_stays_exact(stream, conds, p, bucket) -> None:
    index = CollectiveSum(p=p, bucket_ms=bucket)
    events: list[tuple[str, int, float]] = []
    ts, cut, peak = 1_000, None, 0
    for key_no, gap, value, expire in stream:
        ts += gap
        index.add(f"k{key_no}", ts, value)
        events.append((f"k{key_no}", ts, value))
        peak = max(peak, len(held_keys(events, cut)))
        if expire:
            cut = ts - HORIZON
            index.expire(cut)
            check_sum_bounded(index, held_keys(events, cut), peak)
            for cond in map(within_horizon, conds):
                want = brute(events, cond, ts, "SUM", expired=cut)
                assert index.query(cond, ts) == want
                assert index.matching_keys(cond, ts) == set(want)
                assert set(want) <= index.candidates(cond, ts).keys
    restored = CollectiveSum.from_bytes(index.to_bytes())
    assert restored.to_bytes() == index.to_bytes(), "the forgotten state round-trips exactly"
    check_sum_bounded(restored, held_keys(events, cut), peak)
    for cond in map(within_horizon, conds):
        assert restored.query(cond, ts) == index.query(cond, ts) == brute(events, cond, ts, "SUM", expired=cut)


@settings(max_examples=examples(120), deadline=None)
@given(churn, st.lists(conditions(Aggregate.MAX), min_size=1, max_size=4), st.integers(16, 64))
def test_max_and_min_forget_quiet_keys_and_stay_exact(stream, conds, capacity) -> None:
    maxi, mini = CollectiveExtreme("MAX", capacity, bucket_ms=7), CollectiveExtreme("MIN", capacity, bucket_ms=7)
    events: list[tuple[str, int, float]] = []
    ts, cut, peak, peak_retained = 1_000, None, 0, 0
    for key_no, gap, value, expire in stream:
        ts += gap
        peak_retained = max(peak_retained, 1 + sum(cut is None or t > cut for _, t, _ in events))
        for index in (maxi, mini):
            index.add(f"k{key_no}", ts, value if key_no % 2 else -value)
        events.append((f"k{key_no}", ts, value if key_no % 2 else -value))
        peak = max(peak, len(held_keys(events, cut)))
        if expire:
            cut = ts - HORIZON
            retained = sum(t > cut for _, t, _ in events)
            for index in (maxi, mini):
                index.expire(cut)
                check_extreme_bounded(index, held_keys(events, cut), peak, retained, peak_retained)
            for cond in map(within_horizon, conds):
                assert maxi.query(cond, ts) == brute(events, cond, ts, "MAX")
                assert mini.query(cond, ts) == brute(events, cond, ts, "MIN")
    for index, agg in ((maxi, "MAX"), (mini, "MIN")):
        restored = CollectiveExtreme.from_bytes(index.to_bytes())
        assert restored.to_bytes() == index.to_bytes(), "the forgotten state round-trips exactly"
        assert set(restored.stairs) == set(index.stairs)
        for cond in map(within_horizon, conds):
            assert restored.query(cond, ts) == brute(events, cond, ts, agg)


def test_a_key_that_returns_after_being_forgotten_is_exact() -> None:
    sums, maxi = CollectiveSum(p=2), CollectiveExtreme("MAX")
    for index in (sums, maxi):
        for t in range(100):
            index.add("back", t, 1e9)  # a long, large history
            index.add("other", t, 1.0)
        index.expire(150)
    assert not sums.substreams and not maxi.stairs
    assert sums.value("back", 50, 200) == 0.0 and maxi.value("back", 50, 200) is None
    assert sums.query(Condition(Aggregate.SUM, "v", 50, high=5.0), 200) == {}, "forgotten keys are not held"
    for index in (sums, maxi):
        index.add("back", 201, 0.5)
        index.add("back", 202, 0.25)
    assert sums.value("back", 10, 202) == 0.75
    assert sums.matching_keys(Condition(Aggregate.SUM, "v", 10, low=0.75, low_inclusive=True), 202) == {"back"}
    assert sums.matching_keys(Condition(Aggregate.SUM, "v", 10, low=0.75), 202) == set()
    assert sums.query(Condition(Aggregate.SUM, "v", 10, high=0.75, high_inclusive=True), 202) == {"back": 0.75}
    assert maxi.query(Condition(Aggregate.MAX, "v", 10, low=0.3), 202) == {"back": 0.5}
    assert len(sums.names) <= 2 and len(maxi.names) <= 2


def test_a_key_with_only_zero_values_is_held_and_forgotten() -> None:
    """Zero elements move no stamp, but their key is held (``SUM < v`` matches it) until they expire."""
    index = CollectiveSum()
    index.add("zero", 10, 0.0)
    assert index.query(Condition(Aggregate.SUM, "v", 100, high=1.0), 20) == {"zero": 0.0}
    index.expire(10)
    assert not index.substreams and index.query(Condition(Aggregate.SUM, "v", 100, high=1.0), 20) == {}


def test_bytes_written_before_keys_were_forgotten_load_without_the_expired_keys() -> None:
    """Old snapshots list expired keys with no elements: they load as forgotten."""
    old_sum = (struct.pack("<Idqi", 4, 1.0, 1_000, 2) + struct.pack("<HId", 4, 0, 3.0) + b"gone"
               + struct.pack("<HId", 4, 1, 3.0) + b"kept" + np.array([7], "<i8").tobytes()
               + np.array([2.5], "<f8").tobytes())
    sums = CollectiveSum.from_bytes(old_sum)
    assert sums.held() == ["kept"] and sums.value("kept", 10, 7) == 2.5
    points = np.array([(7, 1, 2.5)], dtype=[("ts", "<i8"), ("key", "<i4"), ("value", "<f8")])
    old_max = (struct.pack("<4sqi", b"MAX", 1_000, 2) + b"".join(struct.pack("<H", 4) + n for n in (b"gone", b"kept"))
               + np.array([3, 7], "<i8").tobytes() + struct.pack("<q", 1) + points.tobytes())
    maxi = CollectiveExtreme.from_bytes(old_max)
    assert maxi.held() == ["kept"] and maxi.value("kept", 10, 7) == 2.5 and len(maxi.last) == 1


def test_shard_parts_round_trip_the_forgotten_state() -> None:
    """What the shard snapshots (CollectiveIndexes.to_parts/from_parts) holds only the keys in the horizon."""
    indexes = CollectiveIndexes(("price", "volume"), p=4, bucket_ms=1_000)
    for pane in range(40):  # keys k{pane}..k{pane + 4} active at pane: each lives 5 panes
        keys = [f"k{pane + i}" for i in range(5)]
        n = len(keys)
        indexes.add_panes(keys, np.full(n, pane * 1_000), np.full(n, 2), np.full((2, n), 3.0),
                          np.full((2, n), 1.0), np.full((2, n), 2.0))
        indexes.expire(pane * 1_000 - 10_000)
    expected = {f"k{i}" for i in range(30, 44)}
    every: list[CollectiveSum | CollectiveExtreme] = [indexes.count, *indexes.sums.values(), *indexes.maxs.values(),
                                                      *indexes.mins.values()]
    for index in every:
        assert set(index.held()) == expected and len(index.names) <= 20
    restored = CollectiveIndexes.from_parts(("price", "volume"), indexes.to_parts())
    assert restored.to_parts() == indexes.to_parts()
    for cond in (Condition(Aggregate.COUNT, None, 5_000, high=7), Condition(Aggregate.SUM, "volume", 9_000, low=20),
                 Condition(Aggregate.MAX, "price", 3_000, high=5.0)):
        assert restored.matching(cond, 39_999) == indexes.matching(cond, 39_999)
        assert indexes.matching(cond, 39_999) <= expected
