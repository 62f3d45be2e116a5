from __future__ import annotations

import hypothesis
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evaluator.spec import Aggregate, Condition, expr_terms
from subscriptions.language import ConditionError, check_window, format_condition, parse_condition


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("SUM(volume) OVER 5m > 2e6", Condition(Aggregate.SUM, "volume", 300_000, low=2e6)),
        ("count(*) over 30s >= 100", Condition(Aggregate.COUNT, None, 30_000, low=100, low_inclusive=True)),
        ("AVG(price) OVER 1h BETWEEN 10 AND 20", Condition(Aggregate.AVG, "price", 3_600_000, 10, 20, True, True)),
        ("MIN(price) OVER 1500ms <= 1_000.5", Condition(Aggregate.MIN, "price", 1_500, high=1000.5, high_inclusive=True)),
        ("  max( PRICE )   OVER 2d < -1 ", Condition(Aggregate.MAX, "price", 172_800_000, high=-1)),
        ("QUANTILE(volume, 0.95) OVER 15m > 5000",
         Condition(Aggregate.QUANTILE, "volume", 900_000, low=5000, q=0.95)),
        ("median(price) over 1m < 3", Condition(Aggregate.QUANTILE, "price", 60_000, high=3, q=0.5)),
        ("SUM(volume) OVER 1m > +5", Condition(Aggregate.SUM, "volume", 60_000, low=5)),
        ("LAST(price) OVER 1m >= 10", Condition(Aggregate.LAST, "price", 60_000, low=10, low_inclusive=True)),
        ("MAX(price) - MIN(price) OVER 30m > 3%",
         Condition(Aggregate.EXPR, None, 1_800_000, low=3, percent_of="price",
                   expression=("-", ("agg", "MAX", "price", None), ("agg", "MIN", "price", None)))),
        ("SUM(volume) / (COUNT(*) + 1) OVER 5m BETWEEN 1 AND 2",
         Condition(Aggregate.EXPR, None, 300_000, 1, 2, True, True,
                   expression=("/", ("agg", "SUM", "volume", None),
                               ("+", ("agg", "COUNT", None, None), ("num", 1.0))))),
    ],
)
def test_parses(text: str, expected: Condition) -> None:
    assert parse_condition(text) == expected


@pytest.mark.parametrize(
    ("text", "message", "column"),
    [
        ("", "empty", None),
        ("SUMM(volume) OVER 5m > 1", "unknown aggregate 'SUMM'", 1),
        ("SUM(vol) OVER 5m > 1", "unknown attribute 'vol'", 5),
        ("SUM(volume) OVER 5 > 1", "expected a window", 18),
        ("SUM(volume) OVER 5m", "expected a comparison", 20),
        ("SUM(volume) OVER 5m > 1 extra", "unexpected 'extra'", 25),
        ("SUM(volume) OVER 5m ! 1", "unexpected character '!'", 21),
        ("AVG(price) OVER 1m BETWEEN 5 AND 1", "empty range", 20),
        ("SUM() OVER 1m > 1", "expected an attribute", 5),
        ("SUM(volume) OVER 0s > 1", "not a positive", 18),
        ("QUANTILE(price) OVER 1m > 1", "expected ',' and the quantile's fraction", 15),
        ("QUANTILE(price, 1.5) OVER 1m > 1", "between 0 and 1", 17),
        ("COUNT(*) OVER 1m > 3%", "exactly one attribute", 1),
        ("SUM(volume) - AVG(price) OVER 1m > 3%", "exactly one attribute", 1),
        ("MAX(price) OVER 1m BETWEEN 1% AND 3", "both ends of the range", 20),
        ("2 * 3 OVER 1m > 1", "needs an aggregate", 1),
        ("(MAX(price) - MIN(price) > 1", "expected ), found '>'", 26),
        ("(MAX(price) - MIN(price) OVER 1m > 1", "a window inside parentheses ends them", 34),
        ("(SUM(volume) OVER 5m) / SUM(volume) > 3", "OVER and a window for the parts with none", 37),
        ("(SUM(volume) OVER LAST 5 EVENTS) > 3", "a part's own window is a time window", 19),
        ("(SUM(volume) OVER 5m) / SUM(volume) OVER LAST 10 EVENTS > 3", "no part may have a time window", 37),
        ("(2 OVER 5m) + SUM(volume) OVER 1m > 1", "a window needs an aggregate", 4),
    ],
)
def test_errors_say_what_and_where(text: str, message: str, column: int | None) -> None:
    with pytest.raises(ConditionError) as info:
        parse_condition(text)
    assert message in str(info.value)
    assert info.value.column == column


