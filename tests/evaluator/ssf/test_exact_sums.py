"""Window sums equal ``math.fsum`` of the window's values whatever came before them (issue #11).

Values are log-uniform over 1e-3..1e15 (volumes, byte counters) after long histories of
large values; the answer must be within 1e-12 relative of the direct sum, in the index's
value, its exact verification (threshold decisions) and after a state round trip.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluator.asw.rint import RunningIntervals
from evaluator.spec import Aggregate, Condition
from evaluator.ssf.ci_sum import CollectiveSum
from evaluator.ssf.naive import NaiveSubstreams
from tests.examples import examples

REL = 1e-12
ISSUE_CASES = [([1e15] * 10, [1.0] * 3), ([99.99] * 1_000, [0.1, 0.2])]  # (history, window) from the issue
magnitudes = st.floats(-3, 15).map(lambda e: 10.0**e)  # log-uniform 1e-3..1e15
histories = st.one_of(st.lists(magnitudes, max_size=60),
                      st.tuples(st.integers(1, 3_000), magnitudes).map(lambda nv: [nv[1]] * nv[0]))
windows = st.lists(magnitudes, min_size=1, max_size=30)


def close(got: float | None, want: float) -> bool:
    return got is not None and abs(got - want) <= REL * abs(want)


def fill(index: CollectiveSum | NaiveSubstreams, key: str, history: list[float], window: list[float],
         start: int = 0) -> int:
    """History at times start.., then the window; returns the window's first time."""
    for i, v in enumerate(history):
        index.add(key, start + i, v)
    first = start + len(history)
    for i, v in enumerate(window):
        index.add(key, first + i, v)
    return first


@pytest.mark.parametrize("kind", ["collective", "naive"])
@pytest.mark.parametrize(("history", "window"), ISSUE_CASES, ids=["1e15-then-ones", "99.99-then-0.1-0.2"])
def test_the_issue_cases(history: list[float], window: list[float], kind: str) -> None:
    index = CollectiveSum(p=4) if kind == "collective" else NaiveSubstreams("SUM")
    first = fill(index, "k", history, window)
    now = first + len(window) - 1
    assert index.value("k", len(window), now) == math.fsum(window)


@pytest.mark.parametrize(("history", "window"), ISSUE_CASES, ids=["1e15-then-ones", "99.99-then-0.1-0.2"])
def test_the_issue_cases_in_r_int(history: list[float], window: list[float]) -> None:
    rint = RunningIntervals("SUM", len(history) + len(window))
    rint.extend(history)
    for v in window:
        rint.append(v)
    assert rint.lookup(len(window)) == math.fsum(window)


@settings(max_examples=examples(200), deadline=None)
@given(histories=st.lists(st.tuples(histories, windows), min_size=1, max_size=4), p=st.sampled_from([1, 2, 4]),
       data=st.data())
def test_window_sums_and_threshold_decisions_are_exact_whatever_the_history(histories, p: int, data) -> None:
    collective, naive = CollectiveSum(p=p), NaiveSubstreams("SUM")
    events, firsts, now = [], {}, 0
    for k, (history, window) in enumerate(histories):
        key = f"k{k}"
        for index in (collective, naive):
            firsts[key] = fill(index, key, history, window, start=10 * k)
        events += [(key, 10 * k + i, v) for i, v in enumerate(history + window)]
        now = max(now, firsts[key] + len(window) - 1)
    for key, first in firsts.items():
        duration = now - first + 1  # reaches back to the key's first window value: other keys' histories too
        sums = {k: math.fsum(v for kk, t, v in events if kk == k and now - duration < t <= now) for k in firsts}
        for index in (collective, naive):
            assert all(close(index.value(k, duration, now), want) for k, want in sums.items()), type(index)
        # thresholds near this key's sum, farther than the tolerance from any sum: decisions equal the oracle's
        factor = data.draw(st.sampled_from([1 - 1e-9, 1 - 1e-11, 1 + 1e-11, 1 + 1e-9, 0.5, 2.0]))
        c = sums[key] * factor
        if any(abs(c - want) <= 10 * REL * want for want in sums.values()):
            continue
        for cond in (Condition(Aggregate.SUM, "v", duration, low=c), Condition(Aggregate.SUM, "v", duration, high=c)):
            expected = {k for k, want in sums.items() if cond.holds(want)}
            assert collective.matching_keys(cond, now) == expected
            assert set(collective.query(cond, now)) == expected
            assert set(naive.query(cond, now)) == expected


@settings(max_examples=examples(100), deadline=None)
@given(history=histories, window=windows, late=st.lists(magnitudes, max_size=5), expire=st.booleans())
def test_late_inserts_expiry_and_restore_keep_sums_exact(history: list[float], window: list[float],
                                                        late: list[float], expire: bool) -> None:
    index = CollectiveSum(p=4)
    first = fill(index, "k", history, window)
    for i, v in enumerate(late):  # late elements land inside the window, between its elements
        index.add_late("k", first + i % len(window), v)
    now = first + len(window)
    if expire:
        index.expire(first - 1)
    want = math.fsum(window + late)
    for restored in (index, CollectiveSum.from_bytes(index.to_bytes())):
        assert close(restored.value("k", now - first + 1, now), want)
        assert restored.matching_keys(Condition(Aggregate.SUM, "v", now - first + 1, low=want * (1 - 1e-9)),
                                      now) == {"k"}


@settings(max_examples=examples(100), deadline=None)
@given(values=st.lists(magnitudes, min_size=1, max_size=400), capacity=st.integers(2, 64), data=st.data())
def test_r_int_windows_are_exact(values: list[float], capacity: int, data) -> None:
    rint = RunningIntervals("SUM", capacity)
    cut = data.draw(st.integers(0, len(values)))
    rint.extend(values[:cut])
    for v in values[cut:]:
        rint.append(v)
    width = data.draw(st.integers(1, min(rint.capacity, len(values))))
    assert close(rint.lookup(width), math.fsum(values[-width:]))
    restored = RunningIntervals.from_bytes(rint.to_bytes())
    assert close(restored.lookup(width), math.fsum(values[-width:]))
