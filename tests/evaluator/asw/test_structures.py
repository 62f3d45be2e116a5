"""Every shared window structure against brute force: random streams, windows, growth, bytes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluator.asw.base import dyadic_cover
from evaluator.asw.baselines import AggregateTree, MaterializeAll, MaterializeNone
from evaluator.asw.bint import BaseIntervals
from evaluator.asw.lint import LandmarkIntervals, gamma_partition
from evaluator.asw.quantile import QuantileIntervals, kth_smallest, rank_of
from evaluator.asw.rint import RunningIntervals
from evaluator.asw.timebased import TimeWindows
from evaluator.monoid import Agg
from tests.examples import examples

values_st = st.lists(
    st.one_of(st.floats(-1e12, 1e12), st.integers(-5, 5).map(float)), min_size=0, max_size=300
)


def brute(agg: Agg, window: list[float]) -> float:
    if agg in (Agg.SUM, Agg.COUNT):
        return math.fsum(window)
    if not window:
        return math.inf if agg is Agg.MIN else -math.inf
    return min(window) if agg is Agg.MIN else max(window)


def close(agg: Agg, got: float, want: float, scale: float) -> bool:
    if agg in (Agg.MIN, Agg.MAX):
        return got == want
    return abs(got - want) <= 1e-9 * scale + 1e-9


def factories(widths: list[int]):
    return {
        "B-INT": lambda agg, cap: BaseIntervals(agg, cap),
        "L-INT": lambda agg, cap: LandmarkIntervals(agg, cap, widths=widths, gamma=2.0),
        "L-INT-γ1.5": lambda agg, cap: LandmarkIntervals(agg, cap, widths=widths, gamma=1.5),
        "tree": lambda agg, cap: AggregateTree(agg, cap),
        "none": lambda agg, cap: MaterializeNone(agg, cap),
    }


@settings(max_examples=examples(150), deadline=None)
@given(
    values_st,
    st.sampled_from([Agg.SUM, Agg.MIN, Agg.MAX]),
    st.integers(2, 64),
    st.lists(st.integers(1, 80), min_size=1, max_size=6),
    st.data(),
)
def test_tuple_windows_match_brute_force(values, agg, capacity, widths, data) -> None:
    structures = {name: make(agg, capacity) for name, make in factories(widths).items()}
    if agg is Agg.SUM:
        structures["R-INT"] = RunningIntervals(agg, capacity)
    for i, v in enumerate(values):
        for s in structures.values():
            s.append(v)
        if i % 17 == 0 or i == len(values) - 1:
            for name, s in structures.items():
                cap = s.capacity
                for w in [*widths, 1, cap, data.draw(st.integers(1, cap))]:
                    w = min(w, cap)
                    window = values[max(i + 1 - w, 0) : i + 1]
                    scale = math.fsum(abs(x) for x in values[max(i + 1 - 3 * cap, 0) : i + 1])
                    assert close(agg, s.lookup(w), brute(agg, window), scale), (name, w)
                a = data.draw(st.integers(s.oldest, s.n))
                b = data.draw(st.integers(a, s.n))
                assert close(agg, s.range(a, b), brute(agg, values[a:b]), scale), (name, a, b)


@settings(max_examples=examples(60), deadline=None)
@given(values_st, st.integers(2, 64), st.lists(st.integers(1, 64), min_size=1, max_size=5))
def test_materialize_all_matches_for_its_widths(values, capacity, widths) -> None:
    capacity = max(capacity, max(widths))
    for agg in (Agg.SUM, Agg.MIN, Agg.MAX):
        s = MaterializeAll(agg, capacity, widths=widths)
        for i, v in enumerate(values):
            s.append(v)
            scale = math.fsum(abs(x) for x in values[: i + 1])
            for w in widths:
                assert close(agg, s.lookup(w), brute(agg, values[max(i + 1 - w, 0) : i + 1]), scale)


@settings(max_examples=examples(100), deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6), max_size=200),
    st.integers(2, 64),
    st.floats(0, 1),
    st.data(),
)
def test_quantiles_match_sorting(values, capacity, phi, data) -> None:
    q = QuantileIntervals("MIN", capacity)
    for v in values:
        q.append(v)
    for _ in range(5):
        a = data.draw(st.integers(q.oldest, q.n))
        b = data.draw(st.integers(a, q.n))
        window = sorted(values[a:b])
        want = window[rank_of(phi, len(window))] if window else None
        assert q.quantile_range(a, b, phi) == want
    w = data.draw(st.integers(1, q.capacity))
    window = sorted(values[max(len(values) - w, 0) :])
    assert q.quantile(w, phi) == (window[rank_of(phi, len(window))] if window else None)


@given(st.lists(st.lists(st.integers(-50, 50), min_size=0, max_size=20).map(sorted), min_size=1, max_size=6), st.data())
def test_kth_smallest_of_sorted_runs(runs, data) -> None:
    flat = sorted(x for r in runs for x in r)
    if flat:
        k = data.draw(st.integers(0, len(flat) - 1))
        assert kth_smallest([np.array(r, dtype=float) for r in runs], k) == flat[k]


@settings(max_examples=examples(100), deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 30), st.floats(-1e9, 1e9)), max_size=250),
    st.sampled_from([Agg.SUM, Agg.MAX, Agg.MIN]),
    st.integers(1, 200),
    st.data(),
)
def test_time_windows_match_brute_force_and_grow(steps, agg, max_duration, data) -> None:
    ts, events = 0, []
    timed = {
        "B-INT": TimeWindows(BaseIntervals(agg, 4), max_duration),
        "L-INT": TimeWindows(LandmarkIntervals(agg, 4, widths=[1, 3, 10]), max_duration),
    }
    if agg is Agg.SUM:
        timed["R-INT"] = TimeWindows(RunningIntervals(agg, 4), max_duration)
    for gap, v in steps:
        ts += gap  # gaps of 0 give equal timestamps
        events.append((ts, v))
        for t in timed.values():
            t.append(ts, v)
    now = ts + data.draw(st.integers(0, 5))
    for _ in range(4):
        duration = data.draw(st.integers(1, max_duration))
        window = [v for t, v in events if now - duration < t <= now]
        scale = math.fsum(abs(v) for _, v in events)
        for name, t in timed.items():
            assert close(agg, t.lookup(duration, now), brute(agg, window), scale), (name, duration)
        start = now - data.draw(st.integers(0, max_duration))
        end = data.draw(st.integers(start, now))
        past = [v for t, v in events if start < t <= end]  # historical window (start, end]
        for name, t in timed.items():
            assert close(agg, t.structure.range(*t.historical(start, end)), brute(agg, past), scale), (name, start)
    if events:
        with pytest.raises(ValueError):
            timed["B-INT"].append(ts - 1, 0.0)


@settings(max_examples=examples(60), deadline=None)
@given(values_st, st.integers(2, 32), st.sampled_from([Agg.SUM, Agg.MIN, Agg.MAX]))
def test_state_round_trips_through_bytes(values, capacity, agg) -> None:
    kinds = [BaseIntervals, AggregateTree, MaterializeNone] + ([RunningIntervals] if agg is Agg.SUM else [])
    for kind in kinds:
        s = kind(agg, capacity)
        s.extend(values)
        restored = kind.from_bytes(s.to_bytes())
        assert restored.n == s.n and restored.oldest == s.oldest
        for w in range(1, s.capacity + 1):
            assert close(agg, restored.lookup(w), s.lookup(w), math.fsum(abs(v) for v in values))
    lint = LandmarkIntervals(agg, capacity, widths=[2, 5])
    lint.extend(values)
    restored = LandmarkIntervals.from_bytes(lint.to_bytes(), widths=[2, 5])
    for w in range(1, lint.capacity + 1):
        assert close(agg, restored.lookup(w), lint.lookup(w), math.fsum(abs(v) for v in values))


def test_r_int_keeps_precision_over_a_long_stream() -> None:
    r = RunningIntervals(Agg.SUM, 64)
    big = [1e15, -1e15] * 5_000
    r.extend(big)
    r.extend([0.1] * 10)
    assert abs(r.lookup(10) - 1.0) < 1e-9, "re-basing keeps old magnitudes out of new windows"


def test_r_int_batch_extend_equals_appends() -> None:
    values = np.random.default_rng(1).normal(size=1000)
    one, batch = RunningIntervals(Agg.SUM, 128), RunningIntervals(Agg.SUM, 128)
    for v in values:
        one.append(float(v))
    batch.extend(values[:333])
    batch.extend(values[333:])
    for w in (1, 7, 64, 128):
        assert abs(one.lookup(w) - batch.lookup(w)) < 1e-9


def test_lookup_costs_are_what_the_paper_says() -> None:
    assert len(dyadic_cover(1, 1024, 10)) <= 2 * 10
    assert gamma_partition([1, 2, 3, 4, 7, 8, 100, 150, 250], 2.0) == [1, 2, 4, 8, 100, 250]
    with pytest.raises(ValueError):
        RunningIntervals(Agg.MAX, 8)
    with pytest.raises(IndexError):
        BaseIntervals(Agg.SUM, 4).range(0, 1)


@settings(max_examples=examples(50), deadline=None)
@given(st.lists(st.tuples(st.floats(-1e6, 1e6), st.integers(0, 5)), max_size=100), st.integers(1, 64))
def test_average_is_sum_over_count_of_panes(panes, width) -> None:
    from evaluator.asw.average import SharedAverage

    for kind in (RunningIntervals, BaseIntervals):
        avg = SharedAverage(64, kind)
        for total, count in panes:
            avg.append(total * count, float(count))
        window = panes[max(len(panes) - width, 0) :]
        count = sum(c for _, c in window)
        got = avg.lookup(width)
        if count == 0:
            assert got is None
        else:
            want = math.fsum(t * c for t, c in window) / count
            assert abs(got - want) <= 1e-6 * (1 + math.fsum(abs(t * c) for t, c in panes))