def test_window_must_fit_panes_and_history() -> None:
    check_window(parse_condition("SUM(volume) OVER 5m > 1"), 1_000, 3_600_000, 3_600_000)
    with pytest.raises(ConditionError, match="multiple of 1s"):
        check_window(parse_condition("SUM(volume) OVER 1500ms > 1"), 1_000, 3_600_000, 3_600_000)
    with pytest.raises(ConditionError, match="at most 1h"):
        check_window(parse_condition("SUM(volume) OVER 2h > 1"), 1_000, 3_600_000, 3_600_000)
    check_window(parse_condition("MAX(price) - MIN(price) OVER 3h > 1%"), 1_000, 3 * 3_600_000, 3_600_000)
    with pytest.raises(ConditionError, match="quantile's window may be at most 1h"):
        check_window(parse_condition("LAST(price) - MEDIAN(price) OVER 2h > 1"), 1_000, 3 * 3_600_000, 3_600_000)
    with pytest.raises(ConditionError, match="quantiles are switched off"):
        check_window(parse_condition("MEDIAN(price) OVER 1m > 1"), 1_000, 3_600_000, 0)


numbers = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300)
attributes = st.sampled_from(["price", "volume"])
simple_terms = st.one_of(
    st.just(("agg", "COUNT", None, None)),
    st.tuples(st.just("agg"), st.sampled_from(["SUM", "AVG", "MIN", "MAX", "LAST"]), attributes, st.none()),
    st.tuples(st.just("agg"), st.just("QUANTILE"), attributes,
              st.floats(min_value=1e-6, max_value=1.0, exclude_min=True)),
)
expressions = st.recursive(
    st.one_of(simple_terms, st.tuples(st.just("num"), numbers)),
    lambda inner: st.tuples(st.sampled_from(["+", "-", "*", "/"]), inner, inner),
    max_leaves=6,
)


def _condition(expression, window, a, b, op, percent):
    bounds = ({"low": min(a, b), "high": max(a, b), "low_inclusive": True, "high_inclusive": True}
              if op == "between" else {"low": a, "low_inclusive": op == ">="} if op.startswith(">")
              else {"high": a, "high_inclusive": op == "<="})
    if percent:
        return Condition(Aggregate.EXPR, None, window, expression=expression, percent_of=percent, **bounds)
    if expression[0] == "agg":
        return Condition(Aggregate(expression[1]), expression[2], window, q=expression[3], **bounds)
    return Condition(Aggregate.EXPR, None, window, expression=expression, **bounds)


@given(expressions, st.integers(1, 10**9), numbers, numbers, st.sampled_from([">", ">=", "<", "<=", "between"]))
def test_format_round_trips(expression, window, a, b, op) -> None:
    hypothesis.assume(expr_terms(expression))
    condition = _condition(expression, window, a, b, op, None)
    assert parse_condition(format_condition(condition)) == condition


@given(st.sampled_from([("agg", "MAX", "price", None), ("-", ("agg", "MAX", "volume", None), ("num", 1.0))]),
       numbers, st.sampled_from([">", "<=", "between"]))
def test_percentages_round_trip(expression, a, op) -> None:
    attribute = expression[2] if expression[0] == "agg" else "volume"
    condition = _condition(expression, 60_000, a, a + 1, op, attribute)
    assert parse_condition(format_condition(condition)) == condition


# -- the alert lifecycle ---------------------------------------------------------------------------------------

from evaluator.comparators import Range  # noqa: E402  # the lifecycle tests' own imports, kept with them
from evaluator.lifecycle import Lifecycle  # noqa: E402
from subscriptions.language import explain  # noqa: E402


@pytest.mark.parametrize(
    ("text", "lifecycle", "canonical"),
    [
        ("SUM(volume) OVER 5m > 2e6 FOR 2m", Lifecycle(for_ms=120_000), "SUM(volume) OVER 5m > 2000000 FOR 2m"),
        ("SUM(volume) OVER 5m > 2e6 keep firing for 5m", Lifecycle(keep_firing_ms=300_000),
         "SUM(volume) OVER 5m > 2000000 KEEP FIRING FOR 5m"),
        ("SUM(volume) OVER 5m > 2e6 DAMPEN 10m RESOLVE BELOW 1.5e6 FOR 30s",
         Lifecycle(for_ms=30_000, dampen_ms=600_000, resolve=Range(low=1.5e6, low_inclusive=True)),
         "SUM(volume) OVER 5m > 2000000 RESOLVE BELOW 1500000 FOR 30s DAMPEN 10m"),
        ("AVG(price) OVER 1h < 5 RESOLVE ABOVE 5", Lifecycle(resolve=Range(high=5, high_inclusive=True)),
         "AVG(price) OVER 1h < 5 RESOLVE ABOVE 5"),
        ("MAX(price) - MIN(price) OVER 30m > 3% RESOLVE BELOW 2%", Lifecycle(resolve=Range(low=2, low_inclusive=True)),
         "MAX(price) - MIN(price) OVER 30m > 3% RESOLVE BELOW 2%"),
        ("LAST(price) OVER 1m CROSSES ABOVE 100", Lifecycle(crossing="above"), "LAST(price) OVER 1m CROSSES ABOVE 100"),
        ("LAST(price) OVER 1m crosses below -3 dampen 5m", Lifecycle(dampen_ms=300_000, crossing="below"),
         "LAST(price) OVER 1m CROSSES BELOW -3 DAMPEN 5m"),
        ("LAST(price) OVER 1m CROSSES 100", Lifecycle(crossing="either"), "LAST(price) OVER 1m CROSSES 100"),
    ],
)
def test_lifecycle_clauses_parse_and_round_trip(text: str, lifecycle: Lifecycle, canonical: str) -> None:
    condition = parse_condition(text)
    assert condition.lifecycle == lifecycle
    assert format_condition(condition) == canonical
    assert parse_condition(canonical) == condition
    assert explain(condition)


