"""The issue-16 windows in the condition language: CHANGE %, tuple windows, NO DATA, RATE."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evaluator.aggregates import AGGREGATES
from evaluator.comparators import COMPARATORS
from evaluator.spec import Aggregate, Condition, Term
from subscriptions.language import (
    WINDOWS,
    ConditionError,
    check_window,
    explain,
    format_condition,
    language_help,
    parse_condition,
)


@pytest.mark.parametrize(
    ("text", "expected", "canonical"),
    [
        ("CHANGE(price) OVER 5m > 3", Condition(Aggregate.CHANGE, "price", 300_000, low=3), None),
        ("CHANGE(price) OVER 5m > 3%", Condition(Aggregate.PCT_CHANGE, "price", 300_000, low=3), None),
        ("change(price) over 5m < -3%", Condition(Aggregate.PCT_CHANGE, "price", 300_000, high=-3),
         "CHANGE(price) OVER 5m < -3%"),
        ("PCT_CHANGE(price) OVER 1m >= 2", Condition(Aggregate.PCT_CHANGE, "price", 60_000, low=2, low_inclusive=True),
         "CHANGE(price) OVER 1m >= 2%"),
        ("RATE(volume) OVER 10s > 0.5", Condition(Aggregate.RATE, "volume", 10_000, low=0.5), None),
        ("AVG(price) OVER LAST 100 EVENTS > 10", Condition(Aggregate.AVG, "price", 0, low=10, events=100), None),
        ("count(*) over last 1 events >= 1",
         Condition(Aggregate.COUNT, None, 0, low=1, low_inclusive=True, events=1), "COUNT(*) OVER LAST 1 EVENTS >= 1"),
        ("CHANGE(price) OVER LAST 20 EVENTS BETWEEN -1% AND 1%",
         Condition(Aggregate.PCT_CHANGE, "price", 0, -1, 1, True, True, events=20), None),
        ("MAX(price) - MIN(price) OVER LAST 5 EVENTS > 3%",
         Condition(Aggregate.EXPR, None, 0, low=3, percent_of="price", events=5,
                   expression=("-", ("agg", "MAX", "price", None), ("agg", "MIN", "price", None))), None),
        ("NO DATA FOR 5m", Condition(Aggregate.COUNT, None, 300_000, high=0, high_inclusive=True, no_data=True), None),
        ("  no data for 90s ", Condition(Aggregate.COUNT, None, 90_000, high=0, high_inclusive=True, no_data=True),
         "NO DATA FOR 90s"),
    ],
)
def test_parses_and_formats_canonically(text: str, expected: Condition, canonical: str | None) -> None:
    condition = parse_condition(text)
    assert condition == expected
    assert format_condition(condition) == (canonical or text)
    assert parse_condition(format_condition(condition)) == condition


@pytest.mark.parametrize(
    ("text", "message", "column"),
    [
        ("AVG(price) OVER LAST 0 EVENTS > 1", "at least 1, not 0", 22),
        ("AVG(price) OVER LAST 2.5 EVENTS > 1", "whole number of events", 22),
        ("AVG(price) OVER LAST EVENTS > 1", "expected a number of events", 22),
        ("AVG(price) OVER LAST 10 > 1", "expected EVENTS", 25),
        ("RATE(price) OVER LAST 10 EVENTS > 1", "RATE is over a time window only", 1),
        ("AVG(price) - RATE(price) OVER LAST 10 EVENTS > 1", "RATE is over a time window only", 14),
        ("NO DATA FOR", "expected a duration", 12),
        ("NO DATA FOR > 1", "expected a duration", 13),
        ("NO DATA 5m", "expected FOR", 9),
        ("NO 5m", "expected DATA", 4),
        ("NO DATA FOR 5m > 0", "unexpected '>'", 16),
        ("NO DATA FOR 0s", "not a positive", 13),
        ("CHANGE(price) * 2 OVER 5m > 3%", "relative to the window's first value", 1),
        ("PCT_CHANGE(price) OVER 5m > 3%", "use PCT_CHANGE(x) without %", 1),
        ("AVG(price) OVER 5 > 1", "or LAST 100 EVENTS", 17),
    ],
)
def test_errors_say_what_and_where(text: str, message: str, column: int) -> None:
    with pytest.raises(ConditionError) as info:
        parse_condition(text)
    assert message in str(info.value)
    assert info.value.column == column


def test_windows_are_bounded_by_the_settings() -> None:
    check_window(parse_condition("AVG(price) OVER LAST 100 EVENTS > 1"), 1_000, 3_600_000, 3_600_000, 100)
    with pytest.raises(ConditionError, match="at most 100 events"):
        check_window(parse_condition("AVG(price) OVER LAST 101 EVENTS > 1"), 1_000, 3_600_000, 3_600_000, 100)
    with pytest.raises(ConditionError, match="switched off"):
        check_window(parse_condition("AVG(price) OVER LAST 1 EVENTS > 1"), 1_000, 3_600_000, 3_600_000, 0)
    check_window(parse_condition("NO DATA FOR 59m"), 1_000, 3_600_000, 3_600_000, 100)
    with pytest.raises(ConditionError, match="shorter than 1h"):
        check_window(parse_condition("NO DATA FOR 1h"), 1_000, 3_600_000, 3_600_000, 100)
    with pytest.raises(ConditionError, match="change's window may be at most 1m"):  # from retained events
        check_window(parse_condition("CHANGE(price) OVER 5m > 3%".replace("3%", "3")), 1_000, 3_600_000, 60_000)


def test_the_two_percentages_are_told_apart_in_plain_words() -> None:
    assert "in % of its first value" in explain(parse_condition("CHANGE(price) OVER 5m > 3%"))
    assert "3% of its latest price" in explain(parse_condition("MAX(price) - MIN(price) OVER 5m > 3%"))
    assert "last 100 events" in explain(parse_condition("AVG(price) OVER LAST 100 EVENTS > 10"))
    assert "no event for 5m" in explain(parse_condition("NO DATA FOR 5m"))


def test_the_form_help_lists_the_windows_and_new_aggregates() -> None:
    help_ = language_help()
    assert help_.windows == WINDOWS
    syntaxes = [s for s, _ in help_.aggregates]
    assert {"CHANGE(attribute)", "PCT_CHANGE(attribute)", "RATE(attribute)"} <= set(syntaxes)
    for example, _ in WINDOWS:  # every example in the help parses
        whole = " > " in example or " IN " in example or "OVER" not in example
        parse_condition(example if whole else f"AVG(price) {example} > 1")


@given(st.sampled_from([n for n, a in AGGREGATES.items() if a.tuple_windows]), st.integers(1, 10_000),
       st.sampled_from(COMPARATORS), st.lists(st.integers(-50, 50), min_size=2, max_size=2))
def test_tuple_windows_round_trip(name: str, n: int, comparator, thresholds: list[int]) -> None:
    a = AGGREGATES[name]
    term = Term(name, "price" if a.takes_attribute else None, a.param.examples[0] if a.param else None)
    ranges = comparator.ranges(*sorted(float(t) for t in thresholds[: comparator.arity]))
    condition = Condition(Aggregate(name), term.attribute, 0, q=term.param, ranges=ranges, events=n)
    assert parse_condition(format_condition(condition)) == condition
    assert Condition.from_dict(condition.to_dict()) == condition