def test_crossings_compare_one_side() -> None:
    assert parse_condition("LAST(price) OVER 1m CROSSES ABOVE 100").accepted == (Range(low=100),)
    assert parse_condition("LAST(price) OVER 1m CROSSES BELOW 100").accepted == (Range(high=100),)
    assert parse_condition("LAST(price) OVER 1m CROSSES 100").accepted == (Range(low=100),)  # and, inside, below
    assert "crosses above 100" in explain(parse_condition("LAST(price) OVER 1m CROSSES ABOVE 100"))
    assert "once that has held for 2m" in explain(parse_condition("COUNT(*) OVER 1m > 1 FOR 2m"))


@pytest.mark.parametrize(
    ("text", "message", "column"),
    [
        ("SUM(volume) OVER 5m > 2e6 FOR", "expected a duration such as 30s, 5m or 1h after FOR", 30),
        ("SUM(volume) OVER 5m > 2e6 FOR 0s", "FOR 0s is not a positive whole number of milliseconds", 31),
        ("SUM(volume) OVER 5m > 2e6 FOR 2m FOR 3m", "FOR is given twice", 34),
        ("SUM(volume) OVER 5m > 2e6 KEEP FOR 2m", "expected FIRING FOR and a duration", 32),
        ("SUM(volume) OVER 5m > 2e6 KEEP FIRING 2m", "expected FOR and a duration", 39),
        ("SUM(volume) OVER 5m > 2e6 DAMPEN soon", "expected a duration such as 30s, 5m or 1h after DAMPEN", 34),
        ("SUM(volume) OVER 5m > 2e6 RESOLVE 3", "expected BELOW or ABOVE after RESOLVE", 35),
        ("SUM(volume) OVER 5m > 2e6 RESOLVE BELOW 3e6", "must be at or below the firing range", 27),
        ("AVG(price) OVER 5m BETWEEN 1 AND 2 RESOLVE ABOVE 1.5", "must be at or above the firing range", 36),
        ("SUM(volume) OVER 5m < 3 RESOLVE BELOW 1", "use RESOLVE ABOVE for a condition with no lower bound", 25),
        ("SUM(volume) OVER 5m > 2e6 RESOLVE BELOW 1%", "as a percentage exactly when", 27),
        ("LAST(price) OVER 1m CROSSES ABOVE 100 FOR 2m", "a crossing is an event: it takes DAMPEN, not FOR", 39),
        ("LAST(price) OVER 1m CROSSES 100 RESOLVE BELOW 90", "not RESOLVE", 33),
        ("LAST(price) OVER 1m CROSSES ABOVE", "expected a number", 34),
        ("SUM(volume) OVER 5m > 2e6 DAMPEN 5m x", "unexpected 'x' after the condition", 37),
    ],
)
def test_lifecycle_errors_say_what_and_where(text: str, message: str, column: int) -> None:
    with pytest.raises(ConditionError) as info:
        parse_condition(text)
    assert message in str(info.value)
    assert info.value.column == column


@pytest.mark.parametrize("text", [
    "AVG(price) OVER LAST 100 EVENTS > 10 FOR 1m",
    "CHANGE(price) OVER 5m > 3% KEEP FIRING FOR 5m",
    "CHANGE(price) OVER 5m > 3% RESOLVE BELOW 2%",
    "MAX(price) OVER LAST 20 EVENTS CROSSES ABOVE 100 DAMPEN 5m",
])
def test_lifecycle_clauses_combine_with_tuple_windows_and_changes(text: str) -> None:
    condition = parse_condition(text)
    assert condition.lifecycle is not None and format_condition(condition) == text
    assert Condition.from_dict(condition.to_dict()) == condition


def test_no_data_takes_no_clause() -> None:
    with pytest.raises(ConditionError) as error:
        parse_condition("NO DATA FOR 5m FOR 1m")
    assert error.value.column == 16
